"""The budget part of a held-out report: a cap's operating point chosen on the calibration's rows
(validation, or every non-test row out of fold for a head `fugu-lite train` refitted), scored on
the held-out split, next to every single worker and the best one the cap allows.

Honesty rules: λ comes from the calibration (no held-out row is among its rows); the routes use
predicted quality and EXPECTED cost only; the held-out rows' actual cost and quality are the
outcomes reported. The cap's rows are routed as a server routes them: one at a time in traffic
order (`route/follow.traffic_order`), each at the λ of the calibration's curve that follows the
spend of the routes before it (`route/follow.py`: each row's expected cost, settled to the recorded
cost of its route as a served reply settles it; a row's own actual cost never moves its own route).
"Best single worker within the cap" is chosen on TRAINING rows (the best
training quality among workers whose training expected cost is within the cap), then scored on
the held-out rows, so the comparison does not peek either.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.evaluate.baselines import SHOWN_WORKERS
from fugu_pipeline.evaluate.metrics import ci_text, paired_bootstrap, pick
from fugu_pipeline.route.budget import Budget, BudgetCalibration, budget_scores, follow_routes, quality_of
from fugu_pipeline.route.follow import HORIZON, TARGET, CapFollower, traffic_order


def pareto_front(points: list[dict], cost: str = "cost_usd_per_1k", value: str = "quality") -> list[dict]:
    """The points no other point beats on both (lower cost, higher value), cheapest first."""
    front, best = [], -np.inf
    for p in sorted(points, key=lambda p: (p[cost], -p[value])):
        if p[value] > best + 1e-12:
            front.append(p)
            best = p[value]
    return front


def budget_section(checkpoint, data, split: str, calibration: BudgetCalibration, budget: Budget | None,
                   *, n_boot: int = 2000, seed: int = 0) -> dict:
    held, train = data.split(split), data.split("train")
    if held.quality is None or held.cost_usd is None:
        raise ValueError("the budget report needs quality and cost on the held-out rows")
    W = list(data.worker_ids)
    ref = W.index(calibration.reference_worker)
    q_hat = quality_of(checkpoint.head, held.features, held.domains, kind=checkpoint.manifest.head_kind)
    c_hat = calibration.cost_model.predict(held.prompts, held.domains)
    Q, C = held.quality, held.cost_usd
    ref_cost, ref_note = float(C[:, ref].mean()), calibration.reference_note
    if ref_cost <= 0:  # a share of $0 does not exist: the share is of its expected cost on these rows
        ref_cost = float(c_hat[:, ref].mean()) or calibration.reference_cost_usd or 1.0
        ref_note = " ".join(x for x in (ref_note, (
            f"{calibration.reference_worker} costs nothing on the {split} rows, so the shares here are of its expected "
            f"cost there (${ref_cost * 1000:.4g} per 1,000 requests)")) if x)

    def at(lam: float) -> np.ndarray:
        return np.argmax(budget_scores(q_hat, c_hat, lam, calibration.reference_cost_usd), axis=1)

    curve = []
    for p in calibration.curve:
        r = at(p.lam)
        curve.append({"lambda": p.lam, "cost_usd_per_1k": float(pick(C, r).mean()) * 1000,
                      "share": float(pick(C, r).mean()) / ref_cost, "quality": float(pick(Q, r).mean()),
                      "val_share": p.share, "val_quality": p.quality})
    workers = [{"name": w, "cost_usd_per_1k": float(C[:, i].mean()) * 1000, "share": float(C[:, i].mean()) / ref_cost,
                "quality": float(Q[:, i].mean())} for i, w in enumerate(W)]
    out = {
        "reference_worker": calibration.reference_worker,
        "reference_note": ref_note,
        "reference_cost_usd_per_1k": ref_cost * 1000,
        "cost_model": calibration.cost_model.describe(),
        "calibration": {"checkpoint": calibration.checkpoint, "data_version": calibration.data_version,
                        "n_val": calibration.n_val, "curve_rows": calibration.curve_rows},
        "workers": workers,
        "router_curve": curve,
        "router_pareto": pareto_front(curve),
    }
    if budget is None:
        return out
    op = calibration.choose(budget)
    curve_arrays = calibration.curve_arrays()
    scores, lams, _ = follow_routes(q_hat, c_hat, calibration.reference_cost_usd, lambda k: curve_arrays,
                                    CapFollower(calibration.cap_usd(budget)), traffic_order(held.task_ids), actual=C)
    r = np.argmax(scores, axis=1)
    cost = float(pick(C, r).mean())
    realised = {"cost_usd_per_1k": cost * 1000, "share": cost / ref_cost}
    met = within_cap(realised["share"], budget.share) if budget.share is not None else \
        within_cap(realised["cost_usd_per_1k"], budget.usd_per_1k)
    # the best single worker the cap allows, chosen on TRAINING rows
    c_train = calibration.cost_model.predict(train.prompts, train.domains).mean(axis=0)
    allowed = [i for i in range(len(W)) if (within_cap(c_train[i] / c_train[ref], budget.share) if budget.share is not None
                                              else within_cap(c_train[i] * 1000, budget.usd_per_1k))]
    chosen = {
        "budget": budget.model_dump(),
        "describe": budget.describe(),
        "lambda": op.lam,  # the cap's λ with its margin on the calibration's rows: whether it is kept there
        "followed": {"lambda_min": float(lams.min()), "lambda_median": float(np.median(lams)),
                     "lambda_max": float(lams.max()), "target": TARGET, "horizon": HORIZON,
                     "expected_share": float(pick(c_hat, r).mean()) / max(float(c_hat[:, ref].mean()), 1e-300)}
        if len(lams) else None,
        "met_on_validation": op.met_on_validation,
        "chosen_on": calibration.rows_text(),  # the rows its curve is drawn on
        "validation": {"cost_usd_per_1k": op.val_cost_usd_per_1k, "share": op.val_share, "quality": op.val_quality},
        split: {**realised, "quality": float(pick(Q, r).mean()), "met": bool(met),
                "route_distribution": {w: int((r == i).sum()) for i, w in enumerate(W)}},
        "note": op.note,
    }
    rq = pick(Q, r)
    chosen[split]["quality_ci"] = paired_bootstrap(rq, np.zeros_like(rq), n_boot, seed, min_rows=2)
    if allowed:
        best = max(allowed, key=lambda i: float(np.nanmean(train.quality[:, i])))
        chosen["best_single_within_cap"] = {
            "worker": W[best], "chosen_on": "train quality among workers whose train expected cost is within the cap",
            "quality": float(Q[:, best].mean()), "cost_usd_per_1k": float(C[:, best].mean()) * 1000,
            "router_minus_it": paired_bootstrap(rq, Q[:, best], n_boot, seed, min_rows=2)}
    else:
        chosen["best_single_within_cap"] = None
    out["operating_point"] = chosen
    return out


def budget_lines(sec: dict, split: str = "test") -> list[str]:
    """The budget section as printed lines: each worker, the router's Pareto points, the chosen point."""
    lines = [f"budget: reference (strongest on train) {sec['reference_worker']}, "
             f"${sec['reference_cost_usd_per_1k']:.4g} per 1,000 requests on {split}; {sec['cost_model']}"]
    if sec.get("reference_note"):
        lines.append(f"  note: {sec['reference_note']}")
    lines.append("  worker                                   cost $/1k   share   quality")
    workers = sec["workers"]
    if len(workers) > SHOWN_WORKERS:  # every worker the router used, then the best of the rest
        used = [w for w in workers if w["share"] > 0 or w["name"] == sec["reference_worker"]]
        rest = sorted((w for w in workers if w not in used), key=lambda w: -w["quality"])
        shown = used + rest[:max(0, SHOWN_WORKERS - 2 - len(used))]
        workers = [w for w in workers if w in shown]
    for w in workers:
        lines.append(f"  {w['name']:<40} {w['cost_usd_per_1k']:9.4g} {w['share']:7.3f} {w['quality']:9.4f}")
    if len(workers) < len(sec["workers"]):
        lines.append(f"  ... {len(sec['workers']) - len(workers)} more workers the router never chose (every one in the JSON report)")
    lines.append("  router Pareto points (λ: share, quality): " + ", ".join(
        f"{p['lambda']:.3g}: ({p['share']:.3f}, {p['quality']:.4f})" for p in sec["router_pareto"]))
    op = sec.get("operating_point")
    if op:
        t, v = op[split], op["validation"]
        ci = t["quality_ci"]
        interval = f"({ci['note']})" if ci["low"] is None else f"[{ci['low']:.4f}, {ci['high']:.4f}]"
        fo = op.get("followed")
        served = (f"; served following the spend, λ {fo['lambda_min']:.4g} to {fo['lambda_max']:.4g} (median "
                  f"{fo['lambda_median']:.4g}), expected cost {fo['expected_share']:.4f} of {sec['reference_worker']}'s"
                  if fo else "")
        lines.append(f"  chosen on {op.get('chosen_on', 'validation')} for the {op['describe']}: λ={op['lambda']:.4g} (share there "
                     f"{v['share']:.4f}{'' if op['met_on_validation'] else ', NOT met'}){served}; on {split}: quality "
                     f"{t['quality']:.4f} {interval} at ${t['cost_usd_per_1k']:.4g} per 1,000 = {t['share']:.4f} of "
                     f"{sec['reference_worker']} ({'within' if t['met'] else 'OVER'} the cap)")
        b = op.get("best_single_within_cap")
        if b:
            d = b["router_minus_it"]
            lines.append(f"  best single worker within the cap (chosen on train): {b['worker']} quality {b['quality']:.4f}; "
                         f"router − it {ci_text(d)}")
        if op["note"]:
            lines.append(f"  note: {op['note']}")
    return lines
