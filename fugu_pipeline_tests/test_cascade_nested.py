"""The cascade's cost-aware pick checked inside the folds (`policies/cascade/nested.py`): the pick,
made per fold on the other folds, must not be significantly below the strongest worker on the rows it
routes, or the strongest ships (`fit._checked_inside_folds`)."""

from types import SimpleNamespace

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import _checked_inside_folds
from fugu_pipeline.policies.cascade.nested import nested_figure
from fugu_pipeline.policies.cascade.ship import CandidateFigure
from fugu_pipeline.train.selection import STRONGEST, holds_inside_folds, interval, passes

PER_FOLD, K = 140, 5
N = PER_FOLD * K
quiet = lambda m: None  # noqa: E731


def _each_lucky(broken: bool):
    """Five cheap candidates; candidate f equals the strongest except on fold f's rows. With `broken`,
    there it is right on 1 row the strongest misses and wrong on 4 it gets: out of fold -3/700 each
    (within the half-point margin, not significantly below), but on the four folds that hold another
    candidate's fold that one reads -3/560 (outside the margin), so the pick for fold f is candidate f,
    and every fold pays its own 3 rows. Without, candidate f ties on fold f (1 row each way)."""
    folds = np.arange(N) % K
    first = [np.flatnonzero(folds == f) for f in range(K)]
    strong = np.ones(N)
    strong[[rows[0] for rows in first]] = 0.0  # one row per fold the strongest misses
    quality, cost = {STRONGEST: strong}, {STRONGEST: np.ones(N)}
    for f, mine in enumerate(first):
        q = strong.copy()
        q[mine[0]] = 1.0  # the candidate gets it
        q[mine[1:5] if broken else mine[1:2]] = 0.0
        quality[f"cheap {f}"], cost[f"cheap {f}"] = q, np.full(N, 0.1 + 0.01 * f)
    cf = SimpleNamespace(quality=quality, cost=cost, figure=quality, per_group={})
    cands = []
    for name in quality:
        m, lo, hi = interval(quality[name] - strong, 400, 0)
        cands.append(CandidateFigure(name, "cascade" if name != STRONGEST else "best worker", float(quality[name].mean()),
                                     float(quality[name].mean()), float(cost[name].mean()), m, lo, hi, "", m, lo, hi))
    return cands, cf, folds


def test_a_pick_that_is_lucky_on_its_own_rows_fails_inside_the_folds():
    cands, cf, folds = _each_lucky(broken=True)
    cheap = next(c for c in cands if c.name == "cheap 0")
    assert passes(cheap.vs_strongest, cheap.vs_low, cheap.vs_high, 0.005, 0.02)  # it passes out of fold
    m, lo, hi, cost = nested_figure(cands, cf, folds, 0.005, 0.02, 400, 0)
    assert m == -15 / N and hi < 0 and not holds_inside_folds(m, lo, hi, 0.02)
    assert 0.1 <= cost <= 0.15  # each fold routed by a cheap candidate
    win, reason, _ = _checked_inside_folds(cheap, "picked", None, cands, cf, folds, CascadeConfig(n_boot=400), 0,
                                           "strong", None, [], [], None, quiet)
    assert win.name == STRONGEST
    assert reason.startswith("cheap 0 passes out of fold (difference -0.0043") and "significantly below it" in reason
    assert "so the strongest worker (strong) ships" in reason


def test_a_pick_that_holds_inside_the_folds_ships_with_that_figure():
    cands, cf, folds = _each_lucky(broken=False)
    cheap = next(c for c in cands if c.name == "cheap 0")
    m, lo, hi, cost = nested_figure(cands, cf, folds, 0.005, 0.02, 400, 0)
    assert m == 0.0 and hi >= 0 and cost == pytest.approx(0.1)  # cheap 0 qualifies on every fold's others: the cheapest
    win, reason, _ = _checked_inside_folds(cheap, "picked", None, cands, cf, folds, CascadeConfig(n_boot=400), 0,
                                           "strong", None, [], [], None, quiet)
    assert win is cheap
    assert reason.startswith("picked; the pick made inside the folds (each fold routed by the candidate the rule "
                             "picks on the others): difference +0.0000 [")
    assert reason.endswith("at 10% of the strongest's cost")


def test_a_saving_that_the_pick_inside_the_folds_does_not_repeat_ships_the_strongest():
    """A candidate as accurate as the strongest everywhere, at half its cost on fold 0's rows only: 10%
    cheaper out of fold. Inside the folds, fold 0's rule sees no saving on the others and keeps the
    strongest; the other folds pick it and pay full price on their own rows: 100% of the strongest's
    cost, so the saving was fold 0's rows, not the rule's; the strongest ships."""
    folds = np.arange(N) % K
    strong = np.ones(N)
    quality = {STRONGEST: strong, "cheap": strong.copy()}
    cost = {STRONGEST: np.ones(N), "cheap": np.where(folds == 0, 0.5, 1.0)}
    cf = SimpleNamespace(quality=quality, cost=cost, figure=quality, per_group={})
    cands = [CandidateFigure(name, "cascade" if name != STRONGEST else "best worker", 1.0, 1.0, float(cost[name].mean()),
                             0.0, 0.0, 0.0, "", 0.0, 0.0, 0.0) for name in quality]
    cheap = cands[1]
    m, lo, hi, paid = nested_figure(cands, cf, folds, 0.005, 0.02, 400, 0)
    assert (m, lo, hi) == (0.0, 0.0, 0.0) and paid == pytest.approx(1.0) and cheap.cost_usd == pytest.approx(0.9)
    win, reason, _ = _checked_inside_folds(cheap, "picked", None, cands, cf, folds, CascadeConfig(n_boot=400), 0,
                                           "strong", None, [], [], None, quiet)
    assert win.name == STRONGEST
    assert "at 100% of the strongest's cost saves less than 2% of its cost, so the strongest worker (strong) ships" in reason


def test_the_choice_per_group_is_rebuilt_on_each_folds_others():
    """Two domains: the cheap worker ties the strongest on `code` and is wrong on `mc` half the
    time. Cheap everywhere fails; the choice per domain (cheap on code, the strongest on mc), rebuilt
    per fold on the other folds, routes each fold as the whole's does: no loss, about half the cost."""
    from fugu_pipeline.policies.cascade.groups import GROUP_STRONGEST

    folds = np.arange(N) % K
    doms = np.array(["code", "mc"] * (N // 2))
    strong = np.ones(N)
    cheap = np.where((doms == "mc") & (np.arange(N) % 4 < 2), 0.0, 1.0)
    quality = {STRONGEST: strong, "cheap everywhere": cheap}
    cost = {STRONGEST: np.ones(N), "cheap everywhere": np.full(N, 0.1)}
    per_group = {(d, GROUP_STRONGEST): (np.where(doms == d, cheap if d == "code" else strong, 0.0),
                                        np.where(doms == d, 0.1 if d == "code" else 1.0, 0.0)) for d in ("code", "mc")}
    cf = SimpleNamespace(quality=quality, cost=cost, figure=quality, per_group=per_group)
    cands = []
    for name in quality:
        m, lo, hi = interval(quality[name] - strong, 400, 0)
        cands.append(CandidateFigure(name, "cascade" if name != STRONGEST else "best worker", float(quality[name].mean()),
                                     float(quality[name].mean()), float(cost[name].mean()), m, lo, hi, "", m, lo, hi))
    args = {"groups": ["code", "mc"], "merged": [], "doms": doms, "per_group": per_group, "group_floor": 0.02}
    m, lo, hi, c = nested_figure(cands, cf, folds, 0.005, 0.02, 400, 0, "cascade per domain", args)
    assert (m, lo, hi) == (0.0, 0.0, 0.0) and c == pytest.approx(0.55)
    m, _, hi, c = nested_figure(cands, cf, folds, 0.005, 0.02, 400, 0)  # without the choice per group
    assert (m, hi, c) == (0.0, 0.0, 1.0)  # cheap everywhere fails on every fold: the strongest
