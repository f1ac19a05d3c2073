"""A cap asked of a cascade, scored out of fold the way it serves (numpy only).

Served, a cap asked of a cascade follows the spend (`spend.request_point`): each request gets the
most accurate saved point whose validation cost is within its guard's effective cap
(`route/follow.effective_cap`), and what it cost then counts in the guard. Its rows of `train`'s
table at caps (`choice.cap_table`: "cascade" and "plans per group") replay that rule out of fold:

- For each fold, the points the checkpoint would save are searched on the other folds' rows
  (`fold_points`): the frontier of the search (`search.frontier_index`, what a choice saves) and the
  plan within each cap of the out-of-fold frontier (`frontier.SHARES`, with the cap's margin), with
  their mean cost and quality on those rows, and run on the fold's own rows.
- Plans per group sharing the cap: each group's points are its own search's frontier on its rows of
  the other folds, one of them chosen per group within the cap as `spend.share_parts` chooses among
  a checkpoint's saved points (`groups.allocate`), and its follower keeps its part of the cap (the
  chosen point's cost, scaled so that the parts add up to the cap); rows of no group follow the
  whole cap over the pooled points.
- Every non-test row then goes through its follower in traffic order (`route/follow.traffic_order`):
  one follower per group and fold, at that fold's cap and points, as a server serving that fold's
  checkpoint would keep it; each row is served the point the rule picks and counted at what that
  point cost on the row. A group's part moves with the allocation on the other folds' rows, by up
  to seven times on a code-and-math mix; one follower across the folds, counting in each fold's
  caps, would carry what a fold with a small part leaves unspent into dearer points of a fold with
  a large one (3% over the cap in dollars there).

Each fold's groups share its cap again as the mix of its rows moves from the other folds' mix
(`spend.RequestShares.parts_for` over `spend.moved_mix`, as the pooled guard keeps it). A share
some fold cannot keep with its margin at any point has no row (serving refuses such a cap:
`spend.request_cap`). The pooled guard's backstop is not replayed: it cuts only once the pooled
spend runs `spend.POOL_SLACK` requests' worth of the cap over it, more than a training set's rows
can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.route.follow import RunningSpend


@dataclass
class Part:
    """One follower's rows of one fold: the points they choose among (validation cost and quality on
    the fold's other rows), each point's quality and cost on each of the rows, and the cap."""

    key: str  # the follower: "*" (the whole cap) or a group
    at: np.ndarray  # positions of the rows among the non-test rows
    cost: np.ndarray  # (P,)
    quality: np.ndarray  # (P,)
    q: np.ndarray  # (len(at), P)
    c: np.ndarray  # (len(at), P)
    cap: float
    cost_se: np.ndarray  # (P,): what a cap's margin reads
    fold: int = 0  # the fold whose rows these are (each fold's rows follow their own cap)
    shares: object = None  # a group's part of a shared cap: the fold's `spend.RequestShares` (its part moves with the mix)


def saved_index(pts, ref: float, z: float) -> list[int]:
    """The points of `pts` (`plans.Points`) a cascade saves for a cap asked later: its frontier and
    the plan within each share of the out-of-fold frontier's caps (shares of `ref`, with `z`
    standard errors), as `spend.cap_points` reads them back."""
    from fugu_pipeline.policies.cascade.frontier import SHARES, best_within
    from fugu_pipeline.policies.cascade.search import frontier_index

    idx = set(frontier_index(pts))
    idx.update(i for i in (best_within(pts, s * ref, z) for s in SHARES) if i is not None)
    return sorted(idx)


def part_of(grid, pts, idx: list[int], te: np.ndarray, at: np.ndarray, key: str, cap: float) -> Part:
    """The `Part` of rows `te` (positions `at`) over the points `idx` of `pts`."""
    from fugu_pipeline.policies.cascade.plans import RowSet

    held = RowSet(grid, te)
    runs = [held.run(pts.plans[i]) for i in idx]
    return Part(key, at, pts.cost[idx], pts.quality[idx], np.stack([r[0] for r in runs], axis=1),
                np.stack([r[1] for r in runs], axis=1), float(cap), pts.cost_se[idx])


def fold_points(grid, tr: np.ndarray, te: np.ndarray, at: np.ndarray, search_cfg, allowed, cap_usd: float, ref: float,
                z: float, memo: dict | None = None) -> list[Part] | None:
    """The pooled row's parts for one fold (one: every row under the whole cap); None when no plan
    of the other folds' rows keeps `cap_usd` with `z` standard errors."""
    from fugu_pipeline.policies.cascade.frontier import best_within
    from fugu_pipeline.policies.cascade.plans import points_for

    pts = points_for(grid, tr, search_cfg, allowed, memo)
    if best_within(pts, cap_usd, z) is None:
        return None
    return [part_of(grid, pts, saved_index(pts, ref, z), te, at, "*", cap_usd)]


def group_points(grid, tr: np.ndarray, te: np.ndarray, at: np.ndarray, gdoms: np.ndarray, groups: list[str],
                 search_cfg, allowed, cap_usd: float, ref: float, z: float, memo: dict | None = None) -> list[Part] | None:
    """The grouped row's parts for one fold, as `spend.request_shares` shares a cap asked of a
    checkpoint with points per group: each group's saved points (its search's frontier on its rows
    of the other folds) and the pooled frontier for the rows of no group, one point each chosen by
    `groups.allocate` within the cap (the groups weighted by their rows), each group's part that
    point's cost scaled so that the parts add up to the cap, never above what its dearest point can
    spend (`spend.share_parts`); rows of no group follow the whole cap over the pooled points. None
    when no choice of saved points keeps the cap there."""
    from fugu_pipeline.policies.cascade.plans import points_for
    from fugu_pipeline.policies.cascade.search import frontier_index
    from fugu_pipeline.policies.cascade.spend import RequestShares, share_parts

    gd = np.asarray(gdoms, dtype=str)
    pooled = points_for(grid, tr, search_cfg, allowed, memo)
    own = [d for d in groups if (gd[tr] == d).any()]
    saved = {d: points_for(grid, tr[gd[tr] == d], search_cfg, allowed, memo) for d in own}
    weights = {d: float((gd[tr] == d).mean()) for d in own}
    rest = 1.0 - sum(weights.values())
    if rest > 1e-9:
        saved["*"], weights["*"] = pooled, rest
    idx = {d: frontier_index(p) for d, p in saved.items()}
    points = lambda d: [{"cost_usd": float(saved[d].cost[i]), "cost_se": float(saved[d].cost_se[i]),  # noqa: E731
                         "quality": float(saved[d].quality[i])} for i in idx[d]]
    shared = [(d, points(d), weights[d]) for d in saved]
    got = share_parts(shared, cap_usd, z)
    if got is None:
        return None
    shares = RequestShares(cap_usd, got[0], shared, z)
    out, held = [], gd[te]
    for d in sorted({x if x in own else "*" for x in held.tolist()}):
        mine = np.flatnonzero(held == d) if d != "*" else np.flatnonzero(~np.isin(held, own))
        part = got[0].get(d, 0.0) if d != "*" else 0.0
        if part > 0:
            out.append(part_of(grid, saved[d], idx[d], te[mine], at[mine], d, part))
            out[-1].shares = shares
        else:  # rows of no group, or a group whose part is nothing: the whole cap over the pooled points
            pts = saved.get(d, pooled)
            out.append(part_of(grid, pts, idx[d] if d in own else saved_index(pooled, ref, z), te[mine], at[mine], "*",
                               cap_usd))
    return out


def replay(parts: list[Part], order: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost) per non-test row: the rows in `order` (positions), each through its part's
    follower (one per key and fold): the most accurate point whose validation cost is within the
    effective cap (ties: the cheaper), else the cheapest, as `spend.follow_pick` picks."""
    from fugu_pipeline.policies.cascade.spend import moved_mix

    where = {}
    for p, part in enumerate(parts):
        for j, k in enumerate(part.at.tolist()):
            where[k] = (p, j)
    cheapest = [int(np.lexsort((-part.quality, part.cost))[0]) for part in parts]
    best_first = [np.lexsort((part.cost, -part.quality)) for part in parts]  # most accurate, then the cheaper
    spend: dict[tuple, RunningSpend] = {}  # one follower per key and fold, as serving keeps its guards
    mix: dict[int, dict[str, float]] = {}  # per fold: each group's share of the grouped requests (`spend.moved_mix`)
    q, c = np.zeros(n), np.zeros(n)
    for k in order.tolist():
        p, j = where[k]
        part = parts[p]
        follower = spend.setdefault((part.key, part.fold), RunningSpend(part.cap))
        if part.shares is not None:  # a group's part, for the mix so far
            follower.set_cap(part.shares.parts_for(mix.setdefault(part.fold, dict(part.shares.start_mix)))
                             .get(part.key, part.cap))
        ok = within_cap(part.cost[best_first[p]], follower.effective())
        i = int(best_first[p][int(np.argmax(ok))]) if ok.any() else cheapest[p]
        q[k], c[k] = part.q[j, i], part.c[j, i]
        if part.shares is not None:
            moved_mix(mix[part.fold], part.key)
        follower.record(float(c[k]))
    return q, c
