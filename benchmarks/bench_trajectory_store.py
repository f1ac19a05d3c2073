"""Trajectory-store size and open time at 100,000 sessions (not a test).

Runs real sessions on the mock pool with role behaviour (three candidate-like scripted policies on
the three task families), then writes them as `--sessions` stored trajectories (the real records,
each under its own head name and seed, the way a CMA-ES run stores one per candidate) to
- the store (`session/store.py`: SQLite, compressed, indexed, turn texts kept once), and
- one JSON line each, the format the store replaced,
and prints each file's size, the time to open the store and look up one trajectory (what a run
does before its first session) against the time to read the JSON lines whole (what opening meant
before), and lookups per second.

    python benchmarks/bench_trajectory_store.py --sessions 100000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from fugu_pipeline.session.callers import ClientCaller
from fugu_pipeline.session.loop import SessionSpec, run_sessions
from fugu_pipeline.session.policy import FixedPolicy
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.store import TrajectoryStore, trajectory_key
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.workers.config import load_workers_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import describe  # noqa: E402


def sample_sessions(n_tasks: int) -> list[Trajectory]:
    config = load_workers_config(REPO / "configs" / "workers.mock-roles.yaml")
    tasks = [Task.model_validate(r) for r in roles_batch(n_tasks)]
    ids = config.worker_ids
    policies = [FixedPolicy(ids, "fast-solver", "worker"), FixedPolicy(ids, "checker", "verifier", one_step=False),
                FixedPolicy(ids, "planner", "thinker", one_step=False)]

    async def go():
        caller = ClientCaller.from_config(config)
        try:
            return await run_sessions([SessionSpec.for_task(p, t, seed=1) for p in policies for t in tasks], caller)
        finally:
            await caller.aclose()

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=100, help="tasks per family in the real sessions replicated")
    args = ap.parse_args()
    print(f"machine: {describe()}; load average {os.getloadavg()[0]:.2f}")
    base = sample_sessions(args.tasks)
    turns = sum(len(t.turns) for t in base) / len(base)
    print(f"{len(base)} real sessions (mean {turns:.2f} turns), replicated to {args.sessions:,} stored trajectories")
    with tempfile.TemporaryDirectory() as tmp:
        store = TrajectoryStore(tmp, "bench").open()
        lines = Path(tmp) / "bench.jsonl"
        t0 = time.perf_counter()
        with lines.open("w") as fh:
            batch = []
            for i in range(args.sessions):
                tr = base[i % len(base)].model_copy(update={"head": f"head-{i // len(base):05d}", "seed": i})
                batch.append(tr)
                fh.write(tr.model_dump_json() + "\n")
                if len(batch) == 2000:
                    store.append(batch)
                    batch = []
            if batch:
                store.append(batch)
        store.close()
        write_s = time.perf_counter() - t0
        db = Path(tmp) / "bench.sqlite"
        size_db = db.stat().st_size + sum(p.stat().st_size for p in Path(tmp).glob("bench.sqlite-*"))
        size_lines = lines.stat().st_size
        probe = base[7].model_copy(update={"head": f"head-{(args.sessions - 1) // len(base):05d}"})
        key = trajectory_key(probe.task_id, probe.head, args.sessions - 1 - (args.sessions - 1) % len(base) + 7, True)
        t0 = time.perf_counter()
        s = TrajectoryStore(tmp, "bench").open()
        found = s.get(key)
        open_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = 2000
        for i in range(n):
            j = (i * 7919) % args.sessions
            tr = base[j % len(base)]
            s.get(trajectory_key(tr.task_id, f"head-{j // len(base):05d}", j, True))
        lookup_s = (time.perf_counter() - t0) / n
        s.close()
        t0 = time.perf_counter()
        every = [Trajectory.model_validate_json(x) for x in lines.read_bytes().splitlines()]
        read_lines_s = time.perf_counter() - t0
        small = TrajectoryStore(Path(tmp) / "small", "bench").open()
        small.append(base[:100])
        small.close()
        t0 = time.perf_counter()
        TrajectoryStore(Path(tmp) / "small", "bench").open().get(key)
        open_small_s = time.perf_counter() - t0
    print(f"written in {write_s:.1f}s (store and JSON lines together); found the probe: {found is not None}; "
          f"{len(every):,} JSON lines read back")
    print("| format | size | open + first lookup | whole read |")
    print("|---|---|---|---|")
    print(f"| store (SQLite, zlib, turn texts once) | {size_db / 2**20:.1f} MiB | {open_s * 1000:.1f} ms "
          f"({open_small_s * 1000:.1f} ms with 100 sessions) | not needed |")
    print(f"| JSON lines (before) | {size_lines / 2**20:.1f} MiB | {read_lines_s:.2f} s (read whole) | "
          f"{read_lines_s:.2f} s |")
    print(f"lookups by key: {lookup_s * 1e6:.0f} us each")


if __name__ == "__main__":
    main()
