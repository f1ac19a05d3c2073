"""The cost-accuracy frontier of a cascade search, out of fold: what each cap buys on rows the plan
was not chosen on.

For each cap (a share of the strongest worker's expected cost, `SHARES`) and each fold, the search
(`search.candidate_plans`, expected costs of the other folds only) picks the most accurate
plan within the cap on the other folds; that plan runs on the held-out fold. Every non-test row then
has an out-of-fold accuracy and expected cost per cap. A cap some fold cannot meet has no point. The
frontier is the non-dominated points (no other point at most as dear and at least as accurate, one
of them strictly), cheapest first; each names the plan the same search picks on every non-test row
under that cap (what a request with that budget is served).
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.policies.cascade.search import CascadeSearch, candidate_plans, strongest

SHARES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.33, 0.4, 0.5, 0.6, 0.75, 1.0)


def plan_points(grid, rows, cfg, allowed, memo: dict | None = None) -> list[tuple[float, float, object]]:
    """(mean expected cost, mean quality, plan) of every plan the search holds, run on `rows`. `memo`
    keeps them by the rows: the cost-aware choice and the frontier search the same folds with the
    same grid (one `fit_cascade`), so each fold's plans run once."""
    key = np.asarray(rows).tobytes()
    if memo is not None and key in memo:
        return memo[key]
    out = []
    for plan in candidate_plans(grid, rows, cfg, allowed):
        q, c, _ = grid.run(plan, rows)
        out.append((float(c.mean()), float(q.mean()), plan))
    if memo is not None:
        memo[key] = out
    return out


def best_within(points, cap: float):
    """The most accurate point whose cost is within `cap` (ties: the cheaper, then the first), or None."""
    within = [p for p in points if within_cap(p[0], cap)]
    return max(within, key=lambda p: (p[1], -p[0])) if within else None


def non_dominated(points: list[dict]) -> list[dict]:
    """The points no other point dominates (cost at most, accuracy at least, one strictly), cheapest first."""
    keep = []
    for p in points:
        if not any((o["cost_usd"] <= p["cost_usd"] and o["quality"] >= p["quality"])
                   and (o["cost_usd"] < p["cost_usd"] or o["quality"] > p["quality"]) for o in points):
            keep.append(p)
    keep.sort(key=lambda p: (p["cost_usd"], -p["quality"]))
    out = []  # equal points: once
    for p in keep:
        if not out or (p["cost_usd"], p["quality"]) != (out[-1]["cost_usd"], out[-1]["quality"]):
            out.append(p)
    return out


def oof_frontier(grid_for, rows: np.ndarray, folds: np.ndarray, cfg: CascadeSearch, allowed=None,
                 shares=SHARES, per_row: bool = False, memo: dict | None = None) -> dict:
    """{"levels": one point per cap met by every fold, "frontier": the non-dominated ones, "plans":
    the plans searched per fold} (see the module docstring). `grid_for(fit_rows)` gives the search
    grid with expected costs from those rows; `folds` the fold of each of `rows`. `per_row`: also
    each level's out-of-fold quality and cost per row of `rows` (`per_row`: {share: (quality, cost)}).
    `memo`: see `plan_points`."""
    n = len(rows)
    qual = {s: np.zeros(n) for s in shares}
    cost = {s: np.zeros(n) for s in shares}
    met = {s: True for s in shares}
    considered = 0
    for f in np.unique(folds):
        tr, te, at = rows[folds != f], rows[folds == f], np.flatnonzero(folds == f)
        g = grid_for(tr)
        pts = plan_points(g, tr, cfg, allowed, memo)
        considered = max(considered, len(pts))
        ref = g.exp_cost[strongest(g, tr)]
        for s in shares:
            best = best_within(pts, s * ref) if met[s] else None
            if best is None:
                met[s] = False
                continue
            q, c, _ = g.run(best[2], te)
            qual[s][at], cost[s][at] = q, c
    g_all = grid_for(rows)
    ref_all = g_all.exp_cost[strongest(g_all, rows)]
    pts_all = plan_points(g_all, rows, cfg, allowed)
    levels = []
    for s in shares:
        if not met[s]:
            continue
        chosen = best_within(pts_all, s * ref_all)
        levels.append({"share": s, "cap_usd": float(s * ref_all), "quality": float(qual[s].mean()),
                       "cost_usd": float(cost[s].mean()), "cost_share": float(cost[s].mean() / max(ref_all, 1e-300)),
                       "plan": chosen[2].describe() if chosen else None,
                       "plan_spec": chosen[2].model_dump() if chosen else None})
    extra = {"per_row": {s: (qual[s], cost[s]) for s in shares if met[s]}} if per_row else {}
    return {**extra, "levels": levels, "frontier": non_dominated(levels), "plans_per_search": considered, "rows": int(n),
            "strongest_cost_usd": float(ref_all), "strongest": g_all.worker_ids[strongest(g_all, rows)],
            "strongest_quality": float(g_all.quality[rows, strongest(g_all, rows)].mean())}


def frontier_lines(front: dict | None) -> list[str]:
    """The frontier as printed lines: one row per non-dominated cap point."""
    if not front or not front.get("frontier"):
        return []
    out = [f"cost-accuracy frontier, out of fold over {front['rows']} non-test rows ({front['plans_per_search']} plans "
           f"searched per fold; {front['strongest']} alone: accuracy {front['strongest_quality']:.4f} at "
           f"${front['strongest_cost_usd'] * 1000:.4g} per 1,000):",
           "  | cap (share of the strongest's cost) | out-of-fold accuracy | $ per 1,000 requests | share | plan |"]
    for p in front["frontier"]:
        out.append(f"  | {p['share']:.0%} | {p['quality']:.4f} | {p['cost_usd'] * 1000:.4g} | {p['cost_share']:.1%} | "
                   f"{p['plan']} |")
    return out
