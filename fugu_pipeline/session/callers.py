"""How a session reaches its workers: one `call(worker_id, messages, task=, seed=)` over the
existing clients (mock, OpenRouter, OpenAI-compatible), each worker's concurrency and rate limits,
a memo of served turns, and the run's USD budget.

- `ClientCaller` wraps the clients `workers.factory.make_client` builds (or any given ones). The
  session's sampling seed goes to the worker as the request's `seed` (`send_seed`), which the mock
  pool draws from and OpenAI-compatible servers use for sampling.
- `TurnMemo` keeps every served turn of a run by (task, worker, messages, seed). Two sessions that
  send the same request with the same seed get the same reply without a second call: that is
  what common random numbers mean for candidates of one CMA-ES generation, and it is free for a
  deterministic worker. It is backed by the trajectory store (`backing`: a miss in memory is looked
  up there by index), so turns already paid for in an earlier (even killed) run are not paid again.
- `SessionBudget` is the budget guard of one-step calls (`workers.budget`) applied to every turn
  of every session of a run: before a call it reserves the worst-case cost (`cost_ceiling` of the
  worker for the full request), after it settles the real cost; a call whose reservation would
  pass the budget is not made, and no call after it. A worker of unknown price makes one call at a
  time until a cost is seen; later calls then reserve the largest cost seen so far.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, OrderedDict
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Protocol

from fugu_pipeline.workers.budget import BudgetLedger, RateLimiter, cost_ceiling
from fugu_pipeline.workers.contract import Completion

if TYPE_CHECKING:
    from fugu_pipeline.session.records import Trajectory
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.config import WorkersConfig, WorkerSpec
    from fugu_pipeline.workers.contract import WorkerClient


class Caller(Protocol):
    worker_ids: list[str]
    dead: dict[str, str]  # worker id -> the fatal error (401/402/403) that took it out of this run

    def spec(self, worker_id: str) -> "WorkerSpec | None": ...

    async def call(self, worker_id: str, messages: list[dict], *, task: "Task | None", seed: int) -> Completion: ...


class ClientCaller:
    """Worker clients behind one `call`, with each worker's `max_concurrency` and `requests_per_minute`."""

    def __init__(self, clients: dict[str, "WorkerClient"], specs: dict[str, "WorkerSpec"] | None = None, *,
                 send_seed: bool = True, own: bool = False):
        self.clients = dict(clients)
        self.specs = dict(specs or {})
        self.worker_ids = list(self.clients)
        self.send_seed = send_seed
        self.calls: Counter = Counter()  # calls made per worker (failed ones included)
        self.dead: dict[str, str] = {}
        self._own = own
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._loop = None  # the slots belong to one event loop (a run keeps one: SessionRunner.call)
        self._limits = {w: RateLimiter(getattr(self.specs.get(w), "requests_per_minute", None)) for w in self.clients}

    @classmethod
    def from_config(cls, config: "WorkersConfig", worker_ids: list[str] | None = None, *, catalog=None,
                    send_seed: bool = True) -> "ClientCaller":
        """Clients for `worker_ids` (default: every configured worker), closed by `aclose()`."""
        from fugu_pipeline.workers.factory import make_client

        ids = worker_ids or config.worker_ids
        specs = {w: config.worker(w) for w in ids}
        return cls({w: make_client(s, config, catalog=catalog) for w, s in specs.items()}, specs,
                   send_seed=send_seed, own=True)

    def spec(self, worker_id: str) -> "WorkerSpec | None":
        return self.specs.get(worker_id)

    async def call(self, worker_id: str, messages: list[dict], *, task: "Task | None", seed: int) -> Completion:
        client = self.clients[worker_id]
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a semaphore another loop waited on cannot be used in this one
            self._loop = loop
            self._slots = {w: asyncio.Semaphore(getattr(self.specs.get(w), "max_concurrency", 64)) for w in self.clients}
        async with self._slots[worker_id]:
            await self._limits[worker_id].wait()
            self.calls[worker_id] += 1
            params = {"seed": int(seed)} if self.send_seed else None
            return await client.complete(messages, task=task, params=params)  # type: ignore[call-arg]

    async def aclose(self) -> None:
        if self._own:
            for c in self.clients.values():
                await c.aclose()


class TurnMemo:
    """Served turns of a run, by request (module docstring). Bounded, least recently used out."""

    def __init__(self, max_items: int = 200_000, backing=None):
        self.max_items = max_items
        self.backing = backing  # an object with completion(key) -> Completion | None (the trajectory store)
        self._items: OrderedDict[str, Completion] = OrderedDict()
        self.hits = 0

    @staticmethod
    def key(task_key: str, worker_id: str, messages: list[dict], seed: int) -> str:
        raw = json.dumps([task_key, worker_id, messages, int(seed)], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    def get(self, key: str) -> Completion | None:
        comp = self._items.get(key)
        if comp is None and self.backing is not None:
            comp = self.backing.completion(key)
            if comp is not None:
                self.put(key, comp)
        if comp is None:
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return replace(comp, extra=dict(comp.extra))

    def put(self, key: str, comp: Completion) -> None:
        self._items[key] = replace(comp, extra=dict(comp.extra))
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def seed_from(self, trajectories: "list[Trajectory]") -> int:
        """Remember every served turn of stored trajectories (finished or stopped); returns how many."""
        n = 0
        for tr in trajectories:
            for t in tr.turns:
                if t.status == "ok" and t.request_sha and t.request_sha not in self._items:
                    self.put(t.request_sha, Completion(
                        answer=t.text or "", cost_usd=t.cost_usd, cost_source=t.cost_source, latency_s=t.latency_s,
                        prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
                        served_model=t.served_model, finish_reason="stop"))
                    n += 1
        return n

    def __len__(self) -> int:
        return len(self._items)


class SessionBudget(BudgetLedger):
    """One USD budget for every turn of a run (module docstring). `budget_usd=None`: no limit."""

    def __init__(self, budget_usd: float | None, catalog=None):
        super().__init__(budget_usd)
        self.catalog = catalog

    async def reserve(self, spec: "WorkerSpec | None", request_text: str) -> float | None:
        """The amount reserved for one call, or None when it must not be made."""
        if self.budget is None:
            return 0.0
        ceiling = cost_ceiling(spec, SimpleNamespace(prompt=request_text), self.catalog) if spec is not None else None
        async with self._cond:
            while ceiling is None and self.max_seen == 0.0 and self.in_flight > 0 and self.stop is None:
                await self._cond.wait()
            estimate = max(self.max_seen, ceiling or 0.0)
            return self._admit(estimate, "turn", "Raise the budget (max_usd), or run again to continue: "
                                                 "finished trajectories and paid turns are kept")


class SpendCaps:
    """Several budgets guarding the same calls (a serve request's own cap and the process's): a call
    is made only when every one admits it; `stop` is the first refusal's reason."""

    def __init__(self, *budgets: SessionBudget):
        self.budgets = [b for b in budgets if b is not None]

    @property
    def stop(self) -> str | None:
        return next((b.stop for b in self.budgets if b.stop), None)

    async def reserve(self, spec: "WorkerSpec | None", request_text: str):
        got = []
        for b in self.budgets:
            est = await b.reserve(spec, request_text)
            if est is None:
                for done, e in got:  # hand back what the others reserved: this call is not made
                    await done.settle(e, 0.0)
                return None
            got.append((b, est))
        return got

    async def settle(self, reserved, cost: float) -> None:
        for b, est in reserved or []:
            await b.settle(est, cost)

    @property
    def spent(self) -> float:
        return self.budgets[0].spent if self.budgets else 0.0
