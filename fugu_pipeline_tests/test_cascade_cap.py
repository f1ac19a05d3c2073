"""A cascade under a user's cap: the most accurate policy within the cap ships (no significance rule
between the user's choice and the best policy that keeps it), and the cap holds on new traffic that
escalates more than the rows it was chosen on (the spend guard, `policies/cascade/spend.py`, in
`evaluate` and in serving)."""

import numpy as np
import pytest

from fugu_pipeline.cost_cap import CostCap
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import fit_cascade
from fugu_pipeline.policies.cascade.search import CascadeSearch
from fugu_pipeline_tests import cascade_fixture

FAST = CascadeSearch(thresholds=6, three_steps=False, finals=2, cheap=2)
quiet = lambda m: None  # noqa: E731


def test_under_a_cap_the_most_accurate_policy_within_it_ships_without_a_significance_rule():
    """A cheap worker nearly as accurate as the strong one: a plan escalating a quarter of the rows
    is more accurate out of fold than the cheap worker alone, within a cap of 30% of the strong
    one's cost, but its gain's interval reaches zero. The user chose the cap: that plan ships."""
    data, grid, inputs = cascade_fixture.close(seed=0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400, cap=CostCap(share=0.3)), log=quiet)
    assert fit.selected_kind == "cascade" and fit.policy.describe().startswith("[cheap] stop if verifier"), fit.reason
    within = [c for c in fit.candidates if not c.note]
    best = max(within, key=lambda c: (c.quality, -c.cost_usd))
    alone = next(c for c in fit.candidates if c.kind == "best worker")
    assert fit.selected == best.name and "best out-of-fold accuracy within the cap" in fit.reason
    assert best.quality > alone.quality and best.low <= 0  # more accurate than the cheap worker, not significantly


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A cascade trained at 20% of the strongest's cost on rows where the cheap worker is right 70% of
    the time; on the test rows (new traffic) it is right 20% of the time, so its plan escalates more."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.make(n=600, test_cheap=0.2)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300, cap=CostCap(share=0.2)), log=quiet)
    path = save_cascade(tmp_path_factory.mktemp("capped"), data, fit, inputs.answer.shape[2])
    cap = 0.2 * fit.expected_cost["strong"]
    return data, grid, inputs, fit, load_cascade(path), cap


def test_evaluate_keeps_the_cap_on_new_rows_that_escalate_more(capped):
    """Run as served, the checkpoint's spend over the held-out rows stays near the cap where the
    shipped plan alone spends over a tenth more."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade

    data, grid, inputs, fit, ckpt, cap = capped
    alone = load_cascade(ckpt.path)
    alone.head.cap_usd = None  # the shipped plans, no guard
    plain = float(np.mean([o.cost_usd for o in cascade_outcomes(alone, data, grid, inputs)]))
    assert plain > 1.1 * cap  # the shipped plan alone overspends on the harder rows
    spent = float(np.mean([o.cost_usd for o in cascade_outcomes(ckpt, data, grid, inputs)]))
    assert spent <= 1.05 * cap and spent < plain, (spent, cap, plain)


def test_serving_escalates_less_when_the_running_spend_nears_the_cap(capped):
    from fugu_pipeline.policies.cascade.policy import CascadePlan
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.spend import cap_points

    *_, fit, ckpt, cap = capped
    router = CascadeRouter(ckpt, None)
    first = router.route_batch(["q"], ["math"])[0]
    assert CascadePlan.model_validate(first.extra["cascade"]["plan"]) == fit.policy.plan_for("math")
    assert first.extra["budget"]["guard"]["allowance_usd"] == pytest.approx(cap)
    for _ in range(20):  # requests that cost twice the cap, as the shipped plan's calls on hard prompts do
        router.record_spend(first, 2 * cap)
    later = router.route_batch(["q"], ["math"])[0]
    guard = later.extra["budget"]["guard"]
    assert guard["requests"] == 20 and guard["allowance_usd"] < 0.9 * cap
    plan = CascadePlan.model_validate(later.extra["cascade"]["plan"])
    assert plan != fit.policy.plan_for("math")  # a plan that escalates less ...
    points = cap_points(ckpt.head.head_params(), ckpt.manifest.metrics, "math")
    served = min(p["cost_usd"] for p in points if CascadePlan.model_validate(p["plan"]) == plan)
    assert served < fit.choices["*"].cost  # ... and costs less on the rows it was chosen on


def test_the_guard_lowers_the_allowance_only_past_the_band_and_keeps_few_caps(capped):
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.spend import MAX_GUARDS, SpendGuard

    g = SpendGuard(1.0)
    for _ in range(10):
        g.record(0.9)  # below 95% of the cap: the cap's own allowance
    assert g.allowance() == 1.0
    for _ in range(10):
        g.record(1.5)
    assert g.allowance() < 1.0
    router = CascadeRouter(capped[4], None)
    for k in range(MAX_GUARDS + 10):  # requests naming ever new caps hold a bounded number of guards
        router.guard(0.001 * (k + 1))
    assert len(router.guards) == MAX_GUARDS and round(0.001, 15) not in router.guards


def test_a_caps_own_margin_bounds_the_plan_and_reaches_the_spend_guard(tmp_path):
    """`--cap share=0.2,margin_z=Z`: the plan's mean cost plus Z standard errors is what must fit the
    cap, so a wide margin ships a plan that escalates less than no margin does; the checkpoint
    records Z, and the guard in serving and `evaluate` bounds the saved points with it."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.spend import cap_margin

    data, grid, inputs = cascade_fixture.make(n=600, test_cheap=0.2)
    fits = {z: fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=200, cap=CostCap(share=0.2, margin_z=z)),
                           log=quiet) for z in (0.0, 8.0)}
    assert fits[8.0].choices["*"].cost < fits[0.0].choices["*"].cost, {z: f.policy.describe() for z, f in fits.items()}
    ckpt = load_cascade(save_cascade(tmp_path, data, fits[0.0], inputs.answer.shape[2]))
    assert ckpt.head.cap_z == 0.0 and cap_margin(ckpt.head) == 0.0
