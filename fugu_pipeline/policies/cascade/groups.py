"""Plans per kind of prompt: a plan, or one worker, per domain (or, for an import without domains,
per prompt cluster), chosen out of fold by the rule the pooled policy is chosen by, per group and
for the whole.

One plan for every row hides a saving one kind of prompt allows: on a mixed import a cheap model
may tie the strongest on code while multiple choice needs the strongest, and a pooled plan, which
must keep the strongest's accuracy on all rows at once, pays for the strongest everywhere. Each
domain with at least `search.min_domain_rows` non-test rows gets its own candidates, out of fold
(per fold, searched on the domain's rows of the other folds, run on its rows of this fold):

- the domain's ladder: the most accurate plan on the domain's rows within each share of the
  strongest worker's expected cost (`choice.LADDER`);
- the domain's own strongest worker alone (the most accurate on its rows of the other folds);
- the pooled candidates (the pooled ladder's plans and always the strongest worker), on its rows.

Per domain the cheapest candidate not significantly below always the strongest worker on the
domain's rows is kept (`train.selection.cheapest_not_below`: paired 95% interval reaching 0, mean
within `cascade.margin`), and, a domain's rows being few, its interval's low end no further below
than `cascade.group_floor` (0.02, the whole's floor): on 89 rows an interval that reaches 0 can
reach down 7 points, and a plan that only ties the strongest there was 15 points below it on the
held-out rows of a real import; at 0.05 a 90-row code cluster still passed where the cheap worker is
6 points below the strongest on the whole set. The whole (each row under its domain's choice, the smaller domains under
the pooled plan) must pass the same test against the strongest on every row; while it does not, the
domain furthest below the strongest moves to its next dearer qualifying candidate (always the
strongest qualifies on every domain, so this ends). Domains too small are merged into the pooled
plan, with one line naming them. A domain unseen in training is served the pooled plan.

Groups without domains (`cascade.groups: auto` on an import that names fewer than two domains, or
`cluster`): the prompt clusters of `train/clusters.py` (k-means over the frozen encoder's prompt
features of the non-test rows, used only where they stand apart from one Gaussian blob by
`cascade.cluster_min_gap`, or the workers do differently on them, and where they hold across the
folds: refitted without each fold's rows, they put that fold's rows where the clusters of every row
do (`train.clusters.fold_agreement`)). Each cluster is a group as a domain is; a checkpoint that plans per
cluster saves the centroids, and serving puts each prompt in its nearest cluster.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.train.groups import GroupChoice, Option, group_label, merged_line, split_groups
from fugu_pipeline.train.groups import choose_groups as _choose_groups
from fugu_pipeline.train.groups import fold_tops_note
from fugu_pipeline.train.selection import STRONGEST

__all__ = ["GroupChoice", "Option", "STRONGEST", "choose_groups", "group_label", "merged_line", "split_groups",
           "group_fold", "GROUP_STRONGEST", "group_rung", "fold_tops_note", "allocate", "fill_parts", "share_cap",
           "shared_figures", "shared_policy"]

GROUP_STRONGEST = "the domain's strongest worker alone"


def group_rung(share: float) -> str:
    return f"its own cascade ≤ {share:.0%} of the strongest's cost"


def group_fold(grid, tr: np.ndarray, te: np.ndarray, doms: np.ndarray, groups: list[str], search_cfg, allowed,
               usable: list[int], shares, ref_cost: float, memo: dict | None = None, tops: dict | None = None) -> dict:
    """{(domain, name): (quality, expected cost) per row of te in that domain, or None}: each
    domain's ladder (`group_rung(share)`) and its own strongest worker alone (`GROUP_STRONGEST`),
    chosen on its rows of `tr` (its index appended to `tops[domain]`)."""
    from fugu_pipeline.policies.cascade.frontier import best_within
    from fugu_pipeline.policies.cascade.plans import RowSet, points_for

    out = {}
    for d in groups:
        tr_d, te_d = tr[doms[tr] == d], te[doms[te] == d]
        if not len(te_d):
            continue
        held = RowSet(grid, te_d)
        pts = points_for(grid, tr_d, search_cfg, allowed, memo)
        for s in shares:
            i = best_within(pts, s * ref_cost)
            out[(d, group_rung(s))] = None if i is None else held.run(pts.plans[i])[:2]
        top = usable[int(np.argmax(grid.quality[tr_d][:, usable].mean(axis=0)))]
        if tops is not None:
            tops.setdefault(d, []).append(top)
        out[(d, GROUP_STRONGEST)] = held.run((((top,), None, None),))[:2]
    return out


def choose_groups(*args, **kw) -> GroupChoice:
    """`train.groups.choose_groups` over a cascade's candidates: a domain's ladder rung, its own
    strongest worker alone, or a pooled candidate."""
    return _choose_groups(*args, spec_of=_spec, **kw)


def _spec(name: str) -> tuple:
    return ("alone", None) if name == GROUP_STRONGEST else ("rung", _share(name))


def _share(name: str) -> float:
    from fugu_pipeline.policies.cascade.choice import LADDER

    return next(s for s in LADDER if group_rung(s) == name)


# Under a pooled cap: the cap shared among the groups
#
# A cap a user sets is on what the whole traffic costs, not on each kind of prompt. One plan for every
# prompt must meet it on every kind at once; on a mix where a cheap worker ties the strongest on one
# kind and not on another, the cheap kind can be served for a tenth of the strongest's cost and the
# rest of the cap spent where it buys accuracy. `share_cap` picks one plan per group (and one for the
# rows of no group) so that the whole's accuracy is the highest whose expected cost bound (the
# row-weighted mean of the groups' costs plus `z` standard errors of that mean) is within the cap.


def allocate(quality: list[np.ndarray], cost: list[np.ndarray], cost_se: list[np.ndarray], weights, cap_usd: float,
             z: float) -> list[int] | None:
    """One index per group into its arrays (a plan's mean quality, mean cost and the cost's standard
    error on the group's rows) with the highest Σ w·quality whose Σ w·cost + z·sqrt(Σ w²·se²) is within
    `cap_usd` (ties: the cheaper); None when even the cheapest plans are not. The groups' Pareto plans
    are swept by a price on cost (each group's best quality − λ·cost, every λ where a group's choice
    changes), then single-group swaps that add accuracy within the cap are taken, best first, until
    none does (a multiple-choice knapsack: the sweep reaches its convex hull, the swaps the budget
    the hull leaves)."""
    from fugu_pipeline.cost_cap import within_cap

    w = np.asarray(weights, float)
    fronts = []
    for q, c in zip(quality, cost):
        keep, best = [], -np.inf
        for i in np.lexsort((-np.asarray(q), np.asarray(c))):  # cheapest first; a dearer plan must add accuracy
            if q[i] > best + 1e-12:
                keep.append(int(i))
                best = q[i]
        fronts.append(np.asarray(keep))
    Q = [np.asarray(q, float)[f] for q, f in zip(quality, fronts)]
    C = [np.asarray(c, float)[f] for c, f in zip(cost, fronts)]
    S = [np.asarray(s, float)[f] for s, f in zip(cost_se, fronts)]

    def bound(pick) -> float:
        tot = sum(w[g] * C[g][k] for g, k in enumerate(pick))
        return float(tot + z * np.sqrt(sum((w[g] * S[g][k]) ** 2 for g, k in enumerate(pick))))

    def total_q(pick) -> float:
        return float(sum(w[g] * Q[g][k] for g, k in enumerate(pick)))

    slopes = {float((Q[g][k + 1] - Q[g][k]) / (C[g][k + 1] - C[g][k]))
              for g in range(len(Q)) for k in range(len(Q[g]) - 1) if C[g][k + 1] > C[g][k]}
    best = None
    for lam in [np.inf, *sorted(slopes, reverse=True), 0.0]:
        pick = [0 if np.isinf(lam) else int(np.argmax(Q[g] - lam * C[g])) for g in range(len(Q))]
        if within_cap(bound(pick), cap_usd) and (best is None or total_q(pick) > total_q(best) + 1e-12):
            best = pick
    if best is None:
        return None
    for _ in range(sum(len(q) for q in Q)):  # each swap adds accuracy, so this ends
        top, gain = None, 1e-12
        for g in range(len(Q)):
            for k in range(len(Q[g])):
                trial = best[:g] + [k] + best[g + 1:]
                d = w[g] * (Q[g][k] - Q[g][best[g]])
                if d > gain and within_cap(bound(trial), cap_usd):
                    top, gain = trial, d
        if top is None:
            break
        best = top
    return [int(fronts[g][k]) for g, k in enumerate(best)]


def fill_parts(costs: dict[str, float], tops: dict[str, float], weights: dict[str, float], cap_usd: float) -> dict[str, float]:
    """Each group's part of `cap_usd`: its chosen point's cost (`costs`) scaled so that the parts,
    weighted by `weights`, add up to the cap, but never above what its dearest saved point costs
    (`tops`) over the follower's target share of a cap (`route/follow.TARGET`): a follower cannot
    spend more than that on average. What a group cannot spend goes to the others, in proportion
    to their costs (water-filling). A group whose point costs nothing gets nothing; where every
    group reaches its top, the parts add up to less than the cap."""
    from fugu_pipeline.route.follow import TARGET

    tops = {g: t / TARGET for g, t in tops.items()}
    parts = {g: 0.0 for g in costs}
    fixed: dict[str, float] = {}
    while True:
        free = [g for g in costs if g not in fixed and costs[g] > 0]
        left = cap_usd - sum(weights[g] * v for g, v in fixed.items())
        denom = sum(weights[g] * costs[g] for g in free)
        if not free or denom <= 0:
            break
        scale = max(left, 0.0) / denom
        over = [g for g in free if costs[g] * scale > tops[g]]
        if not over:
            parts.update({g: costs[g] * scale for g in free})
            break
        fixed.update({g: tops[g] for g in over})
    parts.update(fixed)
    return parts


def share_cap(grid, rows: np.ndarray, gdoms: np.ndarray, groups: list[str], search_cfg, allowed, cap_usd: float,
              z: float, memo: dict | None = None) -> dict | None:
    """{group: (plan, its Points, its index), "*": the same for the rows of no group} chosen on `rows`
    by `allocate` (each group's plans searched on its own rows, as `group_fold` searches them); the
    pooled plan within the cap serves "*" when every row is in a group (None when it has none). None
    when no choice of plans meets the cap."""
    from fugu_pipeline.policies.cascade.plans import points_for

    gd = np.asarray(gdoms, dtype=str)[rows]
    parts = [(d, rows[gd == d]) for d in groups if (gd == d).any()]
    rest = rows[~np.isin(gd, [d for d, _ in parts])]
    if len(rest):
        parts.append(("*", rest))
    pts = [points_for(grid, mine, search_cfg, allowed, memo) for _, mine in parts]
    got = allocate([p.quality for p in pts], [p.cost for p in pts], [p.cost_se for p in pts],
                   [len(mine) / len(rows) for _, mine in parts], cap_usd, z)
    if got is None:
        return None
    out = {d: (p.plans[i], p, i) for (d, _), p, i in zip(parts, pts, got)}
    if "*" not in out:
        p = points_for(grid, rows, search_cfg, allowed, memo)
        i = p.best("quality", p.within(cap_usd, z))
        out["*"] = (p.plans[i], p, i) if i is not None else None
    return out


def shared_figures(cf, name: str, groups: list[str], merged, gd: np.ndarray, clusters, n_boot: int,
                    seed: int) -> GroupChoice:
    """The plans sharing a pooled cap, out of fold on each group's rows against the strongest there
    (`GroupChoice.shared_cap`: what `train` prints per group under a cap). `cf`: the fit's
    `crossfit.CrossFit`."""
    from fugu_pipeline.train.selection import interval

    q, c = cf.quality[name], cf.cost[name]
    sq, sc = cf.quality[STRONGEST], cf.cost[STRONGEST]
    opts = {}
    for d in groups:
        at = gd == d
        m, lo, hi = interval(q[at] - sq[at], n_boot, seed)
        opts[d] = Option("its plan within the shared cap", float(q[at].mean()), float(c[at].mean()), m, lo, hi,
                         spec=("shared", None))
    split = GroupChoice(opts, merged, q, c, float(sc.mean()), {d: int((gd == d).sum()) for d in groups},
                        {d: float(sc[gd == d].mean()) for d in groups}, shared_cap=True)
    if clusters is not None:
        split.about, split.by = {d: f", e.g. {clusters.examples.get(d, '')!r}" for d in groups}, "prompt cluster"
    return split


def shared_policy(g_all, rows, gdoms, groups, cfg, cap_usd, allowed, memo, split):
    """(policy, {group or "*": Choice}, {group: its part of the cap}): the plans `groups.share_cap`
    picks on every non-test row within the pooled cap, and each group's part of it (its plan's
    expected cost, scaled so that the parts weighted by the groups' rows add up to the cap; `fit`
    shares the cap among the saved points instead where some choice of them keeps it:
    `spend.saved_parts`); CapUnmet when no plans meet the cap there."""
    from fugu_pipeline.policies.cascade.policy import CascadePolicy
    from fugu_pipeline.policies.cascade.search import CapUnmet, choice_at

    got = share_cap(g_all, rows, gdoms, groups, cfg.search, allowed, cap_usd, cfg.cap.margin_z, memo)
    if got is None or got["*"] is None:
        raise CapUnmet(f"no plans per group meet the cap of ${cap_usd * 1000:.4g} per 1,000 requests on every "
                       "non-test row")
    choices = {d: choice_at(pts, i, g_all.worker_ids) for d, (_, pts, i) in got.items()}
    per = {d: choices[d].plan for d in got if d != "*"}
    split.plans = {d: p.describe() for d, p in per.items()}
    gd = np.asarray(gdoms, dtype=str)[rows]
    weight = {d: float((gd == d).mean()) for d in per}
    weight["*"] = 1.0 - sum(weight.values())
    had = [d for d in weight if d in choices]
    filled = fill_parts({d: choices[d].cost for d in had},
                        {d: max([choices[d].cost, *(float(p["cost_usd"]) for p in choices[d].frontier)]) for d in had},
                        weight, cap_usd)
    parts = {d: filled[d] for d in per if filled.get(d, 0.0) > 0}
    return CascadePolicy(default=choices["*"].plan, per_domain=per), choices, parts
