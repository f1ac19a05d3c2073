"""Benchmark the router trainers on synthetic cached features (not a test).

Prints, for SepCMA over the final layer of a layernorm_linear head:
  - wall time and generations/second of `train_es` (fitness on the train split every generation,
    the mean and the generation's best on val every `val_every` generations);
  - the time per generation of the batched population fitness (one matrix product for the whole
    population) against a per-candidate Python loop, and their ratio;
and SFT epochs/second on the same data.

    python benchmarks/bench_training.py                       # 10,000 x 1,024 x 4, 300 generations
    python benchmarks/bench_training.py --tasks 2000 --generations 50
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.policies.oneshot.configs import ESConfig, SFTConfig
from fugu_pipeline.policies.oneshot.es import population_fitness, train_es
from fugu_pipeline.policies.oneshot.sft import train_sft


def synthetic(n_train: int, n_val: int, dim: int, workers: int, seed: int) -> RoutingData:
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    domain = rng.integers(0, workers, n)
    centers = rng.normal(0.0, 1.0, (workers, dim))
    feats = (centers[domain] + rng.normal(0.0, 3.0, (n, dim))).astype(np.float32)
    p = np.full((workers, workers), 0.35) + np.eye(workers) * 0.5
    quality = (rng.random((n, workers)) < p[domain]).astype(np.float64)
    utility = quality - 0.1 * np.linspace(0.1, 0.5, workers)[None, :]
    ids = [f"t{i}" for i in range(n)]
    return RoutingData(
        task_ids=ids, prompts=ids, domains=[f"d{k}" for k in domain],
        splits=np.array(["train"] * n_train + ["val"] * n_val), worker_ids=[f"w{k}" for k in range(workers)],
        features=feats, utility=utility, contract=FeatureContract(encoder_id="synthetic", dim=dim),
    )


def loop_fitness(feats: np.ndarray, utility: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """The same fitness, one candidate at a time (the baseline the batched version replaces)."""
    n, k = feats.shape
    rows = np.arange(n)
    out = []
    for th in thetas:
        z = feats @ th.reshape(k, -1).astype(np.float32)
        out.append(utility[rows, z.argmax(axis=1)].mean())
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000, help="training tasks the fitness is computed over")
    ap.add_argument("--val-tasks", type=int, default=1_000)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--generations", type=int, default=300)
    ap.add_argument("--fitness-repeats", type=int, default=20, help="generations timed in the batched-vs-loop comparison")
    ap.add_argument("--sft-epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    print(f"cpu cores visible: {os.cpu_count()}, torch threads: {torch.get_num_threads()}, "
          f"numpy {np.__version__}, torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")
    data = synthetic(args.tasks, args.val_tasks, args.dim, args.workers, args.seed)
    train = data.split("train")
    print(f"data: {args.tasks:,} train + {args.val_tasks:,} val tasks x {args.dim:,} features x {args.workers} workers")

    # --- SFT (also the warm start for ES); one warm-up epoch first (torch's first step pays one-off setup)
    train_sft(data, SFTConfig(epochs=1), log=lambda s: None)
    t = time.perf_counter()
    sft = train_sft(data, SFTConfig(epochs=args.sft_epochs, patience=args.sft_epochs), log=lambda s: None)
    dt = time.perf_counter() - t
    epochs = len(sft.curves["train_loss"])
    print(f"SFT: {epochs} epochs in {dt:.2f} s = {epochs / dt:.2f} epochs/s "
          f"(batch 64, {sft.param_count:,} params), val utility {sft.metrics['val_utility']:.4f}")

    # --- batched vs per-candidate fitness, on one population of the default size
    k = args.dim + 1
    n_params = k * args.workers
    pop = 4 + int(np.floor(3 * np.log(n_params)))
    rng = np.random.default_rng(args.seed)
    feats = np.concatenate([train.features, np.ones((len(train.features), 1), np.float32)], axis=1)
    thetas = rng.normal(0.0, 0.02, (pop + 1, n_params))  # population + the mean, as train_es scores them
    population_fitness(feats, train.utility, thetas)  # warm-up
    t = time.perf_counter()
    for _ in range(args.fitness_repeats):
        fb = population_fitness(feats, train.utility, thetas)
    batched = (time.perf_counter() - t) / args.fitness_repeats
    t = time.perf_counter()
    for _ in range(args.fitness_repeats):
        fl = loop_fitness(feats, train.utility, thetas)
    looped = (time.perf_counter() - t) / args.fitness_repeats
    print(f"fitness of {pop + 1} candidates ({n_params:,} weights each) over {args.tasks:,} tasks, "
          f"mean of {args.fitness_repeats} generations:")
    print(f"  batched (one matmul): {batched * 1e3:8.2f} ms/generation")
    print(f"  per-candidate loop:   {looped * 1e3:8.2f} ms/generation")
    print(f"  speed-up: {looped / batched:.1f}x; max |difference| {np.abs(fb - fl).max():.2e}")

    # --- the full SepCMA run
    cfg = ESConfig(generations=args.generations, seed=args.seed)
    t = time.perf_counter()
    es = train_es(data, cfg, init_state=sft.state_dict, log=lambda s: None)
    dt = time.perf_counter() - t
    print(f"SepCMA: {args.generations} generations, population {es.metrics['es_population_size']}, "
          f"{es.metrics['es_evolved_params']:,} evolved weights: {dt:.2f} s = {args.generations / dt:.2f} generations/s "
          f"({dt / args.generations * 1e3:.1f} ms/generation incl. ask/tell and val every {cfg.val_every})")
    print(f"  train fitness (mean) {es.curves['train_mean'][0]:.4f} -> {es.curves['train_mean'][-1]:.4f}; "
          f"val utility warm start {sft.metrics['val_utility']:.4f}, kept {es.metrics['es_selected']} "
          f"of generation {es.best_epoch}: {es.metrics['val_utility']:.4f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (other processes share these cores)")


if __name__ == "__main__":
    main()
