"""The coordinator head's parameter counts the docs give (docs/multi-turn.md) are the code's: the
heads built with Qwen3-0.6B's sizes (its published config, on the meta device: no weights) and
the tiny encoder's."""

from __future__ import annotations

import re

from fugu_pipeline_tests.conftest import REPO

# Qwen/Qwen3-0.6B's config.json: the sizes that decide the head's and the SVF adapter's counts
QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936}


def _svf_size(config) -> int:
    """The SVF adapter's scales (session/svf.py: one per singular value of each linear matrix of
    the second-to-last layer), from the matrices' shapes."""
    import torch
    from transformers import AutoModel

    from fugu_pipeline.session.svf import decoder_layers

    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(min(m.weight.shape) for m in decoder_layers(model)[-2].modules() if isinstance(m, torch.nn.Linear))


def _figure(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, pattern
    return int(m.group(1).replace(",", ""))


def test_the_docs_head_sizes_are_the_codes():
    from transformers import Qwen3Config

    from fugu_pipeline.policies.coordinator.head import RolesHead, RolesSVFHead

    page = (REPO / "docs" / "multi-turn.md").read_text()
    svf = _svf_size(Qwen3Config(**QWEN3_06B))
    head = RolesHead(1024, 3, worker_sets=3).param_count()
    assert _figure(r"= ([\d,]+) parameters with 3 workers and Qwen3-0\.6B", page) == head
    assert _figure(r"\(([\d,]+)\s+with the tiny encoder\)", page) == RolesHead(64, 3, worker_sets=3).param_count()
    assert _figure(r"\(\+([\d,]+) for Qwen3-0\.6B", page) == svf
    assert _figure(r"([\d,]+) parameters in all", page) == \
        RolesSVFHead(1024, 3, svf_size=svf, worker_sets=3).param_count() == head + svf
