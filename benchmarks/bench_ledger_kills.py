"""kill -9 at random instants during `fugu-lite generate`, then the books: did the cost ledger miss a
paid call, or count one twice?

    python benchmarks/bench_ledger_kills.py                          # 20 kills, this code
    python benchmarks/bench_ledger_kills.py --kills 20 --before DIR  # and another version's

A stub OpenAI-style worker server on 127.0.0.1 (`testing/stub_llm.py`, OpenRouter-style: it bills
`usage.cost`) answers two paid workers; it counts every request it receives: the calls made.
`generate --resume` runs in a child process (with this checkout's code, or `--before`'s: a source
tree of another version, e.g. `git archive BASE fugu_pipeline | tar -x -C DIR`), and is killed with
SIGKILL a random 0-`--max-delay-s` seconds after its first request reaches the server, `--kills`
times; a last run completes the batch. Then, per task, the calls the server saw against the
ledger's `collection` lines:

    missing          calls the server saw with no line (a paid call the ledger never learns of)
    extra            lines with no call the server saw (a call announced, killed before it was sent)
    same call twice  call ids with two lines (this code's lines carry the call's id)
    worst case       lines of calls in flight at a kill, counted at their worst-case cost
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repo's packages

import yaml  # noqa: E402

from benchmarks.machine import describe  # noqa: E402
from fugu_pipeline.ledger import read_entries  # noqa: E402
from fugu_pipeline.testing.stub_llm import StubLLMServer  # noqa: E402

PRICE_IN, PRICE_OUT = 1e-5, 2e-5
MODELS = {"a": "test/model-a", "b": "test/model-b"}


def write_project(folder: Path, url: str, n_tasks: int, concurrency: int) -> tuple[Path, Path]:
    worker = {"kind": "openrouter", "base_url": url, "max_tokens": 50, "max_concurrency": concurrency,
              "max_price_in_per_mtok": PRICE_IN * 1e6, "max_price_out_per_mtok": PRICE_OUT * 1e6}
    raw = {"max_attempts": 1, "workers": [{"id": w, "model": m, **worker} for w, m in MODELS.items()]}
    (folder / "w.yaml").write_text(yaml.safe_dump(raw))
    rows = [{"task_id": f"t{i}", "prompt": f"What is {i} plus 1000?", "domain": "math", "split": "train",
             "reference_answer": str(1000 + i), "grader": {"type": "numeric"}} for i in range(n_tasks)]
    (folder / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "w.yaml", folder / "t.jsonl"


def run_case(code: Path, args, rng: random.Random) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-kills-") as tmp, StubLLMServer(latency_s=args.latency_s) as stub:
        folder = Path(tmp)
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # a killed client's request cut short: expected
        stub.answer_fn = lambda model, prompt: f"The answer is {1000 + int(prompt.split()[2])}"
        for m in MODELS.values():
            stub.add_model(m, prompt=PRICE_IN, completion=PRICE_OUT)
        workers, tasks = write_project(folder, stub.openrouter_url, args.tasks, args.concurrency)
        env = {**os.environ, "PYTHONPATH": str(code), "OPENROUTER_API_KEY": "sk-or-v1-" + "cd" * 20,
               "FUGU_COLLECTOR_KEY_FILE": str(folder / "key" / "collector.key"), "FUGU_TEST_CRASH_AT": ""}
        cmd = [sys.executable, "-m", "fugu_pipeline.cli", "generate", "--workers", str(workers), "--tasks", str(tasks),
               "--output", str(folder / "r.jsonl"), "--ledger", str(folder / "costs.jsonl"), "--resume"]
        kills = 0
        while True:
            seen = len(stub.chat_requests())
            proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if kills < args.kills:
                while proc.poll() is None and len(stub.chat_requests()) == seen:
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, args.max_delay_s))
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    kills += 1
            if proc.wait() == 0 and kills >= args.kills:
                break
            if proc.returncode == 0:  # finished before the kill: nothing left to kill
                break
        made: Counter = Counter()
        for (_, prompt), n in stub.calls.items():
            made[f"t{int(prompt.split()[2])}"] += n
        lines = [e for e in read_entries(folder / "costs.jsonl") if e.kind == "collection"]
        counted = Counter(e.task_id for e in lines)
        twice = sum(n - 1 for (call, _), n in Counter((e.call, e.kind) for e in lines if e.call).items() if n > 1)
        return {"kills": kills, "made": sum(made.values()), "lines": len(lines),
                "missing": sum(max(0, n - counted[t]) for t, n in made.items()),
                "extra": sum(max(0, n - made[t]) for t, n in counted.items()),
                "twice": twice, "worst": sum(e.worst_case for e in lines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=200, help="tasks (two workers answer each)")
    ap.add_argument("--concurrency", type=int, default=4, help="calls in flight per worker")
    ap.add_argument("--latency-s", type=float, default=0.05, help="the stub's answer time")
    ap.add_argument("--max-delay-s", type=float, default=0.5, help="a kill lands 0 to this long after the first call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--before", default=None, help="a source tree of another version (holds fugu_pipeline/)")
    args = ap.parse_args()
    print(describe())
    print(f"{args.tasks} tasks x {len(MODELS)} paid workers, {args.concurrency} calls in flight per worker, stub answers "
          f"in {args.latency_s:g} s, a kill 0-{args.max_delay_s:g} s after a run's first call")
    print(f"{'code':8s} {'kills':>5s} {'calls made':>10s} {'ledger lines':>12s} {'missing':>7s} {'extra':>5s} "
          f"{'same call twice':>15s} {'worst case':>10s}")
    codes = ([("before", Path(args.before).resolve())] if args.before else []) + [("this", ROOT)]
    for name, code in codes:
        r = run_case(code, args, random.Random(args.seed))
        print(f"{name:8s} {r['kills']:5d} {r['made']:10d} {r['lines']:12d} {r['missing']:7d} {r['extra']:5d} "
              f"{r['twice']:15d} {r['worst']:10d}")


if __name__ == "__main__":
    main()
