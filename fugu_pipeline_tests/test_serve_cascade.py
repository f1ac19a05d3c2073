"""A cascade checkpoint served end to end: the official `openai` client on loopback, stub workers on
127.0.0.1, the real app under uvicorn. The reply's `fugu_lite` lists each step (workers, final
answers, verifier scores, cost, latency) and why the cascade stopped; a stream sends the accepted
answer; a failing last step falls back; `route` and `ask` run the same checkpoint."""

from __future__ import annotations

import json
import subprocess

import openai
import pytest

from fugu_pipeline.policies.cascade.route import CascadeRouter
from fugu_pipeline.policies.registry import load_router
from fugu_pipeline.route.router import Router, RouterError
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.conftest import REPO

AGREE, SPLIT, BROKEN = "What is 3 + 4?", "What is 5 + 6?", "What is 8 + 1?"


@pytest.fixture(scope="module")
def cascade(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade")
    return build_cascade_checkpoint(root / "models", root / "emb")


@pytest.fixture(scope="module")
def stub():
    with StubLLMServer() as s:
        s.set_answer(AGREE, "3 + 4 = 7. #### 7", model="stub/alpha")
        s.set_answer(AGREE, "It is 7. #### 7", model="stub/beta")
        for prompt, (a, b, g) in ((SPLIT, ("#### 12", "#### 13", "5 + 6 = 11. #### 11")), (BROKEN, ("#### 9", "#### 10", "x"))):
            s.set_answer(prompt, a, model="stub/alpha")
            s.set_answer(prompt, b, model="stub/beta")
            s.set_answer(prompt, g, model="stub/gamma")
        yield s


@pytest.fixture(scope="module")
def client(cascade, stub):
    app = create_app(load_router(cascade, device="cpu"), stub_workers_config(stub.openai_url), batch_window_ms=2)
    srv = ServerThread(app)
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
    srv.stop()


def _ask(client, prompt, **kw):
    return client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}], **kw)


def test_agreeing_cheap_workers_answer_and_the_strong_one_is_never_called(client, stub):
    stub.reset_counts()
    r = _ask(client, AGREE)
    info = r.model_extra["fugu_lite"]["cascade"]
    assert r.choices[0].message.content == "3 + 4 = 7. #### 7" and r.model_extra["fugu_lite"]["served_by"] == "alpha"
    assert len(info["steps"]) == 1 and info["steps"][0]["answers"] == {"alpha": "7", "beta": "7"}
    assert set(info["steps"][0]["verifier"]) == {"alpha", "beta"} and info["steps"][0]["cost_usd"] > 0
    assert "2 of 2 answers agree" in info["stopped"] and info["calls"] == 2
    assert not [q for q in stub.chat_requests() if q.body and q.body.get("model") == "stub/gamma"]


def test_disagreeing_answers_escalate_to_the_last_step(client):
    r = _ask(client, SPLIT)
    info = r.model_extra["fugu_lite"]
    assert r.choices[0].message.content.endswith("#### 11") and info["served_by"] == "gamma"
    steps = info["cascade"]["steps"]
    assert [s["workers"] for s in steps] == [["alpha", "beta"], ["gamma"]] and steps[1]["answers"] == {"gamma": "11"}
    assert "no stop rule held" in steps[0]["decision"] and info["cascade"]["stopped"].startswith("step 2: last step")
    assert info["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in steps)) and info["attempts"] == 3


def test_a_stream_sends_the_accepted_answer(client):
    chunks = list(_ask(client, SPLIT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith("#### 11")
    last = [c for c in chunks if getattr(c, "model_extra", {}).get("fugu_lite")][-1]
    assert last.model_extra["fugu_lite"]["cascade"]["steps"][-1]["workers"] == ["gamma"]


def test_a_failing_last_step_falls_back_to_the_best_early_answer(client, stub):
    stub.set_fault("http", model="stub/gamma", prompt=BROKEN, status=500)
    try:
        r = _ask(client, BROKEN)
    finally:
        stub.clear_faults()
    info = r.model_extra["fugu_lite"]
    assert info["served_by"] in ("alpha", "beta") and info["fallback_errors"][0]["worker"] == "gamma"
    assert "later steps failed" in info["cascade"]["stopped"]


def test_a_budget_picks_a_plan_within_it_and_an_unmeetable_one_is_a_400(client):
    r = _ask(client, AGREE, extra_body={"fugu_budget": {"usd_per_1k": 1.0}})
    assert r.model_extra["fugu_lite"]["budget"]["validation_cost_usd"] <= 1e-3
    with pytest.raises(openai.BadRequestError, match="no cascade point of this checkpoint meets it"):
        _ask(client, AGREE, extra_body={"fugu_budget": {"usd_per_1k": 0.01}})


def test_a_cascade_is_not_loaded_as_a_one_step_router(cascade):
    with pytest.raises(RouterError, match="is a cascade, not a one-step router"):
        Router.load(cascade, device="cpu")
    assert isinstance(load_router(cascade, device="cpu"), CascadeRouter)


@pytest.mark.slow
def test_route_and_ask_run_the_cascade(cascade, stub, tmp_path, capsys):
    from fugu_pipeline.cli import main

    cfg = tmp_path / "workers.yaml"
    cfg.write_text(json.dumps(stub_workers_config(stub.openai_url).model_dump(mode="json", exclude_none=True)))
    # `route` in this process (the same `main` the console script calls); `ask` as users run it
    assert main(["route", "--checkpoint", str(cascade), "--device", "cpu", "--prompt", AGREE]) == 0
    assert json.loads(capsys.readouterr().out)["cascade"].startswith("[alpha, beta] stop if 2 agree")
    fugu = str(REPO / ".venv" / "bin" / "fugu-lite")
    out = subprocess.run([fugu, "ask", "--checkpoint", str(cascade), "--device", "cpu", "--workers", str(cfg), "--prompt", SPLIT],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    answer, _, meta = out.stdout.partition("\n{")
    assert answer.endswith("#### 11") and json.loads("{" + meta)["fugu_lite"]["served_by"] == "gamma"


def test_the_multi_turn_report_baseline_runs_the_cascade_on_the_fixed_workers_replies(cascade):
    """The coordinator's report shows the cascade on the same tasks from the replies every worker
    gave alone (no new call): agreeing cheap replies stop at step 1, a split goes to gamma."""
    from types import SimpleNamespace

    from fugu_pipeline.policies.cascade.evaluate import cascade_over_single_turns
    from fugu_pipeline.tasks.schema import Task

    tasks = [Task(task_id=f"m{i}", prompt=p, domain="general", reference_answer=ref, grader={"type": "numeric"})
             for i, (p, ref) in enumerate(((AGREE, "7"), (SPLIT, "11")))]
    reply = lambda a, q: SimpleNamespace(answer=a, quality=q, cost_usd=0.001)  # noqa: E731
    replies = {"alpha": [reply("#### 7", 1.0), reply("#### 12", 0.0)], "beta": [reply("#### 7", 1.0), reply("#### 13", 0.0)],
               "gamma": [reply("#### 7", 1.0), reply("#### 11", 1.0)]}
    got = cascade_over_single_turns(load_router(cascade, device="cpu"), tasks, replies)
    assert got["quality"].tolist() == [1.0, 1.0] and got["calls"].tolist() == [2, 3]
    assert got["cost_usd"].tolist() == pytest.approx([0.002, 0.003])


def test_metrics_count_where_each_cascade_stopped(client):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def stops() -> dict[str, float]:
        text = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics").text
        return {s.labels["step"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "fugu_cascade_stops" for s in f.samples if s.name.endswith("_total")}

    before = stops()
    _ask(client, AGREE)  # step 1: the cheap workers agree
    _ask(client, SPLIT)  # step 2: gamma
    after = stops()
    assert after.get("1", 0) - before.get("1", 0) == 1 and after.get("2", 0) - before.get("2", 0) == 1


def test_a_refused_key_on_a_cascade_step_falls_back_and_keeps_the_connection(cascade, stub):
    """A worker answering 401 made the cascade answer 500 `internal server error: FatalWorkerError`,
    and the server closed the connection: the client's next request on it was reset."""
    app = create_app(load_router(cascade, device="cpu"), stub_workers_config(stub.openai_url), batch_window_ms=2,
                     auth_cooldown_s=0)
    srv = ServerThread(app)
    ports = []
    http = openai.DefaultHttpxClient(event_hooks={"response": [
        lambda r: ports.append(r.extensions["network_stream"].get_extra_info("client_addr")[1])]})
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60, http_client=http)
    try:
        stub.set_fault("http", model="stub/alpha", status=401)
        r = _ask(c, AGREE)
        stub.clear_faults()
        info = r.model_extra["fugu_lite"]
        assert info["served_by"] in ("beta", "gamma") and info["fallback_errors"][0]["status"] == 401
        assert _ask(c, AGREE).model_extra["fugu_lite"]["served_by"] == "alpha"
        assert len(ports) == 2 and ports[0] == ports[1]  # the same connection answered both
    finally:
        stub.clear_faults()
        srv.stop()


def test_a_cascade_trained_under_a_cap_follows_its_spend_in_serving(tmp_path):
    """A cascade `train --cap` shipped, served through the official client, requests naming no cap:
    the first gets the most accurate saved point within 98% of the trained cap (the strong worker
    alone); every reply's cost (the sum of its calls, priced far above the cap) counts in the cap's
    follower, whose effective cap then falls, and later requests get the cheaper saved point."""
    cap = 6e-3
    ckpt = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", cap_usd=cap)
    with StubLLMServer() as s:
        cfg = stub_workers_config(s.openai_url)
        for w in cfg.workers:  # each call priced far above the cap
            w.price_in_per_mtok, w.price_out_per_mtok = 2000.0, 4000.0
        srv = ServerThread(create_app(load_router(ckpt, device="cpu"), cfg, batch_window_ms=2))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
            replies = [_ask(client, AGREE).model_extra["fugu_lite"] for _ in range(6)]
        finally:
            srv.stop()
    first, last = replies[0], replies[-1]
    assert "the cap it was trained under" in first["budget"]["cap"]
    assert first["budget"]["guard"]["effective_cap_usd"] == pytest.approx(0.98 * cap)
    assert first["budget"]["validation_cost_usd"] == pytest.approx(5e-3)  # the strong worker alone
    assert first["cascade"]["steps"][0]["workers"] == ["gamma"]
    assert all(r["cost_usd"] > cap for r in replies)
    assert last["budget"]["guard"]["requests"] == 5  # the five replies before it, each counted once
    assert last["budget"]["guard"]["running_mean_usd"] == pytest.approx(
        sum(r["cost_usd"] for r in replies[:5]) / 5)
    assert last["budget"]["guard"]["effective_cap_usd"] < 5e-3
    assert last["budget"]["validation_cost_usd"] == pytest.approx(3e-4)  # the cheaper saved point
    assert last["cascade"]["steps"][0]["workers"] != ["gamma"]


def test_a_shared_cap_is_shared_again_in_serving_when_the_mix_of_requests_moves(tmp_path):
    """Plans per group sharing a trained cap (group a two thirds of the rows, so its plan gets the
    strong worker), served through the official client: requests of group a alone move the mix of
    requests, and once a's share is `MIX_BAND` past its share of the rows the cap is shared again
    over it (the strong worker goes to b, whose rows are now few). The replies' guard and
    `/metrics` show a's part come down and the mix that moved it."""
    import httpx
    import numpy as np
    from prometheus_client.parser import text_string_to_metric_families

    from fugu_pipeline.policies.cascade.spend import MIX_BAND, MIX_WINDOW

    cap = 3.6e-3
    ckpt = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", cap_usd=cap, groups=("a", "a", "b"))
    moved = int(np.ceil(np.log((1 - (2 / 3 + MIX_BAND)) / (1 / 3)) / np.log(1 - 1 / MIX_WINDOW)))  # a's share past the band
    with StubLLMServer() as s:
        s.set_answer(AGREE, "3 + 4 = 7. #### 7")
        cfg = stub_workers_config(s.openai_url)
        srv = ServerThread(create_app(load_router(ckpt, device="cpu"), cfg, batch_window_ms=2))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
            guards = [_ask(client, AGREE, extra_body={"domain": "a"}).model_extra["fugu_lite"]["budget"]["guard"]
                      for _ in range(moved + 20)]
            scraped = httpx.get(srv.url + "/metrics", timeout=30).text
        finally:
            srv.stop()
    first, before, last = guards[0], guards[moved - 10], guards[-1]
    assert first["group"] == "a" and first["pooled_cap_usd"] == pytest.approx(cap)
    assert first["cap_usd"] == pytest.approx(5e-3 / 0.98)  # the strong point's cost over the follower's target
    assert before["cap_usd"] == first["cap_usd"]  # within the band: the parts as trained
    assert last["pooled"]["mix"]["a"] > 2 / 3 + MIX_BAND and last["cap_usd"] < 0.7 * first["cap_usd"]
    got = {(f.name, x.labels["group"]): x.value for f in text_string_to_metric_families(scraped)
           for x in f.samples if f.name in ("fugu_cap_part_usd", "fugu_cap_mix_share")}
    assert got[("fugu_cap_part_usd", "a")] == pytest.approx(last["cap_usd"])
    assert got[("fugu_cap_mix_share", "a")] > 2 / 3 + MIX_BAND
    assert got[("fugu_cap_mix_share", "a")] + got[("fugu_cap_mix_share", "b")] == pytest.approx(1.0, abs=1e-3)
