"""Budget mode against hostile and degenerate input, through the real entry points: `fugu-lite
route` (`main([...])`), the server (uvicorn on 127.0.0.1, the official `openai` client) and the
functions `train`/`evaluate` call (`calibrate_beside`, `calibrate_checkpoint`).

A bad input gets one clear error naming the flag, field or file (CLI: exit 2, one line; server: a
400 naming the field, the other requests unaffected); a degenerate but valid one gets a correct,
explained result, never a crash or a silently wrong route."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.route.budget import calibrate_beside
from fugu_pipeline.testing.serving import WORKERS, synthetic_tasks

PROMPT = "What is 3 times 4?"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A quality head on the tiny encoder, with its budget.json drawn on the training data."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.routing_data import RoutingData
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.train.configs import SFTConfig
    from fugu_pipeline.train.sft import train_sft

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu"))
    prompts, domains, utility = synthetic_tasks()
    tokens = np.array([np.ceil(len(p) / 4) for p in prompts])
    data = RoutingData(
        task_ids=[f"s{k}" for k in range(len(prompts))], prompts=prompts, domains=domains,
        splits=["val" if k % 6 == 0 else "test" if k % 6 == 1 else "train" for k in range(len(prompts))],
        worker_ids=list(WORKERS), features=enc.encode(prompts, domains), utility=utility,
        contract=enc.feature_contract(), quality=(utility >= 1.0).astype(float),
        cost_usd=tokens[:, None] * np.array([1e-6, 4e-6, 2e-5])[None, :])
    models = tmp_path_factory.mktemp("models")
    path = train_sft(data, SFTConfig(seed=0, epochs=5, patience=5, head="quality")).save(models)
    assert calibrate_beside(path, data, log=lambda m: None) is not None
    return path, data


def run(*argv) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue().strip().splitlines()


def route(ckpt, *flags):
    return run("route", "--checkpoint", str(ckpt), "--prompt", PROMPT, "--device", "cpu", *flags)


def one_error(code: int, err: list[str], *needles: str) -> str:
    assert code == 2 and len(err) == 1, err
    assert "Traceback" not in err[0]
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


# --------------------------------------------------------------------------- flags


def test_a_margin_without_a_cap_is_refused_not_ignored(trained, capsys):
    code, out, err = route(trained[0], "--budget-margin-z", "1")
    one_error(code, err, "--budget-margin-z", "--budget-share")
    assert out == ""
