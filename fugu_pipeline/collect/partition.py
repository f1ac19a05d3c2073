"""Collecting one partition: each worker answers each task once, graded and durable at once.

A re-run calls only the cells that are missing, failed, or answered by an older version of the
worker's model. A 401/402/403 stops the run; the budget guard stops spending before the run's
budget would be passed. Storage is the response store (`store.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fugu_pipeline.api_keys import configured_key, scrub_secrets
from fugu_pipeline.call_journal import crash_point
from fugu_pipeline.collect.grading import grade
from fugu_pipeline.collect.records import CallRecord
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.budget import BudgetGuard, RateLimiter
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import (
    FatalWorkerError,
    WorkerCallError,
    WorkerClient,
    task_messages,
)
from fugu_pipeline.workers.factory import make_client
from fugu_pipeline.workers.replies import clean_text


@dataclass
class CollectStats:
    batch: str
    worker_id: str
    n_tasks: int = 0
    n_already_done: int = 0
    n_called: int = 0
    n_ok: int = 0
    n_failed: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    stopped: str | None = None
    errors: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (task id, error kind) of each cell failed here
    skipped_lines: list[int] = field(default_factory=list)  # unreadable lines of the response file
    skipped_note: str | None = None  # how many lines were skipped or cut, and where

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cells_to_call(tasks: Iterable[Task], done: dict[str, CallRecord], model_fingerprint: str | None) -> list[Task]:
    """Tasks whose cell is missing, failed, or was answered by another version of the model.
    Given a fingerprint (openrouter workers with a catalog), a cell recorded without one is stale
    too: it was answered under an offer nobody recorded (every cell of an offline run)."""
    out = []
    for t in tasks:
        rec = done.get(t.task_id)
        if rec is None or rec.status != "ok" or rec.prompt_hash != t.prompt_hash:
            out.append(t)
        elif model_fingerprint is not None and rec.model_fingerprint != model_fingerprint:
            out.append(t)
    return out


async def collect_partition(
    tasks: list[Task],
    batch: str,
    worker_id: str,
    config: WorkersConfig,
    store: ResponseStore,
    *,
    client: WorkerClient | None = None,
    judge: WorkerClient | None = None,
    limit: int | None = None,
    max_usd: float | None = None,
    model_fingerprint: str | None = None,
    catalog=None,
    on_record: Callable[[CallRecord], None] | None = None,
    ledger=None,
) -> CollectStats:
    """Call `worker_id` on every task of the batch whose cell is not done yet; grade and store
    each result as soon as it returns. A 401/402/403 stops the run (raises FatalWorkerError)
    after cancelling every call not yet started; the finished cells stay stored. `ledger`
    (`fugu_pipeline.ledger.CostLedger`): every call over the network is announced to it before it
    is made, and every answered call's cost (kind `collection`, and `judge` for its grading call)
    is appended to it just BEFORE its record is stored, both carrying the call's id: a kill at any
    instant loses no paid call and counts none twice (`ledger.py`)."""
    spec = config.worker(worker_id)
    t0 = time.monotonic()
    stats = CollectStats(batch=batch, worker_id=worker_id, n_tasks=len(tasks))
    own_client = client is None
    client = client or make_client(spec, config, catalog=catalog)
    own_judge = judge is None and config.judge is not None and any(t.grader.type == "llm_judge" for t in tasks)
    if own_judge:
        judge = make_client(config.judge, config, judge=True, catalog=catalog)
    sem = asyncio.Semaphore(spec.max_concurrency)
    limiter = RateLimiter(spec.requests_per_minute)
    guard = BudgetGuard(max_usd if max_usd is not None else config.max_usd_per_run, spec, config.judge, catalog)
    stop: BaseException | None = None
    keys = [configured_key(getattr(w, "api_key_env", None)) for w in (spec, config.judge) if w is not None]
    judge_id = config.judge.id if config.judge is not None else ""

    with store.open_writer(batch, worker_id) as writer:
        done = store.read(batch, worker_id)
        stats.skipped_lines = list(done.skipped_lines)
        notes = [n for n in (done.skipped_note(),) if n]
        if writer.cut_tail_bytes:
            notes.append(f"{writer.path}: cut a torn last line ({writer.cut_tail_bytes} bytes, a write cut off by a crash); its call is made again")
        stats.skipped_note = "; ".join(notes) or None
        todo = cells_to_call(tasks, done, model_fingerprint)
        stats.n_already_done = len(tasks) - len(todo)
        if limit is not None:
            todo = todo[:limit]

        async def one(task: Task) -> None:
            nonlocal stop
            async with sem:
                if stop is not None or guard.stop is not None:
                    return
                estimate = await guard.reserve(task)
                if estimate is None:
                    return
                await limiter.wait()
                stats.n_called += 1
                started = time.time()
                rec = comp = None
                call = await _announce(ledger, spec, config.judge, guard, task, batch)
                try:
                    comp = await client.complete(task_messages(task, spec.system_prompt), task=task)
                    g = await grade(task, comp.answer, judge)
                    rec = CallRecord(
                        task_id=task.task_id, worker_id=worker_id, batch=batch,
                        prompt_hash=task.prompt_hash, status="ok", answer=comp.answer,
                        quality=g.quality, grade_detail=g.detail, cost_usd=comp.cost_usd,
                        cost_source=comp.cost_source, judge_cost_usd=g.judge_cost_usd,
                        latency_s=comp.latency_s, ttft_s=comp.ttft_s,
                        prompt_tokens=comp.prompt_tokens, completion_tokens=comp.completion_tokens,
                        finish_reason=comp.finish_reason, requested_model=comp.requested_model,
                        served_model=comp.served_model, provider=comp.provider,
                        attempts=comp.attempts, model_fingerprint=model_fingerprint,
                        finished_at=time.time(), call_id=call,
                    )
                except FatalWorkerError as exc:
                    stop = stop or exc
                    if call is not None:
                        await asyncio.to_thread(ledger.void, call)
                    return
                except Exception as exc:  # noqa: BLE001 (a bug or a reply nobody foresaw fails this cell, not the batch)
                    error = str(exc) if isinstance(exc, (WorkerCallError, ValueError)) else (
                        f"unexpected {type(exc).__name__}: {exc} (worker {worker_id})")
                    error = scrub_secrets(error, *keys)  # the clients scrub their own; this catches the rest
                    rec = CallRecord(
                        task_id=task.task_id, worker_id=worker_id, batch=batch,
                        prompt_hash=task.prompt_hash, status="failed", error=clean_text(error)[:500],
                        attempts=exc.attempts if isinstance(exc, WorkerCallError) else 1, latency_s=time.time() - started,
                        model_fingerprint=model_fingerprint, finished_at=time.time(), call_id=call,
                        # answered, then failed (grading, a reply nobody foresaw): the answer was paid for
                        cost_usd=comp.cost_usd if comp is not None else 0.0,
                        cost_source=comp.cost_source if comp is not None else "none",
                    )
                finally:
                    spent = 0.0 if rec is None else rec.cost_usd + rec.judge_cost_usd
                    if rec is not None and rec.status == "ok" and rec.cost_source == "none":
                        spent = max(spent, estimate)  # nothing priced the call: it counts at its worst case
                    await guard.settle(estimate, spent)
                await asyncio.to_thread(_persist, writer, ledger, rec, judge_id, comp is not None)  # fsyncs off the loop
                stats.cost_usd += rec.cost_usd + rec.judge_cost_usd
                if rec.status == "ok":
                    stats.n_ok += 1
                else:
                    stats.n_failed += 1
                    key = error_kind(rec.error)
                    stats.errors[key] = stats.errors.get(key, 0) + 1
                    stats.failed.append((task.task_id, key))
                if on_record is not None:
                    on_record(rec)

        try:
            guard.require_prices(todo)  # under a budget, an unpriced paid worker is refused before any call
            if ledger is not None and todo:  # a ledger that cannot be appended to, too
                await asyncio.to_thread(ledger.check)
            await asyncio.gather(*(one(t) for t in todo))
        finally:
            if own_client:
                await client.aclose()
            if own_judge and judge is not None:
                await judge.aclose()
            stats.seconds = time.monotonic() - t0
    if stop is not None:
        raise stop
    stats.stopped = guard.stop
    return stats


async def _announce(ledger, spec, judge, guard: BudgetGuard, task: Task, batch: str) -> str | None:
    """The call's id in the ledger (None without one). A call that someone bills (not the mock
    pool) is announced in the in-flight journal first, with its worst case (worker and judge)."""
    if ledger is None:
        return None
    billed = spec.kind != "mock" or (task.grader.type == "llm_judge" and judge is not None and judge.kind != "mock")
    if not billed:
        return ledger.begin("collection", announce=False)
    call = await asyncio.to_thread(ledger.begin, "collection", worker_id=spec.id, task_id=task.task_id, ref=batch,
                                   worst_usd=guard.ceiling(task))
    crash_point("intent")
    return call


def _persist(writer, ledger, rec: CallRecord, judge_id: str, answered: bool) -> None:
    """What the call cost into the ledger, THEN its record into the partition file: a kill between
    the two leaves a counted call whose cell is called again, never a record nobody paid for in the
    ledger. A call that failed before any answer costs nothing and is not a paid call."""
    if ledger is not None and rec.call_id is not None:
        if answered:
            lines = [("collection", rec.cost_usd, rec.worker_id, rec.task_id, rec.batch)]
            if rec.judge_cost_usd:
                lines.append(("judge", rec.judge_cost_usd, judge_id, rec.task_id, rec.batch))
            ledger.pay(rec.call_id, lines)
            crash_point("ledger")
        else:
            ledger.void(rec.call_id)
    writer.append(rec)
    crash_point("record")


def error_kind(error: str | None) -> str:
    """What a failed cell's error is, in a few words: the text before its first colon."""
    return (error or "error").split(":")[0][:80]


def collect_partition_sync(*args, **kwargs) -> CollectStats:
    return asyncio.run(collect_partition(*args, **kwargs))


def summarize_cells(records: dict[str, CallRecord]) -> dict:
    ok = [r for r in records.values() if r.status == "ok"]
    return {
        "cells": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "mean_quality": (sum(r.quality or 0 for r in ok) / len(ok)) if ok else None,
        "cost_usd": sum(r.cost_usd + r.judge_cost_usd for r in records.values()),
    }

