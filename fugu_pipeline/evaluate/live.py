"""Live accuracy: route a bounded sample of held-out tasks, really call the chosen worker, grade.

The composite's live term goes through one small interface, `LiveEvaluator`: given a head's
`LivePolicy` and the sampled tasks, return one `LiveOutcome` per task (its quality, the worker
calls and turns it took, what it cost). Two implementations are meant to exist:

- `OneCallEvaluator` (here): the one-step router. The head's greedy route on the task's cached
  features picks the worker, the worker is called once, the answer graded by the task's grader.
  With the offline mock pool this reproduces the matrix's cell; with real workers it measures
  what the worker answers today (a model changed upstream, sampling noise) against the matrix.
- a multi-turn evaluator (the session loop built in `session/`, issue 13): it loads the
  coordinator from `policy.checkpoint`, runs Thinker → Worker → Verifier sessions on the same
  tasks and reports `turns` and `calls` per task, which the efficiency term then rewards. It
  plugs in by implementing `evaluate` below; nothing else in the composite changes.

A call that fails scores 0 (the head chose a worker that did not answer). Calls are memoised per
(task, worker) for the evaluator's lifetime: king and challenger routing a task to the same
worker share one answer, so their paired difference carries no sampling noise of that cell.
`max_usd` bounds the spend (each call's worst case reserved from the catalog or configured
prices before it is made; an unpriced paid worker is refused up front).
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

    def __init__(self, config: "WorkersConfig", *, max_usd: float | None = None, concurrency: int = 4):
        self.config = config
        self.max_usd = config.max_usd_per_run if max_usd is None else max_usd
        self.concurrency = concurrency
        self.spent = 0.0
        self.calls = 0
        self._memo: dict[tuple[str, str], LiveOutcome] = {}

    def evaluate(self, policy: LivePolicy, tasks: list["Task"]) -> list[LiveOutcome]:
        missing = [t.task_id for t in tasks if t.task_id not in policy.routes]
        if missing:
            raise ValueError(f"{policy.label}: no route for task(s) {missing[:5]}")
        todo = {(t.task_id, policy.routes[t.task_id]): t for t in tasks
                if (t.task_id, policy.routes[t.task_id]) not in self._memo}
        if todo:
            asyncio.run(self._run(todo))
        return [self._memo[(t.task_id, policy.routes[t.task_id])] for t in tasks]

    async def _run(self, todo: dict[tuple[str, str], "Task"]) -> None:
        from fugu_pipeline.collect.grading import grade
        from fugu_pipeline.workers.budget import cost_ceiling, price_per_token, unpriced_message
        from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError, task_messages
        from fugu_pipeline.workers.factory import make_client

        workers = sorted({w for _, w in todo})
        if self.max_usd is not None:
            for w in workers:
                spec = self.config.worker(w)
                if spec.kind != "mock" and price_per_token(spec) is None:
                    raise FatalWorkerError(unpriced_message(spec, self.max_usd))
        clients = {w: make_client(self.config.worker(w), self.config) for w in workers}
        needs_judge = any(t.grader.type == "llm_judge" for t in todo.values())
        judge = make_client(self.config.judge, self.config, judge=True) if needs_judge and self.config.judge else None
        sem = asyncio.Semaphore(self.concurrency)
        lock = asyncio.Lock()

        async def one(task_id: str, worker: str, task: "Task") -> None:
            spec = self.config.worker(worker)
            async with sem:
                reserve = 0.0
                if self.max_usd is not None:
                    reserve = cost_ceiling(spec, task) or 0.0
                    async with lock:
                        if self.spent + reserve > self.max_usd:
                            raise LiveBudgetExceeded(
                                f"live evaluation: spent ${self.spent:.4f} of max ${self.max_usd:.4f}; the next call "
                                f"could cost ${reserve:.4f}. Lower live_sample or raise max_usd_per_run")
                        self.spent += reserve
                try:
                    comp = await clients[worker].complete(task_messages(task, spec.system_prompt), task=task)
                    g = await grade(task, comp.answer, judge)
                    cost = comp.cost_usd + g.judge_cost_usd
                    out = LiveOutcome(task_id, float(g.quality), cost_usd=cost, workers=[worker])
                except FatalWorkerError:
                    raise
                except (WorkerCallError, ValueError) as exc:
                    cost = 0.0
                    out = LiveOutcome(task_id, 0.0, workers=[worker], error=str(exc)[:300])
                async with lock:
                    self.spent += cost - reserve
                    self.calls += 1
                self._memo[(task_id, worker)] = out

        try:
            await asyncio.gather(*(one(tid, w, t) for (tid, w), t in todo.items()))
        finally:
            for c in clients.values():
                await c.aclose()
            if judge is not None:
                await judge.aclose()


def tasks_by_id(benchgen_dir) -> dict[str, "Task"]:
    """Every task of the BenchGen batch files (their graders and references) by task id."""
    from pathlib import Path

    from fugu_pipeline.tasks.loading import load_all_batches, load_tasks

    p = Path(benchgen_dir)
    pairs = [(None, t) for t in load_tasks(p)] if p.is_file() else load_all_batches(p)
    return {t.task_id: t for _, t in pairs}
