"""A cascade checkpoint served with requests that carry tools, and with a worker in a cooldown: the
official `openai` client on loopback, stub workers on 127.0.0.1. A cascade compares the answers of
its steps; tool calls are not answers to compare, so a request with tools is served one-step by
the first worker of the route that supports tools. A worker that keeps failing is skipped by the
cascade's steps (as a failed call, without calling it) while its cooldown lasts."""

from __future__ import annotations

import openai
import pytest

from fugu_pipeline.policies.registry import load_router
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
from fugu_pipeline.testing.serving import WORKERS, ServerThread, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.testing.tool_round_trip import QUESTION, TOOLS

AGREE = "What is 3 + 4?"


@pytest.fixture(scope="module")
def stub():
    with StubLLMServer() as s:
        s.set_answer(AGREE, "3 + 4 = 7. #### 7")
        yield s


@pytest.fixture(scope="module")
def server(tmp_path_factory, stub):
    root = tmp_path_factory.mktemp("cascade")
    config = stub_workers_config(stub.openai_url)
    config = config.model_copy(update={"workers": [w.model_copy(update={"supports_tools": w.id == "gamma"})
                                                   for w in config.workers]})
    app = create_app(load_router(build_cascade_checkpoint(root / "models", root / "emb"), device="cpu"), config)
    srv = ServerThread(app)
    yield srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
    srv.stop()


def _models(stub) -> list[str]:
    return [r.body["model"] for r in stub.chat_requests()]


def test_a_request_with_tools_is_served_one_step_by_a_worker_that_supports_tools(server, stub):
    _, c = server
    stub.reset_counts()
    r = c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}], tools=TOOLS)
    info = r.model_extra["fugu_lite"]
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "cascade" not in info and info["served_by"] == "gamma" and _models(stub) == ["stub/gamma"]
    assert {s["worker"] for s in info["skipped"]} == {"alpha", "beta"}


def test_a_cascade_step_skips_a_worker_in_its_cooldown_without_calling_it(server, stub):
    _, c = server
    stub.set_fault("http", status=503, model=WORKERS["alpha"])
    try:
        for _ in range(3):  # three 503s in a row: alpha's cooldown begins
            c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": AGREE}])
        stub.reset_counts()
        r = c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": AGREE}])
        info = r.model_extra["fugu_lite"]
        assert "stub/alpha" not in _models(stub) and r.choices[0].message.content == "3 + 4 = 7. #### 7"
        first = info["cascade"]["steps"][0]
        assert first["workers"] == ["alpha", "beta"] and first["errors"][0]["worker"] == "alpha"
        assert "kept out" in first["errors"][0]["error"] and first["errors"][0]["attempts"] == 0
    finally:
        stub.clear_faults()
