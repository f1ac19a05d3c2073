"""The cost-aware choice of what ships, and the per-benchmark table at fixed caps (numpy only).

The rule (`cascade.choose: cheapest`, the default where the utility gives cost no weight): among
every policy scored out of fold on the non-test rows (cascades chosen under a ladder of caps, the
one-shot heads, and always the strongest worker), ship the **cheapest** whose accuracy is not
significantly below always the strongest worker's:

- the per-row accuracy difference policy − strongest has a paired bootstrap 95% interval whose
  upper end reaches 0 (not significantly below), and
- its mean is within `cascade.margin` (0.005: half a point) of the strongest's.

Always the strongest worker meets both (its difference is 0 on every row), so something always
qualifies; when it is the only one, it ships and the reason line says why and what would help.

- `ladder_fold`: for one fold, every plan of the search run once on the other folds' rows, then
  for each cap share the most accurate plan within it (ties: the cheaper), run on this fold.
- `cap_table`: accuracy and $ per 1,000 with 95% intervals of one-shot, cascade, plans per group
  sharing the cap (where the fit has groups) and the strongest alone at each cap share (20%, 33%,
  50% of the strongest's cost). Each row is scored as that share serves when a request asks it:
  the one-shot row is the selected head, λ following the spend on the curve drawn on the other
  folds (`route.budget.cap_route_oof`); the cascade rows are the saved points following the spend
  (`follow_fold.py`).
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.train.selection import interval

LADDER = (0.1, 0.15, 0.2, 0.25, 0.33, 0.4, 0.5, 0.65, 0.8, 1.0)  # shares of the strongest worker's expected cost
TABLE_SHARES = (0.2, 0.33, 0.5)
GROUPED = "plans per group"  # the table's row of plans per domain or prompt cluster sharing the cap (groups.share_cap)


def rung_name(share: float) -> str:
    return f"cascade ≤ {share:.0%} of the strongest's cost"


def ladder_fold(grid, tr: np.ndarray, te: np.ndarray, search_cfg, allowed, shares, ref_cost: float,
                memo: dict | None = None, z: float = 0.0):
    """{share: (quality, expected cost) per row of `te`, or None where no plan fits the share}: the
    most accurate plan within each share of `ref_cost` on `tr` (its mean expected cost plus `z`
    standard errors; ties: the cheaper), run on `te`. `memo`: `plans.points_for`'s."""
    from fugu_pipeline.policies.cascade.frontier import best_within
    from fugu_pipeline.policies.cascade.plans import RowSet, points_for

    pts = points_for(grid, tr, search_cfg, allowed, memo)
    held = RowSet(grid, te)
    out = {}
    for s in shares:
        i = best_within(pts, s * ref_cost, z)
        out[s] = None if i is None else held.run(pts.plans[i])[:2]
    return out


def cap_table(per_row: dict[str, tuple[np.ndarray, np.ndarray] | None], strongest: tuple[np.ndarray, np.ndarray],
              shares=TABLE_SHARES, n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Rows of the per-benchmark table. `per_row`: {"cascade@<share>" / "one-shot@<share>" / "plans per
    group@<share>": (quality, cost) per row, or None}; `strongest`: (quality, cost) of always the
    strongest worker."""
    sq, sc = strongest
    ref = float(sc.mean()) if len(sc) else 0.0
    out = []

    def row(policy: str, share, got):
        if got is None:
            out.append({"share": share, "policy": policy, "n": int(len(sq)), "accuracy": None, "usd_per_1k": None,
                        "share_of_strongest": None, "minus_strongest": None, "note": "no plan within the cap"})
            return
        q, c = got
        a = interval(q, n_boot, seed)
        k = interval(np.asarray(c) * 1000, n_boot, seed)
        d = interval(np.asarray(q) - sq, n_boot, seed)
        out.append({"share": share, "policy": policy, "n": int(len(q)), "accuracy": a, "usd_per_1k": k,
                    "share_of_strongest": float(np.mean(c) / ref) if ref > 0 else None, "minus_strongest": d, "note": ""})

    row("strongest alone", None, strongest)
    for s in shares:
        for kind in ("one-shot", "cascade", GROUPED):
            key = f"{kind}@{s}"
            if key in per_row:
                row(kind, s, per_row[key])
    return out


def table_lines(rows: list[dict], title: str) -> list[str]:
    """The table as printed lines (markdown)."""
    fmt = lambda t, f: "—" if t is None else f"{t[0]:{f}} [{t[1]:{f}}, {t[2]:{f}}]"  # noqa: E731
    out = [title, "| cap (share of the strongest's cost) | policy | accuracy [95%] | $ per 1,000 [95%] | "
                  "share of the strongest's cost | accuracy − strongest [95%] |", "|---|---|---|---|---|---|"]
    for r in rows:
        cap = "none" if r["share"] is None else f"{r['share']:.0%}"
        share = "—" if r["share_of_strongest"] is None else f"{r['share_of_strongest']:.0%}"
        out.append(f"| {cap} | {r['policy']} | {fmt(r['accuracy'], '.4f')} | {fmt(r['usd_per_1k'], '.4g')} | {share} | "
                   f"{fmt(r['minus_strongest'], '+.4f') if r['share'] is not None else '0'} |"
                   + (f" {r['note']}" if r["note"] else ""))
    return out
