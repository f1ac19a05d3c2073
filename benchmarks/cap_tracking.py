"""A one-step head under a cap, held out: what serves (λ following the spend, `route/follow.py`)
against one λ, the one the calibration's rule chooses for the cap with its margin.

    python benchmarks/cap_tracking.py --checkpoint models/<head>/<hash> --data rows.jsonl \
        [--caps 0.2,0.33,0.5] [--batch 8] [--price 1.5]

The held-out rows of an import with recorded costs (JSONL with quality, cost_usd, split) are routed
by the loaded router in traffic order (`follow.traffic_order`), as `evaluate` replays them:
`route_batch` under the cap, `--batch` prompts at a time (requests in flight together), each batch's
replies then settling their follower with the recorded cost of the worker each was routed to
(`Router.record_spend`, as `serve` settles a reply). The one λ routes every row at the
calibration's choice. Printed per cap: each way's held-out accuracy, its difference from the
calibration's reference worker alone, and its actual spend as a share of that worker's held-out
cost (the cap is judged by what the calls cost). `--price` adds a run in which every call costs that
many times what was recorded (prices raised after training: the cost model does not know), shares
still of the recorded cost. Then the time of the routing under the cap against the plain route
(no cap) in the same batches; each prompt is encoded once beforehand, so both time the routing
after the encoder.
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
    ap.add_argument("--batch", type=int, default=8, help="prompts routed together before their replies settle")
    ap.add_argument("--price", type=float, default=1.5, help="a second run with every call this many times dearer")
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
    batches = [range(a, min(a + args.batch, len(test))) for a in range(0, len(test), args.batch)]
    feats = router.encode(prompts, domains)  # each prompt encoded once: the runs below time the routing itself
    row_of = {(p, d): k for k, (p, d) in enumerate(zip(prompts, domains))}

    def served(cap, price: float = 1.0) -> tuple[np.ndarray, float]:
        """(each row's worker, seconds): routed a batch at a time, each reply settling its follower."""
        from fugu_pipeline.policies.registry import load_router as fresh

        r = fresh(args.checkpoint, device="cpu")  # followers start at the target
        r.encode = lambda ps, ds: feats[[row_of[(p, d)] for p, d in zip(ps, ds)]]
        out, t0 = np.zeros(len(test), dtype=int), time.perf_counter()
        for rows in batches:
            got = r.route_batch([prompts[k] for k in rows], [domains[k] for k in rows], budget=cap,
                                default_point=cap is not None)
            for k, d in zip(rows, got):
                out[k] = r.worker_ids.index(d.worker_id)
                r.record_spend(d, price * C[k, out[k]])
        took = time.perf_counter() - t0
        r.close()
        return out, took

    _, t_plain = served(None)
    ref = router.worker_ids.index(cal.reference_worker)
    ref_q, ref_c = Q[:, ref].mean(), C[:, ref].mean()
    rows_at = np.arange(len(test))
    print(f"{machine()}; {args.checkpoint}: {len(test)} held-out rows, {args.batch} at a time; {cal.reference_worker} "
          f"alone {ref_q:.4f} at ${ref_c * 1000:.4g} per 1,000; the plain route (no cap) {t_plain:.2f} s")
    print("| cap | one λ (with the margin): accuracy (− reference), share | what serves, λ following the spend: "
          f"accuracy (− reference), share | the same, every call ×{args.price:g}: accuracy (− reference), share | "
          "routing under the cap (s) |")
    print("|---|---|---|---|---|")
    for share in (float(s) for s in args.caps.split(",")):
        cap = CostCap(share=share)
        try:
            lam = cal.choose(cap).lam
        except BudgetError as exc:
            print(f"| {share:.0%} | {exc} | | | |")
            continue
        w = router.lambda_scores(prompts, domains, lam, feats=feats)[0].argmax(axis=1)
        v, t_follow = served(cap)
        u, _ = served(cap, args.price)
        cells = []
        for way, price in ((w, 1.0), (v, 1.0), (u, args.price)):
            q, c = Q[rows_at, way], price * C[rows_at, way]
            cells.append(f"{q.mean():.4f} ({q.mean() - ref_q:+.4f}), {c.mean() / ref_c:.4f}")
        print(f"| {share:.0%} | {' | '.join(cells)} | {t_follow:.2f} |")
    router.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
