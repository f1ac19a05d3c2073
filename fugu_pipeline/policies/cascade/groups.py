"""Plans per kind of prompt: a plan, or one worker, per domain, chosen out of fold by the rule the
pooled policy is chosen by, per domain and for the whole.

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
than `cascade.group_floor` (0.05): on 89 rows an interval that reaches 0 can reach down 7 points, and
a plan that only ties the strongest there was 15 points below it on the held-out rows of a real
import. The whole (each row under its domain's choice, the smaller domains under
the pooled plan) must pass the same test against the strongest on every row; while it does not, the
domain furthest below the strongest moves to its next dearer qualifying candidate (always the
strongest qualifies on every domain, so this ends). Domains too small are merged into the pooled
plan, with one line naming them. A domain unseen in training is served the pooled plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.train.selection import STRONGEST, cheapest_not_below, interval

GROUP_STRONGEST = "the domain's strongest worker alone"


def group_rung(share: float) -> str:
    return f"domain cascade ≤ {share:.0%} of the strongest's cost"


@dataclass
class Option:
    """One candidate on one domain's rows (the fields `cheapest_not_below` reads), and what it is:
    `spec` ("rung", share) a plan of the domain's ladder, ("alone", None) its own strongest worker,
    ("pooled", name) a pooled candidate."""

    name: str
    spec: tuple
    quality: float
    cost_usd: float
    vs_strongest: float
    vs_low: float
    vs_high: float
    note: str = ""


@dataclass
class GroupChoice:
    groups: dict[str, Option]  # domain -> its choice
    merged: list[tuple[str, int]]  # (domain, non-test rows) served the pooled plan
    quality: np.ndarray  # out of fold per non-test row, every row under its domain's choice
    cost: np.ndarray
    strongest_cost: float  # always the strongest's mean out-of-fold cost (every row)
    rows_of: dict[str, int] = field(default_factory=dict)
    group_strongest_cost: dict[str, float] = field(default_factory=dict)
    stepped_up: list[str] = field(default_factory=list)  # domains moved to a dearer choice for the whole
    plans: dict[str, str] = field(default_factory=dict)  # domain -> the plan it is served (searched on every row)

    def table(self) -> list[dict]:
        return [{"domain": d, "rows": self.rows_of[d], "choice": o.name, "plan": self.plans.get(d, ""),
                 "spec": list(o.spec), "quality": o.quality,
                 "cost_usd": o.cost_usd, "cost_share": o.cost_usd / max(self.group_strongest_cost[d], 1e-300),
                 "vs_strongest": o.vs_strongest, "vs_low": o.vs_low, "vs_high": o.vs_high}
                for d, o in sorted(self.groups.items())]

    def lines(self) -> list[str]:
        out = [f"  domain {r['domain']!r} ({r['rows']} rows): {r['choice']}" + (f" = {r['plan']}" if r["plan"] else "")
               + f": accuracy {r['quality']:.4f}, "
               f"${r['cost_usd'] * 1000:.4g} per 1,000 = {r['cost_share']:.0%} of the strongest's cost there (saving "
               f"{1 - r['cost_share']:.0%}); accuracy − strongest {r['vs_strongest']:+.4f} [{r['vs_low']:+.4f}, "
               f"{r['vs_high']:+.4f}]" for r in self.table()]
        if self.stepped_up:
            out.append(f"  moved to a dearer choice so that the whole is not significantly below the strongest: "
                       f"{', '.join(repr(d) for d in self.stepped_up)}")
        return out


def split_groups(doms: np.ndarray, rows: np.ndarray, min_rows: int) -> tuple[list[str], list[tuple[str, int]]]:
    """(domains with at least `min_rows` of `rows`, [(domain, rows) of the others]), sorted."""
    names, counts = np.unique(np.asarray(doms, dtype=str)[rows], return_counts=True)
    kept = [str(d) for d, c in zip(names, counts) if c >= min_rows]
    return kept, [(str(d), int(c)) for d, c in zip(names, counts) if c < min_rows]


def merged_line(merged: list[tuple[str, int]], min_rows: int) -> str:
    shown = ", ".join(f"{d!r} ({c} rows)" for d, c in merged[:8]) + (f" and {len(merged) - 8} more" if len(merged) > 8 else "")
    return (f"cascade: domain(s) {shown} have fewer than {min_rows} non-test rows (cascade.search.min_domain_rows) to "
            "choose a plan out of fold: merged into the pooled plan")


def group_fold(grid, tr: np.ndarray, te: np.ndarray, doms: np.ndarray, groups: list[str], search_cfg, allowed,
               usable: list[int], shares, ref_cost: float, memo: dict | None = None) -> dict:
    """{(domain, name): (quality, expected cost) per row of te in that domain, or None}: each
    domain's ladder (`group_rung(share)`) and its own strongest worker alone (`GROUP_STRONGEST`),
    chosen on its rows of `tr`."""
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
        out[(d, GROUP_STRONGEST)] = held.run((((top,), None, None),))[:2]
    return out


def choose_groups(groups: list[str], merged: list[tuple[str, int]], doms: np.ndarray, pooled: dict,
                  per_group: dict, default: str, margin: float, n_boot: int, seed: int = 0,
                  floor: float = 0.05) -> GroupChoice:
    """The per-domain choice (see the module docstring). `doms`: the domain of each non-test row;
    `pooled`: {name: (quality, cost) per non-test row} of the pooled candidates, `STRONGEST` among
    them; `per_group`: {(domain, name): (quality, cost) per non-test row, zeros outside the domain}
    (None: unavailable in some fold); `default`: the pooled candidate the merged domains take."""
    sq, sc = pooled[STRONGEST]
    options: dict[str, list[Option]] = {}
    choice: dict[str, Option] = {}
    for d in groups:
        at = doms == d
        cands = [(name, ("pooled", name), v) for name, v in pooled.items()]
        cands += [(name, ("alone", None) if name == GROUP_STRONGEST else ("rung", _share(name)), v)
                  for (g, name), v in per_group.items() if g == d]
        opts = []
        for name, spec, v in cands:
            if v is None:
                continue
            q, c = v[0][at], v[1][at]
            m, lo, hi = interval(q - sq[at], n_boot, seed)
            wide = name != STRONGEST and lo < -floor  # too few rows to tell it from a worse policy
            opts.append(Option(name, spec, float(q.mean()), float(c.mean()), m, lo, hi,
                               f"unavailable: its interval reaches {lo:+.4f}, below -{floor:g} (cascade.group_floor)"
                               if wide else ""))
        pick = cheapest_not_below(opts, STRONGEST, "", margin, int(at.sum()))
        options[d] = sorted([o for o in opts if o.name in pick.qualified], key=lambda o: (o.cost_usd, -o.quality))
        choice[d] = next(o for o in opts if o.name == pick.name)
    q, c = pooled[default][0].copy(), pooled[default][1].copy()
    stepped: list[str] = []
    while True:
        for d, o in choice.items():
            v = pooled[o.name] if o.spec[0] == "pooled" else per_group[(d, o.name)]
            q[doms == d], c[doms == d] = v[0][doms == d], v[1][doms == d]
        m, lo, hi = interval(q - sq, n_boot, seed)
        if hi >= 0 and m >= -margin:
            break
        d = min((d for d in choice if options[d].index(choice[d]) < len(options[d]) - 1),
                key=lambda d: choice[d].vs_strongest, default=None)
        if d is None:  # every domain at its dearest qualifying choice: always the strongest everywhere
            choice = {d: next(o for o in options[d] if o.name == STRONGEST) for d in choice}
            q[:], c[:] = sq, sc
            stepped = sorted(choice)
            break
        choice[d] = options[d][options[d].index(choice[d]) + 1]
        stepped.append(d)
    return GroupChoice(choice, merged, q, c, float(sc.mean()), {d: int((doms == d).sum()) for d in groups},
                       {d: float(sc[doms == d].mean()) for d in groups}, sorted(set(stepped)))


def _share(name: str) -> float:
    from fugu_pipeline.policies.cascade.choice import LADDER

    return next(s for s in LADDER if group_rung(s) == name)
