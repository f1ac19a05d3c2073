"""Words that must agree with the figures beside them: a mock pool's costs are simulated, never a
"training cost" of real money; a coordinator's accuracy interval below zero is "significantly worse",
not "not significant"."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from fugu_pipeline.evaluate.gates import GateConfig, paid_workers, receipt_gate
from fugu_pipeline.policies.coordinator.evaluate import verdict
from fugu_pipeline.train.exchange import Receipt

WORKERS = ["math-expert", "code-expert", "general-expert"]


def _receipt(cost: float) -> Receipt:
    return Receipt(content_hash="0" * 16, weights_sha256="0" * 64, method="sft", head_kind="linear", param_count=10,
                   worker_ids=WORKERS, contract_fingerprint="f", encoder_id="tiny", data_version="v",
                   data_cost_usd=cost, fitness_curve="val_utility", fitness=[0.1, 0.2, 0.3])


def test_a_mock_pools_cost_is_said_to_be_simulated():
    cost = np.full((4, 3), 0.006)
    mock = SimpleNamespace(worker_ids=WORKERS, cost_usd=cost, cost_simulated=True)
    paid = SimpleNamespace(worker_ids=WORKERS, cost_usd=cost, cost_simulated=False)
    assert paid_workers(mock, WORKERS) == [] and paid_workers(paid, WORKERS) == WORKERS
    said = receipt_gate(_receipt(3.2967), GateConfig(), data=mock)
    assert said.ok and "training cost $3.2967, simulated by the mock workers (their calls cost nothing real)" in said.line()
    said = receipt_gate(_receipt(3.2967), GateConfig(), data=paid)
    assert said.ok and "training cost $3.2967" in said.line() and "simulated" not in said.line()


def test_a_matrix_of_mock_workers_says_its_costs_are_simulated(tmp_path):
    from fugu_pipeline.matrix.build import Cell, MatrixInput, TaskRow, build
    from fugu_pipeline.matrix.read import read_arrays
    from fugu_pipeline.reward import UtilityConfig

    tasks = [TaskRow(f"t{i}", "b", f"What is {i} + 1?", "math", "train") for i in range(2)]
    cells = [Cell(t.task_id, w, 1.0, 0.006, 1.0) for t in tasks for w in ("a", "b")]
    for kinds, simulated in ((("mock", "mock"), True), (("mock", "openrouter"), False)):
        db = tmp_path / f"{'-'.join(kinds)}.duckdb"
        build(MatrixInput(tasks, [("a", kinds[0], None), ("b", kinds[1], None)], [], cells, "test", UtilityConfig()), db)
        assert read_arrays(db).cost_simulated is simulated, kinds


def test_not_worth_it_says_significantly_worse_when_the_interval_lies_below_zero():
    coord = {"mean_turns": 2.0, "cost_per_correct_usd": 0.02}
    base = {"mean_turns": 1.0, "cost_per_correct_usd": 0.01}
    below = verdict("math", coord, base, "one-step", {"mean": -0.4, "low": -0.6, "high": -0.2})
    assert below.startswith("math: NOT WORTH IT: accuracy -0.400 [-0.600, -0.200] over one-step (significantly worse)")
    across = verdict("math", coord, base, "one-step", {"mean": 0.05, "low": -0.1, "high": 0.2})
    assert "(not significant)" in across
