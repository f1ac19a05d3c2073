"""Budget mode: a cap in USD per 1,000 requests or a share of the strongest
worker's cost; λ chosen on validation; a cap nothing meets is a clear error naming the field."""

import numpy as np
import pytest

from fugu_pipeline.evaluate.budget_report import budget_lines, budget_section, pareto_front
from fugu_pipeline.route.budget import Budget, BudgetError, calibrate_checkpoint, quality_of
from fugu_pipeline_tests.test_no_cost_leak import make_data


def test_a_budget_is_one_cap():
    with pytest.raises(ValueError, match="exactly one of usd_per_1k"):
        Budget(usd_per_1k=1.0, share=0.3)
    with pytest.raises(ValueError, match="exactly one"):
        Budget()
    with pytest.raises(ValueError):
        Budget(share=0.0)


def test_share_cap_is_met_on_validation_and_on_test():
    data, ckpt = make_data(n=1500)
    cal = calibrate_checkpoint(ckpt, data)
    assert cal.reference_worker == "strong"  # best training quality
    loose, tight = cal.choose(Budget(share=0.6)), cal.choose(Budget(share=0.3))
    assert loose.met_on_validation and tight.met_on_validation
    assert tight.lam >= loose.lam  # a tighter cap needs a larger λ
    assert tight.val_share <= 0.3
    sec = budget_section(ckpt, data, "test", cal, Budget(share=0.3), n_boot=100)
    op = sec["operating_point"]
    assert op["test"]["share"] <= 0.3 and op["test"]["met"]
    assert {w["name"] for w in sec["workers"]} == {"cheap", "mid", "strong"}
    text = "\n".join(budget_lines(sec))
    assert f"chosen on {cal.n_val} validation rows for the cap 30%" in text and "best single worker within the cap" in text
    # an absolute cap: $ per 1,000 requests
    usd = sec["workers"][2]["cost_usd_per_1k"] * 0.5
    assert cal.choose(Budget(usd_per_1k=usd)).val_cost_usd_per_1k <= usd


def test_a_cap_no_operating_point_meets_names_the_field():
    data, ckpt = make_data()
    cal = calibrate_checkpoint(ckpt, data)
    with pytest.raises(BudgetError, match=r"budget share 0.0001: no operating point meets this cap on the calibration.s 120 validation rows.*"
                                          r"Raise the cap to at least"):
        cal.choose(Budget(share=1e-4))
    with pytest.raises(BudgetError, match="budget usd_per_1k 1e-06"):
        cal.choose(Budget(usd_per_1k=1e-6))
    flagged = cal.choose(Budget(share=1e-4), strict=False)
    assert not flagged.met_on_validation and "Raise the cap" in flagged.note


def test_a_policy_head_cannot_budget():
    data, _ = make_data()

    class Policy:
        def __call__(self, x):
            return x

    with pytest.raises(BudgetError, match="no quality estimate"):
        quality_of(Policy(), data.features)


def test_pareto_front_keeps_undominated_points():
    pts = [{"cost_usd_per_1k": c, "quality": q} for c, q in ((1, 0.5), (2, 0.4), (3, 0.7), (0.5, 0.5))]
    assert [(p["cost_usd_per_1k"], p["quality"]) for p in pareto_front(pts)] == [(0.5, 0.5), (3, 0.7)]
    assert np.isfinite([p["quality"] for p in pts]).all()


def test_a_head_under_a_cap_is_scored_out_of_fold_as_it_serves_the_cap():
    """The dear worker's cost grows with the prompt: routed as serving routes (each prompt's expected
    cost, λ from the curve drawn on the other folds, following the spend), the dear worker answers
    the short prompts and the long ones go to the cheap worker. Routing by each worker's mean cost
    would send rows to the dear worker whatever their length. The spend ends at the cap's target,
    above what each fold's λ chosen with the margin spends, and within the cap."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.route.budget import cap_route_oof, route_curve, smallest_within
    from fugu_pipeline.route.expected_cost import fit_expected_cost

    rng = np.random.default_rng(0)
    n = 600
    prompts = ["x" * int(k) for k in rng.integers(40, 4000, size=n)]
    tokens = np.array([len(p) / 4 for p in prompts])
    cost = np.stack([np.full(n, 1e-6), 1e-6 * tokens], axis=1)  # cheap: flat; dear: per prompt token
    model = fit_expected_cost(prompts, ["d"] * n, cost, ["cheap", "dear"])
    c_hat = model.predict(prompts, ["d"] * n)
    q = np.stack([np.full(n, 0.5), np.full(n, 0.9)], axis=1) + rng.normal(0, 0.01, (n, 2))
    folds = np.arange(n) % 5
    cap = CostCap(share=0.3)
    c_ref = float(c_hat[:, 1].mean())
    route, tiny = cap_route_oof(q, c_hat, c_ref, 1, folds, [cap, CostCap(share=0.0001)], rng.permutation(n))
    dear = route == 1
    assert 0.1 < dear.mean() < 0.6
    assert tokens[dear].max() < np.median(tokens[~dear])  # the short prompts, as serving routes them
    fixed = np.zeros(n, dtype=np.int64)  # each fold at the one λ its other folds' curve chooses with the margin
    for f in range(5):
        tr = folds != f
        p = smallest_within(route_curve(q[tr], c_hat[tr], c_ref, 1), cap)
        fixed[~tr] = np.argmax(q[~tr] - p.lam * c_hat[~tr] / c_ref, axis=1)
    spend = c_hat[np.arange(n), route].mean() / c_hat[:, 1].mean()
    assert 0.3 * 0.95 <= spend <= 0.3 and spend > c_hat[np.arange(n), fixed].mean() / c_hat[:, 1].mean() + 0.005
    assert tiny is None  # below the cheapest: no route, drawn from the same curves


def test_a_cap_between_two_points_of_the_lambda_grid_is_spent_up_to_it():
    """Predicted gains of the dear worker all within 1% of each other: the λ that meets half the
    reference's cost lies between two points of the grid; the curve is refined there, so the cap's
    route sends about half the rows to the dear worker (not none, the next grid point's)."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.route.budget import cap_route_oof, route_curve

    rng = np.random.default_rng(0)
    n = 400
    q = np.stack([0.7 + 0.001 * rng.random(n), np.full(n, 0.8)], axis=1)
    c_hat = np.tile([0.1, 1.0], (n, 1))
    (route,) = cap_route_oof(q, c_hat, 1.0, 1, np.arange(n) % 4, [CostCap(share=0.5, margin_z=0)], np.arange(n))
    assert 0.35 <= (route == 1).mean() <= 0.5
    curve = route_curve(q, c_hat, 1.0, 1)
    assert all(a.share - b.share <= 0.02 + 1e-12 for a, b in zip(curve, curve[1:]))


def test_a_tie_in_predicted_quality_is_not_refined_towards_zero():
    """Two workers predicted exactly equal on every row: at λ = 0 the first wins the tie, at any λ > 0
    the cheaper; no λ splits a tie, so the refining stops at its floor, and the curve stays a sweep
    (each λ larger, each cost no larger) that a calibration accepts."""
    from fugu_pipeline.route.budget import REFINE_FLOOR, route_curve

    rng = np.random.default_rng(1)
    n = 300
    q = np.repeat(rng.random((n, 1)), 3, axis=1)
    c_hat = np.tile([1.0, 0.5, 0.1], (n, 1)) * (1 + 1e-3 * rng.random((n, 1)))
    curve = route_curve(q, c_hat, 1.0, 0)
    lams = [p.lam for p in curve]
    assert all(b > a for a, b in zip(lams, lams[1:])) and min(x for x in lams if x > 0) >= REFINE_FLOOR
    assert all(b.cost_usd <= a.cost_usd for a, b in zip(curve, curve[1:]))
    assert curve[0].share == pytest.approx(1.0) and curve[1].share < 0.2  # the tie: all-or-nothing at λ → 0
