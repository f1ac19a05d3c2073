"""The cost-aware default of a one-shot router: the operating point `route`, `ask`, `serve` and
`evaluate` use when a request states no cap (numpy only).

Where the utility gives cost no weight (quality-only weights, what every import is trained with) and
the matrix records cost, the argmax of predicted quality pays for the strongest worker wherever the
head leans to it. The default is instead **the cheapest λ-routing (argmax q̂ − λ·ĉ/c_ref, the
budget rule of `budget.py`) whose out-of-fold accuracy is not significantly below always the
strongest worker's**, the same rule as a cascade's (`train/selection.cheapest_not_below`):

- every λ of the budget grid routes the selected head's K-fold out-of-fold predictions over the
  non-test rows (ĉ: the calibration's expected cost, fitted on training rows);
- always the strongest worker: per fold, the most accurate on the other folds (the reason says so
  when that is not always the worker that serves, `train.groups.fold_tops_note`);
- a λ qualifies when the per-row accuracy difference from the strongest has a paired bootstrap 95%
  interval reaching 0, whose low end is above −`floor` (0.02, as `cascade.floor`), and a mean within
  `margin` (0.005, as `cascade.margin`); the cheapest that saves at least `MIN_SAVING` (2%) of the
  strongest's cost ships;
- when the plain head (λ = 0) is already significantly below the strongest, or no cheaper λ
  qualifies, the default is the strongest worker alone, with the line saying why (except that a
  λ costing no more than the strongest and significantly more accurate than it, its interval's low
  end above 0, is kept: where every worker costs the same, that is what a router is for; a gain
  whose interval reaches 0 is the handful-of-rows chance the 2% minimum guards against).

Per domain (`domains` given, two or more of them, `min_rows` non-test rows each): the same rule per
domain among the same λs and always the strongest, and for the whole, as a cascade's plans per
domain are chosen (`train/groups.py`: each domain's cheapest choice not significantly below
the strongest on its rows, its interval's low end above −`group_floor`; the whole held to the rule,
the domain furthest below moved to a dearer choice until it holds). A choice that differs by domain
ships when it saves at least `MIN_SAVING` (2% of the strongest's cost, what any cheaper policy must
save to count as cheaper) over the pooled point,
its whole interval's low end above −`floor` too: on a mixed import a cheap worker may tie the
strongest on one kind of prompt only; a smaller saving does not pay for a choice made on fewer rows.

An import that names fewer than two domains is grouped by prompt clusters instead (`train/clusters.py`:
k-means over the head's prompt features of the non-test rows, used only where the prompts stand apart
from one Gaussian blob of their covariance); the point then holds the centroids (`PointClusters`) and
the `Router` puts each request in its nearest cluster before reading its λ.

The point is saved in the checkpoint's `budget.json` (`BudgetCalibration.default`, the schema in
`route/default_point.py`, which the `Router` reads to route by it), beside it, so the checkpoint's
content hash is untouched.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.route.default_point import DEFAULT_FLOOR, DEFAULT_MARGIN, DefaultPoint, PointClusters
from fugu_pipeline.train.clusters import DEFAULT_CLUSTER_MIN_GAP, pick_groups
from fugu_pipeline.train.groups import DEFAULT_GROUP_FLOOR, DEFAULT_MIN_DOMAIN_ROWS, fold_tops_note
from fugu_pipeline.train.selection import (MIN_SAVING, STRONGEST, Figure, cheaper, cheapest_not_below, interval, intervals,
                                           passes)


def lam_name(lam: float) -> str:
    return "the plain head (λ = 0)" if lam == 0 else f"λ-routing at λ = {lam:.4g}"


def choose_default(q_oof: np.ndarray, quality: np.ndarray, c_hat: np.ndarray, c_ref: float, folds: np.ndarray,
                   worker_ids: list[str], lambdas, *, margin: float = DEFAULT_MARGIN, n_boot: int = 2000,
                   seed: int = 0, floor: float | None = DEFAULT_FLOOR) -> DefaultPoint:
    """The rule of the module docstring. Rows are the non-test rows: `q_oof` the head's out-of-fold
    predicted quality (n, W), `quality` the observed one, `c_hat` the expected cost (n, W)."""
    return choose_default_route(q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas, margin=margin,
                                n_boot=n_boot, seed=seed, floor=floor)[0]


def choose_default_route(q_oof: np.ndarray, quality: np.ndarray, c_hat: np.ndarray, c_ref: float, folds: np.ndarray,
                         worker_ids: list[str], lambdas, *, margin: float = DEFAULT_MARGIN, n_boot: int = 2000,
                         seed: int = 0, floor: float | None = DEFAULT_FLOOR, domains=None,
                         min_rows: int = DEFAULT_MIN_DOMAIN_ROWS, group_floor: float = DEFAULT_GROUP_FLOOR,
                         log=None, features: np.ndarray | None = None, prompts: list[str] | None = None,
                         min_gap: float = DEFAULT_CLUSTER_MIN_GAP, how: str = "auto",
                         nested: bool = True) -> tuple[DefaultPoint, np.ndarray]:
    """`choose_default`, with the point's route over the rows (each row's worker index, out of fold):
    what the cascade's choice scores the head at, so what it compares is what the head serves.
    `domains` (each row's): also a point per domain (the module docstring); where they name fewer
    than two, per prompt cluster of `features` (the rows' prompt features, `prompts` to name them);
    `how` (auto | domain | cluster | off, as `cascade.groups`) says which. `nested`: a cheaper point
    ships only when the rule itself, run inside the folds, passes too (`_nested_check`)."""
    args = (q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas)
    opts = dict(margin=margin, n_boot=n_boot, seed=seed, floor=floor, min_rows=min_rows, group_floor=group_floor,
                min_gap=min_gap, how=how)
    point, route = _choose(*args, **opts, domains=domains, log=log, features=features, prompts=prompts)
    if not nested or point.kind != "lambda":
        return point, route
    return _nested_check(point, route, args, opts, domains, features, prompts)


def _choose(q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas, *, margin, n_boot, seed, floor, domains,
            min_rows, group_floor, log, features, prompts, min_gap, how) -> tuple[DefaultPoint, np.ndarray]:
    point, route, table = _pooled_default(q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas, margin=margin,
                                          n_boot=n_boot, seed=seed, floor=floor)
    if domains is None:
        return point, route
    doms = np.asarray(domains, dtype=str)
    say = log if log is not None else (lambda line: None)
    groups, _, keys, clusters = pick_groups(how, doms, np.arange(len(doms)), features, prompts, min_rows, min_gap,
                                            say, seed, who="default operating point", one="one point for every prompt",
                                            pooled="the pooled point", what="a point", quality=quality)
    if not groups:
        return point, route
    return _per_domain(point, route, table, np.asarray(keys, dtype=str), margin, n_boot, seed, floor, min_rows,
                       group_floor, log, clusters)


def _nested_check(point: DefaultPoint, route: np.ndarray, args: tuple, opts: dict, domains, features,
                  prompts) -> tuple[DefaultPoint, np.ndarray]:
    """The point, or always the strongest worker when the rule that chose it fails its own test once it
    is run inside the folds. The point's λ (and its groups) were picked among many on the very rows
    whose figure then passed the test, so that figure is the best of many draws; on new rows it is
    lower. Here, per fold, the whole rule (λ grid, groups, floors) runs on the other folds' rows and
    its point routes this fold's rows; those routes' accuracy against the strongest's must reach 0
    with a mean within `margin` and a low end above −`floor`, as the point's own did, and their cost
    must save at least `MIN_SAVING` of the strongest's: a saving the rule does not repeat inside the
    folds was those rows' luck (on a real import's split a point at 97% of gpt-4's cost, 98% inside
    the folds, lost two points held out)."""
    q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas = args
    quality, c_hat = np.nan_to_num(np.asarray(quality, np.float64)), np.asarray(c_hat, np.float64)
    ref = c_ref if c_ref > 0 else 1.0
    n = len(quality)
    q, c, strong_q = np.zeros(n), np.zeros(n), np.zeros(n)
    doms = None if domains is None else np.asarray(domains, dtype=str)
    for f in np.unique(folds):
        at, tr = np.flatnonzero(folds == f), np.flatnonzero(folds != f)
        if len(np.unique(folds[tr])) < 2:
            return point, route  # too few folds to nest
        inner, _ = _choose(q_oof[tr], quality[tr], c_hat[tr], c_ref, folds[tr], worker_ids, lambdas, **opts,
                           domains=None if doms is None else doms[tr], log=None,
                           features=None if features is None else features[tr],
                           prompts=None if prompts is None else [prompts[i] for i in tr])
        keys = inner.group_keys(None if doms is None else doms[at], None if features is None else features[at])
        lams = inner.lambdas(keys, len(at))
        top = int(np.argmax(quality[tr].mean(axis=0)))
        routed = np.argmax(q_oof[at] - np.nan_to_num(lams)[:, None] * c_hat[at] / ref, axis=1)
        pick = np.where(np.isfinite(lams), routed, worker_ids.index(inner.strongest_worker))
        q[at], c[at], strong_q[at] = quality[at, pick], c_hat[at, pick], quality[at, top]
    margin, floor = opts["margin"], opts["floor"]
    m, lo, hi = interval(q - strong_q, opts["n_boot"], opts["seed"])
    share = float(c.mean()) / point.strongest_cost_usd if point.strongest_cost_usd > 0 else 1.0
    figure = (f"the rule run inside the folds (each fold routed by the point chosen on the others): difference "
              f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}] at {share:.0%} of the strongest's cost")
    claims = cheaper(point.oof_cost_usd, point.strongest_cost_usd)  # not so a point kept for accuracy at equal cost
    if passes(m, lo, hi, margin, floor) and (cheaper(float(c.mean()), point.strongest_cost_usd) or not claims):
        # the very test the point passed, margin and minimum saving included (see holds_inside_folds)
        return point.model_copy(update={"reason": f"{point.reason}; {figure}"}), route
    top_all = point.strongest_worker
    reason = (f"{point.routing(point.lam) if not point.per_domain else point.per_domain_text()} passes out of fold "
              f"(difference {point.difference[0]:+.4f} [{point.difference[1]:+.4f}, {point.difference[2]:+.4f}]), but "
              f"it was picked among many on those very rows, and {figure} "
              + ("is significantly below it" if hi < 0 else f"is more than {margin * 100:.2g} point below it"
                 if m < -margin else f"reaches below -{floor:g}" if floor is not None and lo < -floor
                 else f"saves less than {MIN_SAVING:.0%} of its cost")
              + f", so the strongest worker ({top_all}) is the default; more rows would let a cheaper routing qualify")
    strongest = DefaultPoint(kind="strongest", lam=None, strongest_worker=top_all, reason=reason,
                             oof_accuracy=point.strongest_accuracy, oof_cost_usd=point.strongest_cost_usd,
                             strongest_accuracy=point.strongest_accuracy, strongest_cost_usd=point.strongest_cost_usd,
                             difference=(0.0, 0.0, 0.0), margin=margin, floor=floor, n_rows=point.n_rows)
    return strongest, np.full(n, worker_ids.index(top_all))


def _pooled_default(q_oof, quality, c_hat, c_ref, folds, worker_ids, lambdas, *, margin, n_boot, seed, floor):
    """(the pooled point, its route, {candidate name: (λ or None, quality, expected cost, route) per row})."""
    q_oof, quality, c_hat = (np.asarray(a, np.float64) for a in (q_oof, quality, c_hat))
    n = len(quality)
    quality = np.nan_to_num(quality)
    strong_q, strong_c, strong_route = np.zeros(n), np.zeros(n), np.zeros(n, int)
    tops = []
    for f in np.unique(folds):
        at, tr = folds == f, folds != f
        top = int(np.argmax(quality[tr].mean(axis=0))) if tr.any() else int(np.argmax(quality.mean(axis=0)))
        strong_q[at], strong_c[at], strong_route[at] = quality[at, top], c_hat[at, top], top
        tops.append(top)
    top_all = worker_ids[int(np.argmax(quality.mean(axis=0)))]
    note = fold_tops_note(tops, worker_ids.index(top_all), list(worker_ids))
    ref = c_ref if c_ref > 0 else 1.0
    cands, seen, lam_of = [Figure(STRONGEST, float(strong_q.mean()), float(strong_c.mean()), 0.0, 0.0, 0.0)], {}, {}
    route_of = {}
    idx = np.arange(n)
    for lam in lambdas:
        route = np.argmax(q_oof - lam * c_hat / ref, axis=1)
        key = route.tobytes()
        if key in seen:  # the same routes as a smaller λ: the same policy
            continue
        name = lam_name(float(lam))
        seen[key] = name
        lam_of[name] = float(lam)
        route_of[name] = route
    routes = np.stack(list(route_of.values()), axis=1)  # (n, λs): every distinct routing's figures in one pass
    q_all, c_all = np.take_along_axis(quality, routes, axis=1), np.take_along_axis(c_hat, routes, axis=1)
    diff = q_all - strong_q[:, None]
    mean_q, mean_c, mean_d = q_all.mean(axis=0), c_all.mean(axis=0), diff.mean(axis=0)
    # the interval only where the rule reads it: the plain head, every routing within `margin` of the
    # strongest, and the cheaper one closest to it (the reason names it when the strongest ships); a
    # mean further below fails whatever its interval
    read = (mean_d >= -margin) | (np.arange(len(mean_d)) == 0)
    lower = np.flatnonzero(cheaper(mean_c, cands[0].cost_usd))  # what the rule counts as cheaper
    if len(lower):
        read[lower[np.argmax(mean_d[lower])]] = True
    figs = np.full((len(mean_d), 2), np.nan)
    figs[read] = intervals(diff[:, read], n_boot, seed)[:, 1:]
    for k, name in enumerate(route_of):
        cands.append(Figure(name, float(mean_q[k]), float(mean_c[k]), float(mean_d[k]), *map(float, figs[k])))
    base, plain = cands[0], cands[1]
    table = {STRONGEST: (None, strong_q, strong_c, strong_route)}
    table.update({name: (lam_of[name], quality[idx, r], c_hat[idx, r], r) for name, r in route_of.items()})

    def point(kind, lam, fig, reason):
        route = route_of[fig.name] if kind == "lambda" else np.full(n, worker_ids.index(top_all))
        reason += f"; {STRONGEST}, {note}" if note else ""
        return DefaultPoint(kind=kind, lam=lam, strongest_worker=top_all, reason=reason, oof_accuracy=fig.quality,
                            oof_cost_usd=fig.cost_usd, strongest_accuracy=base.quality, strongest_cost_usd=base.cost_usd,
                            difference=(fig.vs_strongest, fig.vs_low, fig.vs_high), margin=margin, floor=floor,
                            n_rows=n), route, table

    if plain.vs_high < 0:
        return point("strongest", None, base, (
            f"{plain.name} is significantly below {STRONGEST} ({top_all}) out of fold over {n} non-test rows: accuracy "
            f"{plain.quality:.4f} against {base.quality:.4f}, difference {plain.vs_strongest:+.4f} [{plain.vs_low:+.4f}, "
            f"{plain.vs_high:+.4f}] (95% paired bootstrap interval below 0), so no λ can keep its accuracy and the "
            f"strongest worker ({top_all}) is the default; a head with more signal (more rows, better features) would "
            "let a cheaper routing qualify"))
    pick = cheapest_not_below(cands, STRONGEST, top_all, margin, n, floor)
    if pick.strongest_ships:
        # nothing cheaper qualifies; a routing that costs no more and is significantly more accurate beats it
        same = [c for c in cands[1:] if c.cost_usd <= base.cost_usd * (1 + 1e-6) and c.vs_low > 0]
        if not same:
            return point("strongest", None, base, pick.reason)
        win = max(same, key=lambda c: (c.quality, -c.cost_usd))
        return point("lambda", lam_of[win.name], win, (
            f"{win.name} costs no more than {STRONGEST} ({top_all}) and is significantly more accurate out of fold over {n} non-test "
            f"rows: accuracy {win.quality:.4f} against {base.quality:.4f}, difference {win.vs_strongest:+.4f} "
            f"[{win.vs_low:+.4f}, {win.vs_high:+.4f}], at ${win.cost_usd * 1000:.4g} per 1,000 = "
            f"{win.cost_usd / base.cost_usd if base.cost_usd > 0 else 1:.0%} of its cost; no cheaper policy is within "
            f"{margin * 100:.2g} point of it without being significantly below it"))
    win = next(c for c in cands if c.name == pick.name)
    return point("lambda", lam_of[pick.name], win, pick.reason)


def _per_domain(point: DefaultPoint, route: np.ndarray, table: dict, doms: np.ndarray, margin: float, n_boot: int,
                seed: int, floor: float | None, min_rows: int, group_floor: float, log,
                clusters=None) -> tuple[DefaultPoint, np.ndarray]:
    """The pooled point, or a point per domain (per prompt cluster: `clusters`, `doms` each row's
    cluster) where that is cheaper (the module docstring)."""
    from fugu_pipeline.train.groups import choose_groups, split_groups

    groups, merged = split_groups(doms, np.arange(len(doms)), min_rows)
    if not groups or len(groups) + len(merged) < 2:
        return point, route
    pooled = {name: (q, c) for name, (_, q, c, _) in table.items()}
    default = next((name for name, (lam, *_rest) in table.items()
                    if point.kind == "lambda" and lam == point.lam), STRONGEST)
    got = choose_groups(groups, merged, doms, pooled, {}, default, margin, n_boot, seed, floor=group_floor)
    strong_q = table[STRONGEST][1]
    m, lo, hi = interval(got.quality - strong_q, n_boot, seed)
    cost = float(got.cost.mean())
    per = {d: table[o.name][0] for d, o in got.groups.items()}
    saving = (point.oof_cost_usd - cost) / point.strongest_cost_usd if point.strongest_cost_usd > 0 else 0.0
    by = "domain" if clusters is None else "prompt cluster"
    same = all(v == (point.lam if point.kind == "lambda" else None) for v in per.values())
    if floor is not None and lo < -floor or saving < MIN_SAVING or same:
        if log is not None:
            log(f"default operating point: one point for every {by} kept: "
                + ("each one's choice is the pooled point" if same else
                   f"a point per {by} would cost {-saving:.1%} of the strongest's cost more" if saving < 0 else
                   f"a point per {by} would save {saving:.1%} of the strongest's cost, less than {MIN_SAVING:.0%}"
                   if saving < MIN_SAVING else
                   f"a point per {by}'s interval against the strongest reaches {lo:+.4f}, below -{floor:g}"))
        return point, route
    new_route = route.copy()
    for d, o in got.groups.items():
        at = doms == d
        new_route[at] = table[o.name][3][at]
    share = cost / point.strongest_cost_usd if point.strongest_cost_usd > 0 else 1.0
    shown = "; ".join(f"{d}: {o.name}" for d, o in sorted(got.groups.items()))
    others = "" if clusters is not None and set(got.groups) == set(clusters.names) else f"; other {by}s: {point.pooled()}"
    reason = (f"a point per {by} ({shown}{others}) is "
              f"cheaper than one point for all and not significantly below {STRONGEST} ({point.strongest_worker}) on each "
              f"{by}'s rows or on the whole: accuracy {float(got.quality.mean()):.4f} against {point.strongest_accuracy:.4f}, "
              f"difference {m:+.4f} [{lo:+.4f}, {hi:+.4f}], at ${cost * 1000:.4g} per 1,000 = {share:.0%} of its cost "
              f"(one point for all: {point.oof_cost_usd / point.strongest_cost_usd if point.strongest_cost_usd > 0 else 1:.0%}; "
              f"out of fold over {point.n_rows} non-test rows)")
    if clusters is not None:
        got.about, got.by = {n: f", e.g. {clusters.examples.get(n, '')!r}" for n in got.groups}, by
    if log is not None:
        log(f"default operating point per {by}, out of fold:")
        for line in got.lines():
            log(line)
    return point.model_validate({**point.model_dump(), "per_domain": per, "reason": reason,
                                 "oof_accuracy": float(got.quality.mean()), "oof_cost_usd": cost,
                                 "difference": (m, lo, hi),
                                 "clusters": None if clusters is None else PointClusters.of(clusters)}), new_route


def default_lines(p: DefaultPoint) -> list[str]:
    """How `fugu-lite train` and `evaluate` state the default (one line each)."""
    what = (p.per_domain_text() + " (λ-routing: argmax predicted quality − "
            "λ·expected cost / the reference's mean cost)" if p.per_domain else
            f"λ-routing at λ = {p.lam:.4g} (argmax predicted quality − λ·expected cost / the reference's mean cost)"
            if p.kind == "lambda" else f"always the strongest worker, {p.strongest_worker}")
    return [f"the selected head's default operating point (what it routes by when no cap is asked): {what}",
            f"reason: {p.reason}"]

