"""Multi-turn delegation the way users reach it: `"fugu_mode": "multi_turn"` through the official
`openai` SDK against the real server (stub LLM workers on 127.0.0.1 replying by role), and
`fugu-lite ask --mode multi-turn`. The coordinator is a real roles checkpoint whose head was fitted
to a known script (Thinker alpha, Worker beta, Verifier gamma, Worker beta, ...)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from fugu_pipeline.policies.coordinator.route import PromotedRoles, RolesCoordinator
from fugu_pipeline.route.router import Router
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.roles_serving import imitation_checkpoint
from fugu_pipeline.testing.serving import WORKERS, ServerThread, build_checkpoints, stub_workers_config
from fugu_pipeline.train.pointer import ROLES_POINTER, write_pointer

from . import serve_fixtures
from .conftest import REPO

IDS = list(WORKERS)
SCRIPT = [("alpha", "thinker"), ("beta", "worker"), ("gamma", "verifier"), ("beta", "worker"), ("gamma", "verifier")]
REPLIES = {"thinker": "Plan: multiply the two numbers, then check the product.", "worker": "6 x 7 = 42.\nFinal answer: 42",
           "verifier": "I re-did the product.\nVERDICT: REVISE"}
PROMPTS = [(f"What is {a} times {b}?", "math") for a, b in [(6, 7), (3, 9), (12, 4), (8, 8), (5, 11), (7, 13)]]
QUESTION = "What is 6 times 7?"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    models = tmp_path_factory.mktemp("models")
    build_checkpoints(models, seeds=(0,), epochs=5)  # a promoted one-step router for the default mode
    roles = imitation_checkpoint(models, IDS, SCRIPT, PROMPTS, REPLIES)
    write_pointer(models, {"checkpoint": str(roles.relative_to(models)), "content_hash": roles.name, "method": "roles"},
                  ROLES_POINTER)
    return models, roles


stub = serve_fixtures.stub


@pytest.fixture(autouse=True)
def _replies(stub):
    for role, text in REPLIES.items():
        stub.set_role_reply(role, text)
    yield
    stub.clear_faults()
    stub.role_replies.clear()


@pytest.fixture(scope="module")
def server(models, stub):
    from fugu_pipeline.route.promoted import PromotedRouter

    srv = ServerThread(create_app(PromotedRouter(models[0], device="cpu"), stub_workers_config(stub.openai_url),
                                  roles=PromotedRoles(models[0], device="cpu"), batch_window_ms=2))
    yield srv.url
    srv.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=60)


def ask(client, stream: bool = False, **extra):
    return client.chat.completions.with_raw_response.create(
        model="fugu-lite", messages=[{"role": "user", "content": QUESTION}], stream=stream,
        extra_body={"fugu_mode": "multi_turn", "domain": "math", **extra})


def test_the_fitted_coordinator_follows_its_script(models, stub):
    import asyncio

    from fugu_pipeline.session.callers import ClientCaller
    from fugu_pipeline.workers.http import make_http_client

    coord = RolesCoordinator.load(models[1], device="cpu")
    config = stub_workers_config(stub.openai_url)
    caller = ClientCaller({w.id: make_http_client(w, config, stream=False) for w in config.workers},
                          {w.id: w for w in config.workers}, own=True)
    tr = asyncio.run(coord.session(QUESTION, "math", caller))
    assert [(t.served_by, t.role) for t in tr.turns] == SCRIPT
    assert tr.stop_reason == "max_turns" and tr.committed_turn == 4


def test_multi_turn_request_through_the_openai_sdk(client, stub):
    stub.set_role_reply("verifier", "Correct.\nVERDICT: ACCEPT")
    raw = ask(client)
    r = raw.parse()
    info = r.model_extra["fugu_lite"]
    assert r.choices[0].message.content == REPLIES["worker"]
    assert [(t["served_by"], t["role"]) for t in info["turns"]] == SCRIPT[:3]
    assert info["mode"] == "multi_turn" and info["stop_reason"] == "accepted" and info["committed_turn"] == 2
    assert info["turns"][2]["verdict"] == "accept" and info["cost_usd"] > 0
    assert raw.headers["x-fugu-mode"] == "multi_turn" and raw.headers["x-fugu-turns"] == "3"
    assert raw.headers["x-fugu-served-by"] == "beta" and r.model == "stub/beta"
    assert r.usage.total_tokens == sum(t["prompt_tokens"] + t["completion_tokens"] for t in info["turns"])
    assert stub.role_calls[("stub/gamma", "verifier")] >= 1


def test_multi_turn_streams_the_committed_answer(client, stub):
    stub.set_role_reply("verifier", "VERDICT: ACCEPT")
    raw = ask(client, stream=True)
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLIES["worker"] and raw.headers["x-fugu-turns"] == "3"
    assert chunks[-1].model_extra["fugu_lite"]["stop_reason"] == "accepted"


def test_a_worker_failing_mid_session_falls_back_inside_the_server(client, stub):
    stub.set_fault("http", status=503, model="stub/beta")  # the Worker of turns 2 and 4
    r = ask(client).parse()
    turns = r.model_extra["fugu_lite"]["turns"]
    assert turns[1]["chosen_worker"] == "beta" and turns[1]["served_by"] != "beta"
    assert turns[1]["fallback_errors"][0]["worker"] == "beta" and turns[1]["fallback_errors"][0]["status"] == 503
    assert r.choices[0].message.content == REPLIES["worker"]


def test_every_worker_failing_is_a_502_with_the_turns(client, stub):
    stub.set_fault("http", status=500)
    with pytest.raises(openai.APIStatusError) as e:
        ask(client)
    assert e.value.status_code == 502
    body = e.value.response.json()
    assert body["error"]["code"] == "all_workers_failed" and body["fugu_lite"]["turns"][0]["status"] == "failed"


def test_bad_mode_and_missing_coordinator_are_400(client, models, stub):
    with pytest.raises(openai.BadRequestError, match="fugu_mode"):
        ask(client, fugu_mode="three_turns")
    with pytest.raises(openai.BadRequestError, match="'fugu_budget' applies to one-step routing"):
        ask(client, fugu_budget={"share": 0.3})
    from fugu_pipeline.route.router import Router

    app = create_app(Router.load(next((models[0] / "sft").iterdir()), device="cpu"), stub_workers_config(stub.openai_url))
    srv = ServerThread(app)
    try:
        bare = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="multi-turn coordinator"):
            ask(bare)
        plain = bare.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}])
        assert plain.model_extra["fugu_lite"]["chosen_worker"] in IDS  # one-step mode is untouched
    finally:
        srv.stop()


def test_one_step_router_refuses_a_roles_checkpoint(models):
    from fugu_pipeline.route.router import Router, RouterError

    with pytest.raises(RouterError, match="multi-turn coordinator"):
        Router.load(models[1], device="cpu")


@pytest.mark.slow
def test_fugu_lite_ask_multi_turn(models, stub, tmp_path):
    workers = tmp_path / "workers.yaml"
    workers.write_text(yaml.safe_dump(stub_workers_config(stub.openai_url).model_dump(mode="json")))
    out = subprocess.run([sys.executable, "-m", "fugu_pipeline.cli", "ask", "--mode", "multi-turn", "--workers",
                          str(workers), "--models-dir", str(models[0]), "--prompt", QUESTION, "--domain", "math",
                          "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    answer, _, rest = out.stdout.partition("\n{")
    info = json.loads("{" + rest)["fugu_lite"]
    assert answer.strip().endswith("Final answer: 42") and info["mode"] == "multi_turn"
    assert [(t["served_by"], t["role"]) for t in info["turns"]] == SCRIPT and info["committed_turn"] == 4


# --------------------------------------------------------------------------- honest replies, caps, REVISE


def test_a_revise_leads_to_a_corrected_answer_through_the_openai_sdk(client, stub):
    """The Verifier rejects 41 with its reason; the next Worker turn is handed that objection and
    answers 42; the Verifier accepts; the reply carries the corrected answer."""
    stub.set_role_reply("worker", lambda model, prompt: "6 x 7 = 42.\nFinal answer: 42" if "Latest verdict" in prompt
                        else "6 x 7 = 41.\nFinal answer: 41")
    stub.set_role_reply("verifier", lambda model, prompt: "VERDICT: REVISE: 6 x 7 is 42, not 41"
                        if "Final answer: 41" in prompt else "Checked: 42.\nVERDICT: ACCEPT")
    r = ask(client).parse()
    info = r.model_extra["fugu_lite"]
    assert [(t["role"], t["verdict"]) for t in info["turns"]] == [
        ("thinker", None), ("worker", None), ("verifier", "revise"), ("worker", None), ("verifier", "accept")]
    assert info["stop_reason"] == "accepted" and info["committed_turn"] == 4
    assert r.choices[0].message.content.endswith("Final answer: 42")


def test_one_step_fields_are_listed_back_not_silently_ignored(client, stub):
    # before: fugu_cost_weight in a multi-turn request was dropped without a word
    stub.set_role_reply("verifier", "VERDICT: ACCEPT")
    raw = ask(client, fugu_cost_weight=0.5, top_k=3)
    info = raw.parse().model_extra["fugu_lite"]
    assert any(x.startswith("fugu_cost_weight:") for x in info["ignored"])
    assert any(x.startswith("top_k:") for x in info["ignored"]) and raw.headers["x-fugu-ignored"] == "2"
    with pytest.raises(openai.BadRequestError, match="fugu_max_usd"):
        ask(client, fugu_max_usd=-1)


def test_a_session_stopped_by_its_spend_cap_is_a_429_with_the_turns_it_paid_for(client, stub):
    # the first turn (Thinker) costs at most ~$0.002 at the stub's prices: a $0.0025 cap lets it run, then stops
    with pytest.raises(openai.RateLimitError) as e:
        ask(client, fugu_max_usd=0.0025)
    body = e.value.response.json()
    assert body["error"]["code"] == "budget" and body["error"]["type"] == "insufficient_quota"
    info = body["fugu_lite"]
    assert info["stop_reason"] == "budget" and [t["role"] for t in info["turns"]] == ["thinker"]
    assert info["spend_caps"]["session_usd"] == 0.0025 and info["cost_usd"] > 0
    assert e.value.response.headers["x-fugu-turns"] == "1"


@pytest.fixture(scope="module")
def planner_only(models):
    """A coordinator that only ever plans: it never commits an answer."""
    return imitation_checkpoint(models[0] / "planner-only", IDS, [("alpha", "thinker")] * 5, PROMPTS, REPLIES)


def test_no_committed_answer_is_an_error_not_a_200_with_a_plan(models, planner_only, stub):
    # before: HTTP 200 whose content was the Thinker's plan ("Do not answer yet.")
    config = stub_workers_config(stub.openai_url, max_usd_per_serve_process=0.005)
    srv = ServerThread(create_app(Router.load(next((models[0] / "sft").iterdir()), device="cpu"), config,
                                  roles=RolesCoordinator.load(planner_only, device="cpu")))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError) as e:
            ask(c)
        assert e.value.status_code == 502
        body = e.value.response.json()
        assert body["error"]["code"] == "max_turns" and "without committing an answer" in body["error"]["message"]
        assert [t["role"] for t in body["fugu_lite"]["turns"]] == ["thinker"] * 5 and body["fugu_lite"]["cost_usd"] > 0
        # the process cap ($0.005) is spent by a few such sessions; then every multi-turn request is refused
        codes, spent = [], body["fugu_lite"]["cost_usd"]
        while len(codes) < 60 and codes[-2:] != ["budget", "budget"]:
            with pytest.raises(openai.APIStatusError) as e:
                ask(c)
            codes.append(e.value.response.json()["error"]["code"])
            spent += e.value.response.json()["fugu_lite"]["cost_usd"]
        assert codes[-2:] == ["budget", "budget"] and set(codes[:-2]) <= {"max_turns", "budget"}
        caps = e.value.response.json()["fugu_lite"]["spend_caps"]
        assert caps["process_usd"] == 0.005 and spent <= 0.005 and caps["process_spent_usd"] == pytest.approx(spent)
    finally:
        srv.stop()


@pytest.mark.slow
def test_fugu_lite_ask_without_a_committed_answer_exits_nonzero(planner_only, stub, tmp_path):
    workers = tmp_path / "workers.yaml"
    workers.write_text(yaml.safe_dump(stub_workers_config(stub.openai_url).model_dump(mode="json")))
    out = subprocess.run([sys.executable, "-m", "fugu_pipeline.cli", "ask", "--mode", "multi-turn", "--workers",
                          str(workers), "--checkpoint", str(planner_only), "--prompt", QUESTION, "--domain", "math",
                          "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "without a committed answer (max_turns)" in out.stderr
    assert out.stdout.startswith("(no committed answer)")


@pytest.mark.parametrize("what", ["models_dir", "checkpoint"])
def test_a_coordinator_alone_is_served(models, stub, tmp_path, what):
    """Before: `serve --models-dir` refused to start with only a coordinator promoted, and
    `serve --checkpoint` of a roles checkpoint looked for roles.json under it, so every multi-turn
    request got a 400. Now both start; a one-step request gets a 400 naming what is missing."""
    import shutil

    from fugu_pipeline.serve.run import providers

    if what == "models_dir":  # a models folder whose only king is a coordinator
        alone = tmp_path / "models"
        shutil.copytree(models[1], alone / "roles" / models[1].name)
        write_pointer(alone, {"checkpoint": f"roles/{models[1].name}", "content_hash": models[1].name, "method": "roles"},
                      ROLES_POINTER)
        target = alone
    else:
        target = models[1]
    provider, roles, absent = providers(target, device="cpu")
    assert provider is None and roles is not None and absent
    srv = ServerThread(create_app(provider, stub_workers_config(stub.openai_url), roles=roles, absent=absent))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        stub.set_role_reply("verifier", "Correct.\nVERDICT: ACCEPT")
        r = ask(c).parse()
        assert r.choices[0].message.content == REPLIES["worker"] and r.model_extra["fugu_lite"]["mode"] == "multi_turn"
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}])
        body = e.value.response.json()["error"]
        print("\n" + body["message"])
        assert body["code"] == "no_one_step_router" and '"fugu_mode": "multi_turn"' in body["message"]
        assert ("current.json is missing" in body["message"]) == (what == "models_dir")
        import httpx

        health = httpx.get(srv.url + "/health", timeout=30).json()
        assert health["status"] == "ok" and health["checkpoint"] is None and health["one_step_router"] == absent
    finally:
        srv.stop()


def test_every_field_of_a_multi_turn_request_given_a_wrong_type_gets_a_4xx_or_an_answer(server):
    """The one-step path's sweep (`test_serve_hostile.py`) on the multi-turn path: each request and
    message field, each wrong value; every reply an OpenAI-shaped 4xx or an answer, never a 5xx."""
    from fugu_pipeline_tests.serve_fixtures import assert_openai_error
    from fugu_pipeline_tests.test_serve_hostile import MESSAGE_FIELDS, MUTATED_FIELDS, WRONG

    fives = []
    with httpx.Client(base_url=server, timeout=60) as http:
        for where, field in [("body", f) for f in MUTATED_FIELDS if f != "fugu_mode"] + \
                            [("message", f) for f in MESSAGE_FIELDS]:
            for value in WRONG:
                body = {"model": "fugu-lite", "fugu_mode": "multi_turn", "domain": "math",
                        "messages": [{"role": "user", "content": QUESTION}]}
                (body if where == "body" else body["messages"][0])[field] = value
                r = http.post("/v1/chat/completions", json=body)
                if r.status_code >= 400 and assert_openai_error(r, r.status_code).get("code") == "max_turns":
                    continue  # the coordinator read an odd domain and committed no answer: its 502, by design
                if r.status_code >= 500:
                    fives.append((where, field, repr(value)[:20], r.status_code, r.text[:120]))
    assert not fives, fives
