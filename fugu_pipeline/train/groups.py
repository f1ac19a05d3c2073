"""Choosing per group of prompts (a domain, or a learnt cluster of prompts) by the rule the pooled
choice is made by (`selection.cheapest_not_below`), per group and for the whole: what a cascade's
plans per group (`policies/cascade/groups.py`) and a one-shot head's default operating point per
domain (`policies/oneshot/default_point.py`) both choose with.

Per group the cheapest candidate not significantly below always the strongest worker on the group's
rows is kept, its interval's low end no further below than `floor` (a group's rows are few); the
whole (each row under its group's choice, the smaller groups under the pooled default) must pass the
same test on every row; while it does not, the group furthest below the strongest moves to its next
dearer qualifying candidate (always the strongest qualifies on every group, so this ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.train.selection import STRONGEST, Figure, cheapest_not_below, interval, intervals, passes

CLUSTER_PREFIX = "prompt cluster "
# a group needs this many non-test rows to get its own choice (`cascade.search.min_domain_rows`), and
# a cheaper choice on its rows an interval whose low end is no further below the strongest than this
# (`cascade.group_floor`), the whole's own floor: a group's rows are few, and a looser bound lets a
# cheap worker through on a lucky sample of them
DEFAULT_MIN_DOMAIN_ROWS = 40
DEFAULT_GROUP_FLOOR = 0.02


@dataclass
class Option(Figure):
    """One candidate on one group's rows, and what it is (`spec`, the caller's: a cascade's ("rung",
    share), ("alone", None) or ("pooled", name))."""

    spec: tuple = ()


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
    about: dict[str, str] = field(default_factory=dict)  # group -> what it holds (a prompt cluster: its nearest prompt)
    by: str = "domain"  # what the groups are: "domain" or "prompt cluster"
    notes: dict[str, str] = field(default_factory=dict)  # group -> what its out-of-fold figure is, where that needs saying
    shared_cap: bool = False  # the groups' plans share one pooled cap (not each chosen by the cheapest rule)
    frontiers: dict[str, list] = field(default_factory=dict)  # group -> its searched points, where it serves no plan of its own

    def table(self) -> list[dict]:
        return [{"domain": d, "rows": self.rows_of[d], "choice": o.name, "plan": self.plans.get(d, ""),
                 "spec": list(o.spec), "quality": o.quality,
                 "cost_usd": o.cost_usd, "cost_share": o.cost_usd / max(self.group_strongest_cost[d], 1e-300),
                 "vs_strongest": o.vs_strongest, "vs_low": o.vs_low, "vs_high": o.vs_high,
                 **({"note": self.notes[d]} if d in self.notes else {})}
                for d, o in sorted(self.groups.items())]

    def lines(self) -> list[str]:
        out = [f"  {group_label(r['domain'])} ({r['rows']} rows{self.about.get(r['domain'], '')}): {r['choice']}"
               + (f" = {r['plan']}" if r["plan"] else "")
               + f": accuracy {r['quality']:.4f}, "
               f"${r['cost_usd'] * 1000:.4g} per 1,000 = {r['cost_share']:.0%} of the strongest's cost there (saving "
               f"{1 - r['cost_share']:.0%}); accuracy − strongest {r['vs_strongest']:+.4f} [{r['vs_low']:+.4f}, "
               f"{r['vs_high']:+.4f}]" + (f" ({r['note']})" if r.get("note") else "") for r in self.table()]
        if self.stepped_up:
            out.append(f"  moved to a dearer choice so that the whole is not significantly below the strongest: "
                       f"{', '.join(repr(d) for d in self.stepped_up)}")
        return out


def fold_tops_note(tops: list[int], served: int, ids: list[str]) -> str:
    """"" when every fold's strongest worker is the one that serves; else what the out-of-fold
    figure of "the strongest alone" is: each fold's own, the most accurate on the other folds."""
    if all(t == served for t in tops):
        return ""
    counts = {ids[t]: tops.count(t) for t in dict.fromkeys(tops)}
    said = ", ".join(f"{w} on {k} of {len(tops)} folds" for w, k in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"out of fold each fold's own strongest (the most accurate on the other folds): {said}; "
            f"{ids[served]}, the most accurate on every non-test row, serves")


def group_label(name: str) -> str:
    """How a report names a group: a prompt cluster by its name, a domain quoted."""
    return name if name.startswith(CLUSTER_PREFIX) else f"domain {name!r}"


def split_groups(doms: np.ndarray, rows: np.ndarray, min_rows: int) -> tuple[list[str], list[tuple[str, int]]]:
    """(domains with at least `min_rows` of `rows`, [(domain, rows) of the others]), sorted."""
    names, counts = np.unique(np.asarray(doms, dtype=str)[rows], return_counts=True)
    kept = [str(d) for d, c in zip(names, counts) if c >= min_rows]
    return kept, [(str(d), int(c)) for d, c in zip(names, counts) if c < min_rows]


def merged_line(merged: list[tuple[str, int]], min_rows: int, who: str = "cascade", pooled: str = "the pooled plan",
                rows_setting: str = "cascade.search.min_domain_rows", what: str = "a plan") -> str:
    shown = ", ".join(f"{d!r} ({c} rows)" for d, c in merged[:8]) + (f" and {len(merged) - 8} more" if len(merged) > 8 else "")
    return (f"{who}: group(s) {shown} have fewer than {min_rows} non-test rows ({rows_setting}) to "
            f"choose {what} out of fold: merged into {pooled}")


def routed_by(choice: dict[str, Option], doms: np.ndarray, pooled: dict, per_group: dict,
              default: str) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost) per row of each row under its group's choice ({group: Option}), the other rows
    under the pooled `default`; `pooled` and `per_group` as `choose_groups` takes them, over the same
    rows as `doms`."""
    q, c = pooled[default][0].copy(), pooled[default][1].copy()
    for d, o in choice.items():
        at = doms == d
        v = pooled[o.name] if o.spec[0] == "pooled" else per_group[(d, o.name)]
        q[at], c[at] = v[0][at], v[1][at]
    return q, c


def choose_groups(groups: list[str], merged: list[tuple[str, int]], doms: np.ndarray, pooled: dict,
                  per_group: dict, default: str, margin: float, n_boot: int, seed: int = 0,
                  floor: float = DEFAULT_GROUP_FLOOR, spec_of=lambda name: ("group", name)) -> GroupChoice:
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
        cands += [(name, spec_of(name), v) for (g, name), v in per_group.items() if g == d]
        cands = [(name, spec, v) for name, spec, v in cands if v is not None]
        q_all = np.stack([v[0][at] for _, _, v in cands], axis=1)
        c_all = np.stack([v[1][at] for _, _, v in cands], axis=1)
        figs = intervals(q_all - sq[at][:, None], n_boot, seed)  # every candidate on the same resamples, one pass
        opts = []
        for k, (name, spec, _) in enumerate(cands):
            m, lo, hi = map(float, figs[k])
            wide = name != STRONGEST and lo < -floor  # too few rows to tell it from a worse policy
            opts.append(Option(name, float(q_all[:, k].mean()), float(c_all[:, k].mean()), m, lo, hi,
                               f"unavailable: its interval reaches {lo:+.4f}, below -{floor:g} (cascade.group_floor)"
                               if wide else "", spec=spec))
        pick = cheapest_not_below(opts, STRONGEST, "", margin, int(at.sum()))
        options[d] = sorted([o for o in opts if o.name in pick.qualified], key=lambda o: (o.cost_usd, -o.quality))
        choice[d] = next(o for o in opts if o.name == pick.name)
    stepped: list[str] = []
    while True:
        q, c = routed_by(choice, doms, pooled, per_group, default)
        m, lo, hi = interval(q - sq, n_boot, seed)
        if passes(m, lo, hi, margin, None):  # the whole: the rule without a floor (each group had its own)
            break
        d = min((d for d in choice if options[d].index(choice[d]) < len(options[d]) - 1),
                key=lambda d: choice[d].vs_strongest, default=None)
        if d is None:  # every domain at its dearest qualifying choice: always the strongest everywhere
            choice = {d: next(o for o in options[d] if o.name == STRONGEST) for d in choice}
            q, c = sq.copy(), sc.copy()
            stepped = sorted(choice)
            break
        choice[d] = options[d][options[d].index(choice[d]) + 1]
        stepped.append(d)
    return GroupChoice(choice, merged, q, c, float(sc.mean()), {d: int((doms == d).sum()) for d in groups},
                       {d: float(sc[doms == d].mean()) for d in groups}, sorted(set(stepped)))
