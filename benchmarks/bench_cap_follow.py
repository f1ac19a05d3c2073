"""How long `train`'s out-of-fold replay of a one-step head under caps takes (`route.budget.cap_route_oof`:
the non-test rows in traffic order through one follower per cap, each row at the λ of its fold's
curve and then settled by its recorded cost), against a floor measured in the same run: the same
curves drawn, each fold routed at one λ per cap in one vectorised argmax (what the replay did
before λ followed the spend).

    python benchmarks/bench_cap_follow.py [--rows 10000,100000] [--workers 4] [--caps 0.2,0.33,0.5]

Synthetic rows: uniform predicted quality, expected costs spread over two orders of magnitude
across the workers, each call's recorded cost within 20% of its expected cost, five folds. Printed
per size: both times, their ratio, and the mean recorded spend of each way as a share of the
reference worker's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import describe  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="10000,100000")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--caps", default="0.2,0.33,0.5", help="shares of the reference (dearest) worker's cost")
    args = ap.parse_args(argv)
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.route.budget import budget_scores, cap_route_oof, route_curve, smallest_within

    budgets = [CostCap(share=float(s)) for s in args.caps.split(",")]
    print(describe())
    print("| rows | caps | following the spend (s) | one λ per fold, same curves (s) | ratio | spend share, following / one λ |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.rows.split(",")):
        rng = np.random.default_rng(0)
        W = args.workers
        q = rng.random((n, W))
        c = rng.random((n, W)) * np.geomspace(0.03, 3.0, W) * 1e-3
        actual = c * (0.8 + 0.4 * rng.random((n, W)))  # what each call cost: the expected cost, give or take 20%
        ref, folds, order = W - 1, np.arange(n) % 5, rng.permutation(n)
        c_ref = float(c[:, ref].mean())
        t0 = time.perf_counter()
        followed = cap_route_oof(q, c, c_ref, ref, folds, budgets, order, actual=actual)
        t_follow = time.perf_counter() - t0
        t0 = time.perf_counter()
        fixed = [np.zeros(n, dtype=np.int64) for _ in budgets]
        for f in np.unique(folds):
            tr = folds != f
            curve = route_curve(q[tr], c[tr], c_ref, ref)
            for k, b in enumerate(budgets):
                fixed[k][~tr] = np.argmax(budget_scores(q[~tr], c[~tr], smallest_within(curve, b).lam, c_ref), axis=1)
        t_floor = time.perf_counter() - t0
        share = lambda r: actual[np.arange(n), r].mean() / actual[:, ref].mean()  # noqa: E731
        shares = ", ".join(f"{share(a):.3f} / {share(b):.3f}" for a, b in zip(followed, fixed))
        print(f"| {n:,} | {len(budgets)} | {t_follow:.2f} | {t_floor:.2f} | {t_follow / t_floor:.1f} | {shares} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
