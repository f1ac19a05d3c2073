"""How long a default `fugu-lite train` takes as the import grows (1k, 10k, 100k rows), against a
floor measured in the same run on the same rows.

The import: a synthetic reward-matrix JSONL of `rows` prompts over four domains and four mock
workers (a cheap generalist, two dear specialists, a middling one); each prompt is built from word
lists and numbers, so prompts are distinct, and the math prompts end with a shared instruction line
(the prompt rules find it, so `train` chooses between the prompts as they are and stripped, as on
real imports); a worker's chance of being right depends on its domain skill and on the prompt's
difficulty (the size of its numbers), so routing has something to learn. Quality, cost and latency
per call; the utility weights of `configs/workers.mock.yaml` (`--weights quality`: the quality-only
weights of `configs/reward.quality.yaml`, as imports are trained, which adds each head's default
operating point). No replies: the cascade step is
skipped, so the figure is the heads' (encoding, the feature choice, the head families, the
ensemble, calibration).

Per size, each in a fresh process (so its peak RSS is its own):
  - train: `fugu-lite train --encoder tiny` (the built-in tiny Qwen3, offline) with a cold cache,
    the default `configs/train.yaml`: wall time and peak RSS;
  - floor: the same prompts encoded once by the bare tiny encoder (no cache, one layer setting),
    then a numpy least-squares fit of the quality on those features and one cosine kNN (k = 30) of
    every row against the training rows: what any router over these features has to pay at least.

    nice -n 10 .venv/bin/python benchmarks/bench_train_scale.py --sizes 1000 10000 100000

prints one line per size and the machine; `--timeout` (seconds per train run) stops a size that
runs too long and says how far it got (the last line its log reached).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repo's packages
DOMAINS = ("math", "code", "general", "trivia")
WORKERS = {  # id: (skill per domain, cost per call in USD, latency in s)
    "cheap-generalist": ((0.70, 0.50, 0.80, 0.60), 0.0004, 1.0),
    "math-specialist": ((0.95, 0.60, 0.65, 0.55), 0.0060, 2.5),
    "code-specialist": ((0.60, 0.95, 0.60, 0.55), 0.0080, 3.0),
    "mid-all-rounder": ((0.80, 0.75, 0.75, 0.85), 0.0025, 2.0),
}
NAMES = "Ana Bo Chen Dara Eli Femi Goro Hana Ivo Jun Kai Lena Milo Nia Omar Pia".split()
ITEMS = "apples books coins marbles stamps pencils shells cards tickets bricks".split()
NOUNS = "list dict tuple string set integer generator iterator class decorator".split()
TOPICS = "river mountain planet painter composer empire novel element bridge festival".split()
MATH_LINE = "Answer with a single number and nothing else."


def prompt(rng: np.random.Generator, domain: str) -> tuple[str, float]:
    """(prompt text, difficulty in [0, 1]): bigger numbers and longer chains are harder."""
    a, b, c = (int(x) for x in rng.integers(2, 10 ** rng.integers(1, 5), size=3))
    hard = float(min(1.0, np.log10(max(a, b, c)) / 4))
    name, item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    if domain == "math":
        return f"{name} has {a} {item}, buys {b} more and gives away {c}. How many {item} are left?\n{MATH_LINE}", hard
    if domain == "code":
        noun = NOUNS[rng.integers(len(NOUNS))]
        return f"In Python, write a function that takes a {noun} of {a} items and returns the {b % 7 + 1}th largest.", hard
    topic = TOPICS[rng.integers(len(TOPICS))]
    if domain == "general":
        return f"Explain in {a % 5 + 2} sentences why a {topic} matters to {name}, for a reader aged {b % 60 + 10}.", hard
    return f"Which {topic} is number {a} on the list {name} wrote in {1800 + b % 220}?", hard


def write_import(path: Path, rows: int, seed: int = 0) -> None:
    """The synthetic reward-matrix JSONL of `rows` rows (splits train 60 %, val 15 %, test 25 %)."""
    rng = np.random.default_rng(seed)
    ids = list(WORKERS)
    skill = np.array([WORKERS[w][0] for w in ids])  # (W, D)
    cost = np.array([WORKERS[w][1] for w in ids])
    lat = np.array([WORKERS[w][2] for w in ids])
    splits = np.array(["train"] * 12 + ["val"] * 3 + ["test"] * 5)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            d = int(rng.integers(len(DOMAINS)))
            text, hard = prompt(rng, DOMAINS[d])
            p = np.clip(skill[:, d] - 0.35 * hard * (1.2 - skill[:, d]), 0.02, 0.99)
            q = (rng.random(len(ids)) < p).astype(float)
            f.write(json.dumps({
                "task_id": f"syn-{i:07d}", "prompt": text, "domain": DOMAINS[d], "split": str(splits[i % len(splits)]),
                "worker_ids": ids, "quality": q.tolist(),
                "cost_usd": np.round(cost * (0.8 + 0.4 * rng.random(len(ids))), 6).tolist(),
                "latency_s": np.round(lat * (0.8 + 0.4 * rng.random(len(ids))), 3).tolist()}) + "\n")


def run_measured(cmd: list[str], log: Path, timeout: float) -> tuple[float, float, int | None]:
    """(wall seconds, peak RSS in MiB, exit status or None when stopped at `timeout`) of `cmd`."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                return time.perf_counter() - t0, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)
            if time.perf_counter() > deadline:
                proc.kill()
                _, _, usage = os.wait4(proc.pid, 0)
                return time.perf_counter() - t0, usage.ru_maxrss / 1024, None
            time.sleep(0.2)


def last_line(log: Path) -> str:
    text = log.read_text(errors="replace").replace("\r", "\n")
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:200] if lines else "(nothing logged)"


def floor(data: Path) -> dict:
    """The bare work over the same rows: encode each distinct prompt once, a least-squares fit, a kNN."""
    import torch

    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings

    rows = [json.loads(x) for x in data.read_text(encoding="utf-8").splitlines()]
    prompts = [r["prompt"] for r in rows]
    quality = np.array([r["quality"] for r in rows])
    train = np.array([r["split"] == "train" for r in rows])
    t0 = time.perf_counter()
    enc = Encoder.load(EncoderSettings(model="tiny"))
    distinct = sorted(set(prompts), key=len, reverse=True)
    vec = {}
    for s in range(0, len(distinct), 512):
        chunk = distinct[s:s + 512]
        vec.update(zip(chunk, enc.encode_texts(chunk)))
    x = np.stack([vec[p] for p in prompts]).astype(np.float64)
    t1 = time.perf_counter()
    xa = np.hstack([x, np.ones((len(x), 1))])
    np.linalg.lstsq(xa[train], quality[train], rcond=None)
    t2 = time.perf_counter()
    xn = torch.nn.functional.normalize(torch.from_numpy(x.astype(np.float32)), dim=-1)
    bank, k = xn[torch.from_numpy(train)], min(30, int(train.sum()))
    for s in range(0, len(xn), 4096):
        torch.topk(xn[s:s + 4096] @ bank.T, k, dim=1)
    t3 = time.perf_counter()
    return {"encode_s": t1 - t0, "lstsq_s": t2 - t1, "knn_s": t3 - t2, "dim": int(x.shape[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per train run (default 1800)")
    ap.add_argument("--work", default=None, help="folder for the imports, caches and models (default: a temporary one)")
    ap.add_argument("--weights", choices=("mock", "quality"), default="mock",
                    help="mock: the utility weights of configs/workers.mock.yaml (cost priced, so no default operating "
                         "point); quality: configs/reward.quality.yaml, as imports are trained (each head also gets "
                         "its default operating point, checked inside the folds)")
    ap.add_argument("--floor-of", default=None, help=argparse.SUPPRESS)  # the floor, in its own process
    args = ap.parse_args()
    if args.floor_of:
        print(json.dumps(floor(Path(args.floor_of))))
        return
    from benchmarks.machine import describe

    print(f"machine: {describe()}")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-train-scale-"))
    exe = str(Path(sys.executable).with_name("fugu-lite"))
    for n in args.sizes:
        d = work / f"rows-{n}"
        d.mkdir(parents=True, exist_ok=True)
        data = d / "import.jsonl"
        write_import(data, n)
        weights = ROOT / ("configs/workers.mock.yaml" if args.weights == "mock" else "configs/reward.quality.yaml")
        cmd = [exe, "train", "--data", str(data), "--workers", str(weights), "--encoder", "tiny",
               "--cache-dir", str(d / "cache"), "--work-dir", str(d / "work"), "--output", str(d / "models")]
        wall, rss, rc = run_measured(cmd, d / "train.log", args.timeout)
        fwall, frss, frc = run_measured([sys.executable, __file__, "--floor-of", str(data)], d / "floor.log", args.timeout)
        fl = json.loads(last_line(d / "floor.log")) if frc == 0 else None
        state = "done" if rc == 0 else (f"stopped after {args.timeout:.0f}s at: {last_line(d / 'train.log')}"
                                        if rc is None else f"exit {rc}: {last_line(d / 'train.log')}")
        floor_s = f"floor {fwall:.1f}s (encode {fl['encode_s']:.1f}s, lstsq {fl['lstsq_s']:.2f}s, kNN {fl['knn_s']:.2f}s; " \
                  f"dim {fl['dim']}), peak RSS {frss:.0f} MiB" if fl else f"floor failed: {last_line(d / 'floor.log')}"
        ratio = f", {wall / fwall:.1f}x the floor" if fl and rc == 0 else ""
        print(f"{n:>7,} rows: train {wall:.1f}s, peak RSS {rss:.0f} MiB ({state}){ratio}; {floor_s}", flush=True)
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
