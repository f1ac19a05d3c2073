"""`GET /metrics` (`serve/metrics.py`): traffic through the official `openai` client first, then a
scrape parsed with prometheus-client's own parser; every counter moved by exactly what the traffic
should have moved it. Stub LLM workers on 127.0.0.1."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import WORKERS, ServerThread, stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub

TOKEN = "metrics-token"
CHAT = "/v1/chat/completions"


@pytest.fixture
def server(models, stub):
    app = create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url), api_token=TOKEN,
                     batch_window_ms=1)
    srv = ServerThread(app)
    srv.app = app
    yield srv
    srv.stop()


def scrape(url: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one scrape, `_created` samples left out."""
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(r.text)
            for s in f.samples if not s.name.endswith("_created")}


def value(figures: dict, name: str, **labels) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


def test_a_scrape_counts_exactly_the_traffic_that_came_before_it(server, stub):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
    before = scrape(server.url)
    replies = [client.chat.completions.create(model="fugu-lite", messages=ask(f"What is {k} times 3?"),
                                              extra_body={"domain": "math"}) for k in range(3)]
    streamed = list(client.chat.completions.create(model="fugu-lite", messages=ask("Stream it"), stream=True,
                                                   stream_options={"include_usage": True}))
    first = replies[0].model_extra["fugu_lite"]["served_by"]
    stub.set_fault("http", status=503, model=WORKERS[first], times=1)  # one fallback
    fell = client.chat.completions.create(model="fugu-lite", messages=ask("What is 0 times 3?"), extra_body={"domain": "math"})
    for wid in WORKERS.values():  # every worker fails: a 502
        stub.set_fault("http", status=429, model=wid)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="fugu-lite", messages=ask("no one answers"))
    stub.clear_faults()
    with pytest.raises(openai.AuthenticationError):  # no token: a 401 before anything is parsed
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    after = scrape(server.url)

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert failed.value.status_code == 502
    assert moved("fugu_requests_total", path=CHAT, kind="one_step", status="200") == 5
    assert moved("fugu_requests_total", path=CHAT, kind="one_step", status="502") == 1
    assert moved("fugu_requests_total", path="/v1/models", kind="none", status="401") == 1
    assert moved("fugu_requests_total", path="/metrics", kind="none", status="200") == 1  # the first scrape
    assert moved("fugu_request_duration_seconds_count", path=CHAT, kind="one_step") == 6
    assert value(after, "fugu_requests_in_flight") == 0  # /metrics itself is not counted

    answered = [r.model_extra["fugu_lite"] for r in replies + [fell]]
    end = [c.model_extra["fugu_lite"] for c in streamed if c.model_extra and c.model_extra.get("fugu_lite")][-1]
    for wid in WORKERS:
        mine = [i for i in answered + [end] if i["served_by"] == wid]
        assert moved("fugu_worker_calls_total", worker=wid, result="ok") == len(mine)
        assert moved("fugu_cost_usd_total", worker=wid) == pytest.approx(sum(i["cost_usd"] for i in mine))
        usage = [r.usage for r in replies + [fell] if r.model_extra["fugu_lite"]["served_by"] == wid]
        usage += [streamed[-1].usage] if end["served_by"] == wid else []
        assert moved("fugu_tokens_total", worker=wid, direction="in") == sum(u.prompt_tokens for u in usage)
        assert moved("fugu_tokens_total", worker=wid, direction="out") == sum(u.completion_tokens for u in usage)
        assert moved("fugu_worker_errors_total", worker=wid, kind="http_429") == 1
        assert moved("fugu_worker_errors_total", worker=wid, kind="http_503") == (wid == first)
        assert moved("fugu_worker_calls_total", worker=wid, result="error") == 1 + (wid == first)
        assert value(after, "fugu_worker_kept_out", worker=wid) == 0


def test_a_worker_whose_key_is_refused_shows_as_kept_out(server, stub):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
    first = client.chat.completions.create(model="fugu-lite", messages=ask("hi")).model_extra["fugu_lite"]["served_by"]
    stub.set_fault("http", status=402, model=WORKERS[first])
    assert client.chat.completions.create(model="fugu-lite", messages=ask("hi")).model_extra["fugu_lite"]["served_by"] != first
    assert client.chat.completions.create(model="fugu-lite", messages=ask("hi again")).choices[0].message.content
    figures = scrape(server.url)
    assert value(figures, "fugu_worker_kept_out", worker=first) == 1
    assert 0 < value(figures, "fugu_worker_kept_out_seconds", worker=first) <= 60
    assert value(figures, "fugu_worker_errors_total", worker=first, kind="http_402") == 1
    assert value(figures, "fugu_worker_errors_total", worker=first, kind="kept_out") == 1  # the next request skipped it
    assert sum(value(figures, "fugu_worker_kept_out", worker=w) for w in WORKERS) == 1


def test_metrics_need_the_token_and_each_app_counts_its_own(server, models, stub):
    assert httpx.get(server.url + "/metrics").status_code == 401
    other = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url),
                                    api_token=TOKEN, batch_window_ms=1))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
        client.chat.completions.create(model="fugu-lite", messages=ask("only here"))
        assert value(scrape(server.url), "fugu_requests_total", path=CHAT, kind="one_step", status="200") == 1
        assert value(scrape(other.url), "fugu_requests_total", path=CHAT, kind="one_step", status="200") == 0
    finally:
        other.stop()


def test_a_bug_in_a_worker_client_is_a_fallback_counted_as_other(server, stub):
    """A worker client raising something else than a WorkerCallError (a bug) fails that call only:
    plain and streamed requests fall back, the traceback goes to the log, /metrics counts it."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
    first = client.chat.completions.create(model="fugu-lite", messages=ask("hi")).model_extra["fugu_lite"]["served_by"]

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    worker_client = server.app.state.fugu.workers.clients[first]
    worker_client.complete = worker_client.open_stream = broken
    plain = client.chat.completions.create(model="fugu-lite", messages=ask("hi"))
    chunks = list(client.chat.completions.create(model="fugu-lite", messages=ask("hi"), stream=True))
    end = [c.model_extra["fugu_lite"] for c in chunks if c.model_extra and c.model_extra.get("fugu_lite")][-1]
    for info in (plain.model_extra["fugu_lite"], end):
        assert info["served_by"] != first and info["fallback_errors"][0]["worker"] == first
        assert "internal error in the client of worker" in info["fallback_errors"][0]["error"]
    assert value(scrape(server.url), "fugu_worker_errors_total", worker=first, kind="other") == 2
