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

Routing. The text of the LAST USER MESSAGE is routed (what is being asked now decides who
answers; a shared system prompt or long history would make every route look alike). Extra body
fields, all optional, at the top level or inside a `fugu_lite` object (top level wins):
`fugu_allowed_workers` / `fugu_lite.allowed_workers` (worker ids; an unknown id is a 400),
`fugu_cost_weight` / `fugu_lite.cost_weight` (float >= 0; used by quality heads),
`domain` / `fugu_lite.domain` (hint fed to the encoder's prompt template and prompt rules; default
"general"), `fugu_budget` / `fugu_lite.budget` (a cost cap, `{"share": 0.3}` of the strongest
worker's cost or `{"usd_per_1k": 2.5}`, optionally `"margin_z"`: λ comes from the checkpoint's
budget calibration, chosen on validation; the expected cost counts every message's text, which
is what the worker is billed for). A server-wide default cap (`default_budget`, `fugu-lite serve
--budget-share/--budget-usd-per-1k`) applies to requests that send neither `fugu_budget` nor
`fugu_cost_weight`.
Concurrent requests are routed together in one encoder pass (`batching.py`). The router is a
`Router` (a fixed checkpoint) or a `PromotedRouter` (follows `models/promoted/current.json`, so a
promotion takes effect without a restart; if a newly promoted checkpoint fails to load, the last
good one keeps serving and `/health` shows the error).

Calling and fallback. The client's messages and sampling fields (temperature, top_p, max_tokens,
max_completion_tokens, stop, presence/frequency_penalty, seed, logit_bias, user,
response_format, reasoning_effort) go to the worker; a worker's configured `system_prompt` is
prepended when the client sent no system message. A plain request calls the worker without
streaming; a streamed one relays the worker's stream. Each worker gets `worker_attempts` attempts
(default 1: falling back is quicker than backing off); on failure the next worker in the route's
ranking is tried, and every failure is listed in `fugu_lite.fallback_errors`. A streamed reply
starts only after the worker's first chunk has arrived, so failures before the first byte fall
back too; an error after that ends the stream with an OpenAI-style `data: {"error": ...}` event.
All workers failing gives a 502. Per-worker `max_concurrency` and `requests_per_minute` hold
here too (requests over them wait).

Clients that leave, and shutdown. uvicorn only tells the app (through `receive()`) that a client
disconnected, so every request's work races that news (`lifecycle.unless_abandoned`): a client that leaves
before its reply is ready cancels the worker call (its connection to the worker is closed, nothing
falls back), one that leaves mid-stream closes the worker's stream. `/health` counts both under
`disconnected`. When shutdown begins (`Service.begin_shutdown`, from `run.py`) new requests get a
503 `server_shutting_down`, and replies in flight get a grace period to finish; then a stream ends
with a `server_shutting_down` error event before `[DONE]` and a plain request gets that 503.

Reporting. `fugu_lite` in the reply (streamed: in the first chunk, and complete with cost, usage
and latency in the chunk that ends the answer, or in the usage chunk when include_usage asks for one) holds the probabilities, ranking, chosen
and serving worker, worker calls made, fallback errors, cost, timings, and `ignored`: the request
fields that had no effect, each with the reason (`fugu_cost_weight` sent to a head without a cost
term, `domain` with a prompt template that has no `{domain}`, a `model` other than "fugu-lite",
fields that are not passed to workers). The headers `x-fugu-worker` (chosen), `x-fugu-served-by`,
`x-fugu-attempts` (worker calls made), `x-fugu-latency-ms`, `x-fugu-cost-usd` (when known: not for
streams) and `x-fugu-checkpoint` (`<method>/<content hash>`) carry the same.

Timings (milliseconds; worker calls run on their own event loop, `upstream.py`, so they are timed
where nothing else queues):
- `route_ms`: receipt to route decision (the wait for a routing batch and the encoder pass).
- `queue_ms`: waiting for a worker's concurrency slot (`max_concurrency`) or rate limit.
- `upstream_ms`: inside worker calls, every attempt, failed ones included: from handing the request
  to the worker's client to its reply having been read. For a stream: until its first content
  (first chunk), until its end (last chunk).
- `latency_ms`: the server's total, from receipt to the reply being ready (a stream: its first
  byte in the first chunk, its end in the last).
- `overhead_ms` = `latency_ms` - `upstream_ms`: everything the router adds: parsing, routing,
  `queue_ms`, the hand-over to the worker loop and back (where a busy server queues), and building
  the reply.

Empty answers, one rule: a reply with no text (blank content) is a failed call, plain or streamed,
and the next worker is tried. A stream is committed to the client only when the worker's first
non-blank content has arrived, so a stream that ends empty falls back like a plain reply.

Thin over the core: this module routes and calls workers; it never trains or grades, and never
imports dagster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fugu_pipeline.route.budget import Budget
from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import BudgetUnavailable, RouteDecision, Router, RouterError
from fugu_pipeline.serve import cascade as serve_cascade, multi_turn
from fugu_pipeline.serve.info import health, list_models, retrieve_model
from fugu_pipeline.serve.lifecycle import ClientGone, ShuttingDown, shutting_down, unless_abandoned
from fugu_pipeline.serve.batching import RouteBatcher, RouteRequest, route_grouped
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
)
from fugu_pipeline.serve.source import RouterSource, checkpoint_tag
from fugu_pipeline.serve.upstream import CallTiming, RelayedStream, Workers, usage_of
from fugu_pipeline.train.pointer import POINTER
from fugu_pipeline.workers.config import WorkersConfig, load_workers_config
from fugu_pipeline.workers.contract import Completion, WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")

DEFAULT_MAX_BODY_BYTES = 2 << 20
DEFAULT_BATCH_WINDOW_MS = 3.0
DEFAULT_MAX_BATCH = 32


# --------------------------------------------------------------------------- the service


class Service:
    def __init__(self, source: RouterSource, workers: Workers, *, api_token: str | None, max_body_bytes: int,
                 batch_window_ms: float, max_batch: int, default_budget: Budget | None = None):
        self.source, self.workers = source, workers
        # a router trained on imported data routes by the data's ids: the worker listing one as an alias answers it
        self.served_id = {a: w.id for w in workers.config.workers for a in (*w.aliases, w.id)}
        self.default_budget = default_budget
        self.api_token = api_token or None
        self.max_body_bytes = max_body_bytes
        self.batcher = RouteBatcher(self._route_batch, window_ms=batch_window_ms, max_batch=max_batch)
        self.started, self.started_wall = time.monotonic(), time.time()
        self.counts = {"requests": 0, "served": 0, "fallbacks": 0, "all_workers_failed": 0, "disconnected": 0}
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once the app has started
        self.stopping = False  # shutdown has begun: new requests get a 503
        self.grace_s: float | None = None  # set when shutdown begins
        self.grace_over = asyncio.Event()  # replies still running are ended now
        self.relays: set[RelayedStream] = set()  # streams being relayed

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
            except Exception as exc:
                raise RouterUnavailable(f"no router could be loaded: {type(exc).__name__}: {exc}") from exc
            out = route_grouped(router, [self._routed_ids(r, router) for r in requests])
        tag = checkpoint_tag(router)
        no_cost_term = not hasattr(router.checkpoint.head, "route_scores")
        template = router.encoder.settings.prompt_template
        uses_domains = getattr(router.checkpoint.head, "uses_domains", False)  # kNN, prior, MLP, ensemble
        for r, d in zip(requests, out):
            if isinstance(d, RouteDecision):
                d.extra["checkpoint_tag"] = tag
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

    def check_auth(self, request: Request) -> None:
        if self.api_token is None:
            return
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), self.api_token.encode()):
            raise APIError(401, "invalid or missing bearer token: send 'Authorization: Bearer <token>' with the "
                           "token this server was started with (FUGU_SERVE_TOKEN)", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def route(self, req: ChatRequest) -> RouteDecision:
        budget = req.budget or (self.default_budget if req.cost_weight is None else None)
        try:
            return await self.batcher.route(RouteRequest(req.text, req.domain, req.allowed, req.cost_weight, budget,
                                                         req.billed_text if budget is not None else None))
        except BudgetUnavailable as exc:
            if req.budget is None:  # the server's own default cap (a checkpoint reloaded since start cannot honour it)
                raise APIError(503, f"this server's default budget cannot be honoured: {exc}", type="server_error",
                               code="budget_unavailable") from None
            raise APIError(400, str(exc), param="fugu_budget", code="budget_unavailable") from None
        except RouterError as exc:
            raise APIError(400, str(exc), param=exc.param, code=exc.code or "invalid_request") from None
        except RouterUnavailable as exc:
            raise APIError(503, str(exc), type="server_error", code="router_unavailable") from None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _route_info(d: RouteDecision) -> dict:
    info = {"chosen_worker": d.worker_id, "probabilities": {w: round(p, 6) for w, p in d.probabilities.items()},
            "ranking": d.ranking, "checkpoint": d.extra.get("checkpoint_tag"), "checkpoint_tag": d.extra.get("checkpoint_tag")}
    if "budget" in d.extra:
        info["budget"] = d.extra["budget"]
    if "domain_note" in d.extra:
        info["domain_note"] = d.extra["domain_note"]
    return info


def _headers(info: dict) -> dict[str, str]:
    h = {"x-fugu-worker": info["chosen_worker"], "x-fugu-attempts": str(info["attempts"]),
         "x-fugu-latency-ms": f"{info['latency_ms']:.1f}", "x-fugu-checkpoint": info["checkpoint_tag"] or ""}
    if info.get("served_by"):
        h["x-fugu-served-by"] = info["served_by"]
    if info.get("cost_source") not in (None, "none"):
        h["x-fugu-cost-usd"] = f"{info['cost_usd']:.8g}"
    return h


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


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
    req = parse_chat_request(raw)
    svc.counts["requests"] += 1
    try:
        return await unless_abandoned(request, svc, _chat_completion(request, svc, req, raw, t0))
    except ClientGone:
        svc.counts["disconnected"] += 1
        log.info("client disconnected before its reply was ready; the worker call was cancelled")
        return Response(status_code=499)  # nobody reads it: uvicorn drops it


async def _chat_completion(request: Request, svc: Service, req: ChatRequest, raw: bytes, t0: float) -> Response:
    if multi_turn.requested_mode(raw) == "multi_turn":  # the coordinator delegates over several turns
        return await multi_turn.chat_completion(svc, request.app.state.fugu_roles, req, t0)
    decision = await svc.route(req)
    t_routed = time.perf_counter()
    if "cascade" in decision.extra:  # a cascade checkpoint: its steps, then the accepted answer (serve/cascade.py)
        return await serve_cascade.chat_completion(svc, req, decision, t0, t_routed)

    errors: list[dict] = []
    calls, timing, served, result = 0, CallTiming(), None, None
    for routed in decision.ranking:
        wid = svc.served_id.get(routed, routed)  # a router's id, or the alias a configured worker answers to
        if wid not in svc.workers.clients:
            errors.append({"worker": wid, "error": "not in this server's worker config", "status": None})
            continue
        calls += 1
        try:
            if req.stream:
                result = await svc.workers.open_stream(wid, req.messages, req.params, timing)
            else:
                result = await svc.workers.complete(wid, req.messages, req.params, timing)
        except WorkerCallError as exc:
            errors.append({"worker": wid, "error": str(exc), "status": exc.status, "attempts": exc.attempts})
            log.warning("worker %s failed, falling back: %s", wid, exc)
            continue
        except Exception as exc:  # a bug in a client: this request falls back, the traceback goes to the log
            log.exception("worker %s raised %s; falling back", wid, type(exc).__name__)
            errors.append({"worker": wid, "error": f"internal error: {type(exc).__name__}", "status": None})
            continue
        served = wid
        break

    info = {**_route_info(decision), "served_by": served, "domain": req.domain or "general", "attempts": calls,
            "fallback_errors": errors, "ignored": req.ignored + decision.extra.get("ignored", []), "route_ms": _ms(t_routed - t0),
            "queue_ms": _ms(timing.queue_s), "upstream_ms": _ms(timing.upstream_s)}
    if served is None:
        svc.counts["all_workers_failed"] += 1
        _finish_timing(info, t0, timing)
        detail = "; ".join(f"{e['worker']}: {e['error']}" for e in errors)
        raise APIError(502, f"all {len(decision.ranking)} workers failed: {detail}", type="upstream_error",
                       code="all_workers_failed", extra={"fugu_lite": info}, headers=_headers(info))
    svc.counts["served"] += 1
    svc.counts["fallbacks"] += bool(errors)
    if req.stream:
        return _stream_response(svc, req, served, result, info, t0)

    comp: Completion = result
    info["served_model"] = comp.served_model or comp.requested_model
    info["cost_usd"], info["cost_source"] = comp.cost_usd, comp.cost_source
    _finish_timing(info, t0, timing)
    body = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
        "model": info["served_model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": comp.answer},
                     "finish_reason": comp.finish_reason or "stop", "logprobs": None}],
        "usage": usage_of(comp), "fugu_lite": info,
    }
    return JSONResponse(body, headers=_headers(info))


def _finish_timing(info: dict, t0: float, timing: CallTiming) -> None:
    info["queue_ms"], info["upstream_ms"] = _ms(timing.queue_s), _ms(timing.upstream_s)
    info["latency_ms"] = _ms(time.perf_counter() - t0)
    info["overhead_ms"] = round(info["latency_ms"] - info["upstream_ms"], 3)


def _stream_response(svc: Service, req: ChatRequest, wid: str, stream, info: dict, t0: float) -> StreamingResponse:
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": stream.served_model or getattr(svc.workers.specs[wid], "model", wid)}
    info["served_model"] = head["model"]
    _finish_timing(info, t0, stream.timing)  # until the first byte
    headers = _headers(info)

    svc.relays.add(stream)
    if svc.grace_over.is_set():
        stream.interrupt(ShuttingDown(svc.shutdown_message()))
    ended = False  # the relay reached its end (an answer, or an error event), not a client that left

    async def relay():
        nonlocal ended
        yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}], "fugu_lite": info})
        held = None  # the chunk that ends the answer (finish_reason): the final fugu_lite rides on it
        try:
            async for chunk in stream:
                choices = [{"index": c.get("index", 0), "delta": c.get("delta") or {},
                            "finish_reason": c.get("finish_reason")}
                           for c in chunk.get("choices") or [] if isinstance(c, dict)]
                if not choices:
                    continue
                if held is not None:
                    yield _sse(held)
                    held = None
                if any(c["finish_reason"] for c in choices):
                    held = {**head, "choices": choices}
                else:
                    yield _sse({**head, "choices": choices})
        except WorkerCallError as exc:
            log.warning("worker %s failed after the stream had started: %s", wid, exc)
            yield _sse({"error": {"message": f"worker {wid} failed mid-stream: {exc}", "type": "upstream_error",
                                  "param": None, "code": "upstream_stream_error"}})
            yield "data: [DONE]\n\n"
            ended = True
            return
        except ShuttingDown as exc:
            log.warning("stream from worker %s ended early: %s", wid, exc)
            yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None,
                                  "code": "server_shutting_down"}})
            yield "data: [DONE]\n\n"
            ended = True
            return
        final = dict(info)  # complete now: cost, usage, whole-stream timings
        final["cost_usd"], final["cost_source"] = stream.cost()
        final["usage"] = stream.usage
        _finish_timing(final, t0, stream.timing)
        held = held or {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": stream.finish_reason or "stop"}]}
        if req.include_usage:  # OpenAI's usage chunk (empty choices) comes only when asked for
            yield _sse(held)
            yield _sse({**head, "choices": [], "usage": stream.usage, "fugu_lite": final})
        else:
            yield _sse({**held, "fugu_lite": final})
        yield "data: [DONE]\n\n"
        ended = True

    async def cleanup() -> None:
        svc.relays.discard(stream)
        if not ended:
            svc.counts["disconnected"] += 1
            log.info("client disconnected mid-stream; the stream from worker %s was closed", wid)
        await stream.aclose()

    return _RelayResponse(relay(), cleanup, media_type="text/event-stream",
                          headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _RelayResponse(StreamingResponse):
    """Closes the upstream stream and frees the worker's slot however the response ends, even
    when the client leaves before the first chunk is sent."""

    def __init__(self, content, cleanup: Callable[[], Any], **kw):
        super().__init__(content, **kw)
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._cleanup()


# --------------------------------------------------------------------------- factory and runner


def create_app(
    router_provider: Router | PromotedRouter | Callable[[], Router],
    workers_config: WorkersConfig | str | Path,
    *,
    api_token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    max_batch: int = DEFAULT_MAX_BATCH,
    worker_attempts: int | None = 1,
    default_budget: Budget | None = None,
    roles=None,
) -> Starlette:
    """The Starlette app. `api_token` None or "" means no auth; `worker_attempts` None keeps the
    worker config's `max_attempts`. Refuses a router whose workers the config does not define.
    `roles`: the multi-turn coordinator for `"fugu_mode": "multi_turn"` requests (a
    `route.roles.RolesCoordinator` or `PromotedRoles`; None: such requests get a 400)."""
    config = workers_config if isinstance(workers_config, WorkersConfig) else load_workers_config(workers_config)
    def servable(router: Router) -> None:  # at start, and on every reload of the promoted pointer
        problem = config.missing_routes(router.path, router.worker_ids)
        if problem:
            raise ValueError(problem)

    source = RouterSource(router_provider, servable)
    router = source.get()
    if default_budget is not None:
        router.budget_point(default_budget)  # refuse at start a default cap this checkpoint cannot honour
    svc = Service(source, Workers(config, worker_attempts), api_token=api_token, max_body_bytes=max_body_bytes,
                  batch_window_ms=batch_window_ms, max_batch=max_batch, default_budget=default_budget)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        svc.loop = asyncio.get_running_loop()
        await svc.workers.start()
        try:
            yield
        finally:
            await svc.workers.close()
            svc.batcher.close()

    app = Starlette(
        routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/models", list_models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"]),
                Route("/health", health, methods=["GET"])],
        exception_handlers={APIError: api_error_handler, HTTPException: http_error_handler, Exception: server_error_handler},
        lifespan=lifespan,
    )
    app.state.fugu = svc
    app.state.fugu_roles = roles
    return app


def load_router_provider(checkpoint_or_models_dir: str | Path, *, device: str = "auto", dtype: str = "auto",
                         encoder: str | None = None) -> Router | PromotedRouter:
    """A models directory with `promoted/current.json` gives a PromotedRouter (follows promotions);
    a checkpoint directory gives a fixed Router."""
    path = Path(checkpoint_or_models_dir)
    if (path / POINTER).exists():
        return PromotedRouter(path, device=device, dtype=dtype, encoder=encoder)
    if (path / "manifest.json").exists() or path.is_file():
        return serve_cascade.load_router(path, device=device, dtype=dtype, encoder=encoder)  # one-step, or a cascade
    raise RouterError(f"{path} is neither a checkpoint directory (manifest.json + head.safetensors) nor a models "
                      f"directory with {POINTER}; pass a trained checkpoint or the models directory")
