"""The `eval_report` assets' step (`steps/reports.evaluate_oneshot`) reports a one-shot checkpoint as
it serves, and its record of inputs holds the point it serves: that point lives beside the weights
(`policy.json`, `budget.json`), not in their content hash, so a new point must be a new report."""

from fugu_pipeline.evaluate.composite import CompositeConfig
from fugu_pipeline.evaluate.feature_source import FeatureSource
from fugu_pipeline.route.default_point import DefaultPoint
from fugu_pipeline.route.shipped import ShippedPolicy
from fugu_pipeline.steps.reports import evaluate_oneshot
from fugu_pipeline.train.checkpoints import load_checkpoint
from fugu_pipeline_tests.harness_data import WORKERS, controlled_data, routing_head


def test_a_new_operating_point_beside_the_same_weights_is_a_new_report(tmp_path):
    data = controlled_data(n_test=200)
    models = tmp_path / "models"
    path = routing_head(models, data, (0, 1, 0))
    said: list[str] = []

    def report():
        return evaluate_oneshot(path, FeatureSource.fixed(data), models, CompositeConfig(), matrix_version="m1",
                                log=said.append).rep

    first = report()
    assert first["routes_by"].startswith("the head's plain route")
    assert report() == first and any("nothing evaluated" in line for line in said)  # the same inputs: kept
    said.clear()
    h = load_checkpoint(path).manifest.content_hash
    point = DefaultPoint(kind="strongest", strongest_worker=WORKERS[2], reason="a test's point", oof_accuracy=0.9,
                         oof_cost_usd=1.0, strongest_accuracy=0.9, strongest_cost_usd=1.0, difference=(0.0, 0.0, 0.0),
                         n_rows=600)
    ShippedPolicy(kind="one-shot", name="one-shot test", checkpoint=f"sft/{h}", content_hash=h,
                  operating_point=point).save(path)
    served = report()
    assert not any("nothing evaluated" in line for line in said), said  # the point changed: evaluated again
    assert served["routes_by"] == f"the default operating point (always {WORKERS[2]})"
    assert served["route_distribution"][WORKERS[2]] == served["n_tasks"]  # every figure reads the route served
    assert served["shipped_policy"]["name"] == "one-shot test"
