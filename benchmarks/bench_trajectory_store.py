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
    milestones = sorted({m for m in (1_000, 10_000, args.sessions) if m <= args.sessions})
    opens: dict[int, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "bench.jsonl"
        t0 = time.perf_counter()
        written = 0
        with lines.open("w") as fh:
            for m in milestones:
                store = TrajectoryStore(tmp, "bench").open()
                while written < m:
                    batch = [base[i % len(base)].model_copy(update={"head": f"head-{i // len(base):05d}", "seed": i})
                             for i in range(written, min(m, written + 2000))]
                    store.append(batch)
                    fh.write("".join(tr.model_dump_json() + "\n" for tr in batch))
                    written += len(batch)
                store.close()
                opens[m] = measure_open(tmp, base, m)
        write_s = time.perf_counter() - t0
        size_db = sum(p.stat().st_size for p in Path(tmp).glob("bench.sqlite*"))
        size_lines = lines.stat().st_size
        t0 = time.perf_counter()
        every = [Trajectory.model_validate_json(x) for x in lines.read_bytes().splitlines()]
        read_lines_s = time.perf_counter() - t0
    print(f"written in {write_s:.1f}s (store and JSON lines together); {len(every):,} JSON lines read back; "
          f"load average now {os.getloadavg()[0]:.2f}")
    print("| sessions stored | open the store + first lookup (median of 5) | one lookup by key (median) |")
    print("|---|---|---|")
    for m, (open_s, look_s, _) in opens.items():
        print(f"| {m:,} | {open_s * 1000:.1f} ms | {look_s * 1e6:.0f} us |")
    print(f"size at {args.sessions:,} sessions: store {size_db / 2**20:.1f} MiB (SQLite, zlib, turn texts once) vs "
          f"{size_lines / 2**20:.1f} MiB as JSON lines; reading the JSON lines whole (what opening meant before) "
          f"took {read_lines_s:.1f} s")


def measure_open(root: str, base: list[Trajectory], n: int) -> tuple[float, float, float]:
    """(open + first lookup, one lookup, -) medians over 5 tries, on a store holding n sessions."""
    import statistics

    def key(j: int):
        tr = base[j % len(base)]
        return trajectory_key(tr.task_id, f"head-{j // len(base):05d}", j, True)

    opens, looks = [], []
    for r in range(5):
        t0 = time.perf_counter()
        s = TrajectoryStore(root, "bench").open()
        found = s.get(key((n - 1 - r * 97) % n))
        opens.append(time.perf_counter() - t0)
        assert found is not None
        for i in range(200):
            t0 = time.perf_counter()
            s.get(key((i * 7919 + r) % n))
            looks.append(time.perf_counter() - t0)
        s.close()
    return statistics.median(opens), statistics.median(looks), 0.0


if __name__ == "__main__":
    main()
