"""The OpenAI-compatible server, end to end with the official `openai` SDK: a tiny trained
checkpoint behind `models/promoted/current.json`, stub LLM workers on 127.0.0.1, the real app under
uvicorn in a background thread. Nothing here reaches beyond 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import RouterError
from fugu_pipeline.serve import RouteBatcher, RouteRequest, create_app
from fugu_pipeline.testing.serving import (
    WORKERS,
    ServerThread,
    build_checkpoints,
    promote,
    refusing_url,
    stub_workers_config,
)
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, assert_openai_error, fugu

TOKEN = "fugu-test-token-123"
MAX_BODY = 64 * 1024


# --------------------------------------------------------------------------- fixtures

stub = serve_fixtures.stub
clean_stub = serve_fixtures.clean_stub


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, list[Path]]:
    models = tmp_path_factory.mktemp("models")
    return models, build_checkpoints(models)


@pytest.fixture(scope="module")
def provider(checkpoints) -> PromotedRouter:
    return PromotedRouter(checkpoints[0], device="cpu")


@pytest.fixture(scope="module")
def server(provider, stub):
    app = create_app(provider, stub_workers_config(stub.openai_url), api_token=TOKEN, max_body_bytes=MAX_BODY,
                     batch_window_ms=5)
    srv = ServerThread(app)
    yield srv.url
    srv.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=30)


# --------------------------------------------------------------------------- happy paths


def test_plain_completion_passes_parameters_and_reports_the_route(client, stub):
    stub.reset_counts()
    msgs = [{"role": "system", "content": "Be brief."}, *ask("What is 17 times 3?")]
    resp = client.chat.completions.create(model="fugu-lite", messages=msgs, temperature=0.3, max_tokens=17)
    assert resp.choices[0].message.content == "echo: What is 17 times 3?"
    info = fugu(resp)
    assert info["chosen_worker"] in WORKERS and info["served_by"] == info["chosen_worker"]
    assert resp.model == WORKERS[info["served_by"]]
    assert info["fallback_errors"] == [] and info["attempts"] == 1
    assert abs(sum(info["probabilities"].values()) - 1) < 1e-5
    assert info["ranking"][0] == info["chosen_worker"] and sorted(info["ranking"]) == sorted(WORKERS)
    assert info["cost_source"] == "configured" and info["cost_usd"] > 0
    assert info["latency_ms"] >= info["upstream_ms"] > 0 and info["overhead_ms"] >= 0
    assert resp.usage.total_tokens > 0
    sent = stub.chat_requests()[-1].body
    assert sent["model"] == WORKERS[info["served_by"]] and sent["messages"] == msgs
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 17


def test_route_headers(client, checkpoints):
    raw = client.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("Write a sort in Python."))
    resp = raw.parse()
    h = raw.headers
    assert h["x-fugu-worker"] == fugu(resp)["chosen_worker"]
    assert h["x-fugu-served-by"] == fugu(resp)["served_by"]
    assert h["x-fugu-attempts"] == "1"
    assert float(h["x-fugu-latency-ms"]) > 0 and float(h["x-fugu-cost-usd"]) > 0
    assert h["x-fugu-checkpoint"] == f"sft/{checkpoints[1][0].name}"


def test_streaming_sync(client):
    raw = client.chat.completions.with_raw_response.create(
        model="fugu-lite", messages=ask("Name three prime numbers."), stream=True,
        stream_options={"include_usage": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    chosen = raw.headers["x-fugu-worker"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: Name three prime numbers."
    first, last = fugu(chunks[0]), fugu(chunks[-1])
    assert first["chosen_worker"] == chosen == last["served_by"] and first["probabilities"]
    assert last["cost_usd"] > 0 and last["usage"]["completion_tokens"] > 0
    assert chunks[-1].usage.total_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert {c.model for c in chunks} == {WORKERS[chosen]}


def test_streaming_without_usage_works_in_the_usual_client_loop(client, stub):
    """Without include_usage OpenAI sends no chunk with empty choices; `chunk.choices[0]` in a client
    loop must hold on every chunk. The final fugu_lite rides on the chunk that ends the answer."""
    stream = client.chat.completions.create(model="fugu-lite", messages=ask("Name two colours."), stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)  # IndexError if a chunk had no choices
    assert text == "echo: Name two colours."
    assert chunks[-1].choices[0].finish_reason == "stop" and fugu(chunks[-1])["cost_usd"] > 0
    assert all(c.usage is None for c in chunks)
    # a stream the upstream cuts (no finish_reason, no [DONE]) ends in an error event, not a success
    stub.set_fault("stream_cut", prompt="cut me")
    try:
        with pytest.raises(openai.APIError, match="cut short"):
            for _ in client.chat.completions.create(model="fugu-lite", messages=ask("cut me"), stream=True):
                pass
    finally:
        stub.clear_faults()


def test_async_client_concurrent_plain_and_streamed(server):
    before = httpx.get(server + "/health").json()["batching"]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=30)

        async def plain(i):
            r = await aclient.chat.completions.create(model="fugu-lite", messages=ask(f"What is {i} squared?"))
            return r.choices[0].message.content

        async def streamed(i):
            s = await aclient.chat.completions.create(model="fugu-lite", messages=ask(f"Count to {i}."), stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

        out = await asyncio.gather(*[plain(i) for i in range(8)], *[streamed(i) for i in range(4)])
        await aclient.close()
        return out

    out = asyncio.run(main())
    assert out[:8] == [f"echo: What is {i} squared?" for i in range(8)]
    assert out[8:] == [f"echo: Count to {i}." for i in range(4)]
    stats = httpx.get(server + "/health").json()["batching"]
    # each of the 12 requests routed once, and concurrent ones shared an encoder pass
    assert stats["routed"] - before["routed"] == 12 and stats["batches"] - before["batches"] < 12


def test_models_and_health(client, server, checkpoints):
    assert {m.id for m in client.models.list()} == {"fugu-lite", *WORKERS}
    h = httpx.get(server + "/health").json()
    assert h["status"] == "ok" and h["uptime_s"] > 0
    assert h["checkpoint"]["content_hash"] == checkpoints[1][0].name
    assert "path" not in h["checkpoint"] and str(checkpoints[0]) not in json.dumps(h)  # no token: no filesystem path
    h = httpx.get(server + "/health", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert h["checkpoint"]["path"].endswith(checkpoints[1][0].name)
    assert [w["id"] for w in h["workers"]] == list(WORKERS)


def test_allowed_workers_and_cost_weight_fields(client):
    r = client.chat.completions.create(model="fugu-lite", messages=ask("Hello"),
                                       extra_body={"fugu_allowed_workers": ["beta"], "fugu_cost_weight": 0.5})
    assert fugu(r)["served_by"] == "beta" and set(fugu(r)["probabilities"]) == {"beta"}
    r = client.chat.completions.create(model="fugu-lite", messages=ask("Hello"),
                                       extra_body={"fugu_lite": {"allowed_workers": ["gamma", "alpha"], "domain": "math"}})
    assert fugu(r)["served_by"] in ("gamma", "alpha") and fugu(r)["domain"] == "math"
    assert set(fugu(r)["probabilities"]) == {"gamma", "alpha"}


# --------------------------------------------------------------------------- failures


def test_wrong_or_missing_token_is_401(server):
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model="fugu-lite", messages=ask("hi"))
    assert exc.value.status_code == 401 and exc.value.code == "invalid_api_key"
    r = httpx.post(server + "/v1/chat/completions", json={"messages": ask("hi")})  # no token at all
    assert assert_openai_error(r, 401)["code"] == "invalid_api_key"
    assert httpx.get(server + "/health").status_code == 200


def test_primary_500_falls_back_to_the_next_worker(client, stub):
    prompt = "Prove that the square root of 2 is irrational."
    primary = client.chat.completions.create(model="fugu-lite", messages=ask(prompt)).model_extra["fugu_lite"]["chosen_worker"]
    stub.set_fault("http", status=500, model=WORKERS[primary])
    raw = client.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask(prompt))
    resp, info = raw.parse(), fugu(raw.parse())
    assert info["chosen_worker"] == primary and info["served_by"] == info["ranking"][1] != primary
    assert resp.model == WORKERS[info["served_by"]] and resp.choices[0].message.content == f"echo: {prompt}"
    assert len(info["fallback_errors"]) == 1
    err = info["fallback_errors"][0]
    assert err["worker"] == primary and err["status"] == 500 and "500" in err["error"]
    assert raw.headers["x-fugu-served-by"] == info["served_by"] and raw.headers["x-fugu-attempts"] == "2"


def test_streaming_falls_back_before_the_first_byte(client, stub):
    prompt = "Tell me a short story about a fox."
    primary = fugu(client.chat.completions.create(model="fugu-lite", messages=ask(prompt)))["chosen_worker"]
    stub.set_fault("error_in_200", model=WORKERS[primary], code="server_error")
    raw = client.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask(prompt), stream=True)
    assert raw.headers["x-fugu-worker"] == primary and raw.headers["x-fugu-served-by"] != primary
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"echo: {prompt}"
    assert fugu(chunks[0])["fallback_errors"][0]["worker"] == primary


def test_all_workers_failing_is_a_502_error_object(provider, client, stub):
    with refusing_url() as nowhere:  # a port that refuses connections while the test runs
        down = create_app(provider, stub_workers_config(nowhere, connect_timeout_s=1.0))
        srv = ServerThread(down)
        try:
            dead = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as exc:
                dead.chat.completions.create(model="fugu-lite", messages=ask("Anyone there?"))
            assert exc.value.status_code == 502 and exc.value.code == "all_workers_failed"
            body = exc.value.response.json()
            assert set(body["error"]) == {"message", "type", "param", "code"}
            assert [e["worker"] for e in body["fugu_lite"]["fallback_errors"]] == body["fugu_lite"]["ranking"]
            assert httpx.get(srv.url + "/health").status_code == 200
        finally:
            srv.stop()
    stub.set_fault("http", status=503)  # every model of the stub: streamed requests fail over to nothing
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="fugu-lite", messages=ask("Anyone?"), stream=True)
    assert exc.value.status_code == 502


def test_bad_requests_get_openai_errors_and_the_server_stays_up(client, server):
    url, auth = server + "/v1/chat/completions", {"Authorization": f"Bearer {TOKEN}"}
    post = lambda content, **h: httpx.post(url, content=content, headers={**auth, "Content-Type": "application/json", **h})  # noqa: E731
    assert assert_openai_error(post(b'{"messages": [{"role": "user"'), 400)["code"] == "invalid_json"
    assert assert_openai_error(post(json.dumps({"model": "fugu-lite"})), 400)["param"] == "messages"
    assert assert_openai_error(post(json.dumps({"messages": "hi"})), 400)["param"] == "messages"
    big = json.dumps({"messages": ask("x" * (MAX_BODY + 10))})
    assert assert_openai_error(post(big), 413)["code"] == "request_too_large"
    assert assert_openai_error(post(json.dumps({"messages": ask("hi"), "temperature": 9})), 400)["param"] == "temperature"
    assert_openai_error(httpx.get(server + "/v1/nothing-here", headers=auth), 404)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="fugu-lite", messages=ask("hi"), n=2)
    assert exc.value.param == "n"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="fugu-lite", messages=ask("hi"), extra_body={"fugu_allowed_workers": ["nope"]})
    assert exc.value.code == "unknown_worker" and "nope" in exc.value.message
    assert httpx.get(server + "/health").json()["status"] == "ok"
    assert client.chat.completions.create(model="fugu-lite", messages=ask("still there?")).choices[0].message.content


def test_promotion_switches_checkpoint_without_restart(client, checkpoints):
    models, (first, second) = checkpoints
    assert first.name != second.name
    call = lambda: client.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("2+2?"))  # noqa: E731
    assert call().headers["x-fugu-checkpoint"] == f"sft/{first.name}"
    try:
        promote(models, second)
        raw = call()
        assert raw.headers["x-fugu-checkpoint"] == f"sft/{second.name}"
        assert fugu(raw.parse())["checkpoint"] == f"sft/{second.name}"  # the tag, not a server path
    finally:
        promote(models, first)
    assert call().headers["x-fugu-checkpoint"] == f"sft/{first.name}"


def test_a_broken_promotion_keeps_the_last_good_router(client, server, checkpoints):
    from fugu_pipeline.train.pointer import write_pointer

    models, (first, _) = checkpoints
    try:
        write_pointer(models, {"checkpoint": "sft/does-not-exist", "content_hash": "does-not-exist"})
        raw = client.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("still routed?"))
        assert raw.headers["x-fugu-checkpoint"] == f"sft/{first.name}"
        health = httpx.get(server + "/health").json()
        assert health["checkpoint"]["content_hash"] == first.name and "does-not-exist" not in health["reload_error"]
        assert "the last reload failed" in health["reload_error"]
        health = httpx.get(server + "/health", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert "does-not-exist" in health["reload_error"]
    finally:
        promote(models, first)
    assert httpx.get(server + "/health").json()["reload_error"] is None


def test_a_reload_to_a_router_the_worker_config_cannot_serve_keeps_the_last_good_one():
    """The check `serve` makes at start (every routed id configured or aliased) runs on every reload:
    a promoted checkpoint of other workers keeps the last good router and says why."""
    from types import SimpleNamespace

    from fugu_pipeline.serve.source import RouterSource

    good, other = SimpleNamespace(worker_ids=["a", "b"], path="good"), SimpleNamespace(worker_ids=["org/x"], path="other")
    current = {"r": good}

    def servable(router):
        if "org/x" in router.worker_ids:
            raise ValueError("routes to worker(s) ['org/x'] that the worker config does not define")

    source = RouterSource(lambda: current["r"], servable)
    assert source.get() is good and source.reload_error is None
    current["r"] = other
    assert source.get() is good and "org/x" in source.reload_error
    current["r"] = good
    assert source.get() is good and source.reload_error is None


def test_serve_refuses_a_path_that_is_no_router(tmp_path):
    from fugu_pipeline.serve import load_router_provider

    with pytest.raises(RouterError, match="neither a checkpoint directory"):
        load_router_provider(tmp_path)


# --------------------------------------------------------------------------- mock workers, config, batcher


def test_mock_workers_answer_through_the_server(provider):
    from starlette.testclient import TestClient

    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}} for w in WORKERS]})
    app = create_app(provider, cfg)
    with TestClient(app, base_url="http://127.0.0.1") as tc:  # a name the server answers (serve/hosts.py)
        r = tc.post("/v1/chat/completions", json={"model": "fugu-lite", "messages": ask("What is 6 times 7?")})
        assert r.status_code == 200, r.text
        body = r.json()
        served = body["fugu_lite"]["served_by"]
        assert body["choices"][0]["message"]["content"] == f"[{served}] I would answer: What is 6 times 7?"
        assert body["model"] == f"mock/{served}" and r.headers["x-fugu-cost-usd"]
        with tc.stream("POST", "/v1/chat/completions",
                       json={"messages": ask("Hi there"), "stream": True}) as s:
            events = [json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert text.endswith("I would answer: Hi there") and events[-1]["fugu_lite"]["cost_source"] == "mock"


def test_create_app_refuses_a_router_with_unconfigured_workers(provider, stub):
    cfg = stub_workers_config(stub.openai_url)
    cfg = cfg.model_copy(update={"workers": cfg.workers[:2]})
    with pytest.raises(ValueError, match="gamma"):
        create_app(provider, cfg)


def test_batcher_collects_concurrent_requests_into_batches():
    calls: list[list[str]] = []

    def fn(reqs):
        calls.append([r.text for r in reqs])
        return [RouterError("bad") if r.text == "bad" else r.text.upper() for r in reqs]

    async def main(window_ms, max_batch, texts):
        b = RouteBatcher(fn, window_ms=window_ms, max_batch=max_batch)
        out = await asyncio.gather(*[b.route(RouteRequest(t)) for t in texts], return_exceptions=True)
        return out, b.stats()

    texts = [f"t{i}" for i in range(10)]
    out, stats = asyncio.run(main(50, 32, texts))
    assert out == [t.upper() for t in texts] and calls == [texts] and stats["largest_batch"] == 10
    calls.clear()
    out, stats = asyncio.run(main(50, 4, texts + ["bad"]))
    assert [len(c) for c in calls] == [4, 4, 3] and stats["batches"] == 3
    assert isinstance(out[-1], RouterError) and out[:10] == [t.upper() for t in texts]
    calls.clear()
    asyncio.run(main(0, 1, texts[:3]))
    assert calls == [["t0"], ["t1"], ["t2"]]


def _upstream_app():
    """An upstream that streams slowly, or breaks after its first chunks when asked to."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        head = {"id": "up-1", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            return JSONResponse({**head, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]})

        async def events():
            yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': {'content': 'partial '}}]})}\n\n"
            if prompt == "break":
                yield f"data: {json.dumps({'error': {'code': 'server_error', 'message': 'upstream died'}})}\n\n"
                return
            for i in range(50):
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({**head, 'choices': [{'index': 0, 'delta': {'content': f'{i} '}}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_mid_stream_failure_and_abandoned_streams(provider):
    upstream = ServerThread(_upstream_app())
    cfg = stub_workers_config(upstream.url + "/v1")
    for w in cfg.workers:
        w.max_concurrency = 1  # a leaked slot would make the last request below hang
    srv = ServerThread(create_app(provider, cfg))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        got = []
        with pytest.raises(openai.APIError, match="mid-stream"):
            for chunk in c.chat.completions.create(model="fugu-lite", messages=ask("break"), stream=True):
                got.extend(ch.delta.content or "" for ch in chunk.choices)
        assert "".join(got) == "partial "
        for _ in range(3):  # leave long streams early, on whichever worker they were routed to
            with c.chat.completions.create(model="fugu-lite", messages=ask("go on"), stream=True) as s:
                next(iter(s))
        for wid in WORKERS:
            r = c.chat.completions.create(model="fugu-lite", messages=ask("go on"),
                                          extra_body={"fugu_allowed_workers": [wid]})
            assert r.choices[0].message.content == "whole"
    finally:
        srv.stop()
        upstream.stop()
