"""Collecting responses: each worker answers each task once, graded, durable at once.

Storage (DESIGN §3): one append-only JSON Lines file per (batch, worker) partition,
`<root>/<batch>/<worker>.jsonl`. Each finished call is one line written with a single
`write(2)` on an O_APPEND descriptor and fsync'ed before the next result is taken, so a kill at
any instant loses at most the calls in flight. A torn last line (power loss mid-write) is
ignored on read and cut off before the next append. Partition runs never touch DuckDB.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fugu_pipeline.grading import grade
from fugu_pipeline.schemas import CallRecord, Task
from fugu_pipeline.worker_config import WorkersConfig
from fugu_pipeline.workers import (
    BudgetExceededError,
    FatalWorkerError,
    RateLimiter,
    WorkerCallError,
    WorkerClient,
    cost_ceiling,
    make_client,
    task_messages,
)


class PartitionBusyError(RuntimeError):
    pass


class ResponseStore:
    """The per-partition response files under `root`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, batch: str, worker_id: str) -> Path:
        return self.root / batch / f"{worker_id}.jsonl"

    def read(self, batch: str, worker_id: str) -> dict[str, CallRecord]:
        """The latest record of every cell of the partition (a later line replaces an earlier)."""
        p = self.path(batch, worker_id)
        out: dict[str, CallRecord] = {}
        if not p.exists():
            return out
        with p.open("rb") as fh:
            data = fh.read()
        for raw in data.split(b"\n"):
            if not raw.strip():
                continue
            try:
                rec = CallRecord.model_validate_json(raw)
            except ValueError:
                continue  # a torn last line: its call is simply not done
            out[rec.task_id] = rec
        return out

    def batches(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def open_writer(self, batch: str, worker_id: str) -> "PartitionWriter":
        return PartitionWriter(self.path(batch, worker_id))


class PartitionWriter:
    """Exclusive appender for one partition file (a second concurrent run fails clearly)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise PartitionBusyError(
                f"{path}: another run is collecting this partition right now; wait for it to finish"
            ) from None
        self._repair_tail()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the new file's directory entry is durable too
        finally:
            os.close(dfd)

    def _repair_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 1))
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            cut = data.rfind(b"\n") + 1
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: CallRecord) -> None:
        line = record.model_dump_json().encode("utf-8") + b"\n"
        n = os.write(self._fd, line)
        if n != len(line):  # regular files do not short-write short lines, but never assume
            raise OSError(f"{self.path}: short write ({n} of {len(line)} bytes)")
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    def __enter__(self) -> "PartitionWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cells_to_call(tasks: Iterable[Task], done: dict[str, CallRecord], model_fingerprint: str | None) -> list[Task]:
    """Tasks whose cell is missing, failed, or was answered by an older version of the model."""
    out = []
    for t in tasks:
        rec = done.get(t.task_id)
        if rec is None or rec.status != "ok" or rec.prompt_hash != t.prompt_hash:
            out.append(t)
        elif model_fingerprint is not None and rec.model_fingerprint not in (None, model_fingerprint):
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
) -> CollectStats:
    """Call `worker_id` on every task of the batch whose cell is not done yet; grade and store
    each result as soon as it returns. A 401/402/403 stops the run (raises FatalWorkerError)
    after cancelling every call not yet started; the finished cells stay stored."""
    spec = config.worker(worker_id)
    t0 = time.monotonic()
    stats = CollectStats(batch=batch, worker_id=worker_id, n_tasks=len(tasks))
    budget = max_usd if max_usd is not None else config.max_usd_per_run
    own_client = client is None
    client = client or make_client(spec, config, catalog=catalog)
    own_judge = judge is None and config.judge is not None and any(t.grader.type == "llm_judge" for t in tasks)
    if own_judge:
        judge = make_client(config.judge, config, judge=True, catalog=catalog)
    sem = asyncio.Semaphore(spec.max_concurrency)
    limiter = RateLimiter(spec.requests_per_minute)
    spent = reserved = max_seen = 0.0  # the budget guard's books (USD)
    stop: BaseException | None = None

    with store.open_writer(batch, worker_id) as writer:
        done = store.read(batch, worker_id)
        todo = cells_to_call(tasks, done, model_fingerprint)
        stats.n_already_done = len(tasks) - len(todo)
        if limit is not None:
            todo = todo[:limit]

        budget_lock = asyncio.Condition()
        in_flight = 0

        async def reserve(task: Task) -> float | None:
            """Reserve the call's worst-case cost; None when the budget would be passed.
            A worker of unknown price makes one probe call at a time until a cost is seen."""
            nonlocal reserved, in_flight, stop
            ceiling = cost_ceiling(spec, task, catalog)
            if ceiling is not None and task.grader.type == "llm_judge" and config.judge is not None:
                judge_ceiling = cost_ceiling(config.judge, task, catalog)
                ceiling = None if judge_ceiling is None else ceiling + judge_ceiling
            async with budget_lock:
                while ceiling is None and max_seen == 0.0 and in_flight > 0:
                    await budget_lock.wait()
                estimate = max(max_seen, ceiling or 0.0)
                if stop is not None or spent + reserved + estimate > budget:
                    stop = stop or BudgetExceededError(
                        f"budget guard: spent ${spent:.4f} of max ${budget:.4f} for this run; the next call "
                        f"could cost up to ${estimate:.4f}. Raise max_usd_per_run, or run again to continue"
                    )
                    return None
                reserved += estimate
                in_flight += 1
                return estimate

        async def settle(estimate: float, cost: float) -> None:
            nonlocal spent, reserved, max_seen, in_flight
            async with budget_lock:
                spent += cost
                reserved -= estimate
                in_flight -= 1
                max_seen = max(max_seen, cost)
                budget_lock.notify_all()

        async def one(task: Task) -> None:
            nonlocal stop
            async with sem:
                if stop is not None:
                    return
                estimate = None
                if budget is not None:
                    estimate = await reserve(task)
                    if estimate is None:
                        return
                await limiter.wait()
                stats.n_called += 1
                started = time.time()
                rec = None
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
                        finished_at=time.time(),
                    )
                except FatalWorkerError as exc:
                    stop = stop or exc
                    return
                except (WorkerCallError, ValueError) as exc:
                    rec = CallRecord(
                        task_id=task.task_id, worker_id=worker_id, batch=batch,
                        prompt_hash=task.prompt_hash, status="failed", error=str(exc)[:500],
                        attempts=getattr(exc, "attempts", 1), latency_s=time.time() - started,
                        model_fingerprint=model_fingerprint, finished_at=time.time(),
                    )
                finally:
                    if estimate is not None:
                        await settle(estimate, 0.0 if rec is None else rec.cost_usd + rec.judge_cost_usd)
                await asyncio.to_thread(writer.append, rec)  # the fsync must not stall the other calls
                stats.cost_usd += rec.cost_usd + rec.judge_cost_usd
                if rec.status == "ok":
                    stats.n_ok += 1
                else:
                    stats.n_failed += 1
                    key = (rec.error or "error").split(":")[0][:80]
                    stats.errors[key] = stats.errors.get(key, 0) + 1
                if on_record is not None:
                    on_record(rec)

        try:
            await asyncio.gather(*(one(t) for t in todo))
        finally:
            if own_client:
                await client.aclose()
            if own_judge and judge is not None:
                await judge.aclose()
            stats.seconds = time.monotonic() - t0
    if isinstance(stop, FatalWorkerError):
        raise stop
    if stop is not None:
        stats.stopped = str(stop)
    return stats


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

