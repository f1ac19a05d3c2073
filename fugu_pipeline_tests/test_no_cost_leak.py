"""No cost leakage: every cost-aware routing decision uses the
EXPECTED cost (a model fitted on training rows: per-token price x prompt tokens + a per-domain
offset), never a held-out row's own actual cost or quality. Under a cap, the rows before it in
traffic order have been answered, and their recorded cost settles the spend the cap follows, as
served replies do.

Each test changes what a router could not know when it routes (the held-out rows' actual cost and
quality) and checks that no route and no chosen λ moves, while the reported outcome does move
(so the test would notice a report that ignores the actual cost too). A router that read the
held-out cost (the old cost-quality curve did: argmax(q̂ − λ·C_actual)) fails these tests.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from fugu_pipeline.evaluate.budget_report import budget_section
from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.route.budget import Budget, calibrate_checkpoint, follow_routes
from fugu_pipeline.route.follow import CapFollower, traffic_order
from fugu_pipeline.route.expected_cost import fit_expected_cost

W = ["cheap", "mid", "strong"]
PRICE = np.array([0.1, 1.0, 10.0]) * 1e-6  # USD per prompt token


class NumpyQualityHead:
    """A fixed quality predictor: sigmoid(features @ M)."""

    def __init__(self, m):
        self.m = m

    def predict_quality(self, x):
        return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64) @ self.m))


def make_data(seed: int = 0, n: int = 600) -> tuple[RoutingData, SimpleNamespace]:
    rng = np.random.default_rng(seed)
    d = 8
    x = rng.normal(size=(n, d)).astype(np.float32)
    m = rng.normal(size=(d, 3))
    m[:, 2] += 0.5  # the strong worker is better on average
    quality = (rng.random((n, 3)) < 1 / (1 + np.exp(-x @ m))).astype(float)
    prompts = ["word " * int(k) for k in rng.integers(5, 400, size=n)]
    domains = [("math", "code", "chat")[i % 3] for i in range(n)]
    tokens = np.array([np.ceil(len(p) / 4) for p in prompts])
    cost = tokens[:, None] * PRICE[None, :] + np.array([0.0, 1e-5, 2e-4])[None, :]
    splits = np.array([("train", "train", "train", "val", "test")[i % 5] for i in range(n)])
    data = RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=prompts, domains=domains, splits=splits,
                       worker_ids=W, features=x, utility=quality - 10 * cost, contract=FeatureContract(encoder_id="x", dim=d),
                       quality=quality, cost_usd=cost)
    ckpt = SimpleNamespace(head=NumpyQualityHead(m), path="ckpt",
                           manifest=SimpleNamespace(worker_ids=W, head_kind="numpy", content_hash="abc"))
    return data, ckpt


def scramble_held_out(data: RoutingData, split: str = "test", seed: int = 1, rows=None) -> RoutingData:
    """The same data, with the held-out rows' actual cost and quality replaced by noise (`rows`: a
    mask of the rows, default every row of `split`)."""
    rng = np.random.default_rng(seed)
    rows = data.splits == split if rows is None else rows
    cost, quality = data.cost_usd.copy(), data.quality.copy()
    cost[rows] = rng.random((rows.sum(), 3)) * 1e-2
    quality[rows] = rng.integers(0, 2, (rows.sum(), 3))
    return RoutingData(task_ids=data.task_ids, prompts=data.prompts, domains=data.domains, splits=data.splits,
                       worker_ids=W, features=data.features, utility=data.utility, contract=data.contract,
                       quality=quality, cost_usd=cost)


def test_budget_calibration_reads_no_held_out_row():
    """λ for a cap comes from train (cost model) and val (curve): scrambling test changes nothing."""
    data, ckpt = make_data()
    a = calibrate_checkpoint(ckpt, data)
    b = calibrate_checkpoint(ckpt, scramble_held_out(data))
    assert a.model_dump() == b.model_dump()
    assert a.choose(Budget(share=0.3)).lam == b.choose(Budget(share=0.3)).lam


def test_budget_routes_on_test_read_no_row_s_own_or_later_cost():
    """Under a cap the held-out rows are routed in traffic order, each followed by its reply's
    recorded cost (`route/follow.py`), as serving settles each reply: a row's route reads the actual
    cost of the rows before it, never its own or a later row's. Scrambling the last row's cost moves
    no route (only the reported outcome); scrambling every row's cost does move them (the settling
    is live), and the operating point's λ never moves."""
    data, ckpt = make_data()
    cal = calibrate_checkpoint(ckpt, data)
    budget = Budget(share=0.3)
    held = data.split("test")
    last = held.task_ids[traffic_order(held.task_ids)[-1]]
    a = budget_section(ckpt, data, "test", cal, budget, n_boot=50)
    b = budget_section(ckpt, scramble_held_out(data, rows=np.array([t == last for t in data.task_ids])), "test", cal,
                       budget, n_boot=50)
    c = budget_section(ckpt, scramble_held_out(data), "test", cal, budget, n_boot=50)
    pa, pb, pc = a["operating_point"], b["operating_point"], c["operating_point"]
    assert pa["lambda"] == pb["lambda"] == pc["lambda"]
    assert pa["test"]["route_distribution"] == pb["test"]["route_distribution"]
    assert pa["test"]["cost_usd_per_1k"] != pytest.approx(pb["test"]["cost_usd_per_1k"])  # outcomes are reported
    assert pa["test"]["route_distribution"] != pc["test"]["route_distribution"]
    # every point of the λ sweep routes the same way too
    assert [p["lambda"] for p in a["router_curve"]] == [p["lambda"] for p in b["router_curve"]]


def test_a_replayed_row_s_route_reads_only_the_rows_before_it():
    """`follow_routes` over recorded costs: scrambling the costs of the rows from position j of the
    order on leaves the routes of the rows up to j as they were, and moves some route after j."""
    data, ckpt = make_data()
    cal = calibrate_checkpoint(ckpt, data)
    held = data.split("test")
    q_hat, c_hat = ckpt.head.predict_quality(held.features), cal.cost_model.predict(held.prompts, held.domains)
    order = traffic_order(held.task_ids)
    arrays = cal.curve_arrays()

    def routes(actual):
        scores, _, _ = follow_routes(q_hat, c_hat, cal.reference_cost_usd, lambda k: arrays,
                                     CapFollower(cal.cap_usd(Budget(share=0.3))), order, actual=actual)
        return np.argmax(scores, axis=1)[order]

    base = routes(held.cost_usd)
    moved = False
    for j in (0, len(order) // 3, len(order) - 1):
        noisy = held.cost_usd.copy()
        noisy[order[j:]] = np.random.default_rng(j).random((len(order) - j, 3)) * 1e-2
        got = routes(noisy)
        assert (got[: j + 1] == base[: j + 1]).all()
        moved |= bool((got[j + 1:] != base[j + 1:]).any())
    assert moved


def test_cost_quality_curve_routes_by_expected_cost_only():
    """The report's cost–quality curve: shuffling the held-out rows' actual costs between rows
    leaves every λ's route counts unchanged (they use the expected cost from training)."""
    data, ckpt = make_data()
    held, train = data.split("test"), data.split("train")
    model = fit_expected_cost(train.prompts, train.domains, train.cost_usd, W)
    expected = model.predict(held.prompts, held.domains)
    q_hat = ckpt.head.predict_quality(held.features)

    def report(cost):
        return evaluation_report(EvalInputs(worker_ids=W, utility=held.utility, scores=q_hat, train_utility=train.utility,
                                            quality=held.quality, cost_usd=cost, train_quality=train.quality,
                                            quality_pred=q_hat, expected_cost=expected, cost_ref=1e-3), n_boot=50)

    rng = np.random.default_rng(3)
    a, b = report(held.cost_usd), report(held.cost_usd[rng.permutation(len(held.cost_usd))])
    assert [p["route_counts"] for p in a["cost_quality_curve"]] == [p["route_counts"] for p in b["cost_quality_curve"]]
    assert len({tuple(p["route_counts"]) for p in a["cost_quality_curve"]}) > 2  # λ really moves the routes
    # without an expected cost there is no curve at all (never one drawn from actual costs)
    no_expected = evaluation_report(EvalInputs(worker_ids=W, utility=held.utility, scores=q_hat, train_utility=train.utility,
                                               quality=held.quality, cost_usd=held.cost_usd, quality_pred=q_hat), n_boot=50)
    assert "cost_quality_curve" not in no_expected


def test_expected_cost_recovers_catalog_prices_from_training_rows():
    """Where the cost is price x prompt tokens (+ a fixed output part), the fit recovers it, and a
    domain unseen in training gets the pooled offset."""
    data, _ = make_data()
    train = data.split("train")
    model = fit_expected_cost(train.prompts, train.domains, train.cost_usd, W)
    assert np.allclose(model.per_token, PRICE, rtol=1e-6)
    held = data.split("test")
    assert np.allclose(model.predict(held.prompts, held.domains), held.cost_usd, rtol=1e-6, atol=1e-12)
    unseen = model.predict(held.prompts[:3], ["never-seen"] * 3)
    assert np.allclose(unseen, held.cost_usd[:3], rtol=1e-6, atol=1e-12)


# --------------------------------------------------------------------------- cascades


def _scramble_cascade_test_rows(data, grid, inputs, seed: int = 7):
    """The held-out rows' actual cost, latency, quality and replies replaced by noise."""
    import dataclasses

    rng = np.random.default_rng(seed)
    t = data.splits == "test"
    cost, lat, q = data.cost_usd.copy(), data.latency_s.copy(), data.quality.copy()
    cost[t] = rng.random((t.sum(), 3)) * 0.05
    lat[t] = rng.random((t.sum(), 3)) * 30
    q[t] = rng.integers(0, 2, (t.sum(), 3))
    final = grid.final.copy()
    final[t] = rng.choice(np.array(["a", "b"], dtype=object), size=(t.sum(), 3))
    scrambled = dataclasses.replace(data, cost_usd=cost, latency_s=lat, quality=q, data_version="")
    return scrambled, dataclasses.replace(grid, final=final), inputs


def test_cascade_choice_reads_no_held_out_row():
    """The plan, its thresholds and every candidate's out-of-fold figure come from the non-test rows
    only: scrambling the test rows' costs, qualities and answers changes none of them."""
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline_tests import cascade_fixture

    data, grid, inputs = cascade_fixture.make(n=300)
    cfg = CascadeConfig(search=CascadeSearch(thresholds=4, three_steps=False, finals=2, cheap=2), n_boot=200)
    a = fit_cascade(data, grid, inputs, cfg, log=lambda m: None)
    b = fit_cascade(*_scramble_cascade_test_rows(data, grid, inputs), cfg, log=lambda m: None)
    assert a.policy == b.policy and a.table() == b.table() and a.expected_cost == b.expected_cost


def test_cascade_steps_on_test_ignore_the_actual_cost(tmp_path):
    """On held-out rows a cascade stops by its answers and thresholds, never by what a call cost:
    other actual costs give the same steps and the same answering worker, while the reported cost
    moves (so a report that ignored the actual cost would fail too)."""
    import dataclasses

    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline_tests import cascade_fixture

    data, grid, inputs = cascade_fixture.make(n=300)
    cfg = CascadeConfig(search=CascadeSearch(thresholds=4, three_steps=False, finals=2, cheap=2), n_boot=200)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit_cascade(data, grid, inputs, cfg, log=lambda m: None),
                                     inputs.answer.shape[2]))
    t = data.splits == "test"
    cost = data.cost_usd.copy()
    cost[t] = cost[t][:, ::-1] * 50  # the strong worker now cheap, the cheap ones dear
    other = dataclasses.replace(data, cost_usd=cost, data_version="")
    a, b = cascade_outcomes(ckpt, data, grid, inputs), cascade_outcomes(ckpt, other, grid, inputs)
    assert [(o.answered_by, o.stop_step, o.calls) for o in a] == [(o.answered_by, o.stop_step, o.calls) for o in b]
    assert sum(o.cost_usd for o in a) != pytest.approx(sum(o.cost_usd for o in b))
