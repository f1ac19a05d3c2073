"""The multi-turn session loop (TinyRouter's Thinker / Worker / Verifier) over any policy, many
sessions in lockstep.

Each turn the policy reads the transcript so far and picks (worker, role); the worker is called
in that role (`roles.py` prompts, `transcript.py` messages: a bounded window of the transcript, and
after a REVISE the Verifier's objection for the next Worker) and the turn is recorded with its
worker, role, tokens, cost, latency and any fallback. A session stops when
- a Verifier says ACCEPT and some turn already holds a committed answer (a Worker's extractable
  answer, or a Thinker's explicit `\\boxed{...}` / "Final answer: ...") ("accepted");
- right after a Worker turn with an extractable answer, the policy picks the Worker role again:
  that commits the answer without another call ("committed"), so a policy can stop at one turn;
- it has had `max_turns` turns (5 by default; a policy may ask for fewer, e.g. the one-step
  baseline's 1) ("max_turns");
- no worker could serve a turn ("all_workers_failed"; "fatal" when every worker hit a 401/402/403),
  or the budget guard refuses the next call ("budget").
The committed answer is the last non-Verifier turn with an extractable answer, graded by the task's
grader (the judge for `llm_judge`); none at all grades 0.

Failures follow the one-step rules: a turn falls back down the policy's worker ranking (same role);
every failed try is recorded in the turn; a 401/402/403 takes that worker out of the run
(`caller.dead`). The budget guard applies to every call (`callers.SessionBudget`). A stopped
session keeps its paid turns and its committed answer so far.

`run_sessions` advances every session one turn at a time: the transcripts of all of them are
encoded together (one featurizer pass per step), then the step's worker calls run concurrently.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.collect.grading import grade
from fugu_pipeline.session.callers import Caller, SessionBudget, TurnMemo
from fugu_pipeline.session.policy import Policy, Step, pick
from fugu_pipeline.session.records import Trajectory, TurnRecord
from fugu_pipeline.session.roles import ROLES, extractable_answer, parse_verdict
from fugu_pipeline.session.transcript import worker_messages
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError, WorkerClient
from fugu_pipeline.workers.mock_roles import unit

MAX_TURNS = 5


@dataclass
class SessionSpec:
    """One session to run: a policy on a task (or a bare prompt, as when serving) with a seed."""

    policy: Policy
    prompt: str
    domain: str | None = None
    task: Task | None = None
    seed: int = 0
    greedy: bool = True
    allowed: list[str] | None = None  # only these workers may be picked

    @classmethod
    def for_task(cls, policy: Policy, task: Task, seed: int = 0, greedy: bool = True) -> "SessionSpec":
        return cls(policy=policy, prompt=task.prompt, domain=task.domain, task=task, seed=seed, greedy=greedy)

    @property
    def task_key(self) -> str:
        return self.task.task_id if self.task is not None else hashlib.sha256(self.prompt.encode()).hexdigest()[:16]


@dataclass
class _State:
    spec: SessionSpec
    limit: int
    step: Step
    stop: str | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)

    @property
    def turns(self) -> list[TurnRecord]:
        return self.step.turns


def committed(turns: list[TurnRecord]) -> TurnRecord | None:
    """The last non-Verifier turn with an extractable answer."""
    for t in reversed(turns):
        if t.status == "ok" and t.role != "verifier" and t.extractable:
            return t
    return None


async def run_sessions(
    specs: list[SessionSpec],
    caller: Caller,
    *,
    max_turns: int = MAX_TURNS,
    budget: SessionBudget | None = None,
    judge: WorkerClient | None = None,
    judge_spec=None,
    memo: TurnMemo | None = None,
    on_finish: Callable[[Trajectory], object] | None = None,
) -> list[Trajectory]:
    """Run every session to its end (module docstring); `on_finish` sees each trajectory as soon as
    it is graded (the trajectory store appends it there). Returns them in the order of `specs`."""
    states = [_State(s, min(max_turns, s.policy.max_turns or max_turns), Step(s.prompt, s.domain)) for s in specs]
    for st in states:
        unknown = [w for w in st.spec.policy.worker_ids if w not in caller.worker_ids]
        if unknown:
            raise ValueError(f"policy {st.spec.policy.name} routes to worker(s) {unknown} that have no client "
                             f"(known: {caller.worker_ids})")
    results: list[Trajectory | None] = [None] * len(states)
    active = list(range(len(states)))
    while active:
        picks = await _decide([states[i] for i in active])
        called = []
        for i, (pw, pr) in zip(active, picks):
            st = states[i]
            act = _pick(st, pw, pr, caller)
            role = ROLES[act.role]
            last = st.turns[-1] if st.turns else None
            if role == "worker" and last is not None and last.role == "worker" and last.status == "ok" and last.extractable:
                st.stop = "committed"
                continue
            called.append((i, _turn(st, act, pw, pr, caller, budget, memo)))
        await asyncio.gather(*(c for _, c in called))
        for i, _ in called:
            _after_turn(states[i], caller, budget)
        finished = [i for i in active if states[i].stop is not None]
        trajectories = await asyncio.gather(*(_finish(states[i], judge, judge_spec, budget) for i in finished))
        for i, tr in zip(finished, trajectories):
            results[i] = tr
            if on_finish is not None:
                out = on_finish(tr)
                if inspect.isawaitable(out):
                    await out
        active = [i for i in active if states[i].stop is None]
    return results  # type: ignore[return-value]


async def _decide(states: list[_State]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every session's two distributions: shared featurizers encode all transcripts first, then each
    policy reads its own sessions. Runs in a thread (encoding must not stall other requests)."""

    def work() -> list[tuple[np.ndarray, np.ndarray]]:
        from fugu_pipeline.session.featurize import prefetch_many

        feats: dict[int, tuple] = {}
        for st in states:
            f = st.spec.policy.featurizer
            if f is not None:
                feats.setdefault(id(f), (f, []))[1].append(st.step.head)
        prefetch_many(list(feats.values()))
        groups: dict[int, list[int]] = {}
        for j, st in enumerate(states):
            groups.setdefault(id(st.spec.policy), []).append(j)
        out: list = [None] * len(states)
        for rows in groups.values():
            pw, pr = states[rows[0]].spec.policy.distributions([states[j].step for j in rows])
            for k, j in enumerate(rows):
                out[j] = (pw[k], pr[k])
        return out

    return await asyncio.to_thread(work)


def _pick(st: _State, pw: np.ndarray, pr: np.ndarray, caller: Caller):
    s = st.spec
    ids = s.policy.worker_ids
    allowed = None
    if s.allowed is not None or caller.dead:
        allowed = np.array([(s.allowed is None or w in s.allowed) and w not in caller.dead for w in ids])
        if not allowed.any():
            allowed = np.array([s.allowed is None or w in s.allowed for w in ids])
    n = len(st.turns) + 1
    return pick(pw, pr, greedy=s.greedy, allowed=allowed,
                u_worker=unit("worker", str(s.seed), s.task_key, str(n)), u_role=unit("role", str(s.seed), s.task_key, str(n)))


async def _turn(st: _State, act, pw, pr, caller: Caller, budget: SessionBudget | None, memo: TurnMemo | None) -> None:
    s = st.spec
    ids = s.policy.worker_ids
    index, role = len(st.turns) + 1, ROLES[act.role]
    pw = pw[act.role] if np.ndim(pw) == 2 else pw  # one worker distribution per role: the picked role's
    rec = TurnRecord(index=index, role=role, chosen_worker=ids[act.worker],
                     worker_probs={w: round(float(p), 6) for w, p in zip(ids, pw)},
                     role_probs={r: round(float(p), 6) for r, p in zip(ROLES, pr)})
    grader = s.task.grader.type if s.task is not None else None
    for k in act.ranking:
        wid = ids[k]
        if wid in caller.dead:
            rec.fallback_errors.append({"worker": wid, "error": f"skipped: {caller.dead[wid]}", "status": None, "fatal": True})
            continue
        spec = caller.spec(wid)
        msgs = worker_messages(s.prompt, st.turns, role, index, st.limit, getattr(spec, "system_prompt", None))
        key = TurnMemo.key(s.task_key, wid, msgs, s.seed)
        comp = memo.get(key) if memo is not None else None
        if comp is not None:
            rec.reused = True
        else:
            est = await budget.reserve(spec, "\n".join(m["content"] for m in msgs)) if budget is not None else 0.0
            if est is None:
                st.stop = "budget"
                break
            t0 = time.monotonic()
            try:
                comp = await caller.call(wid, msgs, task=s.task, seed=s.seed)
            except WorkerCallError as exc:
                fatal = isinstance(exc, FatalWorkerError)
                if fatal:
                    caller.dead[wid] = str(exc)[:300]
                rec.fallback_errors.append({"worker": wid, "error": str(exc)[:500], "status": exc.status, "fatal": fatal})
                rec.latency_s += time.monotonic() - t0
                rec.attempts += 1
                continue
            finally:
                if budget is not None:
                    await budget.settle(est, comp.cost_usd if comp is not None else 0.0)
            if memo is not None:
                memo.put(key, comp)
        rec.attempts += 1
        rec.served_by, rec.text, rec.request_sha = wid, comp.answer, key
        rec.cost_usd, rec.cost_source = comp.cost_usd, comp.cost_source
        rec.latency_s = round(rec.latency_s + comp.latency_s, 6)
        rec.prompt_tokens, rec.completion_tokens = comp.prompt_tokens, comp.completion_tokens
        rec.served_model = comp.served_model or comp.requested_model
        rec.extractable = extractable_answer(comp.answer, role, grader)
        if role == "verifier":
            rec.verdict, rec.verdict_detail = parse_verdict(comp.answer)
        break
    if rec.served_by is None:
        rec.status = "failed"
    if rec.attempts or rec.served_by is not None or rec.fallback_errors:
        st.turns.append(rec)


def _after_turn(st: _State, caller: Caller, budget: SessionBudget | None) -> None:
    if st.stop is not None:  # the budget guard refused a call
        if budget is not None and budget.stop:
            st.error = budget.stop
        return
    t = st.turns[-1]
    if t.status != "ok":
        every_dead = all(w in caller.dead for w in st.spec.policy.worker_ids)
        st.stop = "fatal" if every_dead else "all_workers_failed"
        st.error = "; ".join(f"{e['worker']}: {e['error']}" for e in t.fallback_errors)[:1000]
    elif t.role == "verifier" and t.verdict == "accept" and committed(st.turns) is not None:
        st.stop = "accepted"
    elif len(st.turns) >= st.limit:
        st.stop = "max_turns"


async def _finish(st: _State, judge: WorkerClient | None, judge_spec, budget: SessionBudget | None) -> Trajectory:
    s = st.spec
    t = committed(st.turns)
    tr = Trajectory(
        task_id=s.task_key, prompt_hash=hashlib.sha256(s.prompt.encode()).hexdigest(), domain=s.domain or "general",
        head=s.policy.name, seed=s.seed, greedy=s.greedy, stop_reason=st.stop, turns=st.turns,
        committed_turn=t.index if t is not None else None, answer=t.text if t is not None else None,
        error=st.error,
    )
    if st.stop == "budget":
        tr.status = "budget"
    elif st.stop in ("fatal", "all_workers_failed") and t is None:
        tr.status = "failed"
    if s.task is not None and tr.status != "budget":
        if t is None:
            tr.quality, tr.grade_detail = 0.0, "no extractable answer in any turn"
        else:
            tr = await _grade(tr, s.task, t.text or "", judge, judge_spec, budget)
    tr.cost_usd = round(sum(x.cost_usd for x in st.turns) + tr.judge_cost_usd, 10)
    tr.latency_s = round(sum(x.latency_s for x in st.turns), 6)
    tr.finished_at = time.time()
    return tr


async def _grade(tr: Trajectory, task: Task, answer: str, judge, judge_spec, budget: SessionBudget | None) -> Trajectory:
    est = 0.0
    if task.grader.type == "llm_judge" and budget is not None:
        est = await budget.reserve(judge_spec, task.prompt + answer)
        if est is None:
            tr.status, tr.stop_reason, tr.error = "budget", "budget", budget.stop
            return tr
    cost = 0.0
    try:
        g = await grade(task, answer, judge)
        cost = g.judge_cost_usd
        tr.quality, tr.grade_detail, tr.judge_cost_usd = g.quality, g.detail, g.judge_cost_usd
    except (WorkerCallError, ValueError) as exc:
        tr.status, tr.error = "failed", f"grading failed: {exc}"[:500]
    finally:
        if task.grader.type == "llm_judge" and budget is not None:
            await budget.settle(est, cost)
    return tr
