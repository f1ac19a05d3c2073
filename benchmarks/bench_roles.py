"""Benchmark the multi-turn coordinator's trajectory CMA-ES (not a test).

For each population size and turn limit, trains the roles head on the mock pool with role
behaviour (`configs/workers.mock-roles.yaml`) and the two task families, with a fresh trajectory
store, and prints generations per second of the CMA-ES loop (timed from the first generation to the
last, so the exploration rollouts and the model load are left out), with what a generation did:
sessions run (candidates + the mean, times tasks; equal heads run once), worker calls actually made
(turns repeated across candidates come from the turn memo), and transcripts encoded (the rest are
read from memory).

    python benchmarks/bench_roles.py                                  # tiny encoder, populations 8/17/34, turns 1/3/5
    python benchmarks/bench_roles.py --populations 17 --turns 5 --generations 20 --encoder tiny
    python benchmarks/bench_roles.py --populations 17 --turns 5 --svf both   # seconds per generation with and without SVF

With `--svf both` every row runs twice, without and with the SVF adapter (`svf: true`), on the same
tasks and seeds, and prints the ratio: SVF's cost per generation against none.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from fugu_pipeline.policies.coordinator.project import open_run, roles_encoder_settings, split
from fugu_pipeline.features.encoder import Encoder
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.policies.coordinator.train import RolesConfig, train_roles
from fugu_pipeline.workers.config import load_workers_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo's benchmarks package
from benchmarks.machine import describe  # noqa: E402


def machine() -> str:
    return f"{describe()}; torch {torch.__version__} with {torch.get_num_threads()} thread(s), Python {platform.python_version()}"


def run_one(enc, config, tasks, population: int, turns: int, generations: int, batch: int, svf: bool = False) -> dict:
    cfg = RolesConfig(generations=generations, population_size=population, max_turns=turns, tasks_per_generation=batch,
                      explore_tasks=8, val_every=10**6, val_tasks=8, max_length=enc.settings.max_length, svf=svf)
    stamps: list[float] = []

    def log(line: str) -> None:
        if line.startswith("roles generation") and not line.startswith("roles generation   0"):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as store, open_run(config, enc.settings, Path(store), tasks, cfg, encoder=enc) as run:
        f = run.featurizer
        t_start = time.perf_counter()
        train_roles(run.runner, f, config.worker_ids, split(tasks, "train"), split(tasks, "val"), cfg, log=log)
        wall = time.perf_counter() - t_start
        calls = sum(run.caller.calls.values())
        sessions = run.runner.stats.sessions_run
        encoded = f.encoded
    gen_s = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return {"population": population, "turns": turns, "gen_per_s": 1.0 / gen_s, "s_per_gen": gen_s, "wall_s": wall,
            "sessions": sessions, "calls": calls, "encoded": encoded}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", default="tiny", help="tiny, or a local model directory")
    ap.add_argument("--populations", type=int, nargs="+", default=[8, 17, 34])
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--tasks-per-generation", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is best on a shared CPU)")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--svf", choices=["off", "on", "both"], default="off", help="with the SVF adapter; both: each row twice")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    enc = Encoder.load(roles_encoder_settings(args.encoder, args.max_length, device="cpu", dtype="float32"))
    config = load_workers_config(REPO / "configs" / "workers.mock-roles.yaml")
    tasks = [Task.model_validate(r) for r in roles_batch(100)]
    print(f"machine: {machine()}")
    print(f"encoder: {enc.describe()}")
    print(f"workers: {len(config.worker_ids)} mock workers with roles; {args.tasks_per_generation} tasks x 1 seed per "
          f"generation; {args.generations} generations per row; fresh trajectory store per row")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.svf]
    print(f"{'population':>10} {'max turns':>9} {'svf':>4} {'gen/s':>7} {'s/gen':>7} {'sessions/gen':>12} {'calls/gen':>9} "
          f"{'encoded/gen':>11}")
    for turns in args.turns:
        for pop in args.populations:
            per = {}
            for svf in modes:
                r = run_one(enc, config, tasks, pop, turns, args.generations, args.tasks_per_generation, svf)
                g = args.generations
                per[svf] = r["s_per_gen"]
                print(f"{pop:>10} {turns:>9} {'on' if svf else 'off':>4} {r['gen_per_s']:>7.2f} {r['s_per_gen']:>7.2f} "
                      f"{r['sessions'] / g:>12.0f} {r['calls'] / g:>9.0f} {r['encoded'] / g:>11.0f}", flush=True)
            if len(per) == 2:
                print(f"{'':>10} {'':>9} SVF costs {per[True] / per[False]:.2f}x the seconds per generation of no SVF "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
