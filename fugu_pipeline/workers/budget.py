"""Spending and pacing: the worst-case cost of a call (for the budget guard) and a rate limiter."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from fugu_pipeline.workers.config import WorkerSpec
from fugu_pipeline.workers.contract import FatalWorkerError

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task


def price_per_token(spec: WorkerSpec, catalog=None) -> tuple[float, float] | None:
    """The worst-case (prompt, completion) USD per token of a worker, or None when nothing prices it.
    OpenRouter: the larger of the catalog price and the configured `max_price_*_per_mtok`, whichever
    exist; an OpenAI-compatible server: its configured price (0 = free); a mock: its simulated cost."""
    if spec.kind == "openai_compatible":
        return spec.price_in_per_mtok / 1e6, spec.price_out_per_mtok / 1e6
    if spec.kind != "openrouter":
        return None
    known = []
    if catalog is not None and catalog.price_per_token(spec.model) is not None:
        known.append(catalog.price_per_token(spec.model))
    if spec.max_price_in_per_mtok is not None:
        known.append((spec.max_price_in_per_mtok / 1e6, spec.max_price_out_per_mtok / 1e6))
    if not known:
        return None
    return max(p for p, _ in known), max(c for _, c in known)


def cost_ceiling(spec: WorkerSpec, task: "Task", catalog=None) -> float | None:
    """A worst-case USD cost of one call, for the budget guard; None when the price is unknown.
    Prompt tokens are over-estimated (3 characters a token); the answer is taken at max_tokens."""
    if spec.kind == "mock":
        return spec.mock.cost_usd * 1.2  # the mock's cost jitter is at most +20%
    price = price_per_token(spec, catalog)
    if price is None:
        return None
    prompt_tokens = len(task.prompt) / 3 + 32
    return prompt_tokens * price[0] + spec.max_tokens * price[1]


def unpriced_message(spec: WorkerSpec, budget_usd: float, role: str = "worker") -> str:
    return (f"budget guard: {role} {spec.id!r} (openrouter model {spec.model!r}) has no known price, so "
            f"max_usd_per_run (${budget_usd:g}) cannot bound what its calls cost. Set max_price_in_per_mtok and "
            f"max_price_out_per_mtok on {role} {spec.id!r} in the worker YAML (USD per million tokens, the most "
            "the model may cost), or materialize openrouter_catalog so the catalog prices it, or remove "
            "max_usd_per_run to run without a budget")


class RateLimiter:
    """At most `per_minute` starts in any 60 s window, spaced evenly."""

    def __init__(self, per_minute: float | None):
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            await asyncio.sleep(delay)


class BudgetLedger:
    """Reserve-then-settle accounting of one USD budget shared by concurrent calls: a call reserves
    its worst case before it is made and settles its real cost after; once a reservation would pass
    the budget, `stop` says why and nothing more is admitted. `budget_usd=None`: no limit."""

    def __init__(self, budget_usd: float | None):
        self.budget = budget_usd
        self.spent = self.reserved = self.max_seen = 0.0
        self.in_flight = 0
        self.stop: str | None = None
        self._cond = asyncio.Condition()

    def _admit(self, estimate: float, unit: str, advice: str) -> float | None:
        """Called holding `self._cond`: reserve `estimate`, or record why not and return None."""
        if self.stop is not None or self.spent + self.reserved + estimate > self.budget:
            self.stop = self.stop or (
                f"budget guard: spent ${self.spent:.4f} of max ${self.budget:.4f} for this run; the next {unit} "
                f"could cost up to ${estimate:.4f}. {advice}")
            return None
        self.reserved += estimate
        self.in_flight += 1
        return estimate

    async def settle(self, estimate: float, cost: float) -> None:
        """Replace the reservation by the real cost. A cost that is not a finite, non-negative number
        is unknown: the reserved worst case is kept (a NaN would make every later check pass)."""
        if self.budget is None:
            return
        if not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost >= 0):
            cost = estimate
        async with self._cond:
            self.spent += cost
            self.reserved -= estimate
            self.in_flight -= 1
            self.max_seen = max(self.max_seen, cost)
            self._cond.notify_all()


class BudgetGuard(BudgetLedger):
    """The run's USD budget: before each call, reserve its worst-case cost (from the catalog or the
    worker's configured maximum prices, at max_tokens); after it, settle the real cost. A call whose
    reservation would pass the budget is not made, and nothing after it either. Under a budget, a
    worker (or judge) that nothing prices is refused before any call: `require_prices`."""

    def __init__(self, budget_usd: float | None, spec: WorkerSpec, judge: WorkerSpec | None = None, catalog=None):
        super().__init__(budget_usd)
        self.spec, self.judge, self.catalog = spec, judge, catalog

    def require_prices(self, tasks: "list[Task]") -> None:
        """Raise FatalWorkerError, naming the worker and the setting, when a budget is set and the
        worker, or the judge of an llm_judge task among `tasks`, has no worst-case price."""
        if self.budget is None or not tasks:
            return
        if price_per_token(self.spec, self.catalog) is None and self.spec.kind != "mock":
            raise FatalWorkerError(unpriced_message(self.spec, self.budget))
        judged = any(t.grader.type == "llm_judge" for t in tasks)
        if judged and self.judge is not None and self.judge.kind != "mock" and price_per_token(self.judge, self.catalog) is None:
            raise FatalWorkerError(unpriced_message(self.judge, self.budget, role="judge"))

    def ceiling(self, task: "Task") -> float | None:
        c = cost_ceiling(self.spec, task, self.catalog)
        if c is not None and task.grader.type == "llm_judge" and self.judge is not None:
            j = cost_ceiling(self.judge, task, self.catalog)
            c = None if j is None else c + j
        return c

    async def reserve(self, task: "Task") -> float | None:
        """The reserved amount, or None when the call must not be made (budget reached)."""
        if self.budget is None:
            return 0.0
        ceiling = self.ceiling(task)
        async with self._cond:
            if ceiling is None:  # require_prices was not called: never spend on an unknown price
                self.stop = self.stop or unpriced_message(self.spec, self.budget)
                return None
            estimate = max(self.max_seen, ceiling)  # a real cost above the ceiling raises the bar
            return self._admit(estimate, "call", "Raise max_usd_per_run, or run again to continue")
