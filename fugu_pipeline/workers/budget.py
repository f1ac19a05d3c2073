"""Spending and pacing: the worst-case cost of a call (for the budget guard) and a rate limiter."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from fugu_pipeline.workers.config import WorkerSpec

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task


def cost_ceiling(spec: WorkerSpec, task: "Task", catalog=None) -> float | None:
    """A worst-case USD cost of one call, for the budget guard; None when the price is unknown.
    Prompt tokens are over-estimated (3 characters a token); the answer is taken at max_tokens."""
    if spec.kind == "mock":
        return spec.mock.cost_usd * 1.2  # the mock's cost jitter is at most +20%
    prompt_tokens = len(task.prompt) / 3 + 32
    if spec.kind == "openai_compatible":
        return (prompt_tokens * spec.price_in_per_mtok + spec.max_tokens * spec.price_out_per_mtok) / 1e6
    price = catalog.price_per_token(spec.model) if catalog is not None else None
    if price is None:
        return None
    return prompt_tokens * price[0] + spec.max_tokens * price[1]


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


class BudgetGuard:
    """The run's USD budget: before each call, reserve its worst-case cost; after it, settle the
    real cost. A call whose reservation would pass the budget is not made, and nothing after it
    either. A worker of unknown price makes one probe call at a time until a cost is seen, and its
    calls then reserve the largest cost seen so far."""

    def __init__(self, budget_usd: float | None, spec: WorkerSpec, judge: WorkerSpec | None = None, catalog=None):
        self.budget = budget_usd
        self.spec, self.judge, self.catalog = spec, judge, catalog
        self.spent = self.reserved = self.max_seen = 0.0
        self.in_flight = 0
        self.stop: str | None = None
        self._cond = asyncio.Condition()

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
            while ceiling is None and self.max_seen == 0.0 and self.in_flight > 0:
                await self._cond.wait()
            estimate = max(self.max_seen, ceiling or 0.0)
            if self.stop is not None or self.spent + self.reserved + estimate > self.budget:
                self.stop = self.stop or (
                    f"budget guard: spent ${self.spent:.4f} of max ${self.budget:.4f} for this run; the next call "
                    f"could cost up to ${estimate:.4f}. Raise max_usd_per_run, or run again to continue")
                return None
            self.reserved += estimate
            self.in_flight += 1
            return estimate

    async def settle(self, estimate: float, cost: float) -> None:
        if self.budget is None:
            return
        async with self._cond:
            self.spent += cost
            self.reserved -= estimate
            self.in_flight -= 1
            self.max_seen = max(self.max_seen, cost)
            self._cond.notify_all()
