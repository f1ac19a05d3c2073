"""Many policies on many (task, seed) pairs, through the trajectory store: what a trainer, an
evaluation and a benchmark all do.

`SessionRunner.run(policies, pairs, greedy)` returns, for every policy, one trajectory per pair.
A pair whose trajectory is stored under (task, policy name, seed, greedy) is read, not run; the
rest run together in lockstep (`loop.run_sessions`, one featurizer pass per step for all of them,
worker calls concurrent), and each is appended to the store the moment it is graded. Lookups go by
the store's index (nothing is read at start); the turn memo falls back to the store, so even a
session that was cut off (killed run, budget stop) reuses the turns it had already paid for.

One event loop for the whole run: every `run()` and `call()` runs on the runner's own loop (made
on first use, ended by `close()`), so the worker clients, their connections, the concurrency slots
and the budget's locks made in one batch serve the next, and the clients are closed on the loop
they ran on (`call(caller.aclose())` before `close()`).

A 401/402/403 from any worker stops the run after the step (`FatalWorkerError`); the budget guard
stopping a session stops it too (`BudgetExhausted`). Everything finished before stays stored, so
running again continues.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from fugu_pipeline.session.callers import Caller, SessionBudget, TurnMemo
from fugu_pipeline.session.loop import MAX_TURNS, SessionSpec, run_sessions
from fugu_pipeline.session.policy import Policy
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.store import TrajectoryStore, trajectory_key
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.contract import FatalWorkerError


RECENT = 20_000  # finished trajectories kept in memory; older ones are read back from the store by index


class BudgetExhausted(RuntimeError):
    """The budget guard refused a turn; finished trajectories are stored, running again continues."""


@dataclass
class RunStats:
    sessions_stored: int = 0  # found in the store, nothing run
    sessions_run: int = 0
    turns_reused: int = 0  # turns served from the memo (no new call)


@dataclass
class SessionRunner:
    caller: Caller
    store: TrajectoryStore | None = None
    max_turns: int = MAX_TURNS
    budget: SessionBudget | None = None
    judge: object = None
    judge_spec: object = None
    memo: TurnMemo = field(default_factory=TurnMemo)
    stats: RunStats = field(default_factory=RunStats)

    def __post_init__(self) -> None:
        self._loop: asyncio.Runner | None = None  # the run's one event loop (made on first use)
        self._done: OrderedDict = OrderedDict()  # recent finished trajectories (the rest are looked up in the store)
        if self.store is not None:
            self.store.open()  # a second run on this store stops here, before any call
            self.memo.backing = self.store

    def stored(self, task: Task, policy: Policy, seed: int, greedy: bool) -> Trajectory | None:
        key = trajectory_key(task.task_id, policy.name, seed, greedy)
        tr = self._done.get(key)
        if tr is None and self.store is not None:
            tr = self.store.get(key)
            if tr is not None:
                self._remember(key, tr)
        return tr if tr is not None and tr.prompt_hash == _prompt_hash(task) else None

    async def arun(self, policies: list[Policy], pairs: list[tuple[Task, int]], greedy: bool) -> list[list[Trajectory]]:
        out: list[list[Trajectory | None]] = [[None] * len(pairs) for _ in policies]
        specs, where = [], []
        for p, pol in enumerate(policies):
            for j, (task, seed) in enumerate(pairs):
                tr = self.stored(task, pol, seed, greedy)
                if tr is not None:
                    out[p][j] = tr
                    self.stats.sessions_stored += 1
                    continue
                specs.append(SessionSpec.for_task(pol, task, seed=seed, greedy=greedy))
                where.append((p, j, pol.name, task.task_id, seed))
        # one session per distinct (policy name, task, seed): equal heads in a population run once
        unique: dict[tuple, int] = {}
        run_specs, run_index = [], []
        for spec, (p, j, name, tid, seed) in zip(specs, where):
            k = (name, tid, seed)
            if k not in unique:
                unique[k] = len(run_specs)
                run_specs.append(spec)
            run_index.append(unique[k])
        if run_specs:
            reused_before = self.memo.hits
            done = await run_sessions(run_specs, self.caller, max_turns=self.max_turns, budget=self.budget,
                                      judge=self.judge, judge_spec=self.judge_spec, memo=self.memo,
                                      on_finish=self._keep)
            if self.store is not None:
                self.store.flush()  # this call's trajectories are on disk before it returns
            self.stats.sessions_run += len(run_specs)
            self.stats.turns_reused += self.memo.hits - reused_before
            for (p, j, *_), r in zip(where, run_index):
                out[p][j] = done[r]
            self._raise_if_stopped(done)
        return out  # type: ignore[return-value]

    def run(self, policies: list[Policy], pairs: list[tuple[Task, int]], greedy: bool) -> list[list[Trajectory]]:
        return self.call(self.arun(policies, pairs, greedy))

    def call(self, coro):
        """`coro`'s result, run on the runner's one event loop (the loop every batch of the run
        uses; made on first use). Not from inside a running loop (await `arun` there)."""
        if self._loop is None:
            self._loop = asyncio.Runner()
        return self._loop.run(coro)

    def close(self) -> None:
        """End the run's event loop (close the clients first: `call(caller.aclose())`)."""
        if self._loop is not None:
            loop, self._loop = self._loop, None
            loop.close()

    def _keep(self, tr: Trajectory) -> None:
        if self.store is not None:
            self.store.submit(tr)
        if tr.status == "ok":
            self._remember(trajectory_key(tr.task_id, tr.head, tr.seed, tr.greedy), tr)

    def _remember(self, key, tr: Trajectory) -> None:
        self._done[key] = tr
        self._done.move_to_end(key)
        while self.store is not None and len(self._done) > RECENT:
            self._done.popitem(last=False)

    def _raise_if_stopped(self, done: list[Trajectory]) -> None:
        if self.caller.dead:
            detail = "; ".join(f"{w}: {e}" for w, e in self.caller.dead.items())
            raise FatalWorkerError(f"stopped: a worker refused every call (fix it, then run again; finished "
                                   f"trajectories are kept): {detail}")
        if any(t.status == "budget" for t in done):
            msg = next(t.error for t in done if t.status == "budget") or "budget guard stopped the run"
            raise BudgetExhausted(msg)


def _prompt_hash(task: Task) -> str:
    return hashlib.sha256(task.prompt.encode()).hexdigest()
