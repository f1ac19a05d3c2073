"""Live accuracy: run a bounded sample of held-out tasks as each head serves, grade, count turns.

The composite's live term goes through one small interface, `LiveEvaluator`: given a head's
`LivePolicy` and the sampled tasks, return one `LiveOutcome` per task (its quality, the worker
calls and turns it took, what it cost). The one-step router's is `OneCallEvaluator` (here): the
head's greedy route on the task's cached features picks the worker, the worker is called once,
the answer graded by the task's grader. With the offline mock pool this reproduces the matrix's
cell; with real workers it measures what the worker answers today (a model changed upstream,
sampling noise) against the matrix. The multi-turn coordinator's live term runs its sessions
through the session loop (`roles_kind.py`), which reports the turns every session took.

A call that fails scores 0 (the head chose a worker that did not answer). Outcomes are kept in
the live store (`live_store.py`) per (head, task, seed), each as it comes (a kill loses only the
calls in flight), so a re-judgement calls nothing, and are
shared by (task, worker, seed): king and challenger routing a task to the same worker share one
answer. Every call made is appended to the cost ledger (`fugu_pipeline/ledger.py`, kind `live`;
its grading call, kind `judge`), announced before it is made and its cost written before its
outcome is kept. `max_usd` bounds the spend (each call's worst case reserved from
the catalog or configured prices before it is made; an unpriced paid worker is refused up front).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.config import WorkersConfig


@dataclass
class LivePolicy:
    """What a live evaluator needs from a head: its label, where its checkpoint is (a multi-turn
    evaluator loads its coordinator from there) and its greedy first route per task id."""

    label: str
    checkpoint: str
    routes: dict[str, str]
    head: str = ""  # the head's content hash: the live store's key
    seed: int = 0


@dataclass
class LiveOutcome:
    task_id: str
    quality: float  # graded answer in [0, 1]; 0 when the call failed
    calls: int = 1  # worker calls made for this task (every turn of a session counts)
    turns: int = 1
    cost_usd: float = 0.0
    workers: list[str] = field(default_factory=list)
    error: str | None = None


class LiveEvaluator(Protocol):
    name: str

    def evaluate(self, policy: LivePolicy, tasks: list["Task"]) -> list[LiveOutcome]: ...


class LiveBudgetExceeded(RuntimeError):
    pass


class OneCallEvaluator:
    """The one-step live evaluator: route, call the chosen worker once, grade."""

    name = "one call per task (route, call, grade)"

    def __init__(self, config: "WorkersConfig", *, max_usd: float | None = None, concurrency: int = 4,
                 store=None, ledger=None):
        self.config = config
        self.max_usd = config.max_usd_per_run if max_usd is None else max_usd
        self.concurrency = concurrency
        self.store = store  # live_store.LiveStore: outcomes kept per (head, task, seed)
        self.ledger = ledger  # ledger.CostLedger: every call made
        self.spent = 0.0
        self.calls = 0
        self._memo: dict[tuple[str, str], LiveOutcome] = {}

    def evaluate(self, policy: LivePolicy, tasks: list["Task"]) -> list[LiveOutcome]:
        missing = [t.task_id for t in tasks if t.task_id not in policy.routes]
        if missing:
            raise ValueError(f"{policy.label}: no route for task(s) {missing[:5]}")
        if self.store is not None:
            for t in tasks:
                w = policy.routes[t.task_id]
                rec = self.store.get(policy.head, t.task_id, w, policy.seed)
                if rec is not None and (t.task_id, w) not in self._memo:
                    self._memo[(t.task_id, w)] = LiveOutcome(t.task_id, rec.quality, calls=rec.calls, turns=rec.turns,
                                                             cost_usd=rec.cost_usd, workers=[w], error=rec.error)
        todo = {(t.task_id, policy.routes[t.task_id]): t for t in tasks
                if (t.task_id, policy.routes[t.task_id]) not in self._memo}
        if todo:  # each outcome kept as it comes (a kill loses only the calls in flight)
            asyncio.run(self._run(todo, lambda o, w: self.keep(policy.head, policy.seed, w, o)))
        out = [self._memo[(t.task_id, policy.routes[t.task_id])] for t in tasks]
        for t, o in zip(tasks, out):  # an outcome shared from another head's cell is this head's too
            self.keep(policy.head, policy.seed, policy.routes[t.task_id], o)
        return out

    def keep(self, head: str, seed: int, worker: str, out: LiveOutcome) -> None:
        """`out` in the live store under (head, task, seed), unless it is there already."""
        if self.store is None:
            return
        from fugu_pipeline.evaluate.live_store import LiveRecord

        rec = self.store.get(head, out.task_id, worker, seed)
        if rec is None or rec.head != head:
            self.store.put(LiveRecord(head=head, task_id=out.task_id, seed=seed, worker=worker, quality=out.quality,
                                      calls=out.calls, turns=out.turns, cost_usd=out.cost_usd, error=out.error))

    async def _announce(self, spec, task: "Task", task_id: str, judge) -> str | None:
        """The call's id in the ledger (None without one); a call someone bills is in the in-flight
        journal, with its worst case, before it is made (`ledger.py`)."""
        if self.ledger is None:
            return None
        from fugu_pipeline.workers.budget import cost_ceiling

        judged = judge is not None and task.grader.type == "llm_judge"
        if spec.kind == "mock" and not (judged and self.config.judge.kind != "mock"):
            return self.ledger.begin("live", announce=False)
        worst = cost_ceiling(spec, task)
        if worst is not None and judged:
            j = cost_ceiling(self.config.judge, task)
            worst = None if j is None else worst + j
        return await asyncio.to_thread(self.ledger.begin, "live", worker_id=spec.id, task_id=task_id, ref="live",
                                       worst_usd=worst)

    def check_workers(self, workers) -> None:
        """Before any call: a paid worker nothing prices is refused under `max_usd`, and the
        ledger is settled and appendable."""
        from fugu_pipeline.workers.budget import price_per_token, unpriced_message
        from fugu_pipeline.workers.contract import FatalWorkerError

        if self.max_usd is not None:
            for w in workers:
                spec = self.config.worker(w)
                if spec.kind != "mock" and price_per_token(spec) is None:
                    raise FatalWorkerError(unpriced_message(spec, self.max_usd))
        if self.ledger is not None:
            self.ledger.check()

    def judge_client(self, tasks):
        """The judge's client when a task is graded by one, else None (the caller closes it)."""
        from fugu_pipeline.workers.factory import make_client

        needs = any(t.grader.type == "llm_judge" for t in tasks)
        return make_client(self.config.judge, self.config, judge=True) if needs and self.config.judge else None

    async def _reserve(self, spec, task: "Task", lock: asyncio.Lock) -> float:
        """The call's worst case, held against `max_usd` before it is made (LiveBudgetExceeded)."""
        from fugu_pipeline.workers.budget import cost_ceiling

        if self.max_usd is None:
            return 0.0
        reserve = cost_ceiling(spec, task) or 0.0
        async with lock:
            if self.spent + reserve > self.max_usd:
                raise LiveBudgetExceeded(
                    f"live evaluation: spent ${self.spent:.4f} of max ${self.max_usd:.4f}; the next call "
                    f"could cost ${reserve:.4f}. Lower live_sample or raise max_usd_per_run")
            self.spent += reserve
        return reserve

    async def _settle(self, lock: asyncio.Lock, reserve: float, cost: float, calls: int = 1) -> None:
        async with lock:
            self.spent += cost - reserve
            self.calls += calls

    async def paid_call(self, client, worker: str, task: "Task", task_id: str, lock: asyncio.Lock):
        """One worker call whose answer is graded elsewhere (a cascade's step): reserved under
        `max_usd`, announced in the ledger before it is made and paid (or voided) after. Raises
        what the client raises."""
        from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError, task_messages

        spec = self.config.worker(worker)
        reserve = await self._reserve(spec, task, lock)
        call = await self._announce(spec, task, task_id, None)
        try:
            comp = await client.complete(task_messages(task, spec.system_prompt), task=task)
        except (WorkerCallError, FatalWorkerError):  # it failed: nothing billed (as the one-call path voids it)
            if call is not None:
                await asyncio.to_thread(self.ledger.void, call)
            await self._settle(lock, reserve, 0.0)
            raise
        except BaseException:  # cancelled in flight (another task's 401 stopped the run): counted at its worst case
            self._abandon(call, spec, task, task_id)
            raise
        if call is not None:
            await asyncio.to_thread(self.ledger.pay, call, [("live", comp.cost_usd, worker, task_id, "live")])
        await self._settle(lock, reserve, comp.cost_usd)
        return comp

    def _abandon(self, call: str | None, spec, task: "Task", task_id: str, kind: str = "live") -> None:
        """A call cancelled in flight: it may have been billed, so its worst case is counted now."""
        from fugu_pipeline.workers.budget import cost_ceiling

        if call is not None:
            self.ledger.abandon(call, (kind, cost_ceiling(spec, task) or 0.0, spec.id, task_id, "live"))

    async def paid_grade(self, task: "Task", answer: str, judge, task_id: str, lock: asyncio.Lock):
        """The grade of an answer paid for elsewhere (`collect.grading.Grade`); a judge someone
        bills is announced in the ledger and paid as a `judge` line. ValueError: it cannot be graded."""
        from fugu_pipeline.collect.grading import grade
        from fugu_pipeline.workers.budget import cost_ceiling
        from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError

        spec = self.config.judge
        billed = (judge is not None and task.grader.type == "llm_judge" and spec is not None and spec.kind != "mock"
                  and self.ledger is not None)
        call = (await asyncio.to_thread(self.ledger.begin, "judge", worker_id=spec.id, task_id=task_id, ref="live",
                                        worst_usd=cost_ceiling(spec, task)) if billed else None)
        try:
            g = await grade(task, answer, judge)
        except (WorkerCallError, FatalWorkerError, ValueError):  # the judge failed: nothing billed
            if call is not None:
                await asyncio.to_thread(self.ledger.void, call)
            raise
        except BaseException:  # cancelled in flight: counted at its worst case
            self._abandon(call, spec, task, task_id, "judge")
            raise
        if call is not None:
            await asyncio.to_thread(self.ledger.pay, call, [("judge", g.judge_cost_usd, spec.id, task_id, "live")])
        await self._settle(lock, 0.0, g.judge_cost_usd, calls=0)
        return g

    async def _run(self, todo: dict[tuple[str, str], "Task"], done=None) -> None:
        from fugu_pipeline.collect.grading import grade
        from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError, task_messages
        from fugu_pipeline.workers.factory import make_client

        workers = sorted({w for _, w in todo})
        self.check_workers(workers)
        clients = {w: make_client(self.config.worker(w), self.config) for w in workers}
        judge = self.judge_client(todo.values())
        sem = asyncio.Semaphore(self.concurrency)
        lock = asyncio.Lock()

        async def one(task_id: str, worker: str, task: "Task") -> None:
            spec = self.config.worker(worker)
            async with sem:
                reserve = await self._reserve(spec, task, lock)
                call = await self._announce(spec, task, task_id, judge)
                comp = None
                try:
                    comp = await clients[worker].complete(task_messages(task, spec.system_prompt), task=task)
                    g = await grade(task, comp.answer, judge)
                    cost = comp.cost_usd + g.judge_cost_usd
                    if call is not None:  # the cost is on disk before the outcome is kept anywhere
                        lines = [("live", comp.cost_usd, worker, task_id, "live")]
                        if g.judge_cost_usd:
                            lines.append(("judge", g.judge_cost_usd, self.config.judge.id if self.config.judge else "",
                                          task_id, "live"))
                        await asyncio.to_thread(self.ledger.pay, call, lines)
                    out = LiveOutcome(task_id, float(g.quality), cost_usd=cost, workers=[worker])
                except FatalWorkerError:  # the worker (or, after its answer, the judge) refused the key
                    if call is not None:
                        if comp is not None:  # answered: paid
                            await asyncio.to_thread(self.ledger.pay, call, [("live", comp.cost_usd, worker, task_id, "live")])
                        else:
                            await asyncio.to_thread(self.ledger.void, call)
                    raise
                except (WorkerCallError, ValueError) as exc:
                    cost = comp.cost_usd if comp is not None else 0.0  # answered, then the grading failed: paid
                    if call is not None:
                        if comp is not None:
                            await asyncio.to_thread(self.ledger.pay, call, [("live", cost, worker, task_id, "live")])
                        else:
                            await asyncio.to_thread(self.ledger.void, call)
                    out = LiveOutcome(task_id, 0.0, workers=[worker], error=str(exc)[:300])
                except BaseException:  # cancelled in flight (another call's 401 stopped the run): its worst case
                    self._abandon(call, spec, task, task_id)
                    raise
                await self._settle(lock, reserve, cost)
                self._memo[(task_id, worker)] = out
                if done is not None:
                    await asyncio.to_thread(done, out, worker)

        try:
            await asyncio.gather(*(one(tid, w, t) for (tid, w), t in todo.items()))
        finally:
            for c in clients.values():
                await c.aclose()
            if judge is not None:
                await judge.aclose()


def live_evaluator(config: "WorkersConfig", project_dir, **kw) -> OneCallEvaluator:
    """The one-step live evaluator of a project: outcomes kept in `data/live/` (per worker pool and
    judge), every call appended to the project's cost ledger."""
    from pathlib import Path

    from fugu_pipeline.evaluate.live_store import LiveStore, live_context
    from fugu_pipeline.ledger import CostLedger, project_ledger

    context = live_context([w.answer_fields() for w in config.workers],
                           config.judge.answer_fields() if config.judge else None)
    return OneCallEvaluator(config, store=LiveStore(Path(project_dir) / "data" / "live", context),
                            ledger=CostLedger(project_ledger(project_dir)), **kw)


def tasks_by_id(benchgen_dir, refused: list | None = None) -> dict[str, "Task"]:
    """Every task of the BenchGen batch files (their graders and references) by task id. A folder's
    bad batch file raises `TaskFileError`; with `refused` (a list) it is appended there and left out,
    as the reward matrix leaves it out."""
    from pathlib import Path

    from fugu_pipeline.tasks.loading import load_all_batches, load_tasks

    p = Path(benchgen_dir)
    pairs = [(None, t) for t in load_tasks(p)] if p.is_file() else load_all_batches(p, refused)
    return {t.task_id: t for _, t in pairs}
