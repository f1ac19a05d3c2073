"""A served cascade reads its workers' replies off the event loop, within a deadline: the request
that once stopped the server (a 40-digit literal before an `=`, echoed back by the workers) is
answered while `/health` and another request are; a reply whose reading runs past the deadline
sends the cascade to its next step, counted in `/health` and logged in one line. The official
`openai` client against the real app on 127.0.0.1; results and order, never the clock."""

from __future__ import annotations

import concurrent.futures
import logging
import threading

import httpx
import openai
import pytest

from fugu_pipeline.policies.registry import load_router
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.test_untrusted_text import hang_alarm

HOSTILE = "Compute x = " + "10" * 20 + " y = 1"
SLOW = "What is 6 + 6?"  # the cheap workers agree, but the reading of their replies is held
AGREE = "What is 3 + 4?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade")
    router = load_router(build_cascade_checkpoint(root / "models", root / "emb"), device="cpu")
    with StubLLMServer() as stub:
        for model in ("stub/alpha", "stub/beta", "stub/gamma"):
            stub.set_answer(HOSTILE, HOSTILE, model=model)  # mock workers that echo the prompt
            stub.set_answer(AGREE, "3 + 4 = 7. #### 7", model=model)
        stub.set_answer(SLOW, "6 + 6 = 12. #### 12", model="stub/alpha")
        stub.set_answer(SLOW, "6 + 6 = 12. #### 12", model="stub/beta")
        stub.set_answer(SLOW, "Twelve, says gamma. #### 12", model="stub/gamma")
        srv = ServerThread(create_app(router, stub_workers_config(stub.openai_url), batch_window_ms=2))
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        yield router, client, srv.url
        srv.stop()


def _ask(client, prompt):
    return client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}])


def test_the_reported_request_is_answered_while_health_and_others_are(served, pytestconfig):
    _, client, url = served
    with hang_alarm(pytestconfig), concurrent.futures.ThreadPoolExecutor(3) as pool:
        hostile = pool.submit(_ask, client, HOSTILE)
        health = pool.submit(httpx.get, url + "/health", timeout=120)
        other = pool.submit(_ask, client, AGREE)
        r, h, o = hostile.result(), health.result(), other.result()
    assert r.choices[0].message.content == HOSTILE and r.model_extra["fugu_lite"]["cascade"]["steps"]
    assert h.status_code == 200 and o.choices[0].message.content == "3 + 4 = 7. #### 7"


def test_a_reading_past_the_deadline_goes_to_the_next_step(served, monkeypatch, caplog):
    """The verifier of SLOW's first step is held: /health and another request are answered while it
    is, and SLOW itself, whose cheap workers agree, is answered by the next step (gamma) before the
    held reading ends."""
    router, client, url = served
    monkeypatch.setenv("FUGU_CASCADE_READ_DEADLINE_S", "0.2")
    entered, release, inside = threading.Event(), threading.Event(), []
    verify = router.verify

    def held(prompt, *a):
        if prompt == SLOW and not inside:
            inside.append(True)
            entered.set()
            release.wait()
            inside.clear()
        return verify(prompt, *a)

    monkeypatch.setattr(router, "verify", held)
    try:
        with caplog.at_level(logging.WARNING, logger="fugu_pipeline.serve"), \
                concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(_ask, client, SLOW)
            assert entered.wait(120)
            h = httpx.get(url + "/health", timeout=120)
            assert h.status_code == 200 and inside  # answered while the reading was held
            o = _ask(client, AGREE)
            assert o.choices[0].message.content == "3 + 4 = 7. #### 7" and inside
            r = slow.result()
            assert inside  # SLOW was answered before its held reading ended
    finally:
        release.set()
    info = r.model_extra["fugu_lite"]
    first = info["cascade"]["steps"][0]
    assert first["over_deadline"] and "not read within the 0.2 s deadline" in first["decision"]
    assert info["served_by"] == "gamma"
    assert r.choices[0].message.content == "Twelve, says gamma. #### 12"
    assert httpx.get(url + "/health", timeout=120).json()["counts"]["cascade_read_over_deadline"] >= 1
    lines = [rec.getMessage() for rec in caplog.records if "not read within" in rec.getMessage()]
    assert lines and all("\n" not in line and "FUGU_CASCADE_READ_DEADLINE_S" in line for line in lines)


def test_a_bad_deadline_setting_is_one_line(monkeypatch):
    from fugu_pipeline.serve.cascade import read_deadline_s
    from fugu_pipeline.settings import SettingsError

    monkeypatch.setenv("FUGU_CASCADE_READ_DEADLINE_S", "soon")
    with pytest.raises(SettingsError, match="FUGU_CASCADE_READ_DEADLINE_S='soon': .*set it to a valid value or unset it"):
        read_deadline_s()
    monkeypatch.setenv("FUGU_CASCADE_READ_DEADLINE_S", "2.5")
    assert read_deadline_s() == 2.5
