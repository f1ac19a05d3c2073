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
`cascade.cluster_min_gap`). Each cluster is a group as a domain is; a checkpoint that plans per
cluster saves the centroids, and serving puts each prompt in its nearest cluster.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.train.groups import GroupChoice, Option, group_label, merged_line, split_groups
from fugu_pipeline.train.groups import choose_groups as _choose_groups
from fugu_pipeline.train.groups import fold_tops_note
from fugu_pipeline.train.selection import STRONGEST

__all__ = ["GroupChoice", "Option", "STRONGEST", "choose_groups", "group_label", "merged_line", "split_groups",
           "group_fold", "GROUP_STRONGEST", "group_rung", "fold_tops_note"]

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
