"""Checkpoints that load and then fail every request, and server-side faults told to clients as
their own.

- A re-signed checkpoint whose weights are huge but finite (±3e38, the largest float32) passed
  every check on its tensors, was served, and every request got a 400 "lower the cost weight",
  blaming the client. Now every head kind's scores are probed at load (`train/probe.py`) and such
  a checkpoint is refused there, with one line; a server keeps its last good checkpoint.
- A damaged `budget.json` beside the served checkpoint put the server's absolute path into a 400
  sent to the client. Now the client is told the checkpoint's tag, and a fault on the server's
  side is a 5xx; the path goes to the server's log.
"""

from __future__ import annotations

import json
import logging
import shutil

import httpx
import numpy as np
import openai
import pytest
import torch

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import Router, RouterError
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import ServerThread, build_checkpoints, promote, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from fugu_pipeline.policies.oneshot.ensemble import EnsembleHead
from fugu_pipeline.policies.oneshot.heads import HEADS, build_head
from fugu_pipeline.policies.oneshot.predictors import DomainPriorHead, KNNHead, MLPHead, QualityPredictor
from fugu_pipeline.policies.oneshot.ridge import RidgeHead
from fugu_pipeline_tests.test_checkpoint_hostile import _edit_tensors

DIM = 16
WORKER_IDS = ["w1", "w2", "w3"]
CONTRACT = FeatureContract(encoder_id="synthetic", dim=DIM)
HUGE = 3e38


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.uniform(size=(40, 3))
    return x, q, ["a", "b"] * 20


def _verifying(head):
    """A cascade whose plan consults its verifier marks the verifier's weights as used."""
    head.used.fill_(1.0)
    return head


def _linear(kind: str, params: dict | None = None, **shape):
    def make():
        head = build_head(kind, DIM, 3, params, **shape)
        torch.manual_seed(0)
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.1)
        return head
    return make


BUILDERS = {
    "layernorm_linear": _linear("layernorm_linear"),
    "normed_linear": _linear("normed_linear"),
    "quality": _linear("quality"),
    "roles_linear": _linear("roles_linear"),
    "roles_linear_svf": _linear("roles_linear_svf", svf_size=4),
    "triage_linear": _linear("triage_linear", {"domains": ["a", "b"], "difficulty_names": ["easy", "medium", "hard"],
                                               "difficulty_edges": [0.34, 0.67], "solve_threshold": 0.5}),
    "domain_prior": lambda: DomainPriorHead.fit(DIM, _data()[1], _data()[1], _data()[2]),
    "knn": lambda: KNNHead.fit(*_data()[:2], _data()[1], _data()[2], k=5),
    "mlp": lambda: MLPHead.fit(_data()[0], _data()[1], _data()[1], _data()[2], hidden=8, n_models=1, epochs=2),
    "ridge": lambda: RidgeHead.fit(_data()[0], _data()[1], _data()[1], _data()[2]),
    "cascade": lambda: _verifying(_linear("cascade", {"policy": {"default": {"steps": [
        {"workers": ["w1", "w2"], "verify": 0.5}, {"workers": ["w3"]}]}}, "answer_dim": 2})()),
    "ensemble": lambda: EnsembleHead.from_members([BUILDERS["knn"](), BUILDERS["domain_prior"]()], [0.5, 0.5],
                                                  [(1.0, 0.0), (1.0, 0.0)]),
}


def _save(root, kind: str, head) -> "object":
    shape = {"svf_size": 4} if kind == "roles_linear_svf" else {}
    return save_checkpoint(root, kind, kind, head.state_dict(), {
        "worker_ids": WORKER_IDS, "feature_contract": CONTRACT, "data_version": "d1",
        "head_params": head.head_params(), "head_shape": shape})


def _huge(kind: str):
    """A tensor edit giving every weight ±3e38 (its sign kept); a quality predictor's routing map
    is computed again from the edited head, as a forger would."""
    def edit(tensors: dict) -> dict:
        head = BUILDERS[kind]()
        head.load_state_dict({k: v for k, v in tensors.items()})
        state = {k: (torch.where(v >= 0, HUGE, -HUGE) if v.is_floating_point() and "routing_map" not in k else v)
                 for k, v in head.state_dict().items()}
        head.load_state_dict(state)
        if isinstance(head, QualityPredictor):
            head.finalize()
        return {k: v.contiguous() for k, v in head.state_dict().items()}
    return edit


def test_every_head_kind_is_covered():
    assert set(BUILDERS) == set(HEADS)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_re_signed_checkpoint_with_huge_finite_weights_is_refused_at_load(tmp_path, kind):
    sane = _save(tmp_path / "sane", kind, BUILDERS[kind]())
    assert load_checkpoint(sane, expected_contract=CONTRACT).manifest.head_kind == kind
    crafted = _edit_tensors(shutil.copytree(sane, tmp_path / "crafted" / sane.name), _huge(kind))  # re-signed
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(crafted, expected_contract=CONTRACT)
    msg = str(e.value)
    assert "\n" not in msg and "refusing these weights" in msg and str(crafted) in msg, msg


# --------------------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def stub():
    with StubLLMServer() as s:
        yield s


def _inflate(ckpt_dir, models_dir):
    """A copy of a served checkpoint whose final layer is ±3e38, re-signed."""
    copy = shutil.copytree(ckpt_dir, models_dir / "sft" / "0000000000000000")
    return _edit_tensors(copy, lambda t: {k: (torch.where(v >= 0, HUGE, -HUGE) if k == "linear.weight" else v)
                                          for k, v in t.items()})


def test_a_server_refuses_a_checkpoint_whose_scores_overflow_and_keeps_the_last_good_one(tmp_path, stub):
    models = tmp_path / "models"
    good = build_checkpoints(models, seeds=(0,))[0]
    crafted = _inflate(good, models)
    with pytest.raises(CheckpointError, match="refusing"):
        Router.load(crafted, device="cpu")

    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url)))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        assert c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}]).choices
        promote(models, crafted)  # the promoted pointer now names the crafted checkpoint
        for _ in range(3):
            r = c.chat.completions.with_raw_response.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}])
            assert r.status_code == 200 and r.headers["x-fugu-checkpoint"] == f"sft/{good.name}"
        h = httpx.get(srv.url + "/health").json()
        assert h["checkpoint"]["content_hash"] == good.name and h["reload_error"], h
    finally:
        srv.stop()
    with pytest.raises((CheckpointError, RouterError), match="refusing"):  # and a server started on it does not start
        create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url))


def test_non_finite_scores_at_request_time_are_the_servers_fault_not_the_clients(tmp_path, stub, monkeypatch):
    models = tmp_path / "models"
    build_checkpoints(models, seeds=(0,))
    router = PromotedRouter(models, device="cpu")
    srv = ServerThread(create_app(router, stub_workers_config(stub.openai_url)))
    try:
        monkeypatch.setattr(Router, "scores", lambda self, *a, **k: np.full((len(a[0]), 3), np.nan, np.float32))
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.InternalServerError) as exc:
            c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}])
        err = exc.value.response.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "checkpoint_fault" and err["param"] is None
        assert "not the request" in err["message"] and str(tmp_path) not in err["message"]
    finally:
        srv.stop()


# --------------------------------------------------------------------------- budget.json


@pytest.fixture(scope="module")
def quality_models(tmp_path_factory):
    models = tmp_path_factory.mktemp("quality-models")
    return models, build_checkpoints(models, seeds=(0,), head="quality")[0]


@pytest.mark.parametrize("calibration, status", [('{"checkpoint": ', 500), ("[1]", 500), (None, 400)])
def test_a_budget_refusal_names_the_checkpoint_by_its_tag_and_a_server_fault_is_a_5xx(quality_models, stub, caplog,
                                                                                        calibration, status):
    models, ckpt = quality_models
    path = ckpt / "budget.json"
    path.unlink(missing_ok=True)
    if calibration is not None:
        path.write_text(calibration)
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url)))
    try:
        with caplog.at_level(logging.INFO):
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
            with pytest.raises(openai.APIStatusError) as exc:
                c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"fugu_budget": {"share": 0.5}})
    finally:
        srv.stop()
        path.unlink(missing_ok=True)
    err = exc.value.response.json()["error"]
    assert exc.value.status_code == status and err["code"] == "budget_unavailable", err
    assert f"sft/{ckpt.name}" in err["message"] and str(models) not in json.dumps(err)
    assert "/" not in err["message"].replace(f"sft/{ckpt.name}", "")  # no path of any kind
    assert err["type"] == ("server_error" if status == 500 else "invalid_request_error")
    assert err["param"] == (None if status == 500 else "fugu_budget")
    if status == 500:  # the operator learns which file and why
        assert str(path) in caplog.text
