"""Evaluation metrics. Plain numpy; every figure comes from the held-out rows.

`evaluation_report` takes the router's per-task scores (higher = preferred) on the held-out
split, the utility matrix, and the training split (for the honest best-fixed baselines).

No leakage: every routing decision here (the greedy route, each point of the cost–quality curve)
uses only what is known before the call: the head's scores or predicted quality, and the
EXPECTED cost (`expected_cost`, from a model fitted on training rows, `route/budget.py`). The
held-out rows' actual quality and cost enter only as outcomes to report.

"Best fixed" is chosen on the training split for each metric it is compared on: the utility
figures against the worker with the best training utility, the quality figures against the
worker with the best training quality (they differ as soon as cost or latency weigh in).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_TOL = 1e-9
CURVE_LAMBDAS = tuple([0.0] + np.geomspace(1e-3, 100.0, 41).tolist())


@dataclass
class EvalInputs:
    """Held-out rows, plus the training split's utility and quality for choosing best fixed workers."""

    worker_ids: list[str]
    utility: np.ndarray  # (N, W) held-out
    scores: np.ndarray  # (N, W) router scores on the held-out rows
    train_utility: np.ndarray  # (M, W)
    domains: list[str] | None = None
    quality: np.ndarray | None = None
    cost_usd: np.ndarray | None = None  # actual cost of the held-out rows: reported, never routed on
    latency_s: np.ndarray | None = None
    train_quality: np.ndarray | None = None
    quality_pred: np.ndarray | None = None  # (N, W) a quality head's predictions, for the cost–quality curve
    expected_cost: np.ndarray | None = None  # (N, W) expected cost from the training fit (route/budget.py)
    cost_ref: float | None = None  # the reference worker's mean expected cost on training rows
    tags: list[tuple[str, ...]] | None = None  # per held-out row
    train_domains: list[str] | None = None  # the training rows' domains: a held-out domain not among them is unseen
    routes: np.ndarray | None = None  # (N,) the route served (a one-shot head at its operating point); None: argmax of scores


def pick(matrix: np.ndarray, routes: np.ndarray) -> np.ndarray:
    return matrix[np.arange(len(routes)), routes]


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 2000, seed: int = 0, *, min_rows: int = 1) -> dict:
    """Mean of a − b per task with a paired bootstrap 95% interval (resampling tasks). The reports
    ask for `min_rows=2`: one row resampled is itself, a zero-width interval that claims certainty,
    so under `min_rows` rows `low` and `high` are None and `note` says why (`ci_text` prints it)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    if len(d) < min_rows:
        return {"mean": float(d.mean()), "low": None, "high": None, "n": int(len(d)),
                "note": f"no interval from {len(d)} row (a bootstrap needs 2 or more)"}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_boot, len(d)))
    means = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "low": float(lo), "high": float(hi), "n": int(len(d))}


def ci_text(ci: dict, fmt: str = "+.4f") -> str:
    """`+0.0123 [-0.0100, +0.0300]`, or the mean and why there is no interval."""
    if ci.get("low") is None:
        return f"{ci['mean']:{fmt}} ({ci.get('note', 'no interval')})"
    return f"{ci['mean']:{fmt}} [{ci['low']:{fmt}}, {ci['high']:{fmt}}]"


def clearly_above(ci: dict, bar: float = 0.0) -> bool:
    """Whether the interval's low end is above `bar`; no interval is never clearly above."""
    return ci.get("low") is not None and ci["low"] > bar


def oracle_accuracy(utility: np.ndarray, routes: np.ndarray, tol: float = TIE_TOL) -> float:
    """Share of tasks routed to a best worker; ties count as correct."""
    best = utility.max(axis=1)
    return float(np.mean(pick(utility, routes) >= best - tol))


def apgr(strong_score: np.ndarray, perf_strong: np.ndarray, perf_weak: np.ndarray, points: int = 101) -> dict:
    """RouteLLM's Average Performance Gap Recovered and calls-to-strong thresholds.

    Route the share x of tasks with the highest `strong_score` to the strong worker, for x on a
    grid from 0 to 1; PGR(x) = (perf(x) − weak) / (strong − weak); APGR = mean of PGR over the
    grid (the area under the curve). CPT(p) = the smallest share of strong calls whose PGR ≥ p.
    """
    n = len(strong_score)
    order = np.argsort(-strong_score, kind="stable")
    weak_total, strong_total = perf_weak.mean(), perf_strong.mean()
    gap = strong_total - weak_total
    xs = np.linspace(0, 1, points)
    gain = np.concatenate([[0.0], np.cumsum((perf_strong - perf_weak)[order])]) / max(n, 1)
    perf = weak_total + gain[np.round(xs * n).astype(int)]
    pgr = (perf - weak_total) / gap if abs(gap) > 1e-12 else np.zeros_like(perf)

    def cpt(p: float) -> float | None:
        hit = np.flatnonzero(pgr >= p - 1e-12)
        return float(xs[hit[0]]) if len(hit) else None

    # random routing recovers PGR(x) = x on average: APGR 0.5 is the random baseline
    return {"apgr": float(np.trapezoid(pgr, xs)), "cpt50": cpt(0.5), "cpt80": cpt(0.8),
            "curve": {"strong_share": xs.tolist(), "pgr": pgr.tolist()},
            "strong_mean": float(strong_total), "weak_mean": float(weak_total)}


def cost_quality_curve(quality_pred: np.ndarray, expected_cost: np.ndarray, cost_ref: float, quality: np.ndarray,
                       cost: np.ndarray, lambdas=CURVE_LAMBDAS) -> list[dict]:
    """Route by argmax(q̂ − λ·ĉ/c_ref) for a sweep of λ, where ĉ is the EXPECTED cost (known before
    the call) and c_ref a training constant; report each route's realised mean cost (`cost`, the
    rows' actual cost: an outcome only) and mean quality."""
    scale = cost_ref if cost_ref and cost_ref > 0 else 1.0
    out = []
    for lam in lambdas:
        r = np.argmax(quality_pred - lam * expected_cost / scale, axis=1)
        out.append({"lambda": float(lam), "mean_cost_usd": float(pick(cost, r).mean()),
                    "mean_quality": float(pick(quality, r).mean()),
                    "route_counts": np.bincount(r, minlength=quality.shape[1]).tolist()})
    return out


def _usable(m: np.ndarray | None) -> bool:
    return m is not None and not np.isnan(m).any()


def group_rows(inp: EvalInputs, routes: np.ndarray, groups: dict[str, np.ndarray], fixed: int, fixed_q: int | None) -> list[dict]:
    """One row per group (a domain, a tag): n, router / best fixed / oracle / random utility, the
    top route; with quality: router, best fixed on quality, oracle; with cost: realised mean cost of
    the routes and of both best fixed workers."""
    U, W = inp.utility, inp.worker_ids
    rows = []
    for name, s in groups.items():
        if not s.any():
            continue
        row = {"name": name, "n": int(s.sum()), "router": float(pick(U[s], routes[s]).mean()),
               "best_fixed": float(U[s, fixed].mean()), "oracle": float(U[s].max(axis=1).mean()),
               "random": float(U[s].mean()), "top_route": W[int(np.bincount(routes[s], minlength=len(W)).argmax())]}
        if fixed_q is not None:
            Q = inp.quality
            row.update(router_quality=float(pick(Q[s], routes[s]).mean()), best_fixed_quality=float(Q[s, fixed_q].mean()),
                       oracle_quality=float(Q[s].max(axis=1).mean()))
        if _usable(inp.cost_usd):
            C = inp.cost_usd
            row.update(router_cost_usd=float(pick(C[s], routes[s]).mean()), best_fixed_cost_usd=float(C[s, fixed].mean()))
            if fixed_q is not None:
                row["best_fixed_quality_cost_usd"] = float(C[s, fixed_q].mean())
        rows.append(row)
    return rows


def macro_over_domains(inp: EvalInputs, routes: np.ndarray, mask: np.ndarray, fixed: int, fixed_q: int | None) -> dict:
    """A group's figures averaged over its domains (each domain's mean first, then their mean), so a
    large data set weighs as much as a small one: what a per-domain average reports for a group of
    data sets. `domains` says how many were averaged."""
    doms = np.asarray(inp.domains)
    rows = group_rows(inp, routes, {d: mask & (doms == d) for d in sorted(set(doms[mask]))}, fixed, fixed_q)
    keys = [k for k in rows[0] if k not in ("name", "n", "top_route")] if rows else []
    return {"domains": len(rows), **{k: float(np.mean([r[k] for r in rows])) for k in keys}}


def evaluation_report(inp: EvalInputs, *, n_boot: int = 2000, seed: int = 0) -> dict:
    U, W = inp.utility, inp.worker_ids
    if U.shape[0] == 0:
        raise ValueError("the held-out split has no rows: nothing to evaluate")
    routes = np.argmax(inp.scores, axis=1) if inp.routes is None else np.asarray(inp.routes, int)
    router_u = pick(U, routes)
    fixed_idx = int(np.argmax(inp.train_utility.mean(axis=0)))
    fixed_test_idx = int(np.argmax(U.mean(axis=0)))
    rep: dict = {
        "n_tasks": int(U.shape[0]),
        "worker_ids": list(W),
        "router_utility": float(router_u.mean()),
        "oracle_utility": float(U.max(axis=1).mean()),
        "best_fixed_worker": W[fixed_idx],
        "best_fixed_utility": float(U[:, fixed_idx].mean()),
        "best_fixed_test_chosen_worker (optimistic)": W[fixed_test_idx],
        "best_fixed_test_chosen_utility (optimistic)": float(U[:, fixed_test_idx].mean()),
        "random_utility": float(U.mean()),
        "oracle_route_accuracy": oracle_accuracy(U, routes),
        "router_minus_best_fixed": paired_bootstrap(router_u, U[:, fixed_idx], n_boot, seed, min_rows=2),
        "route_distribution": {w: int((routes == i).sum()) for i, w in enumerate(W)},
        "per_worker_utility": {w: float(U[:, i].mean()) for i, w in enumerate(W)},
    }
    rep["regret"] = rep["oracle_utility"] - rep["router_utility"]
    fixed_q = None
    if _usable(inp.quality) and _usable(inp.train_quality):
        # the quality figures' own best fixed worker: best training QUALITY (not utility)
        fixed_q = int(np.argmax(inp.train_quality.mean(axis=0)))
        rq = pick(inp.quality, routes)
        rep["best_fixed_quality_worker"] = W[fixed_q]
        rep["best_fixed_quality"] = float(inp.quality[:, fixed_q].mean())
        rep["router_minus_best_fixed_quality"] = paired_bootstrap(rq, inp.quality[:, fixed_q], n_boot, seed, min_rows=2)
    for name, m in (("quality", inp.quality), ("cost_usd", inp.cost_usd), ("latency_s", inp.latency_s)):
        if m is not None:
            rep[f"router_mean_{name}"] = float(np.nanmean(pick(m, routes)))
            rep[f"best_fixed_mean_{name}"] = float(np.nanmean(m[:, fixed_idx]))  # the utility-best worker's
            if fixed_q is not None:
                rep[f"best_fixed_quality_worker_mean_{name}"] = float(np.nanmean(m[:, fixed_q]))
    if inp.domains is not None:
        doms = np.asarray(inp.domains)
        rows = group_rows(inp, routes, {d: doms == d for d in sorted(set(inp.domains))}, fixed_idx, fixed_q)
        rep["per_domain"] = [{"domain": r.pop("name"), **r} for r in rows]
        if inp.train_domains is not None:
            seen = set(inp.train_domains)
            for r in rep["per_domain"]:
                r["seen_in_training"] = r["domain"] in seen
    if inp.tags is not None and any(inp.tags):
        names = sorted({t for ts in inp.tags for t in ts})
        masks = {t: np.array([t in ts for ts in inp.tags]) for t in names}
        rep["per_tag"] = [{"tag": r.pop("name"), "averaged": "over rows", **r}
                          for r in group_rows(inp, routes, masks, fixed_idx, fixed_q)]
        if inp.domains is not None:  # and over the tag's data sets, as routing papers report a group
            for r in rep["per_tag"]:
                r["macro"] = macro_over_domains(inp, routes, masks[r["tag"]], fixed_idx, fixed_q)
    if inp.cost_usd is not None and inp.quality is not None and np.nanstd(inp.cost_usd) > 0:
        points = [{"name": w, "mean_cost_usd": float(inp.cost_usd[:, i].mean()), "mean_quality": float(inp.quality[:, i].mean())} for i, w in enumerate(W)]
        points.append({"name": "router", "mean_cost_usd": rep["router_mean_cost_usd"], "mean_quality": rep["router_mean_quality"]})
        # a ceiling, not a router: it knows each row's outcome after the fact
        points.append({"name": "oracle (utility, after the fact)", "mean_cost_usd": float(pick(inp.cost_usd, U.argmax(axis=1)).mean()),
                       "mean_quality": float(pick(inp.quality, U.argmax(axis=1)).mean())})
        rep["cost_quality_points"] = points
        if inp.quality_pred is not None and inp.expected_cost is not None:
            rep["cost_quality_curve"] = cost_quality_curve(inp.quality_pred, inp.expected_cost, inp.cost_ref or 0.0,
                                                           inp.quality, inp.cost_usd)
    if len(W) == 2:
        perf = inp.quality if inp.quality is not None and not np.isnan(inp.quality).any() else U
        train_perf = inp.train_quality if inp.train_quality is not None and not np.isnan(inp.train_quality).any() else inp.train_utility
        strong = int(np.argmax(train_perf.mean(axis=0)))
        weak = 1 - strong
        margin = inp.scores[:, strong] - inp.scores[:, weak]
        rep["apgr"] = {"strong_worker": W[strong], "weak_worker": W[weak], "measure": "quality" if perf is inp.quality else "utility"}
        if abs(perf[:, strong].mean() - perf[:, weak].mean()) > 1e-12:
            rep["apgr"].update(apgr(margin, perf[:, strong], perf[:, weak]))
        else:  # PGR = (perf − weak) / (strong − weak) is 0/0: nothing to recover, and 0 would read as worse than random
            rep["apgr"].update(apgr=None, cpt50=None, cpt80=None,
                               note=f"APGR undefined: {W[strong]} and {W[weak]} have the same mean {rep['apgr']['measure']} on "
                                    "these rows, so there is no gap to recover")
    return rep


def summary_line(rep: dict) -> str:
    ci = rep["router_minus_best_fixed"]
    s = (f"router {rep['router_utility']:.4f} | best fixed ({rep['best_fixed_worker']}) {rep['best_fixed_utility']:.4f} | "
         f"oracle {rep['oracle_utility']:.4f} | random {rep['random_utility']:.4f} | "
         f"router − best fixed {ci_text(ci)} | "
         f"oracle-route acc {rep['oracle_route_accuracy']:.3f}")
    if "best_fixed_quality_worker" in rep:
        q = rep["router_minus_best_fixed_quality"]
        s += (f" | quality: router {rep['router_mean_quality']:.4f} vs best fixed on quality "
              f"({rep['best_fixed_quality_worker']}) {rep['best_fixed_quality']:.4f}, {ci_text(q)}")
    if "apgr" in rep:
        a = rep["apgr"]
        share = lambda v: "never" if v is None else f"{v:.0%}"  # noqa: E731  (share of strong calls)
        s += (f" | {a['note']}" if a["apgr"] is None
              else f" | APGR {a['apgr']:.3f} CPT50 {share(a['cpt50'])} CPT80 {share(a['cpt80'])}")
    return s
