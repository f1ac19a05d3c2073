"""Report metrics equal hand-computed values on a small fixture."""

import numpy as np
import pytest

from fugu_pipeline.evaluate.metrics import (
    EvalInputs,
    apgr,
    evaluation_report,
    paired_bootstrap,
)
from fugu_pipeline.evaluate.plots import plot_report

# 4 held-out tasks x 3 workers
U = np.array([[1.0, 0.0, 0.5],
              [0.0, 1.0, 0.5],
              [0.2, 0.2, 0.9],
              [0.3, 0.3, 0.1]])
# the router picks: w0, w1, w0, w0 (task 4 ties w0/w1 at the top, so it counts as correct)
SCORES = np.array([[3, 1, 0], [0, 2, 1], [5, 0, 1], [1, 0, 0]], float)
# on train, w2 is best (so best fixed = w2 although w0..w2 differ on test)
TRAIN = np.array([[0.0, 0.0, 1.0], [0.5, 0.5, 0.6]])


def report(**kw):
    return evaluation_report(EvalInputs(worker_ids=["w0", "w1", "w2"], utility=U, scores=SCORES, train_utility=TRAIN,
                                        domains=["a", "a", "b", "b"], **kw), n_boot=500)


def test_headline_metrics_by_hand():
    r = report()
    assert r["router_utility"] == pytest.approx((1.0 + 1.0 + 0.2 + 0.3) / 4)
    assert r["oracle_utility"] == pytest.approx((1.0 + 1.0 + 0.9 + 0.3) / 4)
    assert r["best_fixed_worker"] == "w2"
    assert r["best_fixed_utility"] == pytest.approx((0.5 + 0.5 + 0.9 + 0.1) / 4)
    assert r["best_fixed_test_chosen_worker (optimistic)"] in {"w2"}  # test means: w0 .375, w1 .375, w2 .5
    assert r["random_utility"] == pytest.approx(U.mean())
    assert r["regret"] == pytest.approx(r["oracle_utility"] - r["router_utility"])
    assert r["oracle_route_accuracy"] == pytest.approx(3 / 4)  # task 3 wrong; task 4 tie counts
    assert r["route_distribution"] == {"w0": 3, "w1": 1, "w2": 0}
    ci = r["router_minus_best_fixed"]
    assert ci["mean"] == pytest.approx(r["router_utility"] - r["best_fixed_utility"])
    assert ci["low"] <= ci["mean"] <= ci["high"]
    dom = {row["domain"]: row for row in r["per_domain"]}
    assert dom["a"]["router"] == pytest.approx(1.0) and dom["a"]["best_fixed"] == pytest.approx(0.5)
    assert dom["b"]["oracle"] == pytest.approx(0.6) and dom["b"]["n"] == 2


def test_quality_cost_latency_and_cost_quality_points(tmp_path):
    Q = (U > 0.4).astype(float)
    C = np.tile([0.01, 0.002, 0.005], (4, 1))
    L = np.tile([2.0, 1.0, 3.0], (4, 1))
    # the curve routes by the EXPECTED cost (here the training means), never the rows' actual cost
    r = report(quality=Q, cost_usd=C, latency_s=L, quality_pred=Q, expected_cost=C, cost_ref=0.01)
    assert r["router_mean_quality"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert r["router_mean_cost_usd"] == pytest.approx((0.01 * 3 + 0.002) / 4)
    assert r["router_mean_latency_s"] == pytest.approx((2 * 3 + 1) / 4)
    names = [p["name"] for p in r["cost_quality_points"]]
    assert names[:3] == ["w0", "w1", "w2"] and "router" in names
    curve = r["cost_quality_curve"]
    assert curve[0]["lambda"] == 0 and curve[-1]["mean_cost_usd"] <= curve[0]["mean_cost_usd"]
    paths = plot_report(r, tmp_path)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths) and len(paths) == 3


def test_paired_bootstrap_degenerate():
    ci = paired_bootstrap(np.ones(10), np.zeros(10))
    assert ci == {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 10}


def test_apgr_perfect_random_and_inverse():
    strong = np.array([1, 1, 0, 1, 0, 1, 1, 0], float)
    weak = np.array([0, 1, 0, 0, 0, 1, 0, 0], float)
    perfect = apgr(strong - weak, strong, weak)  # route exactly the tasks where strong helps
    # 3 of 8 tasks gain: PGR(x) = min(8x/3, 1) -> area 1 - (3/8)/2 = 0.8125 (grid rounding aside)
    assert perfect["apgr"] == pytest.approx(1 - 3 / 16, abs=0.01)
    assert perfect["cpt50"] == pytest.approx(0.19) and perfect["cpt80"] == pytest.approx(0.32, abs=0.02)
    inverse = apgr(weak - strong, strong, weak)
    assert inverse["apgr"] < 0.5
    flat = apgr(np.zeros(8), strong, weak)  # ties keep input order
    assert 0.0 <= flat["apgr"] <= 1.0
    assert perfect["curve"]["pgr"][0] == 0.0 and perfect["curve"]["pgr"][-1] == pytest.approx(1.0)


def test_two_worker_report_has_apgr():
    U2 = np.array([[1, 0], [1, 1], [0, 0], [1, 0]], float)
    r = evaluation_report(EvalInputs(worker_ids=["strong", "weak"], utility=U2, scores=U2 * 2 - 1,
                                     train_utility=np.array([[1, 0], [1, 1]], float), quality=U2), n_boot=100)
    assert r["apgr"]["strong_worker"] == "strong" and r["apgr"]["apgr"] > 0.5


def test_empty_split_is_an_error():
    with pytest.raises(ValueError, match="no rows"):
        evaluation_report(EvalInputs(["a"], np.zeros((0, 1)), np.zeros((0, 1)), np.zeros((1, 1))))
