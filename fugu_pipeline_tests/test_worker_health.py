"""Worker cooldowns (`workers/health.py`). A worker whose key was refused was kept out for a while,
but one that kept failing with 429, 5xx, timeouts or connection errors was tried first again on
every request, and every request waited for its failure before falling back. Now repeated
transient failures (or a `Retry-After`) start a cooldown that grows, capped, shown in the reply's
routing details, its headers, `/health` and `Workers.health()`.

The clock is injected: no test waits for a cooldown to run out."""

from __future__ import annotations

import email.utils
import time

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import WORKERS, ServerThread, refusing_url, stub_workers_config
from fugu_pipeline.workers.config import CooldownConfig
from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError
from fugu_pipeline.workers.health import WorkerHealth
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, fugu

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub
PROMPT = "What is 2 times 3?"


class Clock:
    """Monotonic and wall time that move only when a test moves them."""

    def __init__(self):
        self.t, self.w = 1000.0, 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.w

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.w += seconds


def _health(**policy) -> tuple[WorkerHealth, Clock]:
    clock = Clock()
    return WorkerHealth(CooldownConfig(**policy), auth_cooldown_s=60, clock=clock, wall=clock.wall), clock


def _503() -> WorkerCallError:
    return WorkerCallError("HTTP 503: overloaded (gave up after 1 attempts)", status=503, transient=True)


# --------------------------------------------------------------------------- the rules


def test_three_transient_failures_in_a_row_start_a_cooldown_that_doubles_up_to_its_cap():
    h, clock = _health(after_failures=3, first_s=10, max_s=35)
    for _ in range(2):
        h.failed("w", _503())
    assert h.blocked("w") is None and h.state("w")["consecutive_failures"] == 2
    h.failed("w", WorkerCallError("timeout", transient=True))  # a timeout: no status, transient
    s = h.state("w")
    assert s["state"] == "cooling_down" and s["seconds_left"] == 10 and s["consecutive_failures"] == 3
    assert s["until"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.w + 10)) and "3 transient" in s["reason"]
    assert "kept out for 10 s more" in str(h.blocked("w"))
    clock.advance(10.5)
    assert h.blocked("w") is None and h.state("w")["state"] == "ok"  # over: the next call is a probe
    for expected in (20, 35, 35):  # the probe fails: doubled, then capped at max_s
        h.failed("w", _503())
        assert h.state("w")["seconds_left"] == expected
        clock.advance(expected + 0.5)
    assert h.state("w")["cooldowns"] == 4


def test_a_success_ends_a_cooldown_and_failures_of_the_request_do_not_count():
    h, _ = _health(after_failures=2, first_s=10)
    h.failed("w", _503())
    h.succeeded("w")
    h.failed("w", _503())
    assert h.blocked("w") is None  # not two in a row
    for status in (400, 404, None):  # the request's fault, or an answer cut at max_tokens: not the worker's health
        h.failed("w", WorkerCallError("bad request", status=status))
    assert h.state("w")["consecutive_failures"] == 1 and h.blocked("w") is None
    h.failed("w", _503())
    assert h.blocked("w") is not None
    h.succeeded("w")  # a call already in flight came back fine
    assert h.blocked("w") is None and h.state("w") == {**h.state("w"), "state": "ok", "consecutive_failures": 0}


def test_retry_after_keeps_a_worker_out_from_the_first_failure_capped():
    h, _ = _health(after_failures=3, first_s=10, max_s=600)
    h.failed("a", WorkerCallError("HTTP 429", status=429, transient=True, retry_after=42.0))
    h.failed("b", WorkerCallError("HTTP 429", status=429, transient=True, retry_after=86_400.0))
    assert h.state("a")["seconds_left"] == 42 and "Retry-After" in h.state("a")["reason"]
    assert h.state("b")["seconds_left"] == 600  # a day is capped at max_s


def test_a_refused_key_is_kept_out_for_the_auth_cooldown_and_zero_turns_it_off():
    h, _ = _health()
    h.failed("w", FatalWorkerError("HTTP 401 unauthorized", status=401))
    assert h.state("w")["state"] == "kept_out" and h.state("w")["seconds_left"] == 60 and h.blocked("w").status == 401
    off = WorkerHealth(CooldownConfig(), auth_cooldown_s=0)
    off.failed("w", FatalWorkerError("HTTP 401 unauthorized", status=401))
    assert off.blocked("w") is None


# --------------------------------------------------------------------------- served


def _serve(models, config):
    """(server, clock, client, the app's `Workers`) for `config`, with the clock injected."""
    app = create_app(PromotedRouter(models, device="cpu"), config)
    clock = Clock()
    workers = app.state.fugu.workers
    workers.tracker.clock, workers.tracker.wall = clock, clock.wall
    srv = ServerThread(app)
    return srv, clock, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30), workers


def test_a_worker_that_keeps_answering_503_is_skipped_then_probed_again(models, stub):
    srv, clock, c, workers = _serve(models, stub_workers_config(stub.openai_url))
    try:
        primary = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(PROMPT)))["chosen_worker"]
        model = WORKERS[primary]
        stub.set_fault("http", status=503, model=model)
        stub.reset_counts()

        def calls() -> int:
            return sum(n for (m, _), n in stub.calls.items() if m == model)

        for k in range(3):  # each request calls it, waits for its 503, falls back
            info = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(PROMPT)))
            assert calls() == k + 1 and info["served_by"] != primary
        assert info["worker_health"][primary]["state"] == "cooling_down"
        for stream in (False, True):  # now it is not called at all
            r = c.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask(PROMPT), stream=stream)
            info = fugu(list(r.parse())[0] if stream else r.parse())
            assert calls() == 3, stream
            assert info["fallback_errors"][0]["worker"] == primary and info["fallback_errors"][0]["attempts"] == 0
            assert "kept out for 10 s more" in info["fallback_errors"][0]["error"]
            assert info["worker_health"][primary]["consecutive_failures"] == 3 and r.headers["x-fugu-kept-out"] == primary
        snap = workers.health()
        assert set(snap) == set(WORKERS) and snap[primary]["state"] == "cooling_down" and snap[primary]["status"] == 503
        assert all(snap[w]["state"] == "ok" for w in WORKERS if w != primary)
        entry = next(w for w in httpx.get(srv.url + "/health").json()["workers"] if w["id"] == primary)
        assert entry["health"]["state"] == "cooling_down" and entry["kept_out"]["seconds_left"] == 10

        clock.advance(10.5)  # the cooldown is over: one probe, which fails, and the next cooldown is longer
        c.chat.completions.create(model="fugu-lite", messages=ask(PROMPT))
        assert calls() == 4 and workers.health()[primary]["seconds_left"] == 20
        stub.clear_faults()
        clock.advance(20.5)
        again = fugu(c.chat.completions.create(model="fugu-lite", messages=ask(PROMPT)))
        assert again["served_by"] == primary and calls() == 5 and "worker_health" not in again
        assert workers.health()[primary] == {**workers.health()[primary], "state": "ok", "consecutive_failures": 0}
    finally:
        srv.stop()


def test_timeouts_and_connection_errors_count_and_retry_after_dates_are_honoured(models, stub):
    with refusing_url() as dead:  # a port that refuses connections while the test runs
        config = stub_workers_config(stub.openai_url, read_timeout_s=0.3, cooldown={"max_s": 7200})
        config = config.model_copy(update={"workers": [w.model_copy(update={"base_url": dead}) if w.id == "gamma" else w
                                                       for w in config.workers]})
        srv, clock, c, workers = _serve(models, config)
        try:
            stub.set_fault("timeout", model=WORKERS["alpha"], sleep_s=2.0)
            in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
            stub.set_fault("http", status=429, model=WORKERS["beta"], retry_after=in_an_hour)
            for _ in range(3):
                with pytest.raises(openai.APIStatusError) as exc:  # every worker fails: a 502
                    c.chat.completions.create(model="fugu-lite", messages=ask(PROMPT))
                assert exc.value.status_code == 502
            snap = workers.health()
            assert snap["alpha"]["state"] == "cooling_down" and snap["alpha"]["consecutive_failures"] == 3
            assert snap["gamma"]["state"] == "cooling_down" and "connection error" in snap["gamma"]["reason"]
            assert snap["beta"]["consecutive_failures"] == 1  # out after its first 429: it said when to come back
            assert 3000 < snap["beta"]["seconds_left"] <= 3600 and "Retry-After" in snap["beta"]["reason"]
        finally:
            srv.stop()
