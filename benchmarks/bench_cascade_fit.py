"""How long `fugu-lite train`'s cascade step takes as the matrix grows: `fit_cascade` with the default
`cascade:` settings (the cost-aware choice over the cap ladder, the out-of-fold frontier, the
verifier with the paid replies) on a synthetic multiple-choice matrix with recorded replies.

The matrix: `--rows` tasks, `--workers` workers whose accuracy rises from 0.55 to 0.85 and whose
cost rises 1,000-fold from the cheapest to the dearest; a right reply answers (A), a wrong one one
of (B), (C), (D) at random; each reply's features carry a noisy sign of being right; quality-only
weights (so the cost-aware default applies). Prompt features are random: no encoder is loaded, so
the figure is the search's and the verifier's own time.

    .venv/bin/python benchmarks/bench_cascade_fit.py --rows 4000 --workers 11

prints the wall time, the plans searched and what ships.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def synthetic(rows: int, workers: int, seed: int = 0):
    from fugu_pipeline.features.contract import FeatureContract
    from fugu_pipeline.features.routing_data import RoutingData
    from fugu_pipeline.matrix.answers import AnswerGrid
    from fugu_pipeline.reward import UtilityConfig
    from fugu_pipeline.policies.cascade.verifier import VerifierInputs

    rng = np.random.default_rng(seed)
    ids = [f"w{j}" for j in range(workers)]
    quality = (rng.random((rows, workers)) < np.linspace(0.55, 0.85, workers)).astype(float)
    wrong = np.array(["B", "C", "D"], dtype=object)[rng.integers(0, 3, size=(rows, workers))]
    final = np.where(quality > 0, "A", wrong).astype(object)
    text = np.array([[f"The answer is ({f})" for f in row] for row in final], dtype=object)
    prompt = rng.normal(size=(rows, 8)).astype(np.float32)
    answer = rng.normal(size=(rows, workers, 4)).astype(np.float32)
    answer[:, :, 0] += 2 * quality - 1
    cost = np.geomspace(1e-5, 1e-2, workers) * (0.9 + 0.2 * rng.random((rows, workers)))
    splits = np.array(["train", "train", "train", "val", "test"] * (rows // 5 + 1))[:rows]
    data = RoutingData(task_ids=[f"t{i:07d}" for i in range(rows)], prompts=[f"q {i}" for i in range(rows)],
                       domains=["mc"] * rows, splits=splits, worker_ids=ids, features=prompt, utility=quality.copy(),
                       contract=FeatureContract(encoder_id="synthetic", dim=8), quality=quality, cost_usd=cost,
                       latency_s=np.ones((rows, workers)),
                       utility_config=UtilityConfig(cost_weight=0.0, latency_weight=0.0))
    grid = AnswerGrid(list(data.task_ids), ids, text, ["choice"] * rows, final, "synthetic")
    inputs = VerifierInputs(prompt=prompt, answer=answer, has=np.ones((rows, workers), bool), target=quality)
    return data, grid, inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000, help="tasks in the matrix (default 2000)")
    ap.add_argument("--workers", type=int, default=11, help="workers (default 11)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from fugu_pipeline.policies.cascade.fit import fit_cascade

    data, grid, inputs = synthetic(args.rows, args.workers, args.seed)
    t0, cpu0 = time.perf_counter(), time.process_time()
    fit = fit_cascade(data, grid, inputs, log=lambda m: None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    plans = max((c.considered for c in fit.choices.values()), default=0)
    print(f"{args.rows} rows x {args.workers} workers: fit_cascade {wall:.1f} s wall, {cpu:.1f} s CPU; "
          f"{plans} plans searched on all non-test rows")
    print(f"ships {fit.selected}: {fit.reason}")


if __name__ == "__main__":
    main()
