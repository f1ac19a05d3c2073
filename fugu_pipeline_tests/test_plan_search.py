"""The plan search runs plans as tuples on row sets cut once (`policies/cascade/plans.py`): every
figure must be exactly what `simulate` gives for the plan's model, and every choice of a whole fit
the same as with every plan run by `simulate` (the search before it was rewritten). Speed lives in
`benchmarks/bench_plan_search.py`."""

import numpy as np
import pytest

from fugu_pipeline.policies.cascade import plans as cascade_plans
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import fit_cascade
from fugu_pipeline.policies.cascade.plans import RowSet, from_model, plan_tuples, points_for, to_model
from fugu_pipeline.policies.cascade.policy import answer_codes
from fugu_pipeline.policies.cascade.search import CascadeSearch, Grid, candidate_plans, search
from fugu_pipeline_tests import cascade_fixture

quiet = lambda m: None  # noqa: E731
SMALL = CascadeSearch(thresholds=4, finals=2, cheap=2)


def _grid(seed: int = 0, n: int = 300, context: bool = False, per_row: bool = False, examples: bool = False):
    from fugu_pipeline.policies.cascade.verifier_context import with_context
    from fugu_pipeline.train.selection import fold_ids

    data, grid, inputs = cascade_fixture.make(seed=seed, n=n)
    rng = np.random.default_rng(seed)
    codes = answer_codes(grid.final)
    scores = np.clip(0.5 + 0.3 * (2 * data.quality - 1) + rng.normal(scale=0.2, size=data.quality.shape), 0, 1)
    scores[rng.random(scores.shape) < 0.05] = np.nan  # some replies unscored
    rows = np.flatnonzero(data.splits != "test")
    if context:
        folds = fold_ids([data.task_ids[i] for i in rows], 5, 0)
        scores = with_context(True, inputs, scores, codes, rows, folds, quiet)
    cost = data.cost_usd[rows].mean(axis=0)
    lat = np.array([0.5, 1.0, 2.0])
    g = Grid(data.worker_ids, codes, scores, data.quality, cost, lat, data.utility_config)
    if per_row:  # each call's own cost and latency, as a fit reads them where the matrix records them
        g.row_cost = data.cost_usd * rng.uniform(0.2, 3.0, size=data.cost_usd.shape)
        g.row_latency = lat * rng.uniform(0.5, 4.0, size=data.cost_usd.shape)
    if examples:  # which replies pass their prompt's examples: mostly the right ones
        g.passed = rng.random(data.quality.shape) < 0.1 + 0.8 * data.quality
    return g, rows


@pytest.mark.parametrize("context,per_row,examples", [(False, False, False), (True, False, False), (False, True, False),
                                                      (True, True, False), (False, False, True), (True, True, True)])
def test_every_plan_runs_exactly_as_simulate_runs_its_model(context, per_row, examples):
    g, rows = _grid(context=context, per_row=per_row, examples=examples)
    held = RowSet(g, rows)
    n = 0
    listed = list(plan_tuples(g, rows, CascadeSearch()))
    by_examples = [p for p in listed if any(a == cascade_plans.EXAMPLES for _, a, _ in p)]
    assert bool(by_examples) == examples  # the examples rule is searched where the code was run
    for plan in listed:
        model = to_model(plan, g.worker_ids)
        assert from_model(model, g.worker_ids) == plan
        for mine, ref in zip(held.run(plan), g.run(model, rows)):
            assert np.array_equal(mine, ref), model.describe()
        n += 1
    assert n > 100


def test_the_search_picks_what_running_every_model_picks():
    """The old search, written out: every `CascadePlan` run by `simulate`, the best utility (no cap)
    or the most accurate within the cap (ties: the cheaper, then the first)."""
    g, rows = _grid(seed=3)
    cfg = CascadeSearch()
    runs = [(p, *g.run(p, rows)) for p in candidate_plans(g, rows, cfg)]
    figs = [(float(c.mean()), float(q.mean()), float(u.mean())) for _, q, c, u in runs]
    best_u = max(range(len(runs)), key=lambda k: (figs[k][2], -figs[k][0]))
    got = search(g, rows, cfg)
    assert got.plan == runs[best_u][0] and (got.cost, got.quality, got.utility) == figs[best_u]
    assert got.figures == [f[2] for f in figs] and got.considered == len(runs)
    cap = float(np.median([f[0] for f in figs]))
    within = [k for k in range(len(runs)) if figs[k][0] <= cap * (1 + 1e-9)]
    best_q = max(within, key=lambda k: (figs[k][1], -figs[k][0]))
    capped = search(g, rows, cfg, cap)
    assert capped.plan == runs[best_q][0] and capped.figures == [f[1] for f in figs]


def test_a_fit_chooses_exactly_as_with_every_plan_run_by_simulate(monkeypatch):
    """Fixed seed: the whole fit (the cost-aware ladder, the table, the frontier, the final search)
    with the plans run as tuples, and again with every plan run as its model by `simulate`: the same
    chosen plans and the same figures."""
    data, grid, inputs = cascade_fixture.agreeing(n=300, seed=5)
    cfg = CascadeConfig(search=SMALL, n_boot=200)
    fast = fit_cascade(data, grid, inputs, cfg, log=quiet)

    def by_simulate(self, plan):
        return self.grid.run(to_model(plan, self.grid.worker_ids), self.rows)

    monkeypatch.setattr(cascade_plans.RowSet, "run", by_simulate)
    slow = fit_cascade(data, grid, inputs, cfg, log=quiet)
    assert fast.policy == slow.policy and fast.selected == slow.selected and fast.reason == slow.reason
    assert fast.table() == slow.table()
    assert fast.frontier["levels"] == slow.frontier["levels"]
    assert {d: (c.plan, c.quality, c.cost, c.figures, c.frontier) for d, c in fast.choices.items()} == \
        {d: (c.plan, c.quality, c.cost, c.figures, c.frontier) for d, c in slow.choices.items()}


def test_a_row_set_is_run_once_per_grid_through_the_memo():
    g, rows = _grid(seed=1)
    memo: dict = {}
    runs = lambda: sum(isinstance(v, cascade_plans.Points) for v in memo.values())  # noqa: E731
    a = points_for(g, rows, SMALL, None, memo)
    assert points_for(g, rows, SMALL, None, memo) is a and runs() == 1
    other = Grid(g.worker_ids, g.codes, g.scores, g.quality, g.exp_cost * 2, g.exp_latency, g.utility)
    assert points_for(other, rows, SMALL, None, memo) is not a and runs() == 2  # another grid's costs: its own run
    priced = Grid(g.worker_ids, g.codes, g.scores, g.quality, g.exp_cost, g.exp_latency, g.utility, row_cost=g.quality + 1)
    assert points_for(priced, rows, SMALL, None, memo) is not a and runs() == 3  # each call's own cost: its own run
    repriced = Grid(g.worker_ids, g.codes, g.scores, g.quality, g.exp_cost, g.exp_latency, g.utility, row_cost=g.quality + 2)
    assert points_for(repriced, rows, SMALL, None, memo) is not points_for(priced, rows, SMALL, None, memo)
    assert runs() == 4  # other recorded costs under the same means: not the first's run


def test_a_finer_search_of_the_same_rows_runs_only_the_plans_the_coarser_did_not(monkeypatch):
    """A no-cap fit's choice reads the coarse grid and its table at caps the finer one, on the same
    row sets: the second search runs only its new plans, and its figures are exactly those of the
    finer search run alone."""
    g, rows = _grid(seed=2)
    coarse = SMALL.model_copy(update={"single_thresholds": SMALL.thresholds})
    fine = SMALL.model_copy(update={"single_thresholds": 24})
    memo: dict = {}
    a = points_for(g, rows, coarse, None, memo)
    ran: list = []
    real = RowSet.points

    def counted(self, plans):
        ran.extend(plans)
        return real(self, plans)

    monkeypatch.setattr(RowSet, "points", counted)
    b = points_for(g, rows, fine, None, memo)
    new = set(b.plans) - set(a.plans)
    assert new and sorted(ran) == sorted(new), (len(ran), len(new))
    assert len(set(a.plans) & set(b.plans)) > len(new)  # the shapes both grids search alike: not run again
    alone = points_for(g, rows, fine)
    assert b.plans == alone.plans and b.n_rows == alone.n_rows
    for k in ("cost", "quality", "utility", "cost_se"):
        assert np.array_equal(getattr(b, k), getattr(alone, k)), k
    assert points_for(g, rows, fine, None, memo) is b and points_for(g, rows, coarse, None, memo) is a


def test_a_plan_pays_what_each_row_it_escalates_costs():
    """The cheap worker's reply is kept on short rows and escalated on long ones, which cost the
    strong worker four times as much: the plan's cost is those rows' recorded costs, above what the
    workers' mean costs would say."""
    n = 400
    long = np.arange(n) % 4 == 0
    quality = np.stack([(~long).astype(float), np.ones(n)], axis=1)
    scores = np.stack([np.where(long, 0.1, 0.9), np.full(n, np.nan)], axis=1)
    codes = np.stack([np.zeros(n, int), np.ones(n, int)], axis=1)
    row_cost = np.stack([np.full(n, 0.1), np.where(long, 4.0, 1.0)], axis=1)
    from fugu_pipeline.reward import UtilityConfig

    g = Grid(["cheap", "strong"], codes, scores, quality, row_cost.mean(axis=0), np.zeros(2), UtilityConfig(), row_cost=row_cost)
    plan = (((0,), None, 0.5), ((1,), None, None))
    rows = np.arange(n)
    q, c, _ = RowSet(g, rows).run(plan)
    assert q.mean() == 1.0 and np.allclose(c, np.where(long, 0.1 + 4.0, 0.1))
    assert c.mean() == pytest.approx(0.1 + 0.25 * 4.0)  # 1.1; priced at the means: 0.1 + 0.25 * 1.75 = 0.5375
    assert g.per_call(rows, np.ones(n, int))[0].mean() == pytest.approx(1.75)



def test_a_fit_prices_every_candidate_at_each_rows_recorded_costs():
    """Out of fold, always the strongest worker costs what it cost on each row (not its mean over
    the other folds), and a missing cost counts at that mean."""
    from fugu_pipeline.train.selection import STRONGEST

    from dataclasses import replace

    data, grid, inputs = cascade_fixture.agreeing(n=300, seed=5)
    cost = data.cost_usd * np.random.default_rng(1).uniform(0.2, 3.0, size=data.cost_usd.shape)
    cost[7, :] = np.nan
    data = replace(data, cost_usd=cost)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=SMALL, n_boot=200), log=quiet)
    rows = np.flatnonzero(data.splits != "test")
    top = int(np.argmax(data.quality[rows].mean(axis=0)))
    paid = fit.oof_cost[STRONGEST]
    known = ~np.isnan(data.cost_usd[rows, top])
    assert np.array_equal(paid[known], data.cost_usd[rows, top][known]) and not known.all()
    assert np.isfinite(paid).all()


def test_a_test_rows_recorded_cost_never_moves_the_plan():
    """Each call's recorded cost prices plans on the non-test rows only: the test rows' costs (and
    qualities) changed tenfold leave the plan, its thresholds and every out-of-fold figure as they were."""
    from dataclasses import replace

    data, grid, inputs = cascade_fixture.agreeing(n=300, seed=5)
    cost = data.cost_usd * np.random.default_rng(2).uniform(0.2, 3.0, size=data.cost_usd.shape)
    data = replace(data, cost_usd=cost)
    cfg = CascadeConfig(search=SMALL, n_boot=200)
    a = fit_cascade(data, grid, inputs, cfg, log=quiet)
    test = data.splits == "test"
    moved = replace(data, cost_usd=np.where(test[:, None], cost * 10, cost),
                    quality=np.where(test[:, None], 1 - data.quality, data.quality))
    b = fit_cascade(moved, grid, inputs, cfg, log=quiet)
    assert a.policy == b.policy and a.reason == b.reason and a.table() == b.table()
    assert all(np.array_equal(a.oof_cost[k], b.oof_cost[k]) for k in a.oof_cost)
    assert not np.array_equal(moved.cost_usd, data.cost_usd)


def test_a_cheap_workers_own_step_gets_the_finer_threshold_grid():
    """One cheap worker (cost 1) whose reply is right exactly where the verifier scores it above a
    cut, 83% of the rows, then a strong worker (cost 10, always right); a cap of 2.8 asks to keep at
    least 82% of the cheap replies. The coarse grid keeps about 81% or 90% (over the cap, or 7% of wrong
    replies kept); the finer grid of that shape has a level between, so the plan within the cap keeps
    nearly only right replies. Other shapes keep the coarse grid."""
    from fugu_pipeline.reward import UtilityConfig

    n = 400
    rng = np.random.default_rng(0)
    scores = np.column_stack([rng.permutation(n) / n, np.full(n, 0.5)])
    quality = np.column_stack([(scores[:, 0] >= 0.17).astype(float), np.ones(n)])
    codes = np.column_stack([np.where(quality[:, 0] == 1, 0, 1 + np.arange(n)), np.zeros(n, dtype=int)])
    g = Grid(["cheap", "strong"], codes, scores, quality, np.array([1.0, 10.0]), np.array([1.0, 1.0]),
             UtilityConfig(cost_weight=0.0, latency_weight=0.0))
    rows = np.arange(n)
    got = {k: search(g, rows, CascadeSearch(thresholds=10, single_thresholds=k, finals=1), cap_usd=2.8) for k in (10, 40)}
    assert got[10].cost <= 2.8 and got[40].cost <= 2.8
    assert got[40].quality >= 0.99 and got[40].quality > got[10].quality + 0.05, {k: c.plan.describe() for k, c in got.items()}
    singles = {k: [p for p in plan_tuples(g, rows, CascadeSearch(thresholds=10, single_thresholds=k, finals=1))
                   if len(p) == 2 and len(p[0][0]) == 1 and p[0][2] is not None] for k in (10, 40)}
    assert (len(singles[10]), len(singles[40])) == (10, 40)


def test_only_a_capped_fit_searches_the_finer_grid():
    """With no cap the cost ladder's rungs span the costs, and more levels are only more plans picked
    on the same rows: a fit searches `thresholds` levels everywhere; under a cap, pooled or a domain's,
    `single_thresholds` where one cheap worker comes first."""
    from fugu_pipeline.cost_cap import CostCap

    assert CascadeConfig().searched().single_thresholds == 10
    assert CascadeConfig(cap=CostCap(share=0.5)).searched().single_thresholds == 40
    assert CascadeConfig(domain_caps={"code": CostCap(share=0.5)}).searched().single_thresholds == 40
    assert CascadeConfig(search=CascadeSearch(thresholds=6, single_thresholds=30)).searched().single_thresholds == 6
