"""Serving a cascade checkpoint: run its steps (policies/cascade/route.py), answer with the accepted reply.

The route decision of a `CascadeRouter` carries the plan (`extra["cascade"]`); this module calls
it through the server's `Workers` (each worker's client, limits and attempts, as one call) and
answers in the OpenAI shape. The `fugu_lite` block lists every step: its workers, their final
answers, the verifier's scores, the step's cost and latency, the failures, the accept rule's
decision, and why the cascade stopped. A streamed request gets the accepted answer as a stream
(a cascade must read the answers before it knows which one to send, so the text comes in one
content chunk, then the chunk that ends it with the complete `fugu_lite`). A worker whose key is
refused (401/402/403) is one failed call, as on the one-step path: the server keeps it out
(`upstream.py`) and the cascade goes on without it. Every worker failing is a 502, as for one call.

A step's replies are read (final answers, verifier) in a worker thread, all steps of a request within
`FUGU_CASCADE_READ_DEADLINE_S` seconds (default 0.5); past it the cascade goes on to its
next step (`run_cascade`), the step says `over_deadline`, `/health` and `/metrics`
(`fugu_cascade_read_over_deadline_total`) count the request and the log has one line for it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from starlette.responses import JSONResponse, StreamingResponse

from fugu_pipeline.policies.cascade.route import run_cascade
from fugu_pipeline.settings import settings
from fugu_pipeline.serve.protocol import APIError
from fugu_pipeline.serve.upstream import CallTiming, usage_of
from fugu_pipeline.workers.contract import Completion, FatalWorkerError, WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")
READ_DEADLINE_ENV = "FUGU_CASCADE_READ_DEADLINE_S"


def read_deadline_s() -> float:
    """The deadline for reading a request's replies (`FUGU_CASCADE_READ_DEADLINE_S`, default 0.5 s: a
    step's replies are read in about 10 ms, a 64 KiB reply in about 0.1 s; the rest is a hostile reply).
    A value that is not a positive number of seconds is refused in one line naming the variable."""
    return settings().cascade_read_deadline_s


read_deadline_s()  # a bad setting stops `serve` at start, in one line


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def chat_completion(svc, req, decision, t0: float, t_routed: float):
    with svc.source.lock:  # a cap the shipped description sent to the run's cascade: that one (Router.cap_router)
        router = decision.router or svc.source.get()
    timing = CallTiming()

    async def call(routed: str) -> Completion:
        wid = svc.served_id.get(routed, routed)
        if wid not in svc.workers.clients:
            raise WorkerCallError(f"{wid} is not in this server's worker config")
        try:
            return await svc.workers.complete(wid, req.messages, req.params, timing)
        except FatalWorkerError as exc:  # 401/402/403: the server keeps the worker out; this request goes on without it
            raise WorkerCallError(str(exc), attempts=exc.attempts, status=exc.status) from None

    deadline = read_deadline_s()
    run = await run_cascade(router, req.text, req.domain, decision, call, deadline_s=deadline)
    svc.metrics.cascade_stopped(run)
    late = [k + 1 for k, s in enumerate(run.steps) if s.over_deadline]
    if late:
        svc.counts["cascade_read_over_deadline"] = svc.counts.get("cascade_read_over_deadline", 0) + 1
        svc.metrics.cascade_over_deadline.inc()
        log.warning("cascade: the replies of step(s) %s were not read within %g s (%s); %s",
                    late, deadline, READ_DEADLINE_ENV, run.stopped)
    tag = decision.extra.get("checkpoint_tag")
    info = {"chosen_worker": decision.worker_id, "checkpoint": tag, "checkpoint_tag": tag, "mode": "cascade",
            "cascade": {**run.info(), **({"group": group} if (group := decision.extra["cascade"].get("group")) else {})},
            "served_by": run.served_by, "domain": req.domain or "general", "attempts": run.calls,
            "fallback_errors": run.fallback_errors, "ignored": req.ignored + decision.extra.get("ignored", []),
            "route_ms": _ms(t_routed - t0), "queue_ms": _ms(timing.queue_s), "upstream_ms": _ms(timing.upstream_s),
            "cost_usd": run.cost_usd, "cost_source": "sum of the cascade's calls"}
    if "budget" in decision.extra:
        info["budget"] = decision.extra["budget"]
    if "policy" in decision.extra:  # what train chose and printed (route/shipped.py)
        info["policy"] = decision.extra["policy"]
    info["latency_ms"] = _ms(time.perf_counter() - t0)
    info["overhead_ms"] = round(info["latency_ms"] - info["upstream_ms"], 3)
    headers = {"x-fugu-worker": decision.worker_id, "x-fugu-attempts": str(run.calls),
               "x-fugu-latency-ms": f"{info['latency_ms']:.1f}", "x-fugu-checkpoint": tag or "",
               "x-fugu-cost-usd": f"{run.cost_usd:.8g}", **({"x-fugu-served-by": run.served_by} if run.served_by else {})}
    if run.answer is None:
        svc.counts["all_workers_failed"] += 1
        detail = "; ".join(f"{e['worker']}: {e['error']}" for e in run.fallback_errors)
        raise APIError(502, f"every worker of the cascade failed: {detail}", type="upstream_error",
                       code="all_workers_failed", extra={"fugu_lite": info}, headers=headers)
    svc.counts["served"] += 1
    svc.counts["fallbacks"] += bool(run.fallback_errors)
    comp = run.answer
    model = comp.served_model or comp.requested_model or run.served_by
    info["served_model"] = model
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if not req.stream:
        body = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": comp.answer},
                             "finish_reason": comp.finish_reason or "stop", "logprobs": None}],
                "usage": usage_of(comp), "fugu_lite": info}
        return JSONResponse(body, headers=headers)
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}

    async def relay():
        yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        yield _sse({**head, "choices": [{"index": 0, "delta": {"content": comp.answer}, "finish_reason": None}]})
        end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": comp.finish_reason or "stop"}]}
        if req.include_usage:
            yield _sse(end)
            yield _sse({**head, "choices": [], "usage": usage_of(comp), "fugu_lite": info})
        else:
            yield _sse({**end, "fugu_lite": info})
        yield "data: [DONE]\n\n"

    return StreamingResponse(relay(), media_type="text/event-stream",
                             headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
