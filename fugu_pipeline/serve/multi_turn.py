"""`"fugu_mode": "multi_turn"` requests: the promoted multi-turn coordinator delegates the last user
message over several turns (Thinker, Worker, Verifier; `session/loop.py`) through this server's
workers (their concurrency and rate limits hold), and the reply carries the committed answer.

- Body: any chat-completions request plus `"fugu_mode": "multi_turn"` (top level; `"one_step"`, the
  default, is the one-step router). `fugu_allowed_workers` and `domain` apply as in one-step mode; the client's
  sampling fields (temperature, max_tokens, ...) go to every turn; `seed` is the session's seed.
  `fugu_budget` (a one-step cost cap) is refused with a 400.
- Reply: `choices[0].message.content` is the committed answer (the last non-Verifier turn with an
  extractable answer; when no turn has one, the last answering turn's text, `committed_turn`
  null). `fugu_lite` holds the mode, the coordinator, every turn (role, chosen and serving worker,
  verdict, tokens, cost, latency, fallback errors), why the session stopped, its cost and
  timings; headers `x-fugu-mode`, `x-fugu-turns`, `x-fugu-served-by`, `x-fugu-cost-usd`.
  `usage` sums every turn. A streamed request gets the same answer as chunks once the session
  has ended (every turn, fallbacks included, happens before the first byte).
- Errors: 400 for an unknown mode or when no coordinator is loaded (promote one with
  `eval_report_roles`), 502 when no worker could serve a turn and nothing was answered.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.responses import JSONResponse, Response, StreamingResponse

from fugu_pipeline.serve.protocol import APIError, ChatRequest


class WorkersCaller:
    """The server's workers (`serve/upstream.py`) as a session caller."""

    def __init__(self, workers, params: dict):
        from fugu_pipeline.serve.upstream import CallTiming

        self.workers = workers
        self.worker_ids = list(workers.clients)
        self.params = {k: v for k, v in params.items() if k != "seed"}
        self.dead: dict[str, str] = {}
        self.timing = CallTiming()  # summed over every call of the session

    def spec(self, worker_id: str):
        return self.workers.specs.get(worker_id)

    async def call(self, worker_id: str, messages: list[dict], *, task, seed: int):
        return await self.workers.complete(worker_id, messages, {**self.params, "seed": int(seed)}, self.timing)


def _turn(t) -> dict:
    return {"turn": t.index, "role": t.role, "chosen_worker": t.chosen_worker, "served_by": t.served_by,
            "status": t.status, "verdict": t.verdict, "verdict_detail": t.verdict_detail,
            "extractable_answer": t.extractable, "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens, "cost_usd": t.cost_usd, "latency_ms": round(t.latency_s * 1000, 3),
            "worker_probabilities": t.worker_probs, "role_probabilities": t.role_probs,
            "fallback_errors": t.fallback_errors}


async def chat_completion(svc, roles_source, req: ChatRequest, t0: float) -> Response:
    if req.budget is not None:
        raise APIError(400, "'fugu_budget' applies to one-step routing (λ chosen on the router's validation split); the "
                       "multi-turn coordinator has no cost cap: drop fugu_budget, or send the request without "
                       "\"fugu_mode\": \"multi_turn\"", param="fugu_budget", code="invalid_value")
    if roles_source is None:
        raise APIError(400, "multi_turn mode needs a promoted multi-turn coordinator (models/promoted/roles.json): "
                       "materialize eval_report_roles, or start the server with the models directory that holds it",
                       param="fugu_mode", code="multi_turn_unavailable")
    try:
        coordinator = await asyncio.to_thread(roles_source.refresh) if hasattr(roles_source, "refresh") else roles_source
    except Exception as exc:
        raise APIError(503, f"no multi-turn coordinator could be loaded: {type(exc).__name__}: {exc}",
                       type="server_error", code="router_unavailable") from None
    missing = [w for w in coordinator.worker_ids if w not in svc.workers.clients]
    if missing:
        raise APIError(503, f"the coordinator delegates to worker(s) {missing} that this server's config does not define",
                       type="server_error", code="router_unavailable")
    from fugu_pipeline.route.router import RouterError

    caller = WorkersCaller(svc.workers, req.params)
    try:
        tr = await coordinator.session(req.text, req.domain, caller, seed=int(req.params.get("seed", 0)),
                                       allowed=list(req.allowed) if req.allowed is not None else None)
    except RouterError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code or "invalid_request") from None
    answered = [t for t in tr.turns if t.status == "ok" and t.role != "verifier"] or [t for t in tr.turns if t.status == "ok"]
    final = next((t for t in tr.turns if t.index == tr.committed_turn), answered[-1] if answered else None)
    info = {"mode": "multi_turn", "coordinator": coordinator.tag, "stop_reason": tr.stop_reason,
            "committed_turn": tr.committed_turn, "turns": [_turn(t) for t in tr.turns],
            "served_by": final.served_by if final else None, "cost_usd": tr.cost_usd,
            "queue_ms": round(caller.timing.queue_s * 1000, 3), "upstream_ms": round(caller.timing.upstream_s * 1000, 3),
            "latency_ms": round((time.perf_counter() - t0) * 1000, 3), "error": tr.error}
    headers = {"x-fugu-mode": "multi_turn", "x-fugu-turns": str(len(tr.turns)), "x-fugu-cost-usd": f"{tr.cost_usd:.8g}",
               "x-fugu-checkpoint": coordinator.tag}
    if final is None:
        svc.counts["all_workers_failed"] += 1
        raise APIError(502, f"no worker answered any turn ({tr.stop_reason}): {tr.error}", type="upstream_error",
                       code="all_workers_failed", extra={"fugu_lite": info}, headers=headers)
    svc.counts["served"] += 1
    headers["x-fugu-served-by"] = final.served_by or ""
    pt = sum(t.prompt_tokens or 0 for t in tr.turns)
    ct = sum(t.completion_tokens or 0 for t in tr.turns)
    usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": final.served_model or final.served_by}
    if not req.stream:
        return JSONResponse({**head, "object": "chat.completion", "usage": usage, "fugu_lite": info,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": final.text or ""},
                                          "finish_reason": "stop", "logprobs": None}]}, headers=headers)

    def sse(obj: dict) -> str:
        return f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', **obj}, separators=(',', ':'))}\n\n"

    async def events():
        yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                   "fugu_lite": {"mode": "multi_turn", "coordinator": coordinator.tag}})
        yield sse({"choices": [{"index": 0, "delta": {"content": final.text or ""}, "finish_reason": None}]})
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        if req.include_usage:  # OpenAI's usage chunk (empty choices) comes only when asked for
            yield sse(end)
            yield sse({"choices": [], "usage": usage, "fugu_lite": info})
        else:
            yield sse({**end, "fugu_lite": info})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
