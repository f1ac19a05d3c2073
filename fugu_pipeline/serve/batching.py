"""Micro-batching of routing decisions: concurrent requests share one encoder forward pass.

    batcher = RouteBatcher(lambda reqs: route_grouped(router, reqs), window_ms=3, max_batch=32)
    decision = await batcher.route(RouteRequest("Prove that ...", domain="math"))

A request waits at most `window_ms` for others to join it, or less when `max_batch` requests are
already waiting. One batch runs at a time, in the batcher's own routing thread (always the same
one, so torch's per-thread caches exist once), so the event loop keeps serving; requests that
arrive meanwhile form the next batch, which starts as soon as the running one ends.
`max_batch=1` routes one request at a time (the unbatched baseline).

Requests that share `(allowed, cost_weight, budget)` go through one `route_batch` call (one encoder
pass); a batch that mixes several such keys makes one call per key.

One bad request never fails the others: when a group's call raises, each of its requests is
routed again on its own, and only the request(s) that fail alone get the error.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from fugu_pipeline.route.budget import Budget
from fugu_pipeline.route.router import RouteDecision, Router, RouterError


@dataclass(frozen=True)
class RouteRequest:
    text: str
    domain: str | None = None
    allowed: tuple[str, ...] | None = None
    cost_weight: float | None = None
    budget: Budget | None = None  # a cost cap (route/budget.py)
    billed_text: str | None = None  # what the worker is billed for, when more than `text` (the budget's cost)
    default_point: bool = True  # with no cap: the checkpoint's default operating point (False: the plain route)


RouteFn = Callable[[list[RouteRequest]], list["RouteDecision | Exception"]]


def route_grouped(router: Router, requests: list[RouteRequest]) -> list[RouteDecision | Exception]:
    """Route requests with one `route_batch` call per distinct (allowed, cost_weight, budget); a group the
    router refuses (e.g. an unknown allowed worker) gets its RouterError, the others still route.
    Any other failure of a group's call is narrowed down: each of its requests is routed alone, so
    the error reaches only the request(s) that cause it."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((r.allowed, r.cost_weight, r.budget, r.default_point), []).append(i)
    out: list[RouteDecision | Exception] = [RouterError("not routed")] * len(requests)

    def call(rows: list[int], allowed, cost_weight, budget, default_point) -> list[RouteDecision]:
        kw = {} if budget is None else {"budget": budget, "cost_texts": [requests[i].billed_text or requests[i].text
                                                                          for i in rows]}
        if not default_point:
            kw["default_point"] = False
        return router.route_batch([requests[i].text for i in rows], [requests[i].domain for i in rows],
                                  allowed=list(allowed) if allowed is not None else None, cost_weight=cost_weight, **kw)

    for (allowed, cost_weight, budget, default_point), rows in groups.items():
        try:
            decisions: list = call(rows, allowed, cost_weight, budget, default_point)
        except RouterError as exc:
            decisions = [exc] * len(rows)
        except Exception as exc:
            if len(rows) == 1:
                decisions = [exc]
            else:
                decisions = []
                for i in rows:
                    try:
                        decisions += call([i], allowed, cost_weight, budget, default_point)
                    except Exception as alone:
                        decisions.append(alone)
        for i, d in zip(rows, decisions):
            out[i] = d
    return out


class RouteBatcher:
    """Collects concurrent `route()` calls into batches for `fn`, which runs in a thread."""

    def __init__(self, fn: RouteFn, *, window_ms: float = 3.0, max_batch: int = 32):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if window_ms < 0:
            raise ValueError(f"window_ms must be >= 0, got {window_ms}")
        self.fn = fn
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fugu-route")
        self.window_s = window_ms / 1000.0
        self.max_batch = max_batch
        self._pending: list[tuple[RouteRequest, asyncio.Future, float]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self.batches = 0
        self.routed = 0
        self.largest = 0

    def close(self) -> None:
        """Stop the routing thread (after the batch it runs, if any)."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        return {"window_ms": self.window_s * 1000, "max_batch": self.max_batch, "batches": self.batches,
                "routed": self.routed, "largest_batch": self.largest,
                "mean_batch": round(self.routed / self.batches, 3) if self.batches else None}

    async def route(self, request: RouteRequest) -> RouteDecision:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((request, fut, time.monotonic()))
        self._schedule()
        return await fut

    def _schedule(self) -> None:
        if self._task is not None or not self._pending:
            return  # the running batch starts the next one when it ends
        waited = time.monotonic() - self._pending[0][2]
        if len(self._pending) >= self.max_batch or waited >= self.window_s:
            self._start()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window_s - waited, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
        self._task = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[RouteRequest, asyncio.Future, float]]) -> None:
        live = [(r, f) for r, f, _ in batch if not f.done()]  # skip requests whose client went away
        try:
            if live:
                results = await asyncio.get_running_loop().run_in_executor(self._thread, self.fn, [r for r, _ in live])
                if len(results) != len(live):
                    raise RuntimeError(f"route function returned {len(results)} results for {len(live)} requests")
                self.batches += 1
                self.routed += len(live)
                self.largest = max(self.largest, len(live))
                for (_, f), res in zip(live, results):
                    if f.done():
                        continue
                    if isinstance(res, Exception):
                        f.set_exception(res)
                    else:
                        f.set_result(res)
        except Exception as exc:  # the whole batch failed (e.g. no router could be loaded)
            for _, f in live:
                if not f.done():
                    f.set_exception(exc)
        except asyncio.CancelledError:  # shutting down
            for _, f in live:
                f.cancel()
            raise
        finally:
            self._task = None
            if self._pending:
                self._schedule()
