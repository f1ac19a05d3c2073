"""Context windows and `max_tokens` while serving (`workers/limits.py`). A prompt longer than a
worker's context window was sent to it anyway (the catalog knew the window), and `max_tokens:
10**12` went upstream unchanged. Now a worker the prompt cannot fit is skipped, with the reason in
the routing details, no worker fitting is an OpenAI-shaped 400 `context_length_exceeded`, and a
`max_tokens` over a worker's limit is lowered to it and the reply says so. Tested through the
official `openai` client on loopback against stub workers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.serve.upstream import CallTiming, Workers, project_catalog
from fugu_pipeline.testing.serving import WORKERS, ServerThread, stub_workers_config
from fugu_pipeline.workers.catalog import entry_from_api, save_snapshot, snapshot_from_api
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.limits import GLOBAL_MAX_OUTPUT_TOKENS, WorkerSkipped, prompt_tokens_estimate
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, assert_openai_error, fugu

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub
LONG = "What is 2 times 3? " + "Show every step of the work. " * 100  # 2,919 bytes: about 980 tokens estimated


def _config(base_url: str, **per_worker: dict) -> WorkersConfig:
    config = stub_workers_config(base_url)
    return config.model_copy(update={"workers": [w.model_copy(update=per_worker.get(w.id, {}))
                                                 for w in config.workers]})


def _serve(models, config, catalog=None) -> tuple[ServerThread, openai.OpenAI]:
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), config, catalog=catalog))
    return srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _sent(stub) -> dict[str, dict]:
    """worker id -> the last body the stub received for it."""
    by_model = {r.body["model"]: r.body for r in stub.chat_requests()}
    return {w: by_model[m] for w, m in WORKERS.items() if m in by_model}


def test_a_prompt_that_does_not_fit_a_workers_window_is_not_sent_there(models, stub):
    srv, c = _serve(models, stub_workers_config(stub.openai_url))
    try:
        ranking = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(LONG)))["ranking"]
    finally:
        srv.stop()
    small = {w: {"context_window": 600} for w in ranking[:2]}  # the router's first two picks for this prompt
    srv, c = _serve(models, _config(stub.openai_url, **small))
    try:
        stub.reset_counts()
        info = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(LONG)))
        assert info["ranking"] == ranking and info["served_by"] == ranking[2] and set(_sent(stub)) == {ranking[2]}
        assert [s["worker"] for s in info["skipped"]] == ranking[:2]
        for s in info["skipped"]:
            assert s["code"] == "context_length_exceeded" and "context window of 600 tokens" in s["reason"]
            assert "the worker YAML's context_window" in s["reason"]
        assert info["prompt_tokens_estimate"] == prompt_tokens_estimate(ask(LONG)) > 600
        short = fugu(c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?")))
        assert short["skipped"] == [] and short["served_by"] == short["chosen_worker"]  # a short prompt fits everywhere
    finally:
        srv.stop()


def test_no_worker_fitting_is_a_400_context_length_exceeded_before_any_call(models, stub):
    windows = {w: {"context_window": 600} for w in WORKERS}
    srv, c = _serve(models, _config(stub.openai_url, **windows))
    try:
        stub.reset_counts()
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as exc:
                c.chat.completions.create(model="fugu-lite", messages=ask(LONG), stream=stream)
            body = exc.value.response.json()
            assert set(body["error"]) == {"message", "type", "param", "code"}
            assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"
            assert {s["worker"] for s in body["fugu_lite"]["skipped"]} == set(WORKERS)
        assert stub.chat_requests() == []
        windows = {w: {"context_window": 1300} for w in WORKERS}  # the prompt (981) fits, with 319 tokens to spare
        srv2, c2 = _serve(models, _config(stub.openai_url, **windows))
        try:
            with pytest.raises(openai.BadRequestError):  # a max_tokens the window cannot hold is not lowered
                c2.chat.completions.create(model="fugu-lite", messages=ask(LONG), max_tokens=1000)
            info = fugu(c2.chat.completions.create(model="fugu-lite", messages=ask(LONG)))  # the default is
            sent = _sent(stub)[info["served_by"]]
            assert sent["max_tokens"] == info["max_tokens"]["sent"] == 1300 - info["prompt_tokens_estimate"] < 1024
            assert "room the prompt" in info["max_tokens"]["note"] and info["max_tokens"]["asked"] is None
        finally:
            srv2.stop()
    finally:
        srv.stop()


def test_an_absurd_max_tokens_is_lowered_to_each_workers_limit_and_the_reply_says_so(models, stub):
    srv, c = _serve(models, _config(stub.openai_url, alpha={"max_output_tokens": 512}))
    try:
        for field in ("max_tokens", "max_completion_tokens"):
            for worker, limit, source in (("alpha", 512, "max_output_tokens"), ("beta", GLOBAL_MAX_OUTPUT_TOKENS, "global cap")):
                stub.reset_counts()
                r = c.chat.completions.with_raw_response.create(
                    model="fugu-lite", messages=ask("What is 2 times 3?"),
                    extra_body={field: 10**12, "fugu_allowed_workers": [worker]})
                info = fugu(r.parse())
                assert _sent(stub)[worker]["max_tokens"] == limit, (field, worker)
                assert info["max_tokens"]["asked"] == 10**12 and info["max_tokens"]["sent"] == limit
                assert source in info["max_tokens"]["note"] and r.headers["x-fugu-max-tokens"] == str(limit)
        stub.reset_counts()
        info = fugu(c.chat.completions.create(model="fugu-lite", messages=ask("hi"), max_tokens=100,
                                              extra_body={"fugu_allowed_workers": ["alpha"]}))
        assert _sent(stub)["alpha"]["max_tokens"] == 100 and "max_tokens" not in info  # within the limit: unchanged
    finally:
        srv.stop()


def test_invalid_max_tokens_get_a_400_naming_the_field(models, stub):
    srv, c = _serve(models, stub_workers_config(stub.openai_url))
    try:
        stub.reset_counts()
        for field in ("max_tokens", "max_completion_tokens"):
            for bad in (-5, 0, 1.5, True, "10", [10]):
                r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": ask("hi"), field: bad}, timeout=30)
                assert assert_openai_error(r, 400)["param"] == field, (field, bad)
        assert stub.chat_requests() == []
    finally:
        srv.stop()


def test_the_catalog_gives_openrouter_workers_their_window_and_output_limit(models, stub, monkeypatch):
    monkeypatch.setenv("FUGU_TEST_OPENROUTER_KEY", "sk-test")
    config = WorkersConfig.model_validate({"workers": [
        {"id": w, "kind": "openrouter", "model": m, "base_url": stub.openrouter_url, "api_key_env": "FUGU_TEST_OPENROUTER_KEY",
         **({"context_window": 4000} if w == "gamma" else {})} for w, m in WORKERS.items()]})
    catalog = snapshot_from_api({"data": [
        {"id": m, "context_length": 600, "top_provider": {"context_length": 600, "max_completion_tokens": 300},
         "pricing": {"prompt": "0.000001", "completion": "0.000002"}} for m in WORKERS.values()]})
    srv, c = _serve(models, config, catalog)
    try:
        stub.reset_counts()
        info = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(LONG)))
        assert info["served_by"] == "gamma"  # its YAML window (4,000) wins over the catalog's (600)
        assert all("the catalog's context_length" in s["reason"] for s in info["skipped"])
        info = fugu(c.chat.completions.create(model="fugu-lite", messages=ask("hi"), max_tokens=10**12,
                                              extra_body={"fugu_allowed_workers": ["alpha"]}))
        assert _sent(stub)["alpha"]["max_tokens"] == 300 and "max_completion_tokens" in info["max_tokens"]["note"]
        workers = httpx.get(srv.url + "/health").json()["workers"]
        assert {w["id"]: w["limits"]["context_window"] for w in workers} == {"alpha": 600, "beta": 600, "gamma": 4000}
    finally:
        srv.stop()


def test_serve_reads_the_projects_catalog_and_a_broken_one_is_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("FUGU_PROJECT_DIR", str(tmp_path))
    assert project_catalog() is None
    save_snapshot(snapshot_from_api({"data": [{"id": "m/x", "context_length": 8192}]}), tmp_path / "data" / "catalog")
    assert project_catalog().models["m/x"].context_length == 8192
    (tmp_path / "data" / "catalog" / "latest.json").write_text("{not json")
    assert project_catalog() is None


def test_a_cascade_or_session_call_skips_a_worker_the_prompt_does_not_fit_without_calling_it():
    """Cascades and multi-turn sessions call `Workers.complete`, which admits as the one-step loop does."""
    config = WorkersConfig.model_validate({"workers": [{"id": "small", "kind": "mock", "context_window": 600}]})
    workers = Workers(config, attempts=1)  # never started: a call that were made would fail otherwise
    with pytest.raises(WorkerSkipped) as exc:
        asyncio.run(workers.complete("small", ask(LONG), {}, CallTiming()))
    assert exc.value.code == "context_length_exceeded" and exc.value.attempts == 0


def test_the_prompt_estimate_and_the_catalogs_output_limit():
    assert prompt_tokens_estimate([{"role": "user", "content": "abc" * 100}]) == 100 + 8
    assert prompt_tokens_estimate([{"role": "user", "content": "日本語" * 10}]) == 30 + 8  # 3 bytes each: 1 token
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    assert prompt_tokens_estimate([{"role": "user", "content": [{"type": "text", "text": "abc"}, image]}]) == 1 + 8 + 1600
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert prompt_tokens_estimate([{"role": "user", "content": ""}], tools) == -(-len(json.dumps(tools, separators=(",", ":"))) // 3) + 8
    base = {"id": "m/x", "context_length": 8192}
    plain = entry_from_api(base)
    assert plain.max_completion_tokens is None
    assert entry_from_api({**base, "top_provider": {"max_completion_tokens": 4096}}).max_completion_tokens == 4096
    for bad in (True, "4096", -1, 0, float("nan"), None):
        e = entry_from_api({**base, "top_provider": {"max_completion_tokens": bad}})
        assert e.max_completion_tokens is None and e.fingerprint == plain.fingerprint, bad
    assert entry_from_api({**base, "top_provider": {"max_completion_tokens": 4096}}).fingerprint == plain.fingerprint
