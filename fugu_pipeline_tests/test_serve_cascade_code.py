"""A served cascade runs a code reply on its prompt's examples in the sandbox outside the router's
lock: while one reply's run is held, /health and another request (whose reading takes the lock) are
answered. The official `openai` client against the real app on 127.0.0.1; order, never the clock."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx
import openai
import pytest

import fugu_pipeline.policies.cascade.code_examples as ce
from fugu_pipeline.policies.registry import load_router
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.test_untrusted_text import hang_alarm

CODE = 'def twice(x):\n    """Return twice x (served code).\n    >>> twice(2)\n    4\n    """'
REPLY = "def twice(x):\n    return 2 * x"
AGREE = "What is 3 + 4?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from fugu_pipeline.collect.sandbox import interpreter

    root = tmp_path_factory.mktemp("cascade")
    path = build_cascade_checkpoint(root / "models", root / "emb")
    interpreter.cache_clear()
    router = load_router(path, device="cpu")
    assert set(ce.EXECUTED_STATS) <= set(router.head.answer_stats)  # it reads the runs
    assert interpreter.cache_info().currsize == 1  # the sandbox's Python probed at load, not in a request
    with StubLLMServer() as stub:
        for model in ("stub/alpha", "stub/beta", "stub/gamma"):
            stub.set_answer(CODE, REPLY, model=model)
            stub.set_answer(AGREE, "3 + 4 = 7. #### 7", model=model)
        srv = ServerThread(create_app(router, stub_workers_config(stub.openai_url), batch_window_ms=2))
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        yield client, srv.url
        srv.stop()


def _ask(client, prompt):
    return client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}])


def test_a_held_sandbox_run_holds_no_other_request(served, monkeypatch, pytestconfig):
    client, url = served
    monkeypatch.setenv("FUGU_CASCADE_READ_DEADLINE_S", "600")  # the held run is waited for, not skipped
    ce._RECENT.clear()
    entered, release, runs = threading.Event(), threading.Event(), []
    real = ce._run

    def held(reply, prompt):
        runs.append(reply)
        entered.set()
        assert release.wait(120)
        return real(reply, prompt)

    monkeypatch.setattr(ce, "_run", held)
    try:
        with hang_alarm(pytestconfig), concurrent.futures.ThreadPoolExecutor(1) as pool:
            code = pool.submit(_ask, client, CODE)
            assert entered.wait(120)
            assert httpx.get(url + "/health", timeout=120).status_code == 200
            other = _ask(client, AGREE)  # its reading takes the router's lock: free while the run is held
            assert other.choices[0].message.content == "3 + 4 = 7. #### 7" and not code.done()
            release.set()
            r = code.result()
    finally:
        release.set()
    assert r.choices[0].message.content == REPLY and runs and runs[0] == REPLY
    steps = r.model_extra["fugu_lite"]["cascade"]["steps"]
    assert steps and not steps[0].get("over_deadline") and steps[0]["verifier"]  # read, not skipped


def test_a_step_that_stops_on_its_examples_keeps_code_that_passes_and_escalates_code_that_fails(tmp_path):
    """A served plan `[alpha] stop if its code passes the prompt's examples → [gamma]`: alpha's code
    that passes the prompt's `>>>` example is returned after one call; alpha's code that fails it is
    escalated, and gamma answers. The official client on loopback; the runs in the sandbox."""
    plan = {"default": {"steps": [{"workers": ["alpha"], "examples": True}, {"workers": ["gamma"]}]}}
    path = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", plan=plan)
    router = load_router(path, device="cpu")
    assert "its code passes the prompt's examples" in router.head.policy.describe()
    wrong = 'def half(x):\n    """Half of x.\n    >>> half(8)\n    4\n    """'
    ce._RECENT.clear()
    with StubLLMServer() as stub:
        stub.set_answer(CODE, REPLY, model="stub/alpha")
        stub.set_answer(wrong, "def half(x):\n    return x * 2", model="stub/alpha")
        stub.set_answer(CODE, "def twice(x):\n    return x + x", model="stub/gamma")
        stub.set_answer(wrong, "def half(x):\n    return x // 2", model="stub/gamma")
        srv = ServerThread(create_app(router, stub_workers_config(stub.openai_url), batch_window_ms=2))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            kept, escalated = _ask(client, CODE), _ask(client, wrong)
        finally:
            srv.stop()
    run = kept.model_extra["fugu_lite"]["cascade"]
    assert kept.choices[0].message.content == REPLY and len(run["steps"]) == 1
    assert "passes every example" in run["steps"][0]["decision"]
    run = escalated.model_extra["fugu_lite"]["cascade"]
    assert escalated.choices[0].message.content == "def half(x):\n    return x // 2" and len(run["steps"]) == 2
