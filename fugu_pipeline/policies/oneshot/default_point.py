"""The cost-aware default of a one-shot router: the operating point `route`, `ask`, `serve` and
`evaluate` use when a request states no cap (numpy only).

Where the utility gives cost no weight (quality-only weights, what every import is trained with) and
the matrix records cost, the argmax of predicted quality pays for the strongest worker wherever the
head leans to it. The default is instead **the cheapest λ-routing (argmax q̂ − λ·ĉ/c_ref, the
budget rule of `budget.py`) whose out-of-fold accuracy is not significantly below always the
strongest worker's**, the same rule as a cascade's (`train/selection.cheapest_not_below`):

- every λ of the budget grid routes the selected head's K-fold out-of-fold predictions over the
  non-test rows (ĉ: the calibration's expected cost, fitted on training rows);
- always the strongest worker: per fold, the most accurate on the other folds;
- a λ qualifies when the per-row accuracy difference from the strongest has a paired bootstrap 95%
  interval reaching 0, whose low end is above −`floor` (0.02, as `cascade.floor`), and a mean within
  `margin` (0.005, as `cascade.margin`); the cheapest ships;
- when the plain head (λ = 0) is already significantly below the strongest, or no cheaper λ
  qualifies, the default is the strongest worker alone, with the line saying why (except that a
  λ costing no more than the strongest and more accurate than it, a tie in cost, is kept).

The point is saved in the checkpoint's `budget.json` (`BudgetCalibration.default`, the schema in
`route/default_point.py`, which the `Router` reads to route by it), beside it, so the checkpoint's
content hash is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fugu_pipeline.route.default_point import DEFAULT_FLOOR, DEFAULT_MARGIN, DefaultPoint
from fugu_pipeline.train.selection import STRONGEST, cheapest_not_below, interval


@dataclass
class _Fig:  # what `cheapest_not_below` reads of a candidate
    name: str
    quality: float
    cost_usd: float
    vs_strongest: float
    vs_low: float
    vs_high: float
    note: str = ""


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
                         seed: int = 0, floor: float | None = DEFAULT_FLOOR) -> tuple[DefaultPoint, np.ndarray]:
    """`choose_default`, with the point's route over the rows (each row's worker index, out of fold):
    what the cascade's choice scores the head at, so what it compares is what the head serves."""
    q_oof, quality, c_hat = (np.asarray(a, np.float64) for a in (q_oof, quality, c_hat))
    n = len(quality)
    quality = np.nan_to_num(quality)
    strong_q, strong_c = np.zeros(n), np.zeros(n)
    for f in np.unique(folds):
        at, tr = folds == f, folds != f
        top = int(np.argmax(quality[tr].mean(axis=0))) if tr.any() else int(np.argmax(quality.mean(axis=0)))
        strong_q[at], strong_c[at] = quality[at, top], c_hat[at, top]
    top_all = worker_ids[int(np.argmax(quality.mean(axis=0)))]
    ref = c_ref if c_ref > 0 else 1.0
    cands, seen, lam_of = [_Fig(STRONGEST, float(strong_q.mean()), float(strong_c.mean()), 0.0, 0.0, 0.0)], {}, {}
    route_of = {}
    idx = np.arange(n)
    for lam in lambdas:
        route = np.argmax(q_oof - lam * c_hat / ref, axis=1)
        key = route.tobytes()
        if key in seen:  # the same routes as a smaller λ: the same policy
            continue
        q, c = quality[idx, route], c_hat[idx, route]
        d, lo, hi = interval(q - strong_q, n_boot, seed)
        name = lam_name(float(lam))
        seen[key] = name
        lam_of[name] = float(lam)
        route_of[name] = route
        cands.append(_Fig(name, float(q.mean()), float(c.mean()), d, lo, hi))
    base, plain = cands[0], cands[1]

    def point(kind, lam, fig, reason):
        route = route_of[fig.name] if kind == "lambda" else np.full(n, worker_ids.index(top_all))
        return DefaultPoint(kind=kind, lam=lam, strongest_worker=top_all, reason=reason, oof_accuracy=fig.quality,
                            oof_cost_usd=fig.cost_usd, strongest_accuracy=base.quality, strongest_cost_usd=base.cost_usd,
                            difference=(fig.vs_strongest, fig.vs_low, fig.vs_high), margin=margin, floor=floor, n_rows=n), route

    if plain.vs_high < 0:
        return point("strongest", None, base, (
            f"{plain.name} is significantly below {STRONGEST} ({top_all}) out of fold over {n} non-test rows: accuracy "
            f"{plain.quality:.4f} against {base.quality:.4f}, difference {plain.vs_strongest:+.4f} [{plain.vs_low:+.4f}, "
            f"{plain.vs_high:+.4f}] (95% paired bootstrap interval below 0), so no λ can keep its accuracy and the "
            f"strongest worker ({top_all}) is the default; a head with more signal (more rows, better features) would "
            "let a cheaper routing qualify"))
    pick = cheapest_not_below(cands, STRONGEST, top_all, margin, n, floor)
    if pick.strongest_ships:
        # nothing cheaper qualifies; a routing that costs no more and is more accurate beats it (a tie in cost)
        same = [c for c in cands[1:] if c.cost_usd <= base.cost_usd * (1 + 1e-6) and c.vs_strongest > 0 and c.vs_high >= 0]
        if not same:
            return point("strongest", None, base, pick.reason)
        win = max(same, key=lambda c: (c.quality, -c.cost_usd))
        return point("lambda", lam_of[win.name], win, (
            f"{win.name} costs no more than {STRONGEST} ({top_all}) and is more accurate out of fold over {n} non-test "
            f"rows: accuracy {win.quality:.4f} against {base.quality:.4f}, difference {win.vs_strongest:+.4f} "
            f"[{win.vs_low:+.4f}, {win.vs_high:+.4f}], at ${win.cost_usd * 1000:.4g} per 1,000 = "
            f"{win.cost_usd / base.cost_usd if base.cost_usd > 0 else 1:.0%} of its cost; no cheaper policy is within "
            f"{margin * 100:.2g} point of it without being significantly below it"))
    win = next(c for c in cands if c.name == pick.name)
    return point("lambda", lam_of[pick.name], win, pick.reason)


def default_lines(p: DefaultPoint) -> list[str]:
    """How `fugu-lite train` and `evaluate` state the default (one line each)."""
    what = (f"λ-routing at λ = {p.lam:.4g} (argmax predicted quality − λ·expected cost / the reference's mean cost)"
            if p.kind == "lambda" else f"always the strongest worker, {p.strongest_worker}")
    return [f"the selected head's default operating point (what it routes by when no cap is asked): {what}",
            f"reason: {p.reason}"]

