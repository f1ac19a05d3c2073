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


def _grid(seed: int = 0, n: int = 300, context: bool = False):
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
    return Grid(data.worker_ids, codes, scores, data.quality, cost, np.array([0.5, 1.0, 2.0]), data.utility_config), rows


@pytest.mark.parametrize("context", [False, True])
def test_every_plan_runs_exactly_as_simulate_runs_its_model(context):
    g, rows = _grid(context=context)
    held = RowSet(g, rows)
    n = 0
    for plan in plan_tuples(g, rows, CascadeSearch()):
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
    a = points_for(g, rows, SMALL, None, memo)
    assert points_for(g, rows, SMALL, None, memo) is a and len(memo) == 1
    other = Grid(g.worker_ids, g.codes, g.scores, g.quality, g.exp_cost * 2, g.exp_latency, g.utility)
    assert points_for(other, rows, SMALL, None, memo) is not a and len(memo) == 2  # another grid's costs: its own run
