"""Dagster conventions: named jobs, the catalog schedule (off) and the sensor that turns a
refreshed catalog into re-collection, blocking checks that stop training on bad data, row counts
and table schemas as metadata, freshness checks."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline_tests.conftest import REPO


def _small_project(project: Path, fail_worker: str | None = None, n: int = 12) -> None:
    sample = project / "data" / "benchgen" / "sample.jsonl"
    sample.write_text("".join(sample.read_text().splitlines(keepends=True)[:n]))
    for name in ("train_sft.yaml", "train_rl.yaml", "train_es.yaml"):
        (project / "configs" / name).write_text((REPO / "configs" / name).read_text())
    if fail_worker:
        cfg = project / "configs" / "workers.mock.yaml"
        lines = cfg.read_text().splitlines()
        i = next(k for k, line in enumerate(lines) if f"id: {fail_worker}" in line)
        lines[i + 2] = lines[i + 2].rstrip("}") + ", fail_rate: 1.0}"  # every call of this worker fails
        cfg.write_text("\n".join(lines) + "\n")


def _collect(defs: dg.Definitions, instance: dg.DagsterInstance, workers: list[str]) -> None:
    instance.add_dynamic_partitions("task_batches", ["sample"])
    instance.add_dynamic_partitions("workers", workers)
    job = defs.resolve_job_def("collect_responses")
    for w in workers:
        job.execute_in_process(instance=instance, partition_key=dg.MultiPartitionKey({"batch": "sample", "worker": w}))


def test_named_jobs_schedule_and_freshness_checks():
    defs = build_defs(encoder="tiny")
    jobs = {j.name for j in defs.jobs}
    assert {"load_batch", "collect_responses", "refresh_catalog", "train_and_promote", "build_and_train"} <= jobs
    train = defs.resolve_job_def("build_and_train")
    keys = {k.to_user_string() for k in train.asset_layer.selected_asset_keys}
    assert {"reward_matrix", "task_embeddings", "router_sft", "promoted_router"} <= keys
    graph = defs.resolve_asset_graph()
    for name in ("build_and_train", "train_and_promote"):  # every input of the promotion is built in the job
        selected = defs.resolve_job_def(name).asset_layer.selected_asset_keys
        promote_inputs = {k for k in graph.get(dg.AssetKey("promoted_router")).parent_keys
                          if not graph.get(k).is_external}  # (its settings asset is observed, not built)
        assert promote_inputs <= selected, (name, promote_inputs - selected)
    schedule = defs.resolve_schedule_def("openrouter_catalog_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and schedule.job_name == "refresh_catalog"
    graph = defs.resolve_asset_graph()
    fresh = {k.to_user_string(): graph.get(k).freshness_policy for k in graph.get_all_asset_keys()
             if graph.get(k).freshness_policy is not None}
    assert set(fresh) == {"openrouter_catalog", "promoted_router"}
    assert fresh["openrouter_catalog"].fail_window.to_timedelta().total_seconds() == 26 * 3600
    blocking = {spec.name: spec.blocking for c in defs.asset_checks for spec in c.check_specs}
    assert blocking["cells_complete"] and blocking["worker_order_fixed"] and blocking["no_nan"]
    assert not blocking["learning_signal"]


def test_a_refreshed_catalog_requests_recollection_of_changed_workers():
    defs = build_defs(encoder="tiny")
    sensor = defs.resolve_sensor_def("catalog_update_sensor")
    with dg.DagsterInstance.ephemeral() as instance:
        ctx = dg.build_sensor_context(instance=instance)
        assert "never materialized" in sensor(ctx).skip_reason.skip_message
        instance.add_dynamic_partitions("task_batches", ["b1", "b2"])
        instance.add_dynamic_partitions("workers", ["math-expert", "code-expert"])
        instance.report_runless_asset_event(dg.AssetMaterialization(
            "openrouter_catalog", metadata={"changed_workers": dg.MetadataValue.json({"math-expert": ["fp-old", "fp-new"]})}))
        result = sensor(dg.build_sensor_context(instance=instance))
        keys = sorted(r.partition_key for r in result.run_requests)
        assert keys == ["b1|math-expert", "b2|math-expert"]
        assert all(r.tags["fugu/model_fingerprint"] == "fp-new" for r in result.run_requests)
        again = sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))  # nothing new since
        assert not again.run_requests and "no new catalog" in again.skip_reason.skip_message


@pytest.mark.slow
def test_blocking_checks_stop_training_on_an_incomplete_matrix(project, monkeypatch):
    _small_project(project, fail_worker="code-expert")
    monkeypatch.chdir(project)
    defs = build_defs(str(project), "configs/workers.mock.yaml", "tiny")
    with dg.DagsterInstance.ephemeral() as instance:
        _collect(defs, instance, ["math-expert", "code-expert", "general-expert"])
        result = defs.resolve_job_def("build_and_train").execute_in_process(instance=instance, raise_on_error=False)
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert checks["cells_complete"] is False and checks["no_nan"] and checks["worker_order_fixed"]
    assert materialized == {"reward_matrix"}  # nothing trained on it
    assert not (project / "models").exists() or not any((project / "models").rglob("manifest.json"))


@pytest.mark.slow
def test_matrix_metadata_has_row_count_and_table_schema(project, monkeypatch):
    _small_project(project)
    monkeypatch.chdir(project)
    defs = build_defs(str(project), "configs/workers.mock.yaml", "tiny")
    with dg.DagsterInstance.ephemeral() as instance:
        _collect(defs, instance, ["math-expert", "code-expert", "general-expert"])
        defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance, asset_selection=[dg.AssetKey("reward_matrix")])
        meta = instance.get_latest_materialization_event(dg.AssetKey("reward_matrix")).asset_materialization.metadata
        resp = instance.get_latest_materialization_event(dg.AssetKey("responses")).asset_materialization.metadata
    assert meta["dagster/row_count"].value == 12 * 3
    schema = meta["dagster/column_schema"].value
    assert [c.name for c in schema.columns] == ["task_id", "worker_id", "position", "quality", "cost_usd", "latency_s", "utility"]
    assert "| rewards | 36 |" in meta["tables"].value and "| reward_wide | 12 |" in meta["tables"].value
    assert resp["dagster/row_count"].value == 12
