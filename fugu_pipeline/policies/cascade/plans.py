"""The plans a search tries, as plain tuples, and their run on one row set: what the search spends
its time on.

A plan inside the search is a tuple of steps, each `(worker columns, agree, verify)`: no pydantic
model is built per candidate; `to_model` makes the `CascadePlan` when a plan is saved or printed,
`from_model` reads one back. `plan_tuples` lists them (the shapes: `search.candidate_plans`).

`RowSet` cuts one grid's arrays to one row set once (answer codes, qualities, verifier scores) and
memoises what plans share: the modal answer of each ordered set of called workers, the best verifier
score of each step (at each set of paid workers when the scores read them), the last step's answer.
A plan's run is then a few boolean operations over its rows, per plan only over its own columns,
and gives the same per-row quality, expected cost and utility as `policy.simulate`: the same
operations on the same values in the same order (`fugu_pipeline_tests/test_plan_search.py` and
`benchmarks/bench_plan_search.py` check them equal). `RowSet.points` runs every plan once and keeps
the means (and the cost's standard error) as arrays: `Points`, what the choices and the frontier read.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadeStep, _majority_first, _modal

Step = tuple  # (tuple of worker columns, agree: int | None (EXAMPLES: the examples rule), verify: float | None)
Plan = tuple  # tuple of Steps; the last always answers
EXAMPLES = 0  # in a step's agree slot: stop when a reply passes its prompt's examples (no agreement counts 0)


def to_model(plan: Plan, ids: list[str]) -> CascadePlan:
    return CascadePlan(steps=[CascadeStep(workers=[ids[j] for j in cols], agree=None if agree == EXAMPLES else agree,
                                          verify=verify, examples=agree == EXAMPLES)
                              for cols, agree, verify in plan])


def from_model(plan: CascadePlan, ids: list[str]) -> Plan:
    col = {w: j for j, w in enumerate(ids)}
    if any(s.examples and s.agree is not None for s in plan.steps):
        raise ValueError("a searched step stops on agreement or on its examples, not both")
    return tuple((tuple(col[w] for w in s.workers), EXAMPLES if s.examples else s.agree, s.verify) for s in plan.steps)


def uses_verifier(plan: Plan) -> bool:
    return any(v is not None for _, _, v in plan[:-1])


def plan_tuples(grid, rows: np.ndarray, cfg, allowed: list[str] | None = None):
    """Every plan of the searched shapes in search order (`search.candidate_plans` says which), at
    most `cfg.max_plans`, thresholds from the scores on `rows`."""
    ids = grid.worker_ids
    usable = [j for j, w in enumerate(ids) if allowed is None or w in allowed]
    q = grid.quality[rows].mean(axis=0)
    by_q = sorted(usable, key=lambda j: -q[j])
    finals = by_q[: cfg.finals]
    in_context = hasattr(grid.scores, "at")
    passed = getattr(grid, "passed", None)
    examples = passed is not None and bool(passed[rows].any())
    memo: dict = {}

    def levels(js, called=None, n: int = cfg.thresholds) -> list[float]:
        """`n` quantiles of the step's scores (its workers `js`, after paying for `called`)."""
        key = (tuple(js), tuple(called or js), n)
        if key not in memo:
            S = grid.scores.at(list(called or js)) if in_context else grid.scores
            s = S[np.ix_(rows, list(js))].ravel()
            s = s[~np.isnan(s)]
            memo[key] = sorted({round(float(x), 4) for x in np.quantile(s, np.linspace(0.1, 0.95, n))}) if len(s) else []
        return memo[key]

    def coarse(js, called=None, n: int = 5) -> list[float]:
        v = levels(js, called)
        return v[:: max(1, len(v) // n)]

    def plans():
        for f in finals:
            last = ((f,), None, None)
            yield (last,)
            cheap = [j for j in by_q if j != f and grid.exp_cost[j] < grid.exp_cost[f]][: cfg.cheap]
            for a in cheap:
                for v in levels([a], n=cfg.single_thresholds):
                    yield (((a,), None, v), last)
            if examples:  # the code's own test: a cheap worker's reply kept when it passes its prompt's examples
                for a in cheap:
                    yield (((a,), EXAMPLES, None), last)
                if cfg.cheap_steps >= 2:
                    for a, b in itertools.permutations(cheap, 2):
                        yield (((a,), EXAMPLES, None), ((b,), EXAMPLES, None), last)
            for a, b in itertools.combinations(cheap, 2):
                yield (((a, b), 2, None), last)
                for v in levels([a, b])[:: 2]:
                    yield (((a, b), None, v), last)
                    yield (((a, b), 2, v), last)
            if cfg.three_steps or cfg.cheap_steps >= 2:
                for a, b in itertools.permutations(cheap, 2):
                    for v1 in coarse([a]):
                        first = ((a,), None, v1)
                        yield (first, ((b,), 2, None), last)
                        for v2 in coarse([b], [a, b]):
                            yield (first, ((b,), 2, v2), last)
                            if in_context:  # the verifier reads the agreement itself: it may overrule it
                                yield (first, ((b,), None, v2), last)
            if cfg.parallel >= 3:
                for a, b, c in itertools.combinations(cheap, 3):
                    yield (((a, b, c), 2, None), last)
                    yield (((a, b, c), 3, None), last)
                    for v in coarse([a, b, c], n=3):
                        yield (((a, b, c), 2, v), last)
                        if in_context:
                            yield (((a, b, c), None, v), last)
                    for x, y, z in ((a, b, c), (a, c, b), (b, c, a)):
                        yield (((x, y), 2, None), ((z,), 2, None), last)
            if cfg.cheap_steps >= 3:
                for a, b, c in itertools.permutations(cheap, 3):
                    for v1 in coarse([a], n=2):
                        first = ((a,), None, v1)
                        for v2 in [None, *coarse([b], [a, b], n=2)]:
                            for v3 in [None, *coarse([c], [a, b, c], n=2)]:
                                yield (first, ((b,), 2, v2), ((c,), 2, v3), last)

    yield from itertools.islice(plans(), cfg.max_plans)


@dataclass
class Points:
    """Every plan of a search run once on one row set: the plans (tuples, search order) and their
    mean expected cost, mean quality, mean utility and the cost's standard error, as arrays."""

    plans: list
    cost: np.ndarray
    quality: np.ndarray
    utility: np.ndarray
    cost_se: np.ndarray
    n_rows: int

    def best(self, key: str, mask: np.ndarray | None = None) -> int | None:
        """The first plan (search order) with the highest `key` ("quality" or "utility") among
        `mask`, ties going to the cheaper; None when the mask holds none."""
        idx = np.arange(len(self.plans)) if mask is None else np.flatnonzero(mask)
        if not len(idx):
            return None
        v = getattr(self, key)[idx]
        top = idx[v == v.max()]
        c = self.cost[top]
        return int(top[c == c.min()][0])

    def within(self, cap_usd: float, z: float = 0.0) -> np.ndarray:
        """The plans whose mean expected cost, plus `z` standard errors, is within `cap_usd`."""
        return within_cap(self.cost + z * self.cost_se, cap_usd)


class RowSet:
    """One grid's arrays on one row set, cut once; plans run on it (see the module docstring)."""

    def __init__(self, grid, rows: np.ndarray):
        self.grid, self.rows = grid, np.asarray(rows)
        self.n = len(self.rows)
        self.C = grid.codes[self.rows]
        self.Q = grid.quality[self.rows]
        self.in_context = hasattr(grid.scores, "at")
        self.S = None if self.in_context else grid.scores[self.rows]
        self.P = None if getattr(grid, "passed", None) is None else np.asarray(grid.passed, bool)[self.rows]
        per_row = lambda a: np.asarray(a, float)[self.rows] if np.ndim(a) == 2 else np.asarray(a, float)  # noqa: E731
        self.cost, self.lat = per_row(grid.call_cost), per_row(grid.call_latency)  # (n, W) recorded, or (W,)
        self.flat = self.Q.ravel()
        self.base = np.arange(self.n) * self.Q.shape[1]
        self._modal: dict = {}
        self._best: dict = {}
        self._last: dict = {}
        self._step: dict = {}

    def modal(self, called: tuple):
        if called not in self._modal:
            self._modal[called] = _modal(self.C[:, list(called)], list(called))
        return self._modal[called]

    def best_score(self, idx: tuple, called: tuple):
        key = (idx, tuple(sorted(called)) if self.in_context else None)
        if key not in self._best:
            cols = list(idx)
            Sk = self.grid.scores.at(list(called))[np.ix_(self.rows, cols)] if self.in_context else self.S[:, cols]
            s = np.where(self.C[:, cols] >= 0, Sk, -np.inf)
            s = np.where(np.isnan(s), -np.inf, s)
            self._best[key] = (s.max(axis=1), np.asarray(cols)[np.argmax(s, axis=1)])
        return self._best[key]

    def last_pick(self, idx: tuple) -> np.ndarray:
        if idx not in self._last:
            self._last[idx] = _majority_first(self.C[:, list(idx)], list(idx))
        return self._last[idx]

    def _step_terms(self, idx: tuple):
        """One step's cost (its workers' summed) and latency (its slowest), as `simulate` adds them to
        every row reaching it: floats, or per row where the grid records each call's."""
        if idx not in self._step:
            cols = list(idx)
            cost = self.cost[:, cols].sum(axis=1) if self.cost.ndim == 2 else float(np.add.reduce(self.cost[cols]))
            lat = self.lat[:, cols].max(axis=1) if self.lat.ndim == 2 else float(np.maximum.reduce(self.lat[cols]))
            self._step[idx] = (cost, lat)
        return self._step[idx]

    def outcome(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """(answering worker column, stop step) per row."""
        n = self.n
        active = np.ones(n, bool)
        pick = np.empty(n, dtype=np.int64)
        stop = np.zeros(n, dtype=np.int64)
        called: tuple = ()
        last_k = len(plan) - 1
        for k, (idx, agree, verify) in enumerate(plan):
            called = called + tuple(idx)
            if k == last_k:
                np.copyto(pick, self.last_pick(tuple(idx)), where=active)
                np.copyto(stop, k, where=active)
                break
            decided = None
            if agree == EXAMPLES:
                if self.P is not None:
                    P = self.P[:, list(idx)]
                    decided = active & P.any(axis=1)
                    np.copyto(pick, np.asarray(idx)[np.argmax(P, axis=1)], where=decided)
            elif agree is not None and len(called) >= agree:
                count, first = self.modal(called)
                decided = active & (count >= agree)
                np.copyto(pick, first, where=decided)
            if verify is not None:
                best, at = self.best_score(tuple(idx), called)
                ok = active & (best >= verify)
                if decided is not None:
                    ok &= ~decided
                np.copyto(pick, at, where=ok)
                decided = ok if decided is None else decided | ok
            if decided is not None:
                np.copyto(stop, k, where=decided)
                active &= ~decided
                if not active.any():
                    break
        return pick, stop

    def run(self, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(quality, expected cost, utility) per row, as `search.Grid.run` gives for the plan's model."""
        pick, stop = self.outcome(plan)
        paid, waited, pc, pw = [], [], 0.0, 0.0
        for idx, _, _ in plan:
            c, w = self._step_terms(tuple(idx))
            pc, pw = pc + c, pw + w
            paid.append(pc)
            waited.append(pw)
        paid, waited = self._at_stop(paid, stop), self._at_stop(waited, stop)  # each row's, up to the step it stopped at
        u = self.grid.utility
        cterm = u.cost_weight * np.minimum(np.maximum(paid, 0) / u.cost_scale_usd, u.cap)
        lterm = u.latency_weight * np.minimum(np.maximum(waited, 0) / u.latency_scale_s, u.cap)
        qual = self.flat[self.base + pick]
        return qual, paid, u.quality_weight * qual - cterm - lterm

    def _at_stop(self, per_step: list, stop: np.ndarray) -> np.ndarray:
        """Each row's running total at its stop step: totals per step (floats), or per step and row."""
        a = np.asarray(per_step)
        return a[stop] if a.ndim == 1 else a[stop, np.arange(self.n)]

    def points(self, plans) -> Points:
        plans = list(plans)
        out = np.empty((len(plans), 4))
        sq = np.sqrt(max(self.n, 1))
        for p, plan in enumerate(plans):
            q, c, u = self.run(plan)
            out[p] = (c.mean(), q.mean(), u.mean(), c.std() / sq)
        return Points(plans, out[:, 0], out[:, 1], out[:, 2], out[:, 3], self.n)


def points_for(grid, rows: np.ndarray, cfg, allowed=None, memo: dict | None = None) -> Points:
    """Every plan of the search run once on `rows` of `grid`. `memo` keeps them by the grid's costs
    (expected and, where recorded, each call's), which replies pass their examples, the rows and the
    search's shape: within one fit the
    choice, the frontier, the per-group plans and the final search read the same row sets, and each
    is run once. It also keeps each plan's figures on a row set, so a second search of the same rows
    (a finer grid for the caps beside the coarse one the choice reads) runs only the plans the first
    did not: a plan is a tuple of workers and thresholds, and its figures depend on nothing else."""
    digest = lambda a: None if a is None else hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).digest()  # noqa: E731
    base = (np.asarray(grid.exp_cost).tobytes(), np.asarray(grid.exp_latency).tobytes(), np.asarray(rows).tobytes(),
            tuple(allowed) if allowed is not None else None, digest(grid.row_cost), digest(grid.row_latency),
            digest(getattr(grid, "passed", None)))
    key = (base, tuple(getattr(cfg, f) for f in _SHAPE))
    if memo is not None and key in memo:
        return memo[key]
    plans = list(plan_tuples(grid, rows, cfg, allowed))
    seen = memo.setdefault(("plans", base), {}) if memo is not None else {}
    todo = [p for p in dict.fromkeys(plans) if p not in seen]
    if todo:
        got = RowSet(grid, rows).points(todo)
        seen.update(zip(todo, zip(got.cost, got.quality, got.utility, got.cost_se)))
    fig = np.array([seen[p] for p in plans], dtype=float).reshape(len(plans), 4)
    pts = Points(plans, fig[:, 0], fig[:, 1], fig[:, 2], fig[:, 3], len(rows))
    if memo is not None:
        memo[key] = pts
    return pts


# what `plan_tuples` reads of a search's settings: two searches alike in these list the same plans
_SHAPE = ("finals", "cheap", "thresholds", "single_thresholds", "three_steps", "cheap_steps", "parallel", "max_plans")
