"""After `fugu-lite train` (and the `router_heads` asset) save the one-shot heads: each head's budget
calibration (`budget.json`) with, where the utility gives cost no weight and the matrix records
cost, its default operating point (`default_point.py`: the cheapest λ-routing not significantly
below always the strongest worker, out of fold; a point per domain, or per prompt cluster, where that is
cheaper)."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.cost_cap import CostCap
from fugu_pipeline.route.budget import LAMBDAS, calibrate_beside, cap_route_oof
from fugu_pipeline.policies.oneshot.default_point import choose_default_route, default_lines
from fugu_pipeline.route.default_point import DEFAULT_FLOOR, DEFAULT_MARGIN, DefaultPoint
from fugu_pipeline.route.follow import traffic_order
from fugu_pipeline.train.clusters import DEFAULT_CLUSTER_MIN_GAP
from fugu_pipeline.train.groups import DEFAULT_GROUP_FLOOR, DEFAULT_MIN_DOMAIN_ROWS


def applies(data) -> str:
    """'' when the default operating point is chosen for `data`, else why not (one phrase)."""
    uc = data.utility_config
    if data.quality is None:
        return "the matrix holds no per-worker quality (rewards only)"
    if uc is not None and uc.cost_weight != 0:
        return "the utility prices cost (its argmax already trades quality for cost)"
    if data.cost_usd is None or not np.any(np.nan_to_num(data.cost_usd[data.splits != "test"]) > 0):
        return "the matrix records no cost (nothing is cheaper than anything)"
    return ""


def calibrate_saved(saved, data, log=print, *, margin: float = DEFAULT_MARGIN, n_boot: int = 2000,
                    seed: int = 0, routes: dict | None = None, floor: float | None = DEFAULT_FLOOR, groups: str = "auto",
                    min_rows: int = DEFAULT_MIN_DOMAIN_ROWS, min_gap: float = DEFAULT_CLUSTER_MIN_GAP,
                    group_floor: float = DEFAULT_GROUP_FLOOR, cap=None, cap_routes: dict | None = None,
                    shares: tuple = (), share_routes: dict | None = None) -> DefaultPoint | None:
    """Every saved head's budget calibration (`budget.calibrate_beside`, `budget.json` beside it) and,
    where `applies`, its default operating point in that file; what `fugu-lite train` and the
    `router_heads` asset both run after saving the heads. Returns the selected head's point (its
    lines logged), or None. `routes` (a dict, when given) receives each head's out-of-fold route at
    its point over the non-test rows, by head name: the route the cascade's choice scores it at. The
    rule's settings (`floor`, `groups`, `min_rows`, `min_gap`, `group_floor`) are the cascade block's:
    one rule, one set of settings, for the cascade's choice and the default point. `cap` (a pooled
    `CostCap`, the cascade's): `cap_routes` receives the selected head's out-of-fold route at the λ
    its calibration's rule chooses for that cap on the other folds, following the spend as it serves
    (`budget.cap_route_oof`), what its
    candidate "at the cap" is scored at (none where some fold cannot meet the cap; the selected head
    only: one router at the cap, not one per head, each a draw more for the best out-of-fold
    figure to be lucky on). `share_routes` receives the selected head's route the same way at each
    of `shares` (shares of the reference worker's cost; None where some fold meets it at no λ): the
    one-shot row of the cascade's table at caps."""
    why_not = applies(data)
    chosen = None
    for s in saved:
        # drawn on every non-test row with its out-of-fold quality (a refitted head), else on validation
        cal = calibrate_beside(s.path, data, log, q_oof=s.oof_quality)
        if cal is None or s.oof_quality is None or s.oof_folds is None:
            continue
        rows = np.flatnonzero(data.splits != "test")
        q_oof = np.clip(np.nan_to_num(np.asarray(s.oof_quality, np.float64)), 0.0, 1.0)
        c_hat = cal.cost_model.predict([data.prompts[i] for i in rows], [data.domains[i] for i in rows])
        ref, folds = list(data.worker_ids).index(cal.reference_worker), np.asarray(s.oof_folds)
        at_cap = cap is not None and cap_routes is not None
        if s.selected and (at_cap or share_routes is not None):  # one curve per fold for every cap it is scored at
            asked = ([cap] if at_cap else []) + ([CostCap(share=x) for x in shares] if share_routes is not None else [])
            got = cap_route_oof(q_oof, c_hat, cal.reference_cost_usd, ref, folds, asked,
                                traffic_order([data.task_ids[i] for i in rows]),
                                actual=None if data.cost_usd is None else np.asarray(data.cost_usd[rows], np.float64))
            if at_cap and got[0] is not None:
                cap_routes[s.name] = got[0]
            elif at_cap:
                log(f"one-shot {s.name} at the cap: no candidate (in some fold no λ keeps {cap.amount()} with its "
                    "margin on the other folds' rows)")
            if share_routes is not None:
                share_routes.update(zip(shares, got[int(at_cap):]))
        if why_not:
            continue
        point, route = choose_default_route(q_oof, data.quality[rows], c_hat, cal.reference_cost_usd, np.asarray(s.oof_folds),
                                            list(data.worker_ids), LAMBDAS, margin=margin, n_boot=n_boot, seed=seed,
                                            domains=[data.domains[i] for i in rows], log=log if s.selected else None,
                                            features=data.features[rows], prompts=[data.prompts[i] for i in rows],
                                            floor=floor, how=groups, min_rows=min_rows, min_gap=min_gap,
                                            group_floor=group_floor)
        cal.default = point
        if routes is not None:
            routes[s.name] = route
        cal.save(s.path)
        if s.selected:
            chosen = point
            for line in default_lines(point):
                log(line)
    if why_not and saved:
        log(f"default operating point: none ({why_not}); with no cap, the head's plain route is served")
    return chosen
