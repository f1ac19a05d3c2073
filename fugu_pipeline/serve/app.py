"""One OpenAI-compatible endpoint in front of the workers: route, call, fall back, report.

    app = create_app(load_promoted("models"), "configs/workers.yaml", api_token="s3cret")
    serve("models", "configs/workers.yaml", host="127.0.0.1", port=8080)  # runs uvicorn

Endpoints
- `POST /v1/chat/completions`, plain or streamed (`stream: true`, SSE `chat.completion.chunk`s
  ending with `data: [DONE]`). `model` is not used to pick a worker (send "fugu-lite"); the
  reply's `model` is the model that actually answered.
- `GET /v1/models`: "fugu-lite" (the router) and every configured worker.
- `GET /health` (no token needed): checkpoint tag and hash, workers, uptime, batching figures; the
  checkpoint's path and the text of a load or reload error only with the token (when one is set).
- `GET /metrics` (the token, when one is set): Prometheus' text format (`metrics.py`).

Routing. The text of the LAST USER MESSAGE is routed (what is being asked now decides who
answers; a shared system prompt or long history would make every route look alike). Extra body
fields, all optional, at the top level or inside a `fugu_lite` object (top level wins):
`fugu_allowed_workers` / `fugu_lite.allowed_workers` (worker ids; an unknown id is a 400),
`fugu_cost_weight` / `fugu_lite.cost_weight` (float >= 0; used by quality heads),
`domain` / `fugu_lite.domain` (hint fed to the encoder's prompt template and prompt rules; default
"general"), `fugu_budget` / `fugu_lite.budget` (a cost cap, `cost_cap.py`: `{"share": 0.3}` of the
strongest worker's cost or `{"usd_per_1k": 2.5}`, optionally `"margin_z"`, or the same as the string
`"share=0.3"`: λ comes from the checkpoint's
budget calibration, chosen on validation; the expected cost counts every message's text, which
is what the worker is billed for). A server-wide default cap (`default_budget`, `fugu-lite serve
--cap`) applies to requests that send neither `fugu_budget` nor
`fugu_cost_weight`.
Concurrent requests are routed together in one encoder pass (`batching.py`). The router is a
`Router` (a fixed checkpoint) or a `PromotedRouter` (follows `models/promoted/current.json`, so a
promotion takes effect without a restart; if a newly promoted checkpoint fails to load, the last
good one keeps serving and `/health` shows the error).

Calling and fallback. The client's messages and sampling fields (temperature, top_p, max_tokens,
max_completion_tokens, stop, presence/frequency_penalty, seed, logit_bias, user,
response_format, reasoning_effort) and tool calling (tools, tool_choice, parallel_tool_calls, tool
messages: `tool_calls.py`, served one-step by workers with `supports_tools`, cascade and multi-turn
checkpoints included) go to the worker; a worker's configured `system_prompt` is prepended when the
client sent no system message. A worker the request does not suit (tools, its context window) is
skipped (`fugu_lite.skipped`; none suiting: a 400), and `max_tokens` is lowered to its limit.
A plain request calls the worker without streaming; a streamed one relays the worker's stream. Each worker gets `worker_attempts` attempts
(default 1: falling back is quicker than backing off); on failure the next worker in the route's
ranking is tried, and every failure is listed in `fugu_lite.fallback_errors`. A streamed reply
starts only after the worker's first chunk has arrived, so failures before the first byte fall
back too; an error after that ends the stream with an OpenAI-style `data: {"error": ...}` event.
All workers failing gives a 502. Per-worker `max_concurrency` and `requests_per_minute` hold
here too (requests over them wait).

Clients that leave, and shutdown (`lifecycle.py`). A client that leaves before its reply is ready
cancels the worker call, one that leaves mid-stream closes the worker's stream (`/health`:
`disconnected`). Once shutdown begins (`Service.begin_shutdown`, from `run.py`) new requests get a
503 `server_shutting_down`; replies in flight get a grace period, then end with that error.

Guards. A `Host` header naming another host than the server's gets a 400 `host_not_allowed`
before any route runs (DNS rebinding; `hosts.py`, `--allowed-host`). A body over `max_body_bytes`
or holding more than `max_json_values` JSON values gets a 413, one that is not strict JSON or
holds a field of the wrong type a 400 (`json_body.py`, `protocol.py`); a body over
`json_body.INLINE_BYTES` is parsed on a thread, so none delays the serving loop. A worker whose
key is refused (401, 402, 403) is kept out for `auth_cooldown_s`, one that keeps failing for a
cooldown that grows (`workers/health.py`): not called, listed in `fallback_errors`, shown in
`fugu_lite.worker_health` and `/health`. More than `limits.max_in_flight` requests at once
get a 503 `server_busy` with `Retry-After` (`connections.py`, which also holds the socket-level
limits `fugu-lite serve` applies). Every worker failure, on every path, is a fallback or a 502,
never a 500: a worker client that raises something else than `WorkerCallError` has it turned
into one (`metrics.MeteredWorkers`).

Reporting. `fugu_lite` in the reply (streamed: in the first chunk, and complete with cost, usage
and latency in the chunk that ends the answer, or in the usage chunk when include_usage asks for one) holds the route's
`scores` with their `score_kind` (and `probabilities` for a policy head), ranking, chosen and serving worker, worker calls made, fallback errors, cost, timings, and `ignored`: the request
fields that had no effect, each with the reason (`fugu_cost_weight` sent to a head without a cost
term, `domain` with a prompt template that has no `{domain}`, a `model` other than "fugu-lite",
fields that are not passed to workers). The headers `x-fugu-worker` (chosen), `x-fugu-served-by`,
`x-fugu-attempts` (worker calls made), `x-fugu-latency-ms`, `x-fugu-cost-usd` (when known: not for
streams) and `x-fugu-checkpoint` (`<method>/<content hash>`) carry the same.
`fugu_lite.policy` (and `/health`'s `checkpoint.policy`) is the description `fugu-lite train` wrote
beside the checkpoint and printed (`route/shipped.py`): which policy it chose, how it routes with no
cap asked, and the out-of-fold figures it was chosen on.

Timings (`route_ms`, `queue_ms`, `upstream_ms`, `latency_ms`, `overhead_ms`, in milliseconds):
see `upstream.py`, whose worker loop measures them.

Empty answers, one rule: a reply with no text (blank content) is a failed call, plain or streamed,
and the next worker is tried. A stream is committed to the client only when the worker's first
non-blank content has arrived, so a stream that ends empty falls back like a plain reply.

Thin over the core: this module routes and calls workers; it never trains or grades, and never
imports dagster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import logging
import time
import uuid
from pathlib import Path
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fugu_pipeline.route.budget import Budget
from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import POLICY_PROBABILITY, BudgetUnavailable, RouteDecision, Router, RouterError
from fugu_pipeline.serve import cascade as serve_cascade, multi_turn
from fugu_pipeline.serve.info import health, list_models, retrieve_model
from fugu_pipeline.serve.connections import ConnectionLimits, GateMiddleware, RequestGate
from fugu_pipeline.serve.lifecycle import ClientGone, ShuttingDown, shutting_down, unless_abandoned
from fugu_pipeline.serve.metrics import MeteredWorkers, MetricsMiddleware, ServeMetrics
from fugu_pipeline.serve.batching import RouteBatcher, RouteRequest, route_grouped
from fugu_pipeline.serve.hosts import HostGuard, HostPolicy
from fugu_pipeline.serve.json_body import DEFAULT_MAX_JSON_VALUES, INLINE_BYTES
from fugu_pipeline.serve.protocol import (
    APIError,
    ChatRequest,
    RouterUnavailable,
    api_error_handler,
    http_error_handler,
    parse_chat_request,
    read_body,
    require_json,
    server_error_handler,
    unservable,
)
from fugu_pipeline.serve.relay import finish_timing, ms, reply_headers, reply_message, routing_limits, stream_response
from fugu_pipeline.serve.source import RouterSource, checkpoint_tag, load_router_provider  # noqa: F401 (its API too)
from fugu_pipeline.serve.upstream import (
    DEFAULT_AUTH_COOLDOWN_S,
    CallTiming,
    RelayedStream,
    WorkerKeptOut,
    WorkerSkipped,
    usage_of,
)
from fugu_pipeline.workers.config import WorkerConfigError, WorkersConfig, load_workers_config
from fugu_pipeline.workers.contract import Completion, WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")

DEFAULT_MAX_BODY_BYTES = 2 << 20
DEFAULT_BATCH_WINDOW_MS = 3.0
DEFAULT_MAX_BATCH = 32
PARSE_THREADS = 2  # request bodies over json_body.INLINE_BYTES are parsed here, off the serving loop


# --------------------------------------------------------------------------- the service


class Service:
    def __init__(self, source: RouterSource, workers: MeteredWorkers, *, api_token: str | None, max_body_bytes: int,
                 batch_window_ms: float, max_batch: int, default_budget: Budget | None = None,
                 max_json_values: int = DEFAULT_MAX_JSON_VALUES, default_point: bool = True):
        self.source, self.workers = source, workers
        self.metrics: ServeMetrics = workers.metrics  # `MeteredWorkers`: /metrics (serve/metrics.py)
        # a router trained on imported data routes by the data's ids: the worker listing one as an alias answers it
        self.served_id = {a: w.id for w in workers.config.workers for a in (*w.aliases, w.id)}
        self.default_budget = default_budget
        self.default_point = default_point  # no cap asked: the checkpoint's default operating point (route/default_point.py)
        self.api_token = api_token or None
        self.max_body_bytes, self.max_json_values = max_body_bytes, max_json_values
        self.parser = concurrent.futures.ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="fugu-parse")
        self.batcher = RouteBatcher(self._route_batch, window_ms=batch_window_ms, max_batch=max_batch)
        self.started, self.started_wall = time.monotonic(), time.time()
        self.counts = {"requests": 0, "served": 0, "fallbacks": 0, "all_workers_failed": 0, "disconnected": 0}
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once the app has started
        self.stopping = False  # shutdown has begun: new requests get a 503
        self.grace_s: float | None = None  # set when shutdown begins
        self.grace_over = asyncio.Event()  # replies still running are ended now
        self.relays: set[RelayedStream] = set()  # streams being relayed
        self.faults_logged: set[str] = set()  # server-side faults already in the log

    def begin_shutdown(self, grace_s: float) -> None:
        """The server is stopping (`run.py` calls this when uvicorn's graceful shutdown begins; any
        thread). New requests get a 503 `server_shutting_down`; replies in flight get `grace_s`
        seconds to finish, then end with that error (a stream: an error event before `[DONE]`) and
        their worker calls are closed."""
        self.stopping = True
        if self.loop is not None:  # None: the app never started, so nothing is in flight
            self.loop.call_soon_threadsafe(self._begin_shutdown, grace_s)

    def _begin_shutdown(self, grace_s: float) -> None:  # serving loop
        if self.grace_s is not None:  # a second signal
            return
        self.grace_s = grace_s
        self.loop.call_later(grace_s, self._end_replies)

    def _end_replies(self) -> None:  # serving loop
        self.grace_over.set()
        for relay in list(self.relays):
            relay.interrupt(ShuttingDown(self.shutdown_message()))

    def shutdown_message(self) -> str:
        if self.grace_over.is_set():
            return (f"the server is shutting down and this reply did not finish within its {self.grace_s:g} s grace "
                    "period; send the request again")
        return "the server is shutting down; send the request again (to another instance)"

    def _route_batch(self, requests: list[RouteRequest]) -> list[RouteDecision | Exception]:
        """Runs in a worker thread: one router (so one checkpoint) for the whole batch."""
        with self.source.lock:
            try:
                router = self.source.get()
            except Exception as exc:  # the reason names server paths: it goes to the log (and /health, with the token)
                log.error("no router could be loaded: %s: %s", type(exc).__name__, exc)
                raise RouterUnavailable("no router could be loaded (the server's log says why)") from exc
            out = route_grouped(router, [self._routed_ids(r, router) for r in requests])
        tag = checkpoint_tag(router)
        no_cost_term = not hasattr(router.checkpoint.head, "route_scores")
        template = router.encoder.settings.prompt_template
        uses_domains = getattr(router.checkpoint.head, "uses_domains", False)  # kNN, prior, MLP, ensemble
        for r, d in zip(requests, out):
            if isinstance(d, RouteDecision):
                d.router = d.router or router  # its reply settles this router's cap, even after a reload
                d.extra.setdefault("checkpoint_tag", tag)  # a cap sent to another checkpoint of the run names it
                if getattr(router, "shipped", None) is not None:  # what train chose and printed (route/shipped.py)
                    d.extra["policy"] = router.shipped.public()
                ignored = d.extra.setdefault("ignored", [])
                if r.cost_weight is not None and no_cost_term:
                    ignored.append(f"fugu_cost_weight: head kind {router.checkpoint.manifest.head_kind!r} has no cost "
                                   "term (only 'quality' heads trade predicted quality against cost); the route does "
                                   "not use it")
                if r.domain is not None and "{domain}" not in template and not uses_domains:
                    ignored.append(f"domain: this checkpoint's prompt template {template!r} does not use {{domain}}; "
                                   "the route does not depend on it")
        return out

    def _routed_ids(self, r: RouteRequest, router: Router) -> RouteRequest:
        """`fugu_allowed_workers` may name a configured worker whose alias the router routes by."""
        if r.allowed is None:
            return r
        config = self.workers.config
        return dataclasses.replace(r, allowed=tuple(config.routed_id(w, router.worker_ids) for w in r.allowed))

    def said(self, exc: RouterError) -> str:
        """What a client is told of a refusal: its public message (no server paths); the server log
        gets the whole of a server-side fault once."""
        if exc.server_fault and str(exc) not in self.faults_logged and len(self.faults_logged) < 100:
            self.faults_logged.add(str(exc))
            log.error("%s", exc)
        return exc.public or str(exc)

    async def parse(self, raw: bytes) -> ChatRequest:
        """The request, parsed and validated outside the serving loop (`json_body.py`): a body of a
        million small values then delays no other request. A small body is parsed in place."""
        if len(raw) <= INLINE_BYTES:
            return parse_chat_request(raw, self.max_json_values)
        return await asyncio.get_running_loop().run_in_executor(self.parser, parse_chat_request, raw,
                                                                self.max_json_values)

    def check_auth(self, request: Request) -> None:
        if self.api_token is None:
            return
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), self.api_token.encode()):
            raise APIError(401, "invalid or missing bearer token: send 'Authorization: Bearer <token>' with the "
                           "token this server was started with (FUGU_SERVE_TOKEN)", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def route(self, req: ChatRequest) -> RouteDecision:
        if self.source.absent:  # a coordinator alone is served: a one-step request is told what is missing
            raise APIError(400, self.source.absent, code="no_one_step_router")
        budget = req.budget or (self.default_budget if req.cost_weight is None else None)
        try:
            return await self.batcher.route(RouteRequest(req.text, req.domain, req.allowed, req.cost_weight, budget,
                                                         req.billed_text if budget is not None else None,
                                                         self.default_point))
        except BudgetUnavailable as exc:  # the client's message names the checkpoint by tag, never by path
            said = self.said(exc)
            if req.budget is None:  # the server's own default cap (a checkpoint reloaded since start cannot honour it)
                raise APIError(503, f"this server's default budget cannot be honoured: {said}", type="server_error",
                               code="budget_unavailable") from None
            raise APIError(500 if exc.server_fault else 400, said, param=None if exc.server_fault else "fugu_budget",
                           type="server_error" if exc.server_fault else "invalid_request_error",
                           code="budget_unavailable") from None
        except RouterError as exc:
            if exc.server_fault:  # the checkpoint's fault, not the request's
                raise APIError(500, self.said(exc), type="server_error", code=exc.code or "checkpoint_fault") from None
            raise APIError(400, str(exc), param=exc.param, code=exc.code or "invalid_request") from None
        except RouterUnavailable as exc:
            raise APIError(503, str(exc), type="server_error", code="router_unavailable") from None


def _route_info(d: RouteDecision) -> dict:
    scores = {w: round(v, 6) for w, v in d.scores.items()}  # `probabilities` only where they are a policy's
    info = {"chosen_worker": d.worker_id, "scores": scores, "score_kind": d.score_kind,
            **({"probabilities": scores} if d.score_kind == POLICY_PROBABILITY else {}),
            "ranking": d.ranking, "checkpoint": d.extra.get("checkpoint_tag"), "checkpoint_tag": d.extra.get("checkpoint_tag")}
    if "budget" in d.extra:
        info["budget"] = d.extra["budget"]
    if "domain_note" in d.extra:
        info["domain_note"] = d.extra["domain_note"]
    if "policy" in d.extra:
        info["policy"] = d.extra["policy"]
    return info


async def chat_completions(request: Request) -> Response:
    t0 = time.perf_counter()
    svc: Service = request.app.state.fugu
    if svc.stopping:
        raise shutting_down(svc)
    svc.check_auth(request)
    require_json(request)
    try:
        raw = await read_body(request, svc.max_body_bytes)
    except ClientDisconnect:  # an ordinary event, not a server error
        log.info("client disconnected while sending its request")
        return Response(status_code=499)
    req = await svc.parse(raw)
    svc.counts["requests"] += 1
    try:
        return await unless_abandoned(request, svc, _chat_completion(request, svc, req, t0))
    except ClientGone:
        svc.counts["disconnected"] += 1
        log.info("client disconnected before its reply was ready; the worker call was cancelled")
        return Response(status_code=499)  # nobody reads it: uvicorn drops it


async def _chat_completion(request: Request, svc: Service, req: ChatRequest, t0: float) -> Response:
    state = request.scope.setdefault("state", {})  # the kind the metrics count this request under
    if req.mode == "multi_turn":  # the coordinator delegates over several turns
        state["fugu_kind"] = "multi_turn"
        return await multi_turn.chat_completion(svc, request.app.state.fugu_roles, req, t0)
    state["fugu_kind"] = "one_step"
    decision = await svc.route(req)
    t_routed = time.perf_counter()
    if "cascade" in decision.extra and not req.uses_tools:  # a cascade checkpoint: its steps, then the accepted
        state["fugu_kind"] = "cascade"  # answer (serve/cascade.py)
        return await serve_cascade.chat_completion(svc, req, decision, t0, t_routed)

    errors: list[dict] = []
    skipped: list[dict] = []  # workers that cannot take this request (tools, context window): not called
    calls, timing, served, result, admitted = 0, CallTiming(), None, None, None
    for routed in decision.ranking:
        wid = svc.served_id.get(routed, routed)  # a router's id, or the alias a configured worker answers to
        if wid not in svc.workers.clients:
            errors.append({"worker": wid, "error": "not in this server's worker config", "status": None})
            continue
        try:
            admitted = svc.workers.admit(wid, req.messages, req.params, req.prompt_tokens)
        except WorkerSkipped as skip:
            skipped.append({"worker": wid, "code": skip.code, "reason": str(skip)})
            continue
        except WorkerKeptOut as kept:  # in a cooldown (a refused key, or failing lately): not called
            errors.append({"worker": wid, "error": str(kept), "status": kept.status, "attempts": 0})
            svc.metrics.call_failed(wid, kept)
            continue
        calls += 1
        try:
            call = svc.workers.open_stream if req.stream else svc.workers.complete
            result = await call(wid, req.messages, admitted.params, timing, req.prompt_tokens)
        except WorkerCallError as exc:  # any failure (`MeteredWorkers` turns a client's bug into one too)
            errors.append({"worker": wid, "error": str(exc), "status": exc.status, "attempts": exc.attempts})
            log.warning("worker %s failed, falling back: %s", wid, exc)
            continue
        served = wid
        break

    info = {**_route_info(decision), "served_by": served, "domain": req.domain or "general", "attempts": calls,
            "fallback_errors": errors, "ignored": req.ignored + decision.extra.get("ignored", []), "route_ms": ms(t_routed - t0),
            "queue_ms": ms(timing.queue_s), "upstream_ms": ms(timing.upstream_s), "skipped": skipped}
    routing_limits(info, req, svc, served, admitted)
    if served is None and skipped and not calls and all(e["status"] is None and "attempts" not in e for e in errors):
        finish_timing(info, t0, timing)  # no worker could take it, none was kept out: the request's fault
        raise unservable(req, skipped, info, reply_headers(info))
    if served is None:
        svc.counts["all_workers_failed"] += 1
        finish_timing(info, t0, timing)
        detail = "; ".join(f"{e['worker']}: {e['error']}" for e in errors)
        raise APIError(502, f"all {len(decision.ranking)} workers failed: {detail}", type="upstream_error",
                       code="all_workers_failed", extra={"fugu_lite": info}, headers=reply_headers(info))
    svc.counts["served"] += 1
    svc.counts["fallbacks"] += bool(errors)
    router = decision.router or svc.source.get()  # the router that made it (`_route_batch`)

    def settle(cost_usd: float, source: str) -> None:  # a route under a cap: its follower learns the reply's cost
        try:  # the reply is paid for and on its way: a fault here must not lose it
            router.record_spend(decision, None if source == "none" else cost_usd)  # "none": no usage, no price
        except Exception:
            log.exception("the reply's cost could not be counted in its cap's spend; the reply is served")

    if req.stream:
        return stream_response(svc, req, served, result, info, t0, on_cost=settle)

    comp: Completion = result
    info["served_model"] = comp.served_model or comp.requested_model
    info["cost_usd"], info["cost_source"] = comp.cost_usd, comp.cost_source
    settle(comp.cost_usd, comp.cost_source)
    finish_timing(info, t0, timing)
    body = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
        "model": info["served_model"],
        "choices": [{"index": 0, "message": reply_message(comp), "finish_reason": comp.finish_reason or "stop",
                     "logprobs": None}],
        "usage": usage_of(comp), "fugu_lite": info,
    }
    return JSONResponse(body, headers=reply_headers(info))


# --------------------------------------------------------------------------- factory and runner


def create_app(
    router_provider: Router | PromotedRouter | Callable[[], Router] | None,
    workers_config: WorkersConfig | str | Path,
    *,
    api_token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    max_batch: int = DEFAULT_MAX_BATCH,
    worker_attempts: int | None = 1,
    default_budget: Budget | None = None,
    default_point: bool = True,
    roles=None,
    absent: str | None = None,
    max_json_values: int = DEFAULT_MAX_JSON_VALUES,
    bind_host: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] | list[str] = (),
    auth_cooldown_s: float = DEFAULT_AUTH_COOLDOWN_S,
    catalog=None,
    limits: ConnectionLimits | None = None,
) -> Starlette:
    """The Starlette app. `api_token` None or "" means no auth; `worker_attempts` None keeps the
    worker config's `max_attempts`. Refuses a router whose workers the config does not define.
    `roles`: the multi-turn coordinator for `"fugu_mode": "multi_turn"` requests (a
    `policies.coordinator.route.RolesCoordinator` or `PromotedRoles`; None: such requests get a 400).
    `max_json_values`: the request body's limit (`json_body.py`); `bind_host` and `allowed_hosts`:
    the `Host` names answered (`hosts.py`); `auth_cooldown_s`: how long a worker whose key was
    refused is kept out (`upstream.py`); `catalog`: a `workers.catalog.CatalogSnapshot` whose context
    lengths and output limits apply to openrouter workers that set none (`workers/limits.py`);
    `limits`: its `max_in_flight` caps the requests being answered at once (`connections.py`; the
    socket-level limits are `fugu-lite serve`'s).
    `router_provider` None: `roles` alone is served; one-step requests get a 400 saying `absent`."""
    config = workers_config if isinstance(workers_config, WorkersConfig) else load_workers_config(workers_config)
    where = "" if isinstance(workers_config, WorkersConfig) else f"{workers_config}: "

    def servable(router: Router) -> None:  # at start, and on every reload of the promoted pointer
        problem = config.missing_routes(router.path, router.worker_ids)
        if problem:  # a ValueError, said in one line by the command
            raise WorkerConfigError(f"{where}{problem}")

    if router_provider is None and roles is None:
        raise RouterError("nothing to serve: neither a one-step router nor a multi-turn coordinator")
    source = RouterSource(router_provider, servable, absent=absent)
    router = source.get() if router_provider is not None else None
    if router is not None and default_budget is not None:
        router.budget_point(default_budget)  # refuse at start a default cap this checkpoint cannot honour
    limits = limits or ConnectionLimits()
    metrics = ServeMetrics()
    workers = MeteredWorkers(config, worker_attempts, auth_cooldown_s, catalog, metrics=metrics)
    metrics.gate = gate = RequestGate(limits)
    metrics.spend = lambda: getattr(source.last, "spend_states", list)()  # none before the first route
    svc = Service(source, workers, api_token=api_token,
                  max_body_bytes=max_body_bytes, batch_window_ms=batch_window_ms, max_batch=max_batch,
                  default_budget=default_budget, max_json_values=max_json_values, default_point=default_point)

    hosts = HostPolicy(bind_host, allowed_hosts)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        svc.loop = asyncio.get_running_loop()
        await svc.workers.start()
        try:
            yield
        finally:
            gate.log.flush()  # the drops and refusals not yet said (connections.DropLog)
            await svc.workers.close()
            svc.batcher.close()
            svc.parser.shutdown(wait=False, cancel_futures=True)

    app = Starlette(
        routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/models", list_models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
                Route("/metrics", metrics.endpoint, methods=["GET"])],
        exception_handlers={APIError: api_error_handler, HTTPException: http_error_handler, Exception: server_error_handler},
        lifespan=lifespan, middleware=[Middleware(MetricsMiddleware, metrics=metrics), Middleware(GateMiddleware, gate=gate),
                                       Middleware(HostGuard, policy=hosts)],
    )
    app.state.fugu = svc
    app.state.fugu_metrics = metrics
    app.state.fugu_limits = limits
    app.state.fugu_hosts = hosts
    app.state.fugu_roles = roles
    return app
