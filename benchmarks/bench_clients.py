"""Throughput of the real worker path: 2,000 calls to a stub server with 100 ms latency at
concurrency 32, through `make_http_client` + `collect_partition` (grading and the fsync'ed
partition file included). Ideal: 2,000 x 0.1 s / 32 = 6.25 s.

    python benchmarks/bench_clients.py                  # stub in its own process
    python benchmarks/bench_clients.py --stub-thread    # stub in a thread of this process
    python benchmarks/bench_clients.py --ledger         # every paid call also appended to the cost ledger

`--ledger` also times the ledger's append alone (`CostLedger.append`: flock, one write, fsync) per
call, and prints what it adds to the run.

The stub runs in its own process by default: in a thread it shares this process's GIL and its
CPU time would be charged to the client. The client side costs about 2-3 ms of CPU per call,
most of it inside httpx/httpcore, so at 320 calls/s the run needs most of one core; on a busy
machine the ratio measures the spare CPU as much as the code.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fugu_pipeline.collect.partition import collect_partition  # noqa: E402
from fugu_pipeline.collect.store import ResponseStore  # noqa: E402
from fugu_pipeline.ledger import CostLedger, verify_ledger  # noqa: E402
from fugu_pipeline.tasks.schema import Task  # noqa: E402
from fugu_pipeline.testing.stub_llm import StubLLMServer  # noqa: E402
from fugu_pipeline.workers.config import WorkersConfig  # noqa: E402
from fugu_pipeline.workers.http import make_http_client  # noqa: E402


@contextmanager
def stub_server(latency: float, separate: bool):
    if not separate:
        with StubLLMServer(latency_s=latency) as s:
            s.record_requests = False
            yield s.base_url
        return
    proc = subprocess.Popen([sys.executable, "-m", "fugu_pipeline.testing.stub_llm", "--latency", str(latency)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--no-stream", action="store_true", help="plain JSON replies instead of SSE")
    ap.add_argument("--stub-thread", action="store_true", help="run the stub server in a thread of this process")
    ap.add_argument("--ledger", action="store_true", help="append every call to a hash-chained cost ledger too")
    args = ap.parse_args()
    os.environ.setdefault("OPENROUTER_API_KEY", "sk-or-v1-bench")
    tasks = [Task(task_id=f"t{i}", prompt=f"Compute {i} times 3.", domain="math", reference_answer=str(3 * i),
                  grader={"type": "numeric"}) for i in range(args.calls)]
    with stub_server(args.latency, not args.stub_thread) as base, tempfile.TemporaryDirectory() as tmp:
        cfg = WorkersConfig.model_validate({"workers": [{
            "id": "bench", "kind": "openrouter", "model": "bench/model", "base_url": base + "/api/v1",
            "max_concurrency": args.concurrency}]})
        client = make_http_client(cfg.worker("bench"), cfg, stream=not args.no_stream)
        ledger = CostLedger(Path(tmp) / "costs.jsonl") if args.ledger else None
        t0, cpu0 = time.perf_counter(), time.process_time()
        stats = asyncio.run(collect_partition(tasks, "bench", "bench", cfg, ResponseStore(tmp), client=client, ledger=ledger))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if ledger is not None:
            ledger.close()
            lines = verify_ledger(Path(tmp) / "costs.jsonl").lines
            with CostLedger(Path(tmp) / "alone.jsonl") as alone:  # the append by itself, one call at a time
                a0 = time.perf_counter()
                for i in range(500):
                    alone.append("collection", 0.001, worker_id="bench", task_id=f"t{i}", ref="bench")
                per_append = (time.perf_counter() - a0) / 500
    ideal = args.calls * args.latency / args.concurrency
    mode = "thread in this process" if args.stub_thread else "separate process"
    print(f"{stats.n_ok} ok, {stats.n_failed} failed of {args.calls} calls; stub: {mode}; "
          f"{'json' if args.no_stream else 'sse'} replies")
    print(f"CPU used by this process during the run: {cpu:.2f} s ({1000 * cpu / args.calls:.2f} ms per call), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"total {elapsed:.2f} s, ideal {ideal:.2f} s, ratio {elapsed / ideal:.3f}")
    if args.ledger:
        print(f"ledger: {lines} lines, chain verified; one append alone (flock, write, fsync) {1000 * per_append:.2f} ms")


if __name__ == "__main__":
    main()
