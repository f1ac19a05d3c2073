"""A one-step head under a cap, held out: what serves (λ following the spend, `route/follow.py`)
against one λ, the one the calibration's rule chooses for the cap with its margin.

    python benchmarks/cap_tracking.py --checkpoint models/<head>/<hash> --data rows.jsonl \
        [--caps 0.2,0.33,0.5]

The held-out rows of an import with recorded costs (JSONL with quality, cost_usd, split) are routed
by the loaded router, `route_batch` under the cap, in traffic order (`follow.traffic_order`), as
`evaluate` replays them; the one λ routes every row at the calibration's choice. Printed per cap:
each way's held-out accuracy, its difference from the calibration's reference worker alone, and
its actual spend as a share of that worker's held-out cost (the follower follows the expected
cost; the actual cost is what the cap is judged by here), and the time `route_batch` took under the
cap against the same call with no cap (the head's plain route), both with their encoder pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a one-shot head with its budget.json")
    ap.add_argument("--data", required=True, help="the import it was trained on (JSONL with quality, cost_usd, split)")
    ap.add_argument("--caps", default="0.2,0.33,0.5", help="shares of the reference worker's cost")
    args = ap.parse_args(argv)
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.route.budget import BudgetError
    from fugu_pipeline.route.follow import traffic_order

    with open(args.data, encoding="utf-8") as f:  # by "\n" only: a reply may hold U+2028, which splitlines() splits at
        rows = [json.loads(line) for line in f if line.strip()]
    test = [r for r in rows if r["split"] == "test"]
    test = [test[k] for k in traffic_order([r["task_id"] for r in test])]
    router = load_router(args.checkpoint, device="cpu")
    cal = router.calibration
    if cal is None:
        raise SystemExit(f"{args.checkpoint}: no budget calibration beside it ({router.calibration_problem})")
    cols = [test[0]["worker_ids"].index(w) for w in router.worker_ids]
    Q = np.array([[r["quality"][i] for i in cols] for r in test], dtype=float)
    C = np.array([[r["cost_usd"][i] for i in cols] for r in test], dtype=float)
    prompts, domains = [r["prompt"] for r in test], [r.get("domain") for r in test]
    t0 = time.perf_counter()
    router.route_batch(prompts, domains, default_point=False)
    t_plain = time.perf_counter() - t0
    feats = router.encode(prompts, domains)
    ref = router.worker_ids.index(cal.reference_worker)
    ref_q, ref_c = Q[:, ref].mean(), C[:, ref].mean()
    rows_at = np.arange(len(test))
    print(f"{machine()}; {args.checkpoint}: {len(test)} held-out rows; {cal.reference_worker} alone {ref_q:.4f} "
          f"at ${ref_c * 1000:.4g} per 1,000; route_batch with no cap (the plain route) {t_plain:.2f} s")
    print("| cap | one λ (with the margin): accuracy (− reference), share | what serves, λ following the spend: "
          "accuracy (− reference), share | route_batch under the cap (s) |")
    print("|---|---|---|---|")
    for share in (float(s) for s in args.caps.split(",")):
        cap = CostCap(share=share)
        try:
            lam = cal.choose(cap).lam
        except BudgetError as exc:
            print(f"| {share:.0%} | {exc} | | |")
            continue
        w = router.lambda_scores(prompts, domains, lam, feats=feats)[0].argmax(axis=1)
        t0 = time.perf_counter()
        got = router.route_batch(prompts, domains, budget=cap)
        t_follow = time.perf_counter() - t0
        v = np.array([router.worker_ids.index(d.worker_id) for d in got])
        q, c, fq, fc = Q[rows_at, w], C[rows_at, w], Q[rows_at, v], C[rows_at, v]
        print(f"| {share:.0%} | {q.mean():.4f} ({q.mean() - ref_q:+.4f}), {c.mean() / ref_c:.4f} | "
              f"{fq.mean():.4f} ({fq.mean() - ref_q:+.4f}), {fc.mean() / ref_c:.4f} | {t_follow:.2f} |")
    router.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
