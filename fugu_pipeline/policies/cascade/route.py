"""Running a cascade checkpoint live: step by step, reading each step's answers before paying for the next.

`CascadeRouter` is a `Router` (so `serve`, `load_promoted`, the routing batches and `/health` take it
as they take any checkpoint) whose decision is a plan, not a worker: `route_batch` gives each prompt
the plan for its domain (under a cap, asked or trained under: the most accurate saved point within
the cap's effective cap, following its spend: `spend.py`), the first step's first worker as `worker_id`, and the plan in
`extra["cascade"]`. `run_cascade` then calls the plan:
- each step's workers at once (`call(worker_id)`, the caller's client with its own keys, retries
  and limits); a failed call is listed and the step goes on with the answers it got;
- after a step, the accept rule (`policies/cascade/policy.decide`) on the final answers so far
  (`tasks/final_answer.py`, the kind the checkpoint learnt for the domain) and the verifier's
  scores (the prompt's and each reply's features from the same encoder; with a context verifier,
  each of the step's replies read with every reply paid for so far, as the plan was chosen);
- the last step is always accepted; when every call of it failed, the remaining workers are tried
  one at a time, the strongest first (the one-call fallback);
- reading a step's replies (their final answers, then the verifier: the encoder and the reply
  statistics) runs in a worker thread, so the event loop keeps serving; with `deadline_s` (the
  reading of all of a request's steps together), a step whose reading runs past what is left of it
  is left unread (`StepRecord.over_deadline`) and the cascade goes on to its next step, as when no
  stop rule holds (the last step's first answer is accepted). A thread cannot be stopped, but every
  reader takes time linear in a bounded part of the reply (docs/routing/cascades.md, "Untrusted
  replies"), so a late one ends soon after; a process would have to carry the encoder and the
  verifier over for every request.
`CascadeRun` records every step (workers, final answers, verifier scores, cost, latency, errors)
and why the cascade stopped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from fugu_pipeline.route.router import CASCADE_PLAN, BudgetUnavailable, RouteDecision, Router, RouterError
from fugu_pipeline.workers.contract import Completion, FatalWorkerError, WorkerCallError

TEXT_MEMO = 1024  # the question and option texts whose vectors a router remembers (`option_fit`)


class CascadeRouter(Router):
    """A cascade checkpoint and the encoder its verifier reads with (see the module docstring)."""

    def __init__(self, checkpoint, encoder, **kw):
        self.head = checkpoint.head
        metrics = checkpoint.manifest.metrics
        self.expected_cost = dict(metrics.get("expected_cost_usd") or {})
        self.worker_quality = dict(metrics.get("worker_quality") or {})
        self.answer_kinds = dict(metrics.get("answer_kinds") or {})
        self.metrics = dict(metrics or {})
        self.guards: dict[float, object] = {}  # cap ($ per request) -> its spend guard (policies/cascade/spend.py)
        self._shares: dict = {}  # a cap asked (CostCap), or "trained" -> how the checkpoint keeps it (spend.RequestShares)
        self._guards_lock = threading.Lock()
        # the encoder's vectors of a question and its options (`option_fit`), read again at each step of a
        # cascade: the last TEXT_MEMO texts, by text, used under the router's lock
        self._text_vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        super().__init__(checkpoint, encoder, **kw)
        from fugu_pipeline.policies.cascade.cross_encoder_use import saved_cross_encoder

        # the verifier's cross-encoder, when it reads one: loaded (and its contract checked) now, not at a request
        self.cross_encoder = saved_cross_encoder(checkpoint.path, getattr(self.head, "cross_encoder", None))
        from fugu_pipeline.policies.cascade.code_examples import EXECUTED_STATS

        if set(EXECUTED_STATS) & set(self.head.answer_stats):
            from fugu_pipeline.collect.sandbox import interpreter

            interpreter()  # the sandbox's Python is probed now (under a second, once), not within a request's deadline

    def plan_for(self, domain: str | None, budget=None, allowed: list[str] | None = None):
        """(plan, budget note or None): the checkpoint's plan for `domain` (a domain it has no plan for,
        or none: the pooled plan), or under `budget` the most accurate saved point whose validation cost
        is within the cap's effective cap (`spend.request_point`); restricted to `allowed`. A
        checkpoint trained under a cap serves that cap the same way when no cap is asked."""
        from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadeStep

        plan, note = self.head.policy.plan_for(domain), None
        if budget is not None:
            plan, note = self._budget_plan(domain, budget)
        elif getattr(self.head, "cap_usd", None) is not None:
            plan, note = self._guarded(domain, plan)
        if allowed is not None:
            steps = [CascadeStep(workers=[w for w in s.workers if w in allowed], agree=s.agree, verify=s.verify)
                     for s in plan.steps if any(w in allowed for w in s.workers)]
            if not steps:
                raise RouterError(f"the cascade calls {plan.workers}, none of them allowed ({sorted(allowed)})",
                                  param="fugu_allowed_workers", code="unknown_worker")
            plan = CascadePlan(steps=steps)
        return plan, note

    def group_keys(self, prompts: list[str], domains=None) -> list:
        """The key of each prompt's plan: its domain, or for a cascade planned per prompt cluster the
        nearest cluster of its prompt features (encoded as training encoded them)."""
        doms = [None] * len(prompts) if domains is None else list(domains)
        if self.head.clusters is None:
            return doms
        with self._lock:
            X = self.encoder.encode(list(prompts), [d or "general" for d in doms])
        return self.head.group_keys(doms, X)

    def own_budget_point(self, budget):
        return self._budget_plan(None, budget)

    def guard(self, cap_usd: float, group: str | None = None, pooled: bool = False):
        """The spend guard of a cap (one per cap, per group for a group's part of a shared cap, and the
        pooled guard beside those parts, `pooled`; kept while the router serves; past `MAX_GUARDS`
        distinct caps, the least recently used one is dropped, so requests naming ever new caps hold
        a bounded memory)."""
        from fugu_pipeline.policies.cascade.spend import MAX_GUARDS, guard_key, new_guard

        key = guard_key(cap_usd, group, pooled)
        with self._guards_lock:
            got = self.guards.pop(key, None) or new_guard(cap_usd, pooled)
            self.guards[key] = got  # the most recently used last
            while len(self.guards) > MAX_GUARDS:
                self.guards.pop(next(iter(self.guards)))
            return got

    def spend_states(self) -> list[dict]:
        """Each spend guard's running spend (a group's part names its group, with the whole cap as
        `cap_usd` and its part now as `part_usd`; the pooled guard beside the parts is "pooled", with
        the mix of requests), then those of the run's checkpoints it sends caps to."""
        with self._guards_lock:
            guards = list(self.guards.items())
        rows = []
        for key, g in guards:
            state = g.state()
            if key[0] == "group":
                state = {**state, "part_usd": state["cap_usd"], "cap_usd": key[2]}
            rows.append({"checkpoint": self.tag, "group": key[1] if key[0] == "group" else "pooled" if key[0] == "pooled"
                         else "", **state})
        return rows + super().spend_states()

    def record_spend(self, decision: RouteDecision, cost_usd: float) -> None:
        """What a served cascade cost, counted by the guard of the cap it was served under (and, for a
        group's part of a shared cap, by the pooled guard too)."""
        held = (decision.extra.get("budget") or {}).get("guard")
        if not held:  # a one-step route under a cap: its follower (`route/capped.py`)
            super().record_spend(decision, cost_usd)
        elif held.get("pooled_cap_usd") is None:
            self.guard(held["cap_usd"]).record(cost_usd)
        else:  # a group's guard is kept under the whole cap (its part moves with the mix of requests)
            self.guard(held["pooled_cap_usd"], held["group"]).record(cost_usd)
            self.guard(held["pooled_cap_usd"], pooled=True).record(cost_usd)

    def _points(self, domain):
        from fugu_pipeline.policies.cascade.spend import cap_points

        return cap_points(self.head.head_params(), self.metrics, domain)

    def _budget_plan(self, domain, budget):
        from fugu_pipeline.policies.cascade.spend import MAX_GUARDS, CapOutOfReach, request_shares

        points = self._points(domain)
        if not points:
            raise BudgetUnavailable(f"{self.path}: this cascade records no budget points; retrain it with `fugu-lite train`")
        with self._guards_lock:
            shares = self._shares.get(budget)
        if shares is None:
            try:  # the cap, shared among the groups where the checkpoint holds a frontier per group
                shares = request_shares(self.head.head_params(), self.metrics, budget)
            except CapOutOfReach as exc:
                raise BudgetUnavailable(str(exc)) from None
            with self._guards_lock:
                self._shares[budget] = shares
                while len(self._shares) > MAX_GUARDS:
                    self._shares.pop(next(iter(self._shares)))
        return self._followed(domain, points, shares, budget.describe())

    def _guarded(self, domain, plan):
        """Under the cap the checkpoint was trained under: the cap followed as a request asking it is
        (`spend.trained_shares`; a worker shipped alone kept while the cap allows it, `spend.own_point`)."""
        from fugu_pipeline.policies.cascade.spend import own_point, trained_shares

        with self._guards_lock:
            shares = self._shares.get("trained")
        if shares is None:
            shares = trained_shares(self.head, self.metrics)
            with self._guards_lock:
                shares = self._shares.setdefault("trained", shares)
        points = self._points(domain)
        if not points:  # a checkpoint that saved no points: its own plan
            return plan, None
        got, note = self._followed(domain, points, shares, "", own_point(self.head, self.metrics))
        held = note["guard"]
        note["cap"] = (f"the cap it was trained under, ${shares.cap_usd * 1000:.4g} per 1,000 requests"
                       + (f" (this group's part: ${held['cap_usd'] * 1000:.4g})" if held.get("group") is not None else ""))
        return got, note

    def _followed(self, domain, points: list[dict], shares, text: str, own: dict | None = None):
        """(plan, budget note): the point of `points` (the group's saved points) `spend.request_point`
        serves a request of `domain` under `shares`."""
        from fugu_pipeline.policies.cascade.policy import CascadePlan
        from fugu_pipeline.policies.cascade.spend import request_point

        best, _, note = request_point(shares, points, domain, lambda c, g, p: self.guard(c, g, p), own)
        return CascadePlan.model_validate(best["plan"]), {
            "cap": text, "validation_cost_usd": best["cost_usd"], "validation_quality": best["quality"], "guard": note}

    def own_route_batch(self, prompts, domains=None, *, allowed=None, cost_weight=None, budget=None, cost_texts=None,
                        default_point=True):
        if allowed is not None:
            unknown = [w for w in allowed if w not in self.worker_ids]
            if unknown:
                raise RouterError(f"unknown worker(s) {unknown[:5]}; this cascade knows {self.worker_ids}",
                                  param="fugu_allowed_workers", code="unknown_worker")
        keys = self.group_keys(prompts, domains)
        out = []
        for k, _ in enumerate(prompts):
            plan, note = self.plan_for(keys[k], budget, allowed)
            rest = [w for w in sorted(self.worker_ids, key=lambda w: -self.worker_quality.get(w, 0.0))
                    if w not in plan.workers and (allowed is None or w in allowed)]
            dec = RouteDecision(worker_id=plan.steps[0].workers[0], scores={w: float(w in plan.workers) for w in self.worker_ids},
                                score_kind=CASCADE_PLAN,
                                ranking=plan.workers + rest, checkpoint=self.path)
            dec.extra["cascade"] = {"plan": plan.model_dump(), "describe": plan.describe(), "fallback": rest,
                                    **({"group": keys[k]} if self.head.clusters is not None else {})}
            if note:
                dec.extra["budget"] = note
            if cost_weight is not None:
                dec.extra.setdefault("ignored", []).append("fugu_cost_weight: a cascade stops by its answers and "
                                                           "thresholds, not by a cost weight (send fugu_budget)")
            out.append(dec)
        return out

    def verify(self, prompt: str, domain: str | None, replies: list[tuple[str, str | None, str | None]],
               context: list[tuple[str, str | None, str | None]] | None = None) -> list[float | None]:
        """Verifier scores of (worker, reply, final answer) triples for one prompt (None: no reply).
        `context`: every reply paid for so far, ending with these (None: these alone); a checkpoint with
        a context verifier reads each reply with them (agreement, answer distribution, calibration)."""
        model = getattr(self.head, "context_model", None) if self.head.context else None
        if model is None or float(self.head.used[0]) != 1.0:
            return self._cell_scores(prompt, domain, replies)
        paid = list(context) if context else list(replies)
        base = self._cell_scores(prompt, domain, paid)
        have = [i for i, (_, r, _) in enumerate(paid) if r is not None]
        ws = [self.worker_ids.index(paid[i][0]) for i in have]
        bucket = [model.bucket_of(paid[i][1], paid[i][2], prompt) for i in have]
        at = [len(paid) - len(replies) + k for k in range(len(replies))]  # these are the last paid replies
        which = [have.index(i) for i in at if i in have]
        got = model.score_live(ws, [paid[i][2] for i in have], [base[i] for i in have], bucket, len(self.worker_ids), which)
        out: list[float | None] = [None] * len(replies)
        for k, s in zip([k for k, i in enumerate(at) if i in have], got):
            out[k] = s
        return out

    def examples_passed(self, prompt: str, replies: list[tuple[str, str | None, str | None]]) -> list[bool]:
        """Whether each (worker, reply, final answer)'s code passes every example its prompt shows (run
        in the sandbox, as training ran it: `VerifierInputs.passed_examples`); a sandbox that cannot
        start, or a prompt that shows none, passes nothing."""
        from fugu_pipeline.policies.cascade.code_examples import examples_stats, passes_all

        have = [i for i, (_, r, _) in enumerate(replies) if r is not None]
        out = [False] * len(replies)
        if have:
            ok = passes_all(examples_stats([(replies[i][1], replies[i][2], prompt) for i in have]))
            for k, i in enumerate(have):
                out[i] = bool(ok[k])
        return out

    def _cell_scores(self, prompt: str, domain: str | None, replies) -> list[float | None]:
        """The cell verifier's scores: each reply read alone."""
        from fugu_pipeline.policies.cascade.answer_features import answer_text
        from fugu_pipeline.policies.cascade.code_examples import EXECUTED_STATS, examples_stats
        from fugu_pipeline.policies.cascade.cross_encoder_use import reply_stats

        if float(self.head.used[0]) != 1.0 or not replies:
            return [None] * len(replies)
        have = [i for i, (_, r, _) in enumerate(replies) if r is not None]
        if not have:
            return [None] * len(replies)
        names = self.head.answer_stats  # the statistics it was trained on, by name
        encoded = self.head.answer_dim > len(names)  # else the verifier reads the replies' statistics only
        # code run on the prompt's examples, in the sandbox: outside the lock, so other requests go on
        executed = (examples_stats([(replies[i][1], replies[i][2], prompt) for i in have])
                    if set(EXECUTED_STATS) & set(names) else None)
        with self._lock:
            p = self.encoder.encode([prompt], [domain or "general"])[0]
            texts = [answer_text(replies[i][1], replies[i][2]) for i in have]
            a = self.encoder.encode_texts(texts) if encoded else np.zeros((len(texts), 0), np.float32)
            stats = reply_stats(prompt, [replies[i][1:] for i in have], names, self.cross_encoder, self._encode_remembered,
                                executed)
        rows = []
        for k, i in enumerate(have):
            w, r, f = replies[i]
            onehot = np.zeros(len(self.worker_ids), np.float32)
            onehot[self.worker_ids.index(w)] = 1.0
            rows.append(np.concatenate([p, a[k], stats[k], onehot]))
        s = self.head.verify(np.stack(rows))
        out: list[float | None] = [None] * len(replies)
        for k, i in enumerate(have):
            out[i] = float(s[k])
        return out

    def _encode_remembered(self, texts: list[str]) -> np.ndarray:
        """`encoder.encode_texts(texts)`, the last `TEXT_MEMO` texts' vectors remembered (the caller
        holds the router's lock)."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._text_vectors]
        if missing:
            for t, v in zip(missing, self.encoder.encode_texts(missing)):
                self._text_vectors[t] = v
        for t in texts:
            self._text_vectors.move_to_end(t)
        out = np.stack([self._text_vectors[t] for t in texts])
        while len(self._text_vectors) > TEXT_MEMO:
            self._text_vectors.popitem(last=False)
        return out

    def answer_kind(self, domain: str | None) -> str | None:
        return self.answer_kinds.get(domain or "") or self.answer_kinds.get("*")


@dataclass
class StepRecord:
    workers: list[str]
    answers: dict[str, str | None] = field(default_factory=dict)  # worker -> final answer
    verifier: dict[str, float | None] = field(default_factory=dict)
    cost_usd: float = 0.0
    latency_s: float = 0.0
    errors: list[dict] = field(default_factory=list)
    decision: str = ""
    over_deadline: bool = False  # its replies were not read in time: the cascade went on without them


@dataclass
class CascadeRun:
    plan: str
    steps: list[StepRecord]
    stopped: str  # why
    answer: Completion | None
    served_by: str | None
    calls: int
    cost_usd: float
    fallback_errors: list[dict]

    def info(self) -> dict:
        return {"plan": self.plan, "stopped": self.stopped, "served_by": self.served_by, "calls": self.calls,
                "cost_usd": self.cost_usd,
                "steps": [{"workers": s.workers, "answers": s.answers, "verifier": s.verifier, "cost_usd": s.cost_usd,
                           "latency_s": round(s.latency_s, 4), "errors": s.errors, "decision": s.decision,
                           **({"over_deadline": True} if s.over_deadline else {})} for s in self.steps]}


def _finals(prompt: str, kind: str | None, answers: list[str | None]) -> tuple[str, list[str | None]]:
    """(the answer kind, each answer's comparable final answer): `kind` None is detected from them."""
    from fugu_pipeline.tasks.final_answer import detect_kind, extract

    kind = kind or detect_kind(prompt, answers)
    return kind, [extract(a, kind) for a in answers]


async def run_cascade(router: CascadeRouter, prompt: str, domain: str | None, decision: RouteDecision,
                      call: Callable[[str], Awaitable[Completion]], verify=None,
                      deadline_s: float | None = None) -> CascadeRun:
    """Call the plan in `decision.extra["cascade"]` (see the module docstring); what it cost is
    counted by the spend guard of the cap it was served under. `verify` runs the verifier (default:
    in a thread, so an event loop keeps serving); `deadline_s` bounds the reading of the steps'
    replies, all steps together (None: no bound)."""
    run = await _run_steps(router, prompt, domain, decision, call, verify, deadline_s)
    router.record_spend(decision, run.cost_usd)
    return run


async def _run_steps(router, prompt: str, domain: str | None, decision: RouteDecision,
                     call: Callable[[str], Awaitable[Completion]], verify=None,
                     deadline_s: float | None = None) -> CascadeRun:
    from fugu_pipeline.policies.cascade.policy import CascadePlan, decide

    plan = CascadePlan.model_validate(decision.extra["cascade"]["plan"])
    verify = verify or (lambda *a: asyncio.to_thread(router.verify, *a))
    got: list[tuple[str, Completion]] = []
    finals: list[str | None] = []
    scores: list[float | None] = []
    passed: list[bool] = []  # each reply's code passes its prompt's examples (run only for an examples rule)
    steps, errors, calls, total = [], [], 0, 0.0
    reading_s = 0.0  # spent reading replies, of `deadline_s`
    kind = router.answer_kind(domain)
    for k, step in enumerate(plan.steps):
        rec = StepRecord(workers=list(step.workers))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(call(w) for w in step.workers), return_exceptions=True)
        rec.latency_s = time.perf_counter() - t0
        calls += len(step.workers)
        new = []
        for w, r in zip(step.workers, results):
            if isinstance(r, FatalWorkerError):
                raise r
            if isinstance(r, BaseException):
                if not isinstance(r, WorkerCallError):
                    raise r
                e = {"worker": w, "error": str(r), "status": r.status, "attempts": r.attempts}
                rec.errors.append(e)
                errors.append(e)
                continue
            rec.cost_usd += r.cost_usd
            new.append((w, r))
        total += rec.cost_usd

        async def read(new=new, step=step, last=k == len(plan.steps) - 1):
            found, new_finals = await asyncio.to_thread(_finals, prompt, kind, [r.answer for _, r in new])
            step_replies = [(w, r.answer, f) for (w, r), f in zip(new, new_finals)]
            # the examples rule's own test: each reply's code run on its prompt's examples (in the sandbox)
            ran = (await asyncio.to_thread(router.examples_passed, prompt, step_replies)
                   if new and step.examples and not last else [False] * len(new))
            if new and getattr(router.head, "context", None):  # read with every reply paid for so far
                paid = [(w, c.answer, f) for (w, c), f in zip(got, finals)] + step_replies
                return found, new_finals, await verify(prompt, domain, step_replies, paid), ran
            return found, new_finals, (await verify(prompt, domain, step_replies) if new else []), ran

        t_read = time.perf_counter()
        try:
            if deadline_s is None:
                kind, new_finals, new_scores, new_passed = await read()
            elif reading_s >= deadline_s:  # nothing left of the deadline: not even started
                raise TimeoutError
            else:
                kind, new_finals, new_scores, new_passed = await asyncio.wait_for(read(), deadline_s - reading_s)
        except TimeoutError:  # the thread ends on its own (linear readers); its result is dropped
            rec.over_deadline = True
            new_finals, new_scores, new_passed = [None] * len(new), [None] * len(new), [False] * len(new)
        reading_s += time.perf_counter() - t_read
        got += new
        finals += new_finals
        scores += new_scores
        passed += new_passed
        rec.answers = {w: f for (w, _), f in zip(new, new_finals)}
        rec.verifier = {w: (None if s is None else round(s, 6)) for (w, _), s in zip(new, new_scores)}
        steps.append(rec)
        last = k == len(plan.steps) - 1
        if not new and not last:
            rec.decision = "every call of this step failed: next step"
            continue
        if rec.over_deadline and not last:
            rec.decision = f"its replies were not read within the {deadline_s:g} s deadline: next step"
            continue
        if not new:
            break
        d = decide(step, last, finals, scores, len(new), passed)
        rec.decision = d.reason
        if d.accept:
            w, comp = got[d.answer_index]
            return CascadeRun(plan.describe(), steps, f"step {k + 1}: {d.reason}", comp, w, calls, total, errors)
    for w in decision.extra["cascade"].get("fallback", []):  # the last step failed: one call at a time
        calls += 1
        try:
            comp = await call(w)
        except FatalWorkerError:
            raise
        except WorkerCallError as exc:
            errors.append({"worker": w, "error": str(exc), "status": exc.status, "attempts": exc.attempts})
            continue
        total += comp.cost_usd
        return CascadeRun(plan.describe(), steps, f"every call of the last step failed: fell back to {w}", comp, w, calls,
                          total, errors)
    if got:  # only early answers came back: the best scored of them
        i = max(range(len(got)), key=lambda j: (scores[j] if scores[j] is not None else -1.0, -j))
        return CascadeRun(plan.describe(), steps, "the later steps failed: the best early answer", got[i][1], got[i][0],
                          calls, total, errors)
    return CascadeRun(plan.describe(), steps, "every worker failed", None, None, calls, total, errors)

