"""The held-out report of a one-shot checkpoint's default operating point (`default_point.py`):
the point `route`, `ask` and `serve` use when a request asks no cap, scored on a split and compared
with always the strongest worker (accuracy with a paired 95% interval, expected and realised cost)."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.evaluate.metrics import paired_bootstrap
from fugu_pipeline.evaluate.reports import head_scores
from fugu_pipeline.route.budget import BudgetCalibration, budget_scores, follow_routes, quality_of
from fugu_pipeline.route.follow import CapFollower, traffic_order
from fugu_pipeline.train.groups import group_label


def default_section(checkpoint, data, split: str, calibration: BudgetCalibration, point=None, n_boot: int = 2000,
                    seed: int = 0) -> dict | None:
    """The section of `point` (None: the calibration's default point), or None when there is no
    point or the split holds no quality."""
    dp = point if point is not None else calibration.default
    held = data.split(split)
    if dp is None or held.quality is None or dp.strongest_worker not in data.worker_ids:
        return None
    n = len(held.task_ids)
    strong = data.worker_ids.index(dp.strongest_worker)
    route, c_hat, keys = point_route(checkpoint, held, calibration, dp)
    rows = np.arange(n)
    quality = np.nan_to_num(held.quality)
    acc, base = quality[rows, route], quality[:, strong]
    exp_c, exp_s = float(c_hat[rows, route].mean()), float(c_hat[:, strong].mean())
    real = held.cost_usd
    out = {"operating_point": dp.describe(), "kind": dp.kind, "lambda": dp.lam, "strongest_worker": dp.strongest_worker,
           "reason": dp.reason, "split": split, "n": n,
           "accuracy": paired_bootstrap(acc, np.zeros(n), n_boot, seed, min_rows=2),
           "strongest_accuracy": float(base.mean()),
           "minus_strongest": paired_bootstrap(acc, base, n_boot, seed, min_rows=2),
           "expected_usd_per_1k": exp_c * 1000, "strongest_expected_usd_per_1k": exp_s * 1000,
           "expected_share_of_strongest": exp_c / exp_s if exp_s > 0 else None,
           "routed_share": {w: float(np.mean(route == j)) for j, w in enumerate(data.worker_ids)}}
    if dp.per_domain:  # each group's rows under its own point (the others under the pooled one)
        keys = np.asarray(keys, dtype=object)
        out["per_group"] = []
        for g in sorted(dp.per_domain):
            at = keys == g
            if not at.any():
                continue
            sc = float(c_hat[at, strong].mean())
            out["per_group"].append({
                "group": g, "by": dp.by, "routing": dp.routing(dp.per_domain[g]), "n": int(at.sum()),
                "accuracy": float(acc[at].mean()), "strongest_accuracy": float(base[at].mean()),
                "minus_strongest": paired_bootstrap(acc[at], base[at], n_boot, seed, min_rows=2),
                "expected_share_of_strongest": float(c_hat[rows[at], route[at]].mean()) / sc if sc > 0 else None})
    if real is not None:
        rc, rs = float(np.nan_to_num(real[rows, route]).mean()), float(np.nan_to_num(real[:, strong]).mean())
        out.update({"realised_usd_per_1k": rc * 1000, "strongest_realised_usd_per_1k": rs * 1000,
                    "realised_share_of_strongest": rc / rs if rs > 0 else None})
    return out


def routes_at(checkpoint, rows, point, calibration: BudgetCalibration | None) -> np.ndarray:
    """The worker index of each of `rows` (a `RoutingData` in the checkpoint's worker order) at
    operating point `point` (None: the head's argmax), as the `Router` routes them."""
    if point is not None and point.strongest_worker in rows.worker_ids:
        if calibration is None:  # always the strongest worker: no cost model needed
            return np.full(len(rows.task_ids), list(rows.worker_ids).index(point.strongest_worker))
        return point_route(checkpoint, rows, calibration, point)[0]
    return np.argmax(head_scores(checkpoint.head, rows.features, rows.domains), axis=1)


def served_routes(checkpoint, rows) -> np.ndarray:
    """The routes a loaded checkpoint serves on `rows` with no cap asked, read from the files beside it
    (`route/shipped.serving_point`: the point `train` chose, a λ per domain or prompt cluster
    included; else its greedy route): what the contest scores."""
    from fugu_pipeline.route.shipped import served_point_of

    return routes_at(checkpoint, rows, *served_point_of(checkpoint))


def served_report(checkpoint, data, split: str, *, calibration: BudgetCalibration | None = None, budget=None,
                  default_point: bool = True, n_boot: int = 2000, seed: int = 0) -> dict:
    """The held-out report of a one-shot checkpoint as it serves (`fugu-lite evaluate` and the
    `eval_report` assets): with no cap asked, every figure reads the route at the operating point it
    serves (`served_routes`), the report says which (`routes_by`), names the shipped policy, and adds
    the point's own section (`default_section`). `calibration`: one drawn on this data (else the
    checkpoint's own budget.json); `default_point=False`: the head's plain route."""
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint
    from fugu_pipeline.route.shipped import read_shipped, served_point_of

    point, own = served_point_of(checkpoint, calibration) if budget is None and default_point else (None, None)
    route_of = None if point is None else (lambda rows: routes_at(checkpoint, rows, point, own))
    rep = evaluate_checkpoint(checkpoint, data, split, n_boot, seed, calibration=calibration, budget=budget,
                              route_of=route_of)
    rep["routes_by"] = point.describe() if point is not None else "the head's plain route (the argmax of its scores)"
    shipped = read_shipped(checkpoint.path, checkpoint.manifest.content_hash)[0]  # what train chose and printed
    if shipped is not None:
        rep["shipped_policy"] = shipped.public()
    if point is not None and own is not None and \
            (sec := default_section(checkpoint, data, split, own, point, n_boot, seed)) is not None:
        rep["default_point"] = sec
    return rep


def point_route(checkpoint, held, calibration: BudgetCalibration, dp) -> tuple[np.ndarray, np.ndarray, list]:
    """(each row's worker index at operating point `dp`, the expected cost (n, W), each row's group:
    its domain or prompt cluster) on the rows of `held` (a `RoutingData` in the checkpoint's worker
    order): what the `Router` routes with no cap asked."""
    c_hat = calibration.cost_model.predict(held.prompts, held.domains)
    if dp.cap is not None:  # shipped under train's cap: the rows in traffic order, λ following the spend
        q_hat = quality_of(checkpoint.head, held.features, held.domains, kind=checkpoint.manifest.head_kind)
        arrays = calibration.curve_arrays()
        scores, _, _ = follow_routes(q_hat, c_hat, calibration.reference_cost_usd, lambda k: arrays,
                                     CapFollower(calibration.cap_usd(dp.cap)), traffic_order(held.task_ids),
                                     actual=None if held.cost_usd is None else np.asarray(held.cost_usd, np.float64))
        return np.argmax(scores, axis=1), c_hat, [None] * len(held.task_ids)
    keys = dp.group_keys(held.domains, held.features)  # each row's domain, or prompt cluster
    lams = dp.lambdas(keys, len(held.task_ids))  # NaN: always the strongest worker
    route = np.full(len(held.task_ids), list(held.worker_ids).index(dp.strongest_worker))
    if np.isfinite(lams).any():
        q_hat = quality_of(checkpoint.head, held.features, held.domains, kind=checkpoint.manifest.head_kind)
        routed = np.argmax(budget_scores(q_hat, c_hat, np.nan_to_num(lams)[:, None], calibration.reference_cost_usd), axis=1)
        route = np.where(np.isfinite(lams), routed, route)
    return route, c_hat, keys


def default_report_lines(sec: dict, shipped_line: str | None = None) -> list[str]:
    """The section as printed. `shipped_line`: the shipped policy's description (`route/shipped.py`),
    said instead of the point's own reason: one description of what ships, with the figures the
    choice among every candidate read."""
    a, d = sec["accuracy"], sec["minus_strongest"]
    ci = lambda x, f: "" if x["low"] is None else f" [{x['low']:{f}}, {x['high']:{f}}]"  # noqa: E731
    share = sec.get("realised_share_of_strongest", sec["expected_share_of_strongest"])
    cost = sec.get("realised_usd_per_1k", sec["expected_usd_per_1k"])
    return [f"operating point used (no cap asked): {sec['operating_point']}",
            f"{sec['split']} ({sec['n']} rows): accuracy {a['mean']:.4f}{ci(a, '.4f')} against always "
            f"{sec['strongest_worker']} {sec['strongest_accuracy']:.4f}, difference {d['mean']:+.4f}{ci(d, '+.4f')}, "
            f"${cost:.4g} per 1,000 = " + ("—" if share is None else f"{share:.0%}") + f" of {sec['strongest_worker']}'s cost",
            *[f"  {group_label(g['group'])} ({g['n']} rows, {g['routing']}): accuracy {g['accuracy']:.4f} against "
              f"{g['strongest_accuracy']:.4f}, difference {g['minus_strongest']['mean']:+.4f}"
              f"{ci(g['minus_strongest'], '+.4f')}, expected cost "
              + ("—" if g["expected_share_of_strongest"] is None else f"{g['expected_share_of_strongest']:.0%}")
              + f" of {sec['strongest_worker']}'s" for g in sec.get("per_group", [])],
            f"as chosen at training: {shipped_line}" if shipped_line else f"chosen at training: {sec['reason']}"]
