"""`"fugu_mode": "multi_turn"` requests: the promoted multi-turn coordinator delegates the last user
message over several turns (Thinker, Worker, Verifier; `session/loop.py`) through this server's
workers (their concurrency and rate limits hold), and the reply carries the committed answer.

- Body: any chat-completions request plus `"fugu_mode": "multi_turn"` (top level; `"one_step"`, the
  default, is the one-step router). `fugu_allowed_workers` and `domain` apply as in one-step mode; the client's
  sampling fields (temperature, max_tokens, ...) go to every turn; `seed` is the session's seed.
  `fugu_max_usd` (a number > 0) caps what this session may spend; it can only lower the worker
  config's `max_usd_per_session` (1 USD by default). One-step fields that have no effect here
  (`fugu_cost_weight`, ...) are listed back in `fugu_lite.ignored`; `fugu_budget` (a one-step cost
  rule over many requests) is refused with a 400 that points to `fugu_max_usd`.
- Spend caps: each turn reserves its worst-case cost against the session's cap and against the
  process's (`max_usd_per_serve_process`, 50 USD by default, summed over every multi-turn session
  this server ran); a turn either cap refuses is not made and the session stops (`budget`).
- Reply: `choices[0].message.content` is the committed answer (the last non-Verifier turn with an
  extractable answer). `fugu_lite` holds the mode, the coordinator, every turn (role, chosen and
  serving worker, verdict, tokens, cost, latency, fallback errors), why the session stopped, its cost
  and timings, the spend caps and `ignored`; headers `x-fugu-mode`, `x-fugu-turns`,
  `x-fugu-served-by`, `x-fugu-cost-usd`. `usage` sums every turn. A streamed request gets the same
  answer as chunks once the session has ended (every turn, fallbacks included, happens before the
  first byte).
- No committed answer is an OpenAI-shaped error, never a 200 carrying a plan: `code` says why
  (`max_turns`: the turns ran out, 502; `all_workers_failed` / `fatal`: no worker could serve a turn,
  502; `budget`: a spend cap stopped it, 429), and `fugu_lite` carries the turns it paid for and
  their cost (the headers too).
- Other errors: 400 for an unknown mode or when no coordinator is loaded (promote one with
  `eval_report_roles`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref

from starlette.responses import JSONResponse, Response, StreamingResponse

from fugu_pipeline.serve.protocol import APIError, ChatRequest

NO_ANSWER_STATUS = {"budget": 429, "max_turns": 502, "all_workers_failed": 502, "fatal": 502}
_PROCESS_SPEND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Service -> its multi-turn ledger


def process_budget(svc):
    """The server process's multi-turn spend ledger (`max_usd_per_serve_process`), made on first use."""
    from fugu_pipeline.session.callers import SessionBudget

    ledger = _PROCESS_SPEND.get(svc)
    if ledger is None:
        ledger = _PROCESS_SPEND[svc] = SessionBudget(svc.workers.config.max_usd_per_serve_process)
    return ledger


def one_step_fields(req: ChatRequest) -> list[str]:
    """The request's fields that mean something to the one-step router only, each with why."""
    out = list(req.ignored)
    if req.cost_weight is not None:
        out.append("fugu_cost_weight: a one-step routing weight; the coordinator's picks do not use it "
                   "(cap a session's spend with fugu_max_usd)")
    return out


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


def no_answer(svc, tr, info: dict, headers: dict) -> APIError:
    """The OpenAI-shaped error of a session that committed no answer, with the turns it paid for."""
    why = tr.stop_reason if tr.stop_reason in NO_ANSWER_STATUS else "max_turns"
    paid = f"{len(tr.turns)} turn(s) costing ${tr.cost_usd:.6f} are in fugu_lite.turns"
    if why == "budget":
        svc.counts["multi_turn_budget"] = svc.counts.get("multi_turn_budget", 0) + 1
        return APIError(429, f"the multi-turn session stopped at a spend cap before any answer was committed: "
                        f"{tr.error or 'budget'}; {paid}", type="insufficient_quota", code="budget",
                        extra={"fugu_lite": info}, headers=headers)
    if why in ("all_workers_failed", "fatal"):
        svc.counts["all_workers_failed"] += 1
        return APIError(502, f"no worker could serve a turn ({tr.stop_reason}) before any answer was committed: "
                        f"{tr.error}; {paid}", type="upstream_error", code=why, extra={"fugu_lite": info},
                        headers=headers)
    svc.counts["multi_turn_no_answer"] = svc.counts.get("multi_turn_no_answer", 0) + 1
    return APIError(502, f"the coordinator used all {len(tr.turns)} turns without committing an answer (no Worker "
                    f"turn held an extractable answer); {paid}", type="upstream_error", code="max_turns",
                    extra={"fugu_lite": info}, headers=headers)


def _turn(t) -> dict:
    return {"turn": t.index, "role": t.role, "chosen_worker": t.chosen_worker, "served_by": t.served_by,
            "status": t.status, "verdict": t.verdict, "verdict_detail": t.verdict_detail,
            "extractable_answer": t.extractable, "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens, "cost_usd": t.cost_usd, "latency_ms": round(t.latency_s * 1000, 3),
            "worker_probabilities": t.worker_probs, "role_probabilities": t.role_probs,
            "fallback_errors": t.fallback_errors}


async def chat_completion(svc, roles_source, req: ChatRequest, t0: float) -> Response:
    if req.budget is not None:
        raise APIError(400, "'fugu_budget' applies to one-step routing (λ chosen on the router's validation split); "
                       "cap a multi-turn session's spend with 'fugu_max_usd' instead, or send the request without "
                       "\"fugu_mode\": \"multi_turn\"", param="fugu_budget", code="invalid_value")
    asked = req.max_usd
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

    from fugu_pipeline.session.callers import SessionBudget, SpendCaps

    config = svc.workers.config
    session_cap = min([c for c in (config.max_usd_per_session, asked) if c is not None], default=None)
    process = process_budget(svc)
    caps = SpendCaps(SessionBudget(session_cap), process)
    caller = WorkersCaller(svc.workers, req.params)
    try:
        tr = await coordinator.session(req.text, req.domain, caller, seed=int(req.params.get("seed", 0)),
                                       allowed=list(req.allowed) if req.allowed is not None else None, budget=caps)
    except RouterError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code or "invalid_request") from None
    final = next((t for t in tr.turns if t.index == tr.committed_turn), None)
    info = {"mode": "multi_turn", "coordinator": coordinator.tag, "stop_reason": tr.stop_reason,
            "committed_turn": tr.committed_turn, "turns": [_turn(t) for t in tr.turns],
            "served_by": final.served_by if final else None, "cost_usd": tr.cost_usd,
            "spend_caps": {"session_usd": session_cap, "process_usd": process.budget,
                           "process_spent_usd": round(process.spent, 8)},
            "ignored": one_step_fields(req),
            "queue_ms": round(caller.timing.queue_s * 1000, 3), "upstream_ms": round(caller.timing.upstream_s * 1000, 3),
            "latency_ms": round((time.perf_counter() - t0) * 1000, 3), "error": tr.error}
    headers = {"x-fugu-mode": "multi_turn", "x-fugu-turns": str(len(tr.turns)), "x-fugu-cost-usd": f"{tr.cost_usd:.8g}",
               "x-fugu-checkpoint": coordinator.tag}
    if final is None:
        raise no_answer(svc, tr, info, headers)
    svc.counts["served"] += 1
    headers["x-fugu-served-by"] = final.served_by or ""
    headers["x-fugu-ignored"] = str(len(info["ignored"]))
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
