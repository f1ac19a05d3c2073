"""The cost-aware pick checked inside the folds (numpy only).

The `cheapest` rule ships the cheapest of many candidates (the ladder's cascades, every one-shot head
at its default point, the plans per group) whose out-of-fold accuracy is not significantly below the
strongest worker's. Each candidate's figure is out of fold, but the pick is made among them on those
very rows: with a dozen candidates, the cheapest that passes is often the one whose rows happened to
favour it, and on new rows it is lower.

Under a pooled cap the pick is the most accurate candidate within the cap; `nested_capped` runs that
pick inside the folds the same way and is reported beside it (the user chose the cap, so it does not
veto: it says how much of the winner's margin was the luck of the rows it was picked on).

`nested_figure` runs the pick itself inside the folds: for each fold, the rule (and the choice per
group, with its default) picks among the candidates on the other folds' rows, and its pick's figures
on this fold's rows are kept. The result is what the procedure, not the one candidate it picked,
scores on rows it did not choose on. `fit.py` ships the pick only when that figure is not
significantly below the strongest's and its interval's low end stays above the floor
(`train.selection.holds_inside_folds`, which says why the margin is not read here).

Prompt clusters (groups of an import without domains) are fitted once, on every non-test row, and
not again per fold here: a cascade plans by them only where they hold across the folds
(`train.clusters.fold_agreement`: refitted without each fold's rows, they put at least 95% of that
fold's rows in the same cluster), so what this figure takes on trust is the few rows that move.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.policies.cascade.groups import choose_groups
from fugu_pipeline.train.groups import routed_by
from fugu_pipeline.train.selection import STRONGEST, Figure, cheapest_not_below, interval, intervals


def nested_figure(cands, cf, folds: np.ndarray, margin: float, floor: float | None, n_boot: int, seed: int,
                  per_name: str | None = None, group_args: dict | None = None) -> tuple[float, float, float, float]:
    """(mean, low, high) of the accuracy difference from always the strongest worker, and the mean
    expected cost, of the pick made per fold on the other folds (the module docstring). `cands`: the
    candidates (`ship.CandidateFigure`, notes as the pick reads them); `cf`: the cross-fit's per-row
    quality and cost; `per_name`: the candidate that plans per group, rebuilt per fold from
    `group_args` (`groups`, `merged`, `doms` of the rows, `per_group`, `group_floor`)."""
    sq = cf.quality[STRONGEST]
    n = len(sq)
    q, c = np.zeros(n), np.zeros(n)
    plain = [x for x in cands if x.name != per_name]
    for f in np.unique(folds):
        tr, at = folds != f, folds == f
        if not tr.any():
            return interval(cf.quality[STRONGEST] - sq, n_boot, seed) + (float(cf.cost[STRONGEST].mean()),)
        qs = np.stack([cf.quality[x.name][tr] for x in plain], axis=1)
        cs = np.stack([cf.cost[x.name][tr] for x in plain], axis=1)
        figs = intervals(qs - sq[tr][:, None], n_boot, seed)
        mine = [Figure(x.name, float(qs[:, k].mean()), float(cs[:, k].mean()), *map(float, figs[k]), note=x.note)
                for k, x in enumerate(plain)]
        got = None
        if per_name is not None and group_args is not None:
            pooled_figs = [m for m, x in zip(mine, plain) if x.kind != "one-shot"]
            default = cheapest_not_below(pooled_figs, STRONGEST, "", margin, int(tr.sum()), floor).name
            pooled = {m.name: (cf.quality[m.name][tr], cf.cost[m.name][tr]) for m in pooled_figs}
            per_group = {k: None if v is None else (v[0][tr], v[1][tr]) for k, v in group_args["per_group"].items()}
            got = choose_groups(group_args["groups"], group_args["merged"], group_args["doms"][tr], pooled, per_group,
                                default, margin, n_boot, seed, floor=group_args["group_floor"])
            d_m, d_lo, d_hi = interval(got.quality - sq[tr], n_boot, seed)
            mine.append(Figure(per_name, float(got.quality.mean()), float(got.cost.mean()), d_m, d_lo, d_hi))
        pick = cheapest_not_below(mine, STRONGEST, "", margin, int(tr.sum()), floor)
        if pick.name == per_name:
            pooled = {x.name: (cf.quality[x.name][at], cf.cost[x.name][at]) for x in plain}
            per_group = {k: None if v is None else (v[0][at], v[1][at]) for k, v in group_args["per_group"].items()}
            q[at], c[at] = routed_by(got.groups, group_args["doms"][at], pooled, per_group, default)
        else:
            q[at], c[at] = cf.quality[pick.name][at], cf.cost[pick.name][at]
    return interval(q - sq, n_boot, seed) + (float(c.mean()),)


def nested_capped(cands, cf, folds: np.ndarray, cap_usd: float, n_boot: int, seed: int) -> tuple[float, float, float, float]:
    """(mean, low, high) of the accuracy difference from always the strongest worker, and the mean
    cost, of the capped pick made per fold on the other folds: the most accurate candidate whose mean
    cost there is within `cap_usd` (ties: the cheaper; none: the cheapest, ties: the more accurate). `cands`: the candidates
    the pick read (`ship.CandidateFigure`; one unavailable in some fold is left out)."""
    from fugu_pipeline.cost_cap import within_cap

    sq = cf.quality[STRONGEST]
    q, c = np.zeros(len(sq)), np.zeros(len(sq))
    names = [x.name for x in cands if not x.note.startswith("unavailable")]
    for f in np.unique(folds):
        tr, at = folds != f, folds == f
        figs = [(float(cf.quality[k][tr].mean()), -float(cf.cost[k][tr].mean()), k) for k in names]
        ok = [x for x in figs if within_cap(-x[1], cap_usd)]
        pick = max(ok)[2] if ok else max(figs, key=lambda x: (x[1], x[0]))[2]
        q[at], c[at] = cf.quality[pick][at], cf.cost[pick][at]
    return interval(q - sq, n_boot, seed) + (float(c.mean()),)
