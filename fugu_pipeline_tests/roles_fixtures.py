"""What the coordinator-training tests share: the tiny encoder as the coordinator reads transcripts
(256 tokens, fp32, CPU, one torch thread), loaded once per test file.

A test file takes it by binding it at module level, which keeps the fixture's scope that file's:

    from fugu_pipeline_tests import roles_fixtures

    encoder = roles_fixtures.encoder
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def encoder():
    import torch

    from fugu_pipeline.policies.coordinator.project import roles_encoder_settings
    from fugu_pipeline.features.encoder import Encoder

    torch.set_num_threads(1)
    enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
    yield enc
    enc.close()
