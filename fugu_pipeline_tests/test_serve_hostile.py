"""Hostile and crafted requests against the real server (uvicorn on 127.0.0.1, stub workers on
127.0.0.1, the official `openai` client where a client can send the request at all). Every bad
request gets an OpenAI-shaped 4xx, fails alone, and the server stays up."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import RouteDecision
from fugu_pipeline.serve import RouteRequest, create_app
from fugu_pipeline.serve.batching import route_grouped
from fugu_pipeline.testing.serving import WORKERS, ServerThread, build_checkpoints, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.replies import DETAIL_CHARS
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import BAD_BODIES, ask, assert_openai_error, fugu

TOKEN = "hostile-test-token"
MAX_BODY = 4 << 20  # room for a 2 MB prompt


stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub


@pytest.fixture(scope="module")
def server(models, stub):
    app = create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url), api_token=TOKEN,
                     max_body_bytes=MAX_BODY, batch_window_ms=30)
    srv = ServerThread(app)
    yield srv.url
    srv.stop()


def post(url: str, content: bytes | str, content_type: str | None = "application/json") -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return httpx.post(url + "/v1/chat/completions", content=content, headers=headers, timeout=30)


def assert_still_serving(url: str) -> None:
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
    c = openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=30)
    assert c.chat.completions.create(model="fugu-lite", messages=ask("still there?")).choices[0].message.content


# --------------------------------------------------------------------------- item 9: one bad request fails alone


def test_a_lone_surrogate_fails_alone_with_a_400_among_20_innocent_requests(server):
    """20 innocent requests (the openai client) and 1 carrying a lone surrogate, all at once, so
    they share routing batches. The openai client refuses to encode a lone surrogate, so the
    hostile one goes as the raw JSON any other client (curl, JavaScript's JSON.stringify) sends."""
    before = httpx.get(server + "/health").json()["batching"]

    async def main():
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
        async with httpx.AsyncClient(timeout=60) as http:
            async def innocent(i):
                r = await client.chat.completions.with_raw_response.create(
                    model="fugu-lite", messages=ask(f"What is {i} times {i + 1}?"))
                return r.status_code, r.parse().choices[0].message.content

            async def hostile():
                raw = b'{"model": "fugu-lite", "messages": [{"role": "user", "content": "What is \\ud800 times 2?"}]}'
                return await http.post(server + "/v1/chat/completions", content=raw,
                                       headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})

            return await asyncio.gather(*[innocent(i) for i in range(10)], hostile(),
                                        *[innocent(i) for i in range(10, 20)])

    out = asyncio.run(main())
    bad = out[10]
    good = out[:10] + out[11:]
    assert [s for s, _ in good] == [200] * 20
    assert [text for _, text in good] == [f"echo: What is {i} times {i + 1}?" for i in range(20)]
    err = assert_openai_error(bad, 400)
    assert err["code"] == "invalid_unicode" and err["param"] == "messages[0].content" and "surrogate" in err["message"]
    after = httpx.get(server + "/health").json()["batching"]
    assert after["routed"] - before["routed"] == 20 and after["largest_batch"] > 1  # they were batched
    assert_still_serving(server)


class _PoisonRouter:
    """A router whose batch call crashes when one poisoned prompt is in it (as the tokenizer did
    on a lone surrogate before prompts were sanitised)."""

    worker_ids = ["alpha", "beta"]

    def __init__(self):
        self.calls = 0

    def route_batch(self, prompts, domains, allowed=None, cost_weight=None):
        self.calls += 1
        if any("poison" in p for p in prompts):
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "surrogates not allowed")
        return [RouteDecision("alpha", {"alpha": 0.6, "beta": 0.4}, ["alpha", "beta"]) for _ in prompts]


def test_a_crash_inside_a_routing_batch_reaches_only_the_request_that_caused_it():
    router = _PoisonRouter()
    reqs = [RouteRequest(f"prompt {i}") for i in range(5)] + [RouteRequest("poison")]
    reqs += [RouteRequest(f"prompt {i}", cost_weight=0.5) for i in range(3)]
    out = route_grouped(router, reqs)
    assert [type(d).__name__ for d in out] == ["RouteDecision"] * 5 + ["UnicodeEncodeError"] + ["RouteDecision"] * 3
    assert router.calls == 1 + 6 + 1  # the poisoned group once, then each of its requests alone


def test_the_encoder_takes_a_lone_surrogate_without_crashing(models):
    router = PromotedRouter(models, device="cpu").refresh()
    d = router.route_batch(["What is \ud800 times 2?", "What is 3 times 4?"], ["math", "math"])
    same = router.route_batch(["What is \ufffd times 2?"], ["math"])[0]
    assert d[0].probabilities == pytest.approx(same.probabilities)


# --------------------------------------------------------------------------- item 14: 400 instead of 500


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_parseable_bad_input_gets_a_400_not_a_500(server, name):
    body = BAD_BODIES[name]
    r = post(server, body if isinstance(body, bytes) else body.encode())
    err = assert_openai_error(r, 400)
    assert err["type"] == "invalid_request_error"
    assert httpx.get(server + "/health", timeout=10).status_code == 200


def test_crafted_input_leaves_the_server_serving(server):
    for body in BAD_BODIES.values():
        post(server, body if isinstance(body, bytes) else body.encode())
    assert_openai_error(post(server, json.dumps({"messages": ask("x" * (MAX_BODY + 1))})), 413)
    assert_still_serving(server)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/json; charset=latin-1",
                                          "text/json"])
def test_a_body_not_sent_as_json_is_refused_with_415(server, content_type):
    r = post(server, json.dumps({"messages": ask("hi")}), content_type=content_type)
    assert assert_openai_error(r, 415)["code"] == "unsupported_media_type"


def test_json_with_a_utf8_charset_is_accepted(server):
    r = post(server, json.dumps({"messages": ask("hi")}), content_type="Application/JSON; charset=UTF-8")
    assert r.status_code == 200, r.text


def test_a_tokenless_server_refuses_a_browser_form_post(models, stub):
    """A page on any site can post a form to http://127.0.0.1:8080 without asking; with no token
    configured, the Content-Type check is what stops it from spending the worker budget."""
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url)))
    try:
        stub.reset_counts()
        form = httpx.post(srv.url + "/v1/chat/completions", data={"messages": "hi"}, timeout=10)
        plain = httpx.post(srv.url + "/v1/chat/completions", content=json.dumps({"messages": ask("hi")}),
                           headers={"Content-Type": "text/plain"}, timeout=10)
        assert form.status_code == plain.status_code == 415
        assert stub.chat_requests() == []
    finally:
        srv.stop()


# --------------------------------------------------------------------------- item 14: ignored fields, empty answers


def test_cost_weight_sent_to_a_head_without_a_cost_term_is_reported_as_ignored(server):
    c = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=30)
    r = c.chat.completions.create(model="fugu-lite", messages=ask("hi"), extra_body={"fugu_cost_weight": 2.0})
    assert fugu(r)["ignored"] == ["fugu_cost_weight: head kind 'layernorm_linear' has no cost term (only 'quality' "
                                  "heads trade predicted quality against cost); the route does not use it"]
    assert fugu(c.chat.completions.create(model="fugu-lite", messages=ask("hi")))["ignored"] == []


def test_fields_that_do_nothing_are_listed_as_ignored(server, stub):
    """A client pointed at fugu-lite with its old settings learns which of them took no effect."""
    c = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=30)
    stub.reset_counts()
    r = c.chat.completions.create(model="gpt-4o", messages=ask("hi"), logprobs=True, temperature=0.2,
                                  extra_body={"domain": "math", "store": True})
    assert fugu(r)["ignored"] == [
        "model: 'gpt-4o' does not pick the worker; the router does (send \"fugu-lite\")",
        "logprobs: not supported by fugu-lite; not sent to the worker",
        "store: not supported by fugu-lite; not sent to the worker",
        "domain: this checkpoint's prompt template '{prompt}' does not use {domain}; the route does not depend on it",
    ]
    sent = stub.chat_requests()[-1].body
    assert sent["temperature"] == 0.2 and "logprobs" not in sent and "store" not in sent


def test_cost_weight_sent_to_a_quality_head_is_used(tmp_path, stub):
    build_checkpoints(tmp_path, seeds=(0,), head="quality")
    srv = ServerThread(create_app(PromotedRouter(tmp_path, device="cpu"), stub_workers_config(stub.openai_url)))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        free = fugu(c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?"),
                                              extra_body={"fugu_cost_weight": 0.0}))
        dear = fugu(c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?"),
                                              extra_body={"fugu_cost_weight": 1000.0}))
        assert free["ignored"] == dear["ignored"] == []
        assert c.models.retrieve("fugu-lite").id == "fugu-lite"  # GET /v1/models/{id}
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("no-such-model")
        assert dear["chosen_worker"] == "alpha"  # the cheapest worker once cost dominates
        assert free["scores"] != dear["scores"] and free["score_kind"] == "predicted_quality_minus_cost"
    finally:
        srv.stop()


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_an_empty_answer_falls_back_the_same_way_plain_or_streamed(server, stub, finish):
    """One rule: a reply with no text is a failed call, and the next worker answers, whether the
    request streams or not (a stream is committed only once the worker's first content arrives)."""
    c = openai.OpenAI(base_url=server + "/v1", api_key=TOKEN, max_retries=0, timeout=30)
    prompt = "Name a colour."
    primary = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(prompt)))["chosen_worker"]
    stub.set_fault("empty_answer", model=WORKERS[primary], finish_reason=finish)
    plain = c.chat.completions.create(model="fugu-lite", messages=ask(prompt))
    chunks = list(c.chat.completions.create(model="fugu-lite", messages=ask(prompt), stream=True))
    streamed_text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    for info in (fugu(plain), fugu(chunks[0])):
        assert info["chosen_worker"] == primary and info["served_by"] != primary
        assert info["fallback_errors"][0]["worker"] == primary and "empty answer" in info["fallback_errors"][0]["error"]
    assert plain.choices[0].message.content == streamed_text == f"echo: {prompt}"


# --------------------------------------------------------------------------- item 14: timings


def test_waiting_for_a_worker_slot_is_queue_time_not_worker_time(models, stub):
    stub.set_latency(0.2)
    cfg = stub_workers_config(stub.openai_url)
    for w in cfg.workers:
        w.max_concurrency = 1
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), cfg))
    try:
        async def main():
            c = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
            return await asyncio.gather(*[c.chat.completions.create(
                model="fugu-lite", messages=ask(f"q{i}"), extra_body={"fugu_allowed_workers": ["alpha"]})
                for i in range(3)])

        infos = sorted((fugu(r) for r in asyncio.run(main())), key=lambda i: i["queue_ms"])
    finally:
        srv.stop()
    for k, info in enumerate(infos):  # one at a time through the single slot: 0, 1 and 2 calls to wait for
        # the last waited >= 360 ms: counted as worker time, its overhead_ms would fall below its queue_ms
        assert info["upstream_ms"] >= 190, info
        assert info["queue_ms"] >= 180 * k, info
        assert info["overhead_ms"] >= info["queue_ms"] and info["latency_ms"] >= info["upstream_ms"] + info["queue_ms"]


def test_a_busy_serving_loop_is_booked_as_overhead_not_as_worker_time(models, stub):
    """Block the serving loop for 0.6 s while a worker call (0.15 s) is in flight: the call's time
    is measured on the worker loop, so upstream_ms stays near 0.15 s and the wait shows as overhead."""
    app = create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url))

    async def with_blocker(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/block":
            time.sleep(0.6)  # a CPU-bound stretch on the serving loop, as under load
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    srv = ServerThread(with_blocker)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        c.chat.completions.create(model="fugu-lite", messages=ask("warm up"))
        stub.set_latency(0.15)

        async def main():
            ac = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
            async with httpx.AsyncClient() as http:  # made first: building a client takes a while on a loaded machine
                call = asyncio.create_task(ac.chat.completions.create(model="fugu-lite", messages=ask("timed")))
                for _ in range(500):  # until the call is with the worker (a fixed sleep raced a loaded machine)
                    if stub.in_flight:
                        break
                    await asyncio.sleep(0.005)
                assert stub.in_flight, "the timed call never reached the worker"
                await http.get(srv.url + "/block", timeout=10)
            return await call

        info = fugu(asyncio.run(main()))
    finally:
        srv.stop()
    assert info["upstream_ms"] >= 140, info
    assert info["latency_ms"] >= 550 and info["overhead_ms"] >= 300, info  # the blocked 0.6 s is not worker time


# --------------------------------------------------------------------------- item 13: the key in 502 bodies and logs


def test_a_quoted_key_never_reaches_the_502_body_or_the_server_log(models, caplog, monkeypatch):
    key = "loc" + secrets.token_hex(20)  # built at run time; a shape no pattern knows
    monkeypatch.setenv("FUGU_TEST_SERVE_KEY", key)
    with StubLLMServer(require_key=key) as s:
        cfg = stub_workers_config(s.openai_url)
        for w in cfg.workers:
            w.api_key_env = "FUGU_TEST_SERVE_KEY"
        for i, model in enumerate(WORKERS.values()):  # every worker quotes the key across the cut
            s.set_fault("http", status=[400, 500, 401][i], model=model, echo_key_at=DETAIL_CHARS - 10 - 15 * i)
        srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), cfg))
        try:
            with caplog.at_level(logging.INFO):
                c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
                with pytest.raises(openai.APIStatusError) as exc:
                    c.chat.completions.create(model="fugu-lite", messages=ask("hello"))
                with pytest.raises(openai.APIStatusError):
                    c.chat.completions.create(model="fugu-lite", messages=ask("hello"), stream=True)
        finally:
            srv.stop()
        assert all(f.hits for f in s.faults)
    assert exc.value.status_code == 502
    texts = [exc.value.response.text, caplog.text]
    secret = key[3:]
    pieces = {secret[i:i + 8] for i in range(len(secret) - 7)}
    assert "[redacted]" in texts[0]
    assert not [p for p in pieces if any(p in t for t in texts)]


def test_a_wide_body_with_long_keys_is_checked_in_one_pass(server, monkeypatch):
    """Paths are spelled out only for an error: 15,000 values (under the value limit) under a 1 MB
    key cost one pass, not 15,000 copies of the key."""
    from fugu_pipeline.serve import json_body

    spelled, path_of = [], json_body._path
    monkeypatch.setattr(json_body, "_path", lambda where: spelled.append(where) or path_of(where))
    body = {"messages": ask("hi"), "x": {"k" * 1_000_000: list(range(15_000))}}
    r = post(server, json.dumps(body))
    assert r.status_code == 200, r.text
    assert spelled == []
    bad = {"messages": ask("hi"), "x": {"k" * 1_000_000: [0, "\ud800"]}}
    err = assert_openai_error(post(server, json.dumps(bad)), 400)
    assert err["param"] == "x." + "k" * 37 + "...[1]" and len(spelled) == 1


# --------------------------------------------------------------------------- every field, every wrong type

MUTATED_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
                  "stream_options", "stop", "tools", "tool_choice", "parallel_tool_calls", "response_format", "seed",
                  "logprobs", "top_logprobs", "logit_bias", "user", "domain", "fugu_budget", "fugu_cost_weight",
                  "fugu_allowed_workers", "fugu_max_usd", "fugu_mode")
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
WRONG = (None, True, -1, 1.5, 1e300, 2**70, "", "x" * 5000, [], [None], {}, {"type": None}, [[[]]])


def test_every_field_of_a_request_given_a_wrong_type_gets_a_4xx_or_an_answer_never_a_5xx(server):
    # found this way: tool_calls on a user message (a number, true) was a TypeError and a 500
    fives = []
    with httpx.Client(base_url=server, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        for where, field in [("body", f) for f in MUTATED_FIELDS] + [("message", f) for f in MESSAGE_FIELDS]:
            for value in WRONG:
                body = {"model": "fugu-lite", "messages": [{"role": "user", "content": "what is 2+2?"}]}
                (body if where == "body" else body["messages"][0])[field] = value
                r = client.post("/v1/chat/completions", json=body)
                if r.status_code >= 500:
                    fives.append((where, field, repr(value)[:20], r.status_code, r.text[:120]))
                elif r.status_code >= 400:
                    assert_openai_error(r, r.status_code)
    assert not fives, fives
    assert_still_serving(server)
