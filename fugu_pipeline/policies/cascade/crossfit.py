"""Cross-fitting the cascade's candidates: for each fold, every policy is chosen on the other folds
(expected costs from those rows) and run on this fold, so every non-test row has an out-of-fold
figure per candidate (`fit.py` says which candidates each way of choosing compares).

Every search of one fit goes through one memo (`plans.points_for`): a fold's plans run once for the
cost-aware ladder, the table at caps, the per-domain plans, a capped search and the frontier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.policies.cascade.choice import GROUPED, TABLE_SHARES, ladder_fold, rung_name
from fugu_pipeline.policies.cascade.follow_fold import fold_points, group_points, replay
from fugu_pipeline.policies.cascade.groups import group_fold
from fugu_pipeline.policies.cascade.search import CAP_Z, CapUnmet, run_policy, search_policy, strongest
from fugu_pipeline.policies.cascade.ship import AT_CAP
from fugu_pipeline.route.follow import traffic_order
from fugu_pipeline.train.selection import STRONGEST


@dataclass
class CrossFit:
    """Per candidate, per non-test row: the figure the choice reads (utility in `utility` mode, else
    quality), the quality and the expected cost; the table's rows; the per-domain candidates."""

    names: list[str]
    figure: dict[str, np.ndarray]
    quality: dict[str, np.ndarray]
    cost: dict[str, np.ndarray]
    table_rows: dict[str, tuple[np.ndarray, np.ndarray]]
    per_group: dict = field(default_factory=dict)  # (domain, name) -> (quality, cost) per row, or None
    missing: set = field(default_factory=set)
    fold_tops: dict = field(default_factory=dict)  # STRONGEST or a domain -> its strongest worker (index) per fold
    unmet: str = ""  # a cap some fold cannot meet: the CapUnmet message


def alone_plan(j: int) -> tuple:
    return (((j,), None, None),)


def cross_fit(data, grid_for, rows: np.ndarray, folds: np.ndarray, doms: np.ndarray, usable: list[int], allowed, cfg,
              mode: str, baseline: str, shares, heads: dict | None, groups: list[str], memo: dict,
              best_worker, head_routes: dict | None = None, shared: tuple | None = None,
              cap_routes: dict | None = None, share_routes: dict | None = None, caps_search=None) -> CrossFit:
    """See the module docstring. `mode`: "cheapest" | "cap" | "utility"; `shares`: the cost-aware
    ladder; `groups`: the domains that get their own candidates; `best_worker(grid, rows)`: the
    baseline worker of the `cap` and `utility` modes; `head_routes`: a head's out-of-fold route at the
    operating point it serves with no cap asked, which its candidate is scored at (else its argmax);
    `shared`: (candidate name, the group of every row, the groups) of the pooled cap shared among
    groups (`groups.share_cap`), one more candidate under a cap; `cap_routes`: a head's out-of-fold
    route at the λ its budget calibration's rule chooses for the pooled cap on the other folds,
    which its candidate "at the cap" is scored at (a head without one has no such candidate: it could
    not serve the cap); `share_routes`: the first head's route at each share of the table at caps,
    as its budget calibration would serve that share (a share it has none for is "—"); `caps_search`:
    the search the table at caps reads (`cfg.search` when None): a cap's, which may be finer than
    the choice's (`CascadeConfig.searched`), so that a row of the table is what `--cap` would ship."""
    from fugu_pipeline.policies.cascade.plans import RowSet

    n = len(rows)
    capped = mode == "cap"
    at_caps = caps_search or cfg.search
    # a one-shot head at the cap: its route at the λ its budget calibration chooses for the pooled cap
    at_cap = {h: r for h, r in (cap_routes or {}).items() if h in (heads or {})} \
        if capped and cfg.cap is not None and not cfg.domain_caps else {}
    names = [STRONGEST] + [rung_name(s) for s in shares] + ([baseline, "cascade"] if mode != "cheapest" else []) \
        + ([shared[0]] if shared else []) + list(heads or {}) + [h + AT_CAP for h in at_cap]
    out = CrossFit(names, {k: np.zeros(n) for k in names}, {k: np.zeros(n) for k in names},
                   {k: np.zeros(n) for k in names},
                   {f"{k}@{s}": (np.zeros(n), np.zeros(n)) for s in TABLE_SHARES for k in ("cascade", "one-shot")
                    if k == "cascade" or heads})
    rdoms = doms[rows]
    # the table at caps also holds plans per group sharing each cap (the cheapest rule's groups, or a cap's)
    table_groups = (doms, groups) if groups else (shared[1], shared[2]) if shared else None
    if table_groups:
        out.table_rows.update({f"{GROUPED}@{s}": (np.zeros(n), np.zeros(n)) for s in TABLE_SHARES})

    def put(name, at, q, c, u=None):
        out.figure[name][at] = u if (mode == "utility" and u is not None) else q
        out.quality[name][at], out.cost[name][at] = q, c

    first_head = next(iter(heads or {}), None)
    uc = data.utility_config
    followed = {k: [] for k in out.table_rows if not k.startswith("one-shot@")}  # each fold's parts, or None
    follows = capped and cfg.cap is not None and not cfg.domain_caps  # a pooled cap's candidates follow its spend
    capped_parts: dict = {k: [] for k in (["cascade"] + ([shared[0]] if shared else []))} if follows else {}
    for f in np.unique(folds):
        tr, te = rows[folds != f], rows[folds == f]
        at = np.flatnonzero(folds == f)
        g = grid_for(tr)
        held = RowSet(g, te)
        top = usable[int(np.argmax(g.quality[tr][:, usable].mean(axis=0)))]
        put(STRONGEST, at, *held.run(alone_plan(top)))
        out.fold_tops.setdefault(STRONGEST, []).append(top)
        for s, got in ladder_fold(g, tr, te, cfg.search, allowed, shares, g.exp_cost[top], memo).items():
            if got is None:
                out.missing.add(rung_name(s))
            else:
                put(rung_name(s), at, *got)
        for s in TABLE_SHARES:  # a cap asked later, as it serves: the saved points following the spend (follow_fold.py)
            ref = g.exp_cost[top]
            followed[f"cascade@{s}"].append(fold_points(g, tr, te, at, at_caps, allowed, s * ref, ref, CAP_Z, memo))
            if table_groups:
                followed[f"{GROUPED}@{s}"].append(group_points(g, tr, te, at, table_groups[0], table_groups[1], at_caps,
                                                               allowed, s * ref, ref, CAP_Z, memo))
        for (d, name), got in group_fold(g, tr, te, doms, groups, cfg.search, allowed, usable, shares, g.exp_cost[top],
                                         memo, out.fold_tops).items():
            if got is None or out.per_group.get((d, name), ()) is None:
                out.per_group[(d, name)] = None
                continue
            q, c = out.per_group.setdefault((d, name), (np.zeros(n), np.zeros(n)))
            mine = at[rdoms[at] == d]
            q[mine], c[mine] = got
        if mode != "cheapest":
            try:
                policy, _ = search_policy(g, tr, doms, cfg.search, cfg.cap, cfg.domain_caps, cfg.per_domain, allowed, memo,
                                          CAP_Z if capped else 0.0)
            except CapUnmet as exc:
                out.unmet = f"cap: {exc}; the strongest worker ({data.worker_ids[top]}) ships"
                return out
            if follows:  # a pooled cap, as it serves: the saved points following the spend (follow_fold.py)
                cap_f, ref = cfg.cap.usd_per_request(g.exp_cost[strongest(g, tr)]), g.exp_cost[top]
                capped_parts["cascade"].append(fold_points(g, tr, te, at, cfg.search, allowed, cap_f, ref,
                                                           cfg.cap.margin_z, memo))
                if shared:
                    capped_parts[shared[0]].append(group_points(g, tr, te, at, shared[1], shared[2], cfg.search, allowed,
                                                                cap_f, ref, cfg.cap.margin_z, memo))
            else:  # a cap per domain: each domain's plan within its own cap
                put("cascade", at, *run_policy(g, policy, te, doms))
            put(baseline, at, *held.run(alone_plan(best_worker(g, tr))))
        for name, s in (heads or {}).items():
            route = (head_routes or {}).get(name, np.argmax(s, axis=1))[at]  # at the point it serves
            q = data.quality[te, route]
            c, lat = g.per_call(te, route)
            u = (uc.quality_weight * q - uc.cost_weight * np.minimum(c / uc.cost_scale_usd, uc.cap)
                 - uc.latency_weight * np.minimum(lat / uc.latency_scale_s, uc.cap))
            put(name, at, q, c, u)
            if name in at_cap:  # routed as it serves the cap: per-prompt expected cost, λ chosen on the other folds
                r = at_cap[name][at]
                put(name + AT_CAP, at, data.quality[te, r], g.per_call(te, r)[0])
            if name == first_head:
                for share in TABLE_SHARES:
                    r = (share_routes or {}).get(share)
                    _table(out, f"one-shot@{share}", at, None if r is None else
                           (data.quality[te, r[at]], g.per_call(te, r[at])[0]))
    order = traffic_order([data.task_ids[i] for i in rows])
    for key, per_fold in followed.items():
        if any(p is None for p in per_fold):
            out.missing.add(key)
        else:
            out.table_rows[key] = replay(_folded(per_fold), order, n)
    for name, per_fold in capped_parts.items():
        if any(p is None for p in per_fold):
            out.missing.add(name)
        else:
            put(name, np.arange(n), *replay(_folded(per_fold), order, n))
    return out


def _folded(per_fold: list) -> list:
    """Each fold's parts, marked with their fold (each fold's rows follow their own cap)."""
    for f, parts in enumerate(per_fold):
        for part in parts:
            part.fold = f
    return [p for parts in per_fold for p in parts]


def _table(out: CrossFit, key: str, at: np.ndarray, got) -> None:
    if got is None:
        out.missing.add(key)
    else:
        out.table_rows[key][0][at], out.table_rows[key][1][at] = got
