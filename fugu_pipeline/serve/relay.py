"""Building a chat-completions reply: its `x-fugu-*` headers and timings (plain and streamed
replies alike), and the streamed reply, which relays a worker's open stream to the client as
`chat.completion.chunk` events (`serve/app.py` documents the protocol).

The first event carries `fugu_lite` as known when the stream starts; the event that ends the
answer (or the usage event, when `stream_options.include_usage` asks for one) carries it complete,
with cost, usage and whole-stream timings. A worker that fails mid-stream, and a reply cut at the
end of the shutdown grace period, end the stream with an OpenAI-style error event before
`data: [DONE]`. However the reply ends (also when the client leaves before the first event), the
worker's stream is closed and its concurrency slot freed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Callable

from starlette.responses import StreamingResponse

from fugu_pipeline.serve.lifecycle import ShuttingDown
from fugu_pipeline.serve.upstream import CallTiming
from fugu_pipeline.workers.contract import WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def reply_headers(info: dict) -> dict[str, str]:
    """The `x-fugu-*` headers of a reply from its `fugu_lite` info."""
    h = {"x-fugu-worker": info["chosen_worker"], "x-fugu-attempts": str(info["attempts"]),
         "x-fugu-latency-ms": f"{info['latency_ms']:.1f}", "x-fugu-checkpoint": info["checkpoint_tag"] or ""}
    if info.get("served_by"):
        h["x-fugu-served-by"] = info["served_by"]
    if info.get("cost_source") not in (None, "none"):
        h["x-fugu-cost-usd"] = f"{info['cost_usd']:.8g}"
    out = sorted(w for w, s in (info.get("worker_health") or {}).items() if s["state"] != "ok")
    if out:
        h["x-fugu-kept-out"] = ",".join(out)
    if info.get("max_tokens"):
        h["x-fugu-max-tokens"] = str(info["max_tokens"]["sent"])
    return h


def reply_message(comp) -> dict:
    """The assistant message of a plain reply from a `Completion`: its text, and its tool calls as
    the worker sent them (the content then null when there is no text, as OpenAI sends it)."""
    if not comp.tool_calls:
        return {"role": "assistant", "content": comp.answer}
    return {"role": "assistant", "content": comp.answer or None, "tool_calls": comp.tool_calls}


def routing_limits(info: dict, req, svc, served: str | None, admitted) -> None:
    """Add to `fugu_lite` what the workers' limits and health did to this request: `skipped` (set
    by the caller), the prompt's estimated tokens, a lowered `max_tokens` of the serving worker
    and the health of the route's workers that are not well (`upstream.Workers.health`)."""
    info["prompt_tokens_estimate"] = req.prompt_tokens
    if served is not None and admitted is not None and admitted.note:
        info["max_tokens"] = {"asked": admitted.asked, "sent": admitted.params.get("max_tokens"), "worker": served,
                              "note": admitted.note}
    route = [svc.served_id.get(w, w) for w in info.get("ranking") or ()]
    unwell = {w: h for w in route if w in svc.workers.specs
              for h in [svc.workers.tracker.state(w)] if h["state"] != "ok" or h["consecutive_failures"]}
    if unwell:
        info["worker_health"] = unwell


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def finish_timing(info: dict, t0: float, timing: CallTiming) -> None:
    """Set the reply's queue, upstream, latency and overhead figures (`upstream.py`) as of now."""
    info["queue_ms"], info["upstream_ms"] = ms(timing.queue_s), ms(timing.upstream_s)
    info["latency_ms"] = ms(time.perf_counter() - t0)
    info["overhead_ms"] = round(info["latency_ms"] - info["upstream_ms"], 3)


def stream_response(svc, req, wid: str, stream, info: dict, t0: float,
                    on_cost: Callable[[float, str], Any] | None = None) -> StreamingResponse:
    """The streamed reply relaying `stream` (an open `upstream.RelayedStream` of worker `wid`) for
    request `req`; `svc` is the app's `Service` (not imported: `app.py` imports this module).
    `on_cost` gets what the stream cost and the figure's source once it has ended with its answer."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": stream.served_model or getattr(svc.workers.specs[wid], "model", wid)}
    info["served_model"] = head["model"]
    finish_timing(info, t0, stream.timing)  # until the first byte
    headers = reply_headers(info)

    svc.relays.add(stream)
    if svc.grace_over.is_set():
        stream.interrupt(ShuttingDown(svc.shutdown_message()))
    ended = False  # the relay reached its end (an answer, or an error event), not a client that left

    async def relay():
        nonlocal ended
        yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
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
                    yield sse(held)
                    held = None
                if any(c["finish_reason"] for c in choices):
                    held = {**head, "choices": choices}
                else:
                    yield sse({**head, "choices": choices})
        except WorkerCallError as exc:
            log.warning("worker %s failed after the stream had started: %s", wid, exc)
            yield sse({"error": {"message": f"worker {wid} failed mid-stream: {exc}", "type": "upstream_error",
                                 "param": None, "code": "upstream_stream_error"}})
            yield "data: [DONE]\n\n"
            ended = True
            return
        except ShuttingDown as exc:
            log.warning("stream from worker %s ended early: %s", wid, exc)
            yield sse({"error": {"message": str(exc), "type": "server_error", "param": None,
                                 "code": "server_shutting_down"}})
            yield "data: [DONE]\n\n"
            ended = True
            return
        final = dict(info)  # complete now: cost, usage, whole-stream timings
        final["cost_usd"], final["cost_source"] = stream.cost()
        if on_cost is not None:
            on_cost(final["cost_usd"], final["cost_source"])
        final["usage"] = stream.usage
        finish_timing(final, t0, stream.timing)
        held = held or {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": stream.finish_reason or "stop"}]}
        if req.include_usage:  # OpenAI's usage chunk (empty choices) comes only when asked for
            yield sse(held)
            yield sse({**head, "choices": [], "usage": stream.usage, "fugu_lite": final})
        else:
            yield sse({**held, "fugu_lite": final})
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


