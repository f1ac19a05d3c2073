"""A one-shot head under a cap: the λ its budget calibration chooses (what serves), against a trial
where λ follows the spend so far, on the held-out rows of an import with recorded costs.

    python benchmarks/cap_tracking.py --checkpoint models/<head>/<hash> --data rows.jsonl \
        [--caps 0.2,0.33,0.5] [--horizon 50] [--target 0.98]

The served λ is the smallest whose mean expected cost plus `margin_z` standard errors on the
calibration's rows is within the cap (`route/budget.py`). On new rows the head can spend far less
than the cap: the margin, and prompts whose predicted gains differ from the calibration's. The trial
serves the rows one at a time in traffic order (`spend.traffic_order`, as `evaluate` runs a
cascade's guard), each at the λ the calibration chooses, with no margin, for an effective cap that
moves with the spend so far, both ways:

    effective cap = cap · target − (spent − n · cap · target) / horizon, within [cap / 4, 4 · cap]

(`follow`). Printed per cap: each way's held-out accuracy, its difference from the calibration's
reference worker alone, and its spend as a share of that worker's held-out cost. A trial: nothing
serves this way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402


def follow(order: np.ndarray, cap_usd: float, horizon: float, target: float,
           route_at: Callable[[int, float], tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost) of each row served in `order`, row k at `route_at(k, effective cap)` (see the
    module docstring), in the rows' own indexing."""
    goal = cap_usd * target
    quality, cost = np.zeros(len(order)), np.zeros(len(order))
    spent = 0.0
    for n, k in enumerate(order):
        eff = min(4 * cap_usd, max(cap_usd / 4, goal - (spent - n * goal) / horizon))
        quality[k], cost[k] = route_at(int(k), eff)
        spent += cost[k]
    return quality, cost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a one-shot head with its budget.json")
    ap.add_argument("--data", required=True, help="the import it was trained on (JSONL with quality, cost_usd, split)")
    ap.add_argument("--caps", default="0.2,0.33,0.5", help="shares of the reference worker's cost")
    ap.add_argument("--horizon", type=float, default=50.0)
    ap.add_argument("--target", type=float, default=0.98, help="the share of the cap the trial aims its spend at")
    args = ap.parse_args(argv)
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.cascade.spend import traffic_order
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.route.budget import BudgetError

    with open(args.data, encoding="utf-8") as f:  # by "\n" only: a reply may hold U+2028, which splitlines() splits at
        rows = [json.loads(line) for line in f if line.strip()]
    test = [r for r in rows if r["split"] == "test"]
    router = load_router(args.checkpoint, device="cpu")
    cal = router.calibration
    if cal is None:
        raise SystemExit(f"{args.checkpoint}: no budget calibration beside it ({router.calibration_problem})")
    cols = [test[0]["worker_ids"].index(w) for w in router.worker_ids]
    Q = np.array([[r["quality"][i] for i in cols] for r in test], dtype=float)
    C = np.array([[r["cost_usd"][i] for i in cols] for r in test], dtype=float)
    prompts, domains = [r["prompt"] for r in test], [r.get("domain") for r in test]
    feats = router.encode(prompts, domains)
    ref = router.worker_ids.index(cal.reference_worker)
    ref_q, ref_c = Q[:, ref].mean(), C[:, ref].mean()
    order = traffic_order([r["task_id"] for r in test])
    print(f"{machine()}; {args.checkpoint}: {len(test)} held-out rows; {cal.reference_worker} alone {ref_q:.4f} "
          f"at ${ref_c * 1000:.4g} per 1,000")
    print("| cap | served λ: accuracy (− reference), share | λ following the spend: accuracy (− reference), share |")
    print("|---|---|---|")
    for share in (float(s) for s in args.caps.split(",")):
        try:
            lam = cal.choose(CostCap(share=share)).lam
        except BudgetError as exc:
            print(f"| {share:.0%} | {exc} | |")
            continue
        s, _ = router.lambda_scores(prompts, domains, lam, feats=feats)
        w = s.argmax(axis=1)
        q, c = Q[np.arange(len(w)), w], C[np.arange(len(w)), w]

        def route_at(k: int, eff: float) -> tuple[float, float]:
            point = cal.choose(CostCap(usd_per_1k=eff * 1000, margin_z=0), strict=False)
            j = int(router.lambda_scores(prompts[k:k + 1], domains[k:k + 1], point.lam, feats=feats[k:k + 1])[0][0].argmax())
            return Q[k, j], C[k, j]

        fq, fc = follow(order, share * cal.reference_cost_usd, args.horizon, args.target, route_at)
        print(f"| {share:.0%} | {q.mean():.4f} ({q.mean() - ref_q:+.4f}), {c.mean() / ref_c:.3f} | "
              f"{fq.mean():.4f} ({fq.mean() - ref_q:+.4f}), {fc.mean() / ref_c:.3f} |")
    router.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
