"""Selection on validation only (numpy, no torch): K-fold out-of-fold predictions over the non-test
rows, the validation objective, the choice of rule, and greedy ensembles.

- `fold_ids(task_ids, k, seed)`: a row's fold is a hash of (seed, task id), so it never depends on
  the other rows or their order, and the test split is never among the rows given.
- `Objective`: the validation figure of routing scores (N, W) on some of the non-test rows. Two
  workers: APGR of the score margin strong − weak (RouteLLM; the strong worker is the better one
  on the non-test rows). More workers: the mean utility of the greedy route, `pooled` over rows,
  `macro` (mean over domains of each domain's mean) or `blend` (their average). Pooled figures
  are dominated by the largest domain, macro ones are noisy where a domain has few rows.
- `nested_rule_check`: which rule to trust. For each rule, pick the best candidate on half of the
  folds and score that pick on the other half (both directions, averaged), with the `blend`
  figure as the judge; the rule whose picks hold up best wins (ties: pooled, then blend).
- `greedy_ensemble`: Caruana's forward selection with replacement of candidates by the objective;
  `nested_ensemble_check` compares "best single candidate" with "greedy ensemble" the same way
  (chosen on one half of the folds, scored on the other), so an ensemble is picked only when it
  holds up on rows its members were not chosen on.
- `cheapest_not_below`: the cost-aware rule a cascade's choice (`policies/cascade/choice.py`) and a one-shot
  head's default operating point (`policies/oneshot/default_point.py`) share: the cheapest candidate whose
  out-of-fold accuracy is not significantly below always the strongest worker's (its paired
  bootstrap 95% interval, `interval`, reaching 0, its mean within a margin).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

RULES = ("pooled", "macro", "blend")
STRONGEST = "always the strongest worker"


def fold_ids(task_ids: list[str], k: int = 5, seed: int = 0) -> np.ndarray:
    """Fold of each row in [0, k): sha256 of (seed, task id)."""
    if k < 2:
        raise ValueError(f"K-fold selection needs k >= 2 folds, got {k}")
    return np.array([int.from_bytes(hashlib.sha256(f"{seed}\x00{t}".encode()).digest()[:8], "big") % k
                     for t in task_ids], dtype=np.int64)


def routed(utility: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each row's utility at its highest-scoring worker (first on ties)."""
    return utility[np.arange(len(scores)), np.argmax(scores, axis=1)]


def macro_mean(values: np.ndarray, domains: np.ndarray) -> float:
    doms = np.unique(domains)
    return float(np.mean([values[domains == d].mean() for d in doms])) if len(doms) else float("nan")


def apgr(score: np.ndarray, perf_strong: np.ndarray, perf_weak: np.ndarray, points: int = 101) -> float:
    """RouteLLM's APGR: send the share x of rows with the highest score to the strong worker;
    PGR(x) = gain / (strong − weak) averaged over a grid of x (the same as evaluate.metrics.apgr)."""
    n = len(score)
    gap = perf_strong.mean() - perf_weak.mean() if n else 0.0
    if n == 0 or abs(gap) < 1e-12:
        return 0.0
    order = np.argsort(-score, kind="stable")
    xs = np.linspace(0, 1, points)
    gain = np.concatenate([[0.0], np.cumsum((perf_strong - perf_weak)[order])]) / n
    return float(np.trapezoid(gain[np.round(xs * n).astype(int)] / gap, xs))


@dataclass
class Objective:
    """Validation figure of routing scores on (a subset of) the non-test rows."""

    utility: np.ndarray  # (N, W) of the non-test rows
    perf: np.ndarray  # (N, W) quality (or utility) for APGR
    domains: np.ndarray  # (N,) str
    strong: int = field(init=False)

    def __post_init__(self) -> None:
        self.domains = np.asarray(self.domains, dtype=str)
        self.strong = int(np.argmax(self.perf.mean(axis=0)))

    @property
    def two_workers(self) -> bool:
        return self.utility.shape[1] == 2

    @property
    def name(self) -> str:
        return "APGR" if self.two_workers else "routed utility"

    def __call__(self, scores: np.ndarray, rows: np.ndarray | None = None, rule: str = "pooled") -> float:
        """The figure of `scores` under `rule`: the greedy route's utility, pooled, macro-averaged over
        domains or their blend; with two workers, "apgr" ranks the rows instead (RouteLLM's metric)."""
        rows = np.arange(len(self.utility)) if rows is None else rows
        s = scores[rows]
        if self.two_workers and rule == "apgr":
            w = 1 - self.strong
            return apgr(s[:, self.strong] - s[:, w], self.perf[rows, self.strong], self.perf[rows, w])
        u = routed(self.utility[rows], s)
        if rule == "pooled":
            return float(u.mean())
        m = macro_mean(u, self.domains[rows])
        if rule == "macro":
            return m
        if rule == "blend":
            return 0.5 * (m + float(u.mean()))
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {RULES}")

    def table(self, scores: np.ndarray, rows: np.ndarray | None = None) -> dict[str, float]:
        """Every figure of one candidate: pooled, macro and blend utility of the greedy route (two
        workers: APGR, which ranks them, and the pooled utility, which promotion compares across
        head kinds in the utility's own units)."""
        if self.two_workers:
            return {"apgr": self(scores, rows, "apgr"), **{r: self(scores, rows, r) for r in RULES}}
        return {r: self(scores, rows, r) for r in RULES}


def halves(folds: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(choose rows, judge rows) pairs: the first half of the folds against the second, and back."""
    fs = np.unique(folds)
    a = np.flatnonzero(np.isin(folds, fs[: len(fs) // 2]))
    b = np.flatnonzero(np.isin(folds, fs[len(fs) // 2:]))
    return [(a, b), (b, a)]


def best_of(preds: dict[str, np.ndarray], objective: Objective, rows=None, rule: str = "pooled") -> str:
    """The candidate with the best objective (first in order on ties)."""
    return max(preds, key=lambda n: (objective(preds[n], rows, rule), -list(preds).index(n)))


def nested_rule_check(preds: dict[str, np.ndarray], objective: Objective, folds: np.ndarray,
                      rules: tuple[str, ...] = RULES, judge: str = "blend") -> dict:
    """{"scores": {rule: held-out figure of its picks}, "rule": the winner, "reason": words}."""
    if objective.two_workers:
        return {"scores": {}, "rule": "apgr", "reason": "two workers: candidates are ranked by APGR"}
    scores = {}
    for rule in rules:
        vals = [objective(preds[best_of(preds, objective, a, rule)], b, judge) for a, b in halves(folds)]
        scores[rule] = float(np.mean(vals))
    order = ["pooled", "blend", "macro"]
    rule = max(rules, key=lambda r: (round(scores[r], 10), -order.index(r)))
    reason = (f"nested check (choose on half of the folds, judge {judge} utility on the other half, both ways): "
              + ", ".join(f"{r} {scores[r]:.4f}" for r in rules) + f"; {rule} holds up best"
              + (" (tie: the simpler rule)" if len({round(v, 10) for v in scores.values()}) < len(scores) else ""))
    return {"scores": scores, "rule": rule, "reason": reason}


def average(preds: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    w = np.ones(len(preds)) if weights is None else np.asarray(weights, float)
    return np.tensordot(w / w.sum(), np.stack(preds), axes=1)


def greedy_ensemble(preds: dict[str, np.ndarray], objective: Objective, rows=None, rule: str = "pooled",
                    rounds: int = 10) -> tuple[dict[str, int], list[float]]:
    """Forward selection with replacement: ({name: count}, objective after each round)."""
    chosen: list[str] = []
    curve: list[float] = []
    best = -np.inf
    for _ in range(rounds):
        cand = {n: objective(average([preds[c] for c in chosen + [n]]), rows, rule) for n in preds}
        n = max(cand, key=lambda k: (cand[k], -list(preds).index(k)))
        if chosen and cand[n] <= best + 1e-9:
            break
        chosen.append(n)
        best = cand[n]
        curve.append(float(best))
    counts: dict[str, int] = {}
    for n in chosen:
        counts[n] = counts.get(n, 0) + 1
    return counts, curve


def ensemble_scores(preds: dict[str, np.ndarray], counts: dict[str, int]) -> np.ndarray:
    names = list(counts)
    return average([preds[n] for n in names], [counts[n] for n in names])


def nested_ensemble_check(singles: dict[str, np.ndarray], members: dict[str, np.ndarray], objective: Objective,
                          folds: np.ndarray, rule: str, judge: str, rounds: int = 10) -> dict[str, float]:
    """Held-out figure of "best single candidate" and of "greedy ensemble", each chosen on one half
    of the folds and judged on the other (both directions, averaged)."""
    single, ens = [], []
    for a, b in halves(folds):
        single.append(objective(singles[best_of(singles, objective, a, rule)], b, judge))
        counts, _ = greedy_ensemble(members, objective, a, rule, rounds)
        ens.append(objective(ensemble_scores(members, counts), b, judge))
    return {"single": float(np.mean(single)), "ensemble": float(np.mean(ens))}


def lodo_folds(domains: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(held-out domain, training rows, held-out rows) for every domain."""
    domains = np.asarray(domains, dtype=str)
    return [(d, np.flatnonzero(domains != d), np.flatnonzero(domains == d)) for d in sorted(set(domains.tolist()))]


def oof_predictions(fit_predict: Callable[[np.ndarray, np.ndarray], dict[str, tuple]], folds: np.ndarray,
                    n_workers: int) -> dict[str, tuple[np.ndarray | None, np.ndarray]]:
    """Assemble the out-of-fold (quality, scores) of every grid point: fit_predict(train_rows,
    pred_rows) -> {name: (quality (n, W) or None, scores (n, W))} for each fold."""
    out: dict[str, list] = {}
    n = len(folds)
    for f in np.unique(folds):
        tr, te = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
        for name, (q, s) in fit_predict(tr, te).items():
            if name not in out:
                out[name] = [None if q is None else np.full((n, n_workers), np.nan), np.full((n, n_workers), np.nan)]
            if q is not None and out[name][0] is not None:
                out[name][0][te] = q
            else:
                out[name][0] = None
            out[name][1][te] = s
    return {k: (v[0], v[1]) for k, v in out.items()}


RESAMPLE_CELLS = 1 << 22  # row draws held at once by a bootstrap (about 32 MB of indices): memory bounded at any size


def interval(values: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    """Mean of `values` (per row) and its bootstrap 95% interval (resampling rows)."""
    v = np.asarray(values, float)
    if len(v) < 2:
        m = float(v.mean()) if len(v) else float("nan")
        return m, m, m
    rng = np.random.default_rng(seed)
    step = max(1, RESAMPLE_CELLS // len(v))  # resamples drawn a chunk at a time (the same draws)
    means = np.concatenate([v[rng.integers(0, len(v), size=(min(step, n_boot - s), len(v)))].mean(axis=1)
                            for s in range(0, n_boot, step)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(v.mean()), float(lo), float(hi)


def intervals(values: np.ndarray, n_boot: int, seed: int = 0, chunk: int | None = None) -> np.ndarray:
    """`interval` of every column of `values` (n, k) at once: (k, 3) of mean, low, high. The
    resamples are the very ones `interval` draws with the same seed (drawn `chunk` at a time, by
    default as many as `RESAMPLE_CELLS` row draws hold), each turned into per-row counts, so all
    columns cost one matrix product per chunk instead of a gather per column; on values that are whole numbers (accuracy differences of 0/1 grades) the figures
    are `interval`'s to the bit."""
    v = np.asarray(values, float)
    n, k = v.shape
    if n < 2:
        return np.array([interval(v[:, j], n_boot, seed) for j in range(k)]).reshape(k, 3)
    rng = np.random.default_rng(seed)
    chunk = chunk or max(1, RESAMPLE_CELLS // n)
    means = np.empty((n_boot, k))
    for s in range(0, n_boot, chunk):
        m = min(chunk, n_boot - s)
        idx = rng.integers(0, n, size=(m, n))
        counts = np.bincount((idx + n * np.arange(m)[:, None]).ravel(), minlength=m * n).reshape(m, n)
        means[s:s + m] = counts.astype(float) @ v / n
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return np.column_stack([v.mean(axis=0), lo, hi])


@dataclass
class Figure:
    """What `cheapest_not_below` reads of a candidate: its out-of-fold accuracy and cost, its accuracy
    difference from always the strongest worker with the 95% interval, and a note (non-empty: it may
    not be chosen, and the note says why)."""

    name: str
    quality: float
    cost_usd: float
    vs_strongest: float
    vs_low: float
    vs_high: float
    note: str = ""


@dataclass
class Pick:
    name: str
    reason: str
    strongest_ships: bool
    qualified: tuple[str, ...] = ()  # every candidate that met the rule, cheapest first


def passes(mean: float, low: float, high: float, margin: float, floor: float | None) -> bool:
    """The cost-aware rule's test of an accuracy difference from the strongest with its 95% interval:
    the interval reaches 0, the mean is within `margin` and the low end no further below than `floor`."""
    return high >= 0 and mean >= -margin and (floor is None or low >= -floor)


MIN_SAVING = 0.02  # a cheaper policy must save this share of the strongest's cost to count as cheaper


def holds_inside_folds(mean: float, low: float, high: float, floor: float | None) -> bool:
    """The test of a cascade's final pick once the pick itself is made inside the folds (per fold on
    the others): the interval reaches 0 and its low end is no further below than `floor`. Not the
    margin: per fold the pick may land on a cheaper candidate that fails it on this fold's rows, and
    the mean then sits a shade below a winner that ties the strongest on every row (a plan equal to
    the strongest on every row was refused so). A one-shot head's point keeps the margin too
    (`passes`): among one head's λ the cheapest that passes sits at the edge, and on a real import's
    split the margin was what refused a point that lost four points held out."""
    return passes(mean, low, high, float("inf"), floor)


def cheaper(cost: float | np.ndarray, strongest_cost: float, min_saving: float = MIN_SAVING):
    """Whether a cost counts as cheaper than the strongest's: by at least `min_saving` of it."""
    return cost < strongest_cost * (1 - max(min_saving, 1e-6))


def cheapest_not_below(cands, strongest_name: str, strongest_worker: str, margin: float, n_rows: int,
                       floor: float | None = None, min_saving: float = MIN_SAVING) -> Pick:
    """The cost-aware rule over `cands` (CandidateFigure-like: name, quality, cost_usd,
    vs_strongest, vs_low, vs_high, note): the cheapest whose accuracy difference from the strongest
    has a paired 95% interval reaching 0 and a mean within `margin`, and, with a `floor`, an
    interval whose low end is no further below 0 than the floor (a non-inferiority bound: on few
    rows an interval that reaches 0 can reach far below it, and what ships must hold on new rows).
    Only a candidate that saves at least `min_saving` of the strongest's cost counts as cheaper: a
    policy that differs from the strongest on a handful of rows passes on them by chance as easily as
    not, and on new rows it routes more of them (a 1% saving out of fold spent 8% less, and lost two
    points, on a real import's held-out rows). For the same reason, qualifying policies whose costs
    differ by less than `min_saving` of the strongest's cost are one price: the most accurate of
    those within that much of the cheapest ships (on a real import a one-shot head 0.4 cent per 1,000
    below a plan per domain was 1.2 points less accurate)."""
    base = next(c for c in cands if c.name == strongest_name)
    lower = [c for c in cands if c.name != strongest_name and cheaper(c.cost_usd, base.cost_usd, min_saving)
             and not c.note.startswith("unavailable")]
    ok = [base] + [c for c in lower if passes(c.vs_strongest, c.vs_low, c.vs_high, margin, floor)]
    ok.sort(key=lambda c: (c.cost_usd, -c.quality, c.name != strongest_name))
    qualified, band = tuple(c.name for c in ok), ok[0].cost_usd + max(min_saving, 0.0) * base.cost_usd
    win = min((c for c in ok if c.cost_usd <= band), key=lambda c: (-c.quality, c.cost_usd, c.name != strongest_name))
    bound = "" if floor is None else f", its low end above -{floor:g}"
    rule = (f"95% paired bootstrap interval of the accuracy difference reaching 0{bound}, mean within the "
            f"{margin * 100:.2g}-point margin, a saving of at least {min_saving:.0%} of its cost, out of fold over "
            f"{n_rows} non-test rows")
    if win.name != strongest_name and win.cost_usd < base.cost_usd:
        share = win.cost_usd / base.cost_usd if base.cost_usd > 0 else float("nan")
        what = "the cheapest policy" if win is ok[0] else (
            f"the most accurate policy costing within {min_saving:.0%} of the strongest's cost of {ok[0].name} "
            f"(accuracy {ok[0].quality:.4f} at ${ok[0].cost_usd * 1000:.4g} per 1,000), the cheapest policy")
        return Pick(win.name, (
            f"{win.name} is {what} not significantly below {STRONGEST} ({strongest_worker}): accuracy "
            f"{win.quality:.4f} against {base.quality:.4f}, difference {win.vs_strongest:+.4f} [{win.vs_low:+.4f}, "
            f"{win.vs_high:+.4f}], at ${win.cost_usd * 1000:.4g} per 1,000 = {share:.0%} of its cost ({rule})"), False, qualified)
    near = max(lower, key=lambda c: c.vs_strongest, default=None)
    tried = (f"; the closest cheaper one, {near.name}, is {near.vs_strongest:+.4f} [{near.vs_low:+.4f}, {near.vs_high:+.4f}]"
             if near is not None else "")
    return Pick(strongest_name, (
        f"no cheaper policy is within {margin * 100:.2g} point of {STRONGEST} ({strongest_worker}, accuracy "
        f"{base.quality:.4f}) without being significantly below it ({rule}){tried}; the strongest worker ships; "
        "replies on more rows, or a cheap worker that agrees with it more often, would let a cheaper policy qualify"), True,
        qualified)
