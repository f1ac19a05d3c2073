"""`GET /metrics`: the server's figures in Prometheus' text format (prometheus-client).

Each app has its own `CollectorRegistry`, so several servers in one process (tests, benchmarks)
keep their own counts. `/metrics` needs the server's bearer token when one is set, like every
endpoint but `/health`: the figures name the workers, their errors and what they cost.

    fugu_requests_total{path, kind, status}           requests answered (kind: one_step, cascade, multi_turn, none)
    fugu_request_duration_seconds{path, kind}         receipt to the last byte of the reply (a stream: its end)
    fugu_requests_in_flight                           requests being answered now (/health and /metrics not counted)
    fugu_requests_refused_total{reason}               503s at a limit (in_flight)
    fugu_worker_calls_total{worker, result}           worker calls (ok, error); a stream counts when it ends
    fugu_worker_errors_total{worker, kind}            failed calls by kind (`error_kind`)
    fugu_cost_usd_total{worker}                       what the answered calls cost
    fugu_tokens_total{worker, direction}              tokens in (prompt) and out (completion)
    fugu_worker_kept_out{worker}                      1 while a worker is kept out (its key refused), else 0
    fugu_worker_kept_out_seconds{worker}              seconds of that left
    fugu_cascade_stops_total{step}                    where cascades stopped (1, 2, ..., fallback, best_early, failed)
    fugu_connections_open                             open client connections (`fugu-lite serve` only)
    fugu_connections_closed_total{reason}             closed by the server: idle (keep-alive expired), header_timeout,
                                                      body_timeout, evicted (cap, oldest idle first), over_capacity

Worker calls are counted where every path makes them (`MeteredWorkers`, the server's `Workers`):
one-step, cascade steps and multi-turn turns alike.
"""

from __future__ import annotations

import logging
import re
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response

from fugu_pipeline.serve.lifecycle import ShuttingDown
from fugu_pipeline.serve.upstream import Workers, WorkerKeptOut
from fugu_pipeline.workers.contract import Completion, WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PATHS = ("/v1/chat/completions", "/v1/models", "/health", "/metrics")

# (kind, pattern over a WorkerCallError's message), first match wins; then the HTTP status; else "other"
_KINDS = [
    ("error_in_200", re.compile(r"inside an HTTP 200 reply|^code \d+:")),
    ("stream_cut", re.compile(r"after the stream had started|stream broke|cut short")),
    ("timeout", re.compile(r"Timeout|^deadline:")),
    ("connect", re.compile(r"ConnectError|connection error: Connect")),
    ("cut", re.compile(r"RemoteProtocolError|ReadError|peer closed")),
    ("malformed", re.compile(r"malformed|not a JSON object|not an object|no choices|no chunks|cannot be decoded|not a list")),
    ("empty_answer", re.compile(r"^empty answer")),
]


def error_kind(exc: BaseException) -> str:
    """The label a failed worker call is counted under: kept_out, error_in_200, stream_cut, timeout,
    connect, cut (the connection closed mid-reply), malformed, empty_answer, http_<status>, other."""
    if isinstance(exc, WorkerKeptOut):
        return "kept_out"
    msg = str(exc)
    for kind, pattern in _KINDS:
        if pattern.search(msg):
            return kind
    status = getattr(exc, "status", None)
    return f"http_{status}" if status else "other"


class ServeMetrics:
    """The app's metrics, on a registry of its own."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("fugu_requests_total", "requests answered", ["path", "kind", "status"], registry=r)
        self.latency = Histogram("fugu_request_duration_seconds", "receipt to the reply's last byte", ["path", "kind"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.worker_calls = Counter("fugu_worker_calls_total", "worker calls", ["worker", "result"], registry=r)
        self.worker_errors = Counter("fugu_worker_errors_total", "failed worker calls by kind", ["worker", "kind"], registry=r)
        self.cost = Counter("fugu_cost_usd_total", "USD the answered worker calls cost", ["worker"], registry=r)
        self.tokens = Counter("fugu_tokens_total", "tokens in (prompt) and out (completion)", ["worker", "direction"],
                              registry=r)
        self.cascade_stops = Counter("fugu_cascade_stops_total", "where cascades stopped", ["step"], registry=r)
        self.cascade_over_deadline = Counter("fugu_cascade_read_over_deadline_total",
                                             "cascade requests whose replies were not read within the read deadline",
                                             registry=r)
        self.gate = None  # connections.RequestGate, set by the app
        self.guard = None  # connections.ConnectionGuard, set by `fugu-lite serve`
        self.workers: Workers | None = None
        self.spend = None  # () -> the current router's `spend_states()`, set by the app
        r.register(_LiveFigures(self))

    # ------------------------------------------------------------------ worker calls

    def call_ok(self, wid: str, cost_usd: float, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self.worker_calls.labels(wid, "ok").inc()
        if cost_usd:
            self.cost.labels(wid).inc(cost_usd)
        if prompt_tokens:
            self.tokens.labels(wid, "in").inc(prompt_tokens)
        if completion_tokens:
            self.tokens.labels(wid, "out").inc(completion_tokens)

    def call_failed(self, wid: str, exc: BaseException) -> None:
        """A failed call of `wid`; a worker kept out (not called) counts as an error of kind `kept_out` only."""
        if not isinstance(exc, WorkerKeptOut):
            self.worker_calls.labels(wid, "error").inc()
        self.worker_errors.labels(wid, error_kind(exc)).inc()

    def cascade_stopped(self, run) -> None:
        """Where a cascade run stopped: its step number, `fallback` (one call at a time after the
        last step failed), `best_early` (the later steps failed) or `failed`."""
        stopped = run.stopped or ""
        m = re.match(r"step (\d+):", stopped)
        step = m.group(1) if m else "fallback" if "fell back" in stopped else "best_early" if run.answer else "failed"
        self.cascade_stops.labels(step).inc()

    # ------------------------------------------------------------------ the endpoint

    async def endpoint(self, request: Request) -> Response:
        request.app.state.fugu.check_auth(request)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _LiveFigures:
    """Figures read when scraped: requests in flight, connections, refusals, and each worker's kept-out state."""

    def __init__(self, metrics: ServeMetrics):
        self.m = metrics

    def describe(self):
        return []

    def collect(self):
        m = self.m
        if m.gate is not None:
            yield GaugeMetricFamily("fugu_requests_in_flight", "requests being answered now", value=m.gate.in_flight)
            refused = CounterMetricFamily("fugu_requests_refused", "requests refused with a 503 at a limit", labels=["reason"])
            for reason in sorted({"in_flight", *m.gate.refused}):
                refused.add_metric([reason], m.gate.refused[reason])
            yield refused
        if m.guard is not None:
            yield GaugeMetricFamily("fugu_connections_open", "open client connections", value=len(m.guard.open))
            yield GaugeMetricFamily("fugu_connections_cap", "the open-connection cap", value=m.guard.cap)
            closed = CounterMetricFamily("fugu_connections_closed", "client connections the server closed",
                                         labels=["reason"])
            for reason in sorted({"idle", "header_timeout", "body_timeout", "evicted", "over_capacity", *m.guard.closed}):
                closed.add_metric([reason], m.guard.closed[reason])
            yield closed
        if m.spend is not None:  # each cap's running spend (route/follow.py, policies/cascade/spend.py)
            labels = ["checkpoint", "cap_usd", "group"]
            count = GaugeMetricFamily("fugu_cap_requests", "requests counted under a cost cap since the router loaded",
                                      labels=labels)
            mean = GaugeMetricFamily("fugu_cap_running_mean_usd", "their mean cost per request, USD", labels=labels)
            part = GaugeMetricFamily("fugu_cap_part_usd", "a group's part of a shared cap now, USD per request",
                                     labels=labels)
            mix = GaugeMetricFamily("fugu_cap_mix_share", "a group's share of a shared cap's recent requests "
                                    "(its parts are shared over it)", labels=labels)
            for row in m.spend():
                key = [row["checkpoint"], f"{row['cap_usd']:.6g}", row["group"]]
                count.add_metric(key, row["requests"])
                mean.add_metric(key, row["running_mean_usd"])
                if "part_usd" in row:
                    part.add_metric(key, row["part_usd"])
                for group, share in (row.get("mix") or {}).items():
                    mix.add_metric([row["checkpoint"], f"{row['cap_usd']:.6g}", str(group)], share)
            yield from (count, mean, part, mix)
        if m.workers is not None:
            flag = GaugeMetricFamily("fugu_worker_kept_out", "1 while the worker is kept out (its key refused)",
                                     labels=["worker"])
            left = GaugeMetricFamily("fugu_worker_kept_out_seconds", "seconds the worker stays kept out",
                                     labels=["worker"])
            for wid in m.workers.specs:
                info = m.workers.kept_out_info(wid, detail=False)
                flag.add_metric([wid], 0.0 if info is None else 1.0)
                left.add_metric([wid], 0.0 if info is None else info["seconds_left"])
            yield flag
            yield left


class MetricsMiddleware:
    """ASGI middleware counting every request by path, kind and status, and timing it to its last byte."""

    def __init__(self, app, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), 500

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope["path"]
            path = path if path in PATHS else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
            kind = (scope.get("state") or {}).get("fugu_kind", "none")
            self.metrics.requests.labels(path, kind, str(status)).inc()
            self.metrics.latency.labels(path, kind).observe(time.perf_counter() - t0)


class MeteredWorkers(Workers):
    """The server's `Workers`, with every call counted (`ServeMetrics`), and any exception a
    worker's client raises that is not a `WorkerCallError` (a bug) turned into one, with its
    traceback logged: every path then falls back, as it does for any failed call."""

    def __init__(self, *args, metrics: ServeMetrics, **kwargs):
        super().__init__(*args, **kwargs)
        self.metrics = metrics
        metrics.workers = self

    async def complete(self, wid: str, *args, **kwargs) -> Completion:
        try:
            comp = await super().complete(wid, *args, **kwargs)
        except Exception as exc:
            raise self._failed(wid, exc) from None
        self.metrics.call_ok(wid, comp.cost_usd, comp.prompt_tokens, comp.completion_tokens)
        return comp

    async def open_stream(self, wid: str, *args, **kwargs):
        try:
            stream = await super().open_stream(wid, *args, **kwargs)
        except Exception as exc:
            raise self._failed(wid, exc) from None
        return MeteredStream(stream, self, wid)

    def _failed(self, wid: str, exc: Exception) -> WorkerCallError:
        if not isinstance(exc, WorkerCallError):
            log.error("worker %s: its client raised %s; counted as a failed call", wid, type(exc).__name__,
                      exc_info=exc)
            exc = WorkerCallError(f"internal error in the client of worker {wid}: {type(exc).__name__}")
        self.metrics.call_failed(wid, exc)
        return exc


class MeteredStream:
    """A relayed stream (`upstream.RelayedStream`) whose end is counted: its cost and tokens, or
    the error that cut it (a client's bug becomes a `WorkerCallError`, so the relay ends the
    stream with an error event). Everything else is the inner stream's."""

    def __init__(self, inner, workers: MeteredWorkers, wid: str):
        self._inner, self._workers, self._wid = inner, workers, wid

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def __aiter__(self):
        try:
            async for chunk in self._inner:
                yield chunk
        except (WorkerCallError, ShuttingDown) as exc:
            if isinstance(exc, WorkerCallError):
                self._workers.metrics.call_failed(self._wid, exc)
            raise
        except Exception as exc:  # a bug in the stream's client: the relay ends the stream with an error event
            raise self._workers._failed(self._wid, exc) from None
        usage = self._inner.usage if isinstance(self._inner.usage, dict) else {}
        self._workers.metrics.call_ok(self._wid, self._inner.cost()[0], _int(usage.get("prompt_tokens")),
                                      _int(usage.get("completion_tokens")))


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
