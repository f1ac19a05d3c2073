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

from fugu_pipeline.policies.cascade.plans import RowSet, points_for, to_model, uses_verifier
from fugu_pipeline.policies.cascade.search import CAP_Z, CascadeSearch, strongest

SHARES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.33, 0.4, 0.5, 0.6, 0.75, 1.0)


def best_within(pts, cap: float, z: float = 0.0) -> int | None:
    """The most accurate plan of `pts` (`plans.Points`) whose mean expected cost plus `z` standard
    errors is within `cap` (ties: the cheaper, then the first), or None."""
    return pts.best("quality", pts.within(cap, z))


def intervals(columns: list[np.ndarray], n_boot: int, seed: int = 0, chunk: int = 100) -> list[list[float]]:
    """The bootstrap 95% interval of the mean of each per-row vector of `columns` (the same rows),
    the same resamples for all, drawn `chunk` at a time (a resample matrix of every row at once
    would hold n_boot x rows indices; each resample's mean is its row counts times the columns)."""
    if not columns:
        return []
    X = np.stack(columns, axis=1).astype(float)
    n = len(X)
    if n < 2:
        return [[float(X[:, k].mean())] * 2 if n else [float("nan")] * 2 for k in range(X.shape[1])]
    rng = np.random.default_rng(seed)
    means = []
    for b in range(0, n_boot, chunk):
        m = min(chunk, n_boot - b)
        idx = rng.integers(0, n, size=(m, n)) + (np.arange(m) * n)[:, None]
        means.append(np.bincount(idx.ravel(), minlength=m * n).reshape(m, n) @ X / n)  # each resample's row counts
    means = np.concatenate(means)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return [[float(a), float(b)] for a, b in zip(lo, hi)]


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
                 shares=SHARES, per_row: bool = False, memo: dict | None = None, z: float = CAP_Z,
                 n_boot: int = 2000, seed: int = 0) -> dict:
    """{"levels": one point per cap met by every fold, "frontier": the non-dominated ones, ...} (see
    the module docstring). `grid_for(fit_rows)` gives the search grid with expected costs from those
    rows; `folds` the fold of each of `rows`. A plan is within a cap when its mean expected cost plus
    `z` standard errors is, on the rows it is chosen on. Each level holds its plan (`plan_spec`,
    searched on every row of `rows`), whether it reads the verifier, its out-of-fold accuracy and
    cost with 95% intervals. `per_row`: also each level's out-of-fold quality and cost per row of
    `rows` ({share: (quality, cost)}). `memo`: `plans.points_for`'s."""
    n = len(rows)
    qual = {s: np.zeros(n) for s in shares}
    cost = {s: np.zeros(n) for s in shares}
    met = {s: True for s in shares}
    considered = 0
    for f in np.unique(folds):
        tr, te, at = rows[folds != f], rows[folds == f], np.flatnonzero(folds == f)
        g = grid_for(tr)
        pts = points_for(g, tr, cfg, allowed, memo)
        held = RowSet(g, te)
        considered = max(considered, len(pts.plans))
        ref = g.exp_cost[strongest(g, tr)]
        for s in shares:
            i = best_within(pts, s * ref, z) if met[s] else None
            if i is None:
                met[s] = False
                continue
            q, c, _ = held.run(pts.plans[i])
            qual[s][at], cost[s][at] = q, c
    g_all = grid_for(rows)
    top = strongest(g_all, rows)
    ref_all = g_all.exp_cost[top]
    pts_all = points_for(g_all, rows, cfg, allowed, memo)
    levels = []
    kept = [s for s in shares if met[s]]
    bounds = intervals([qual[s] for s in kept] + [cost[s] for s in kept], n_boot, seed)
    for s in kept:
        i = best_within(pts_all, s * ref_all, z)
        plan = None if i is None else to_model(pts_all.plans[i], g_all.worker_ids)
        levels.append({"share": s, "cap_usd": float(s * ref_all), "quality": float(qual[s].mean()),
                       "cost_usd": float(cost[s].mean()), "cost_share": float(cost[s].mean() / max(ref_all, 1e-300)),
                       "quality_interval": bounds[kept.index(s)], "cost_interval": bounds[len(kept) + kept.index(s)],
                       "plan": plan.describe() if plan else None, "plan_spec": plan.model_dump() if plan else None,
                       "uses_verifier": bool(i is not None and uses_verifier(pts_all.plans[i])),
                       # the plan's own figures on every row of `rows` (what a served cap compares)
                       **({"fit_cost_usd": float(pts_all.cost[i]), "fit_cost_se": float(pts_all.cost_se[i]),
                           "fit_quality": float(pts_all.quality[i])} if i is not None else {})})
    extra = {"per_row": {s: (qual[s], cost[s]) for s in shares if met[s]}} if per_row else {}
    return {**extra, "levels": levels, "frontier": non_dominated(levels), "plans_per_search": considered, "rows": int(n),
            "cap_z": z, "strongest_cost_usd": float(ref_all), "strongest": g_all.worker_ids[top],
            "strongest_quality": float(g_all.quality[rows, top].mean())}


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
