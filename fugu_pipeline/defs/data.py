"""The data path: BenchGen batches -> tasks -> responses (batch x worker) -> reward_matrix."""


import hashlib
import json
from pathlib import Path

import dagster as dg

from fugu_pipeline.collect.partition import collect_partition_sync, summarize_cells
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.defs.catalog import run_model_fingerprint
from fugu_pipeline.defs.partitions import (
    DUCKDB_WRITER_POOL,
    WORKER_CALLS_POOL,
    batch_x_worker,
    task_batches,
    workers,
)
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.matrix.build import build, from_collection, from_import
from fugu_pipeline.matrix.read import (
    check_no_nan,
    little_to_learn,
    read_arrays,
    signal_health,
)
from fugu_pipeline.tasks.loading import (
    TaskFileError,
    batch_name,
    list_batch_files,
    load_tasks,
)
from fugu_pipeline.workers.catalog import load_latest
from fugu_pipeline.workers.config import reward_source
from fugu_pipeline.workers.contract import FatalWorkerError


def _batch_file(pipeline: PipelineResource, batch: str) -> Path:
    path = pipeline.paths.benchgen / f"{batch}.jsonl"
    if not path.exists():
        raise dg.Failure(f"batch file {path} not found: partition {batch!r} has no file in {pipeline.paths.benchgen}")
    return path


def _load_batch(pipeline: PipelineResource, batch: str):
    try:
        return load_tasks(_batch_file(pipeline, batch))
    except TaskFileError as exc:
        raise dg.Failure(description=str(exc)) from None


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@dg.asset(partitions_def=task_batches, group_name="data", kinds={"jsonl"})
def tasks(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """One BenchGen batch, parsed and validated (DESIGN §4). A bad line fails the whole batch with
    its file and line; nothing of the batch is used until the file is fixed."""
    path = _batch_file(pipeline, context.partition_key)
    loaded = _load_batch(pipeline, context.partition_key)
    by = lambda f: dict(sorted(_count(f(t) for t in loaded).items()))  # noqa: E731
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "tasks": len(loaded),
            "domains": dg.MetadataValue.json(by(lambda t: t.domain)),
            "splits": dg.MetadataValue.json(by(lambda t: t.split)),
            "graders": dg.MetadataValue.json(by(lambda t: t.grader.type)),
            "preview": dg.MetadataValue.md(_preview(loaded[:5])),
        },
        data_version=dg.DataVersion(_file_hash(path)),
    )


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _preview(rows) -> str:
    lines = ["| task_id | domain | split | grader | prompt |", "|---|---|---|---|---|"]
    for t in rows:
        p = t.prompt.replace("|", "\\|").replace("\n", " ")[:80]
        lines.append(f"| {t.task_id} | {t.domain} | {t.split} | {t.grader.type} | {p} |")
    return "\n".join(lines)


@dg.asset(
    partitions_def=batch_x_worker,
    deps=[dg.AssetDep(tasks, partition_mapping=dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="batch"))],
    pool=WORKER_CALLS_POOL,
    group_name="data",
    kinds={"jsonl"},
)
def responses(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Each worker answers each task of the batch once, graded at once and durable at once.
    A re-run calls only missing or failed cells (and cells answered by an older version of the
    worker's model, when the catalog sensor passes a new fingerprint)."""
    keys = context.partition_key.keys_by_dimension
    batch, worker_id = keys["batch"], keys["worker"]
    config = pipeline.load_workers()
    if worker_id not in config.worker_ids:
        raise dg.Failure(f"worker {worker_id!r} is no longer in {pipeline.workers_config}; it is retired and not collected")
    loaded = _load_batch(pipeline, batch)
    store = ResponseStore(pipeline.paths.responses)
    # the worker's model version: cells answered by an older one are collected again
    fingerprint = run_model_fingerprint(context.run.tags, pipeline, config.worker(worker_id))
    catalog = load_latest(pipeline.paths.catalog)  # catalog prices for cost when usage has none
    try:
        stats = collect_partition_sync(loaded, batch, worker_id, config, store, model_fingerprint=fingerprint, catalog=catalog)
    except FatalWorkerError as exc:
        raise dg.Failure(description=f"worker {worker_id}: {exc}") from None
    if stats.stopped:
        context.log.warning(stats.stopped)
    if stats.skipped_note:
        context.log.warning(stats.skipped_note)
    cells = summarize_cells(store.read(batch, worker_id))
    context.log.info(f"{batch} x {worker_id}: called {stats.n_called}, ok {stats.n_ok}, failed {stats.n_failed}, "
                     f"already done {stats.n_already_done}")
    return dg.MaterializeResult(
        metadata={
            "called": stats.n_called,
            "already_done": stats.n_already_done,
            "ok_this_run": stats.n_ok,
            "failed_this_run": stats.n_failed,
            "cells_ok": cells["ok"],
            "cells_failed": cells["failed"],
            "mean_quality": cells["mean_quality"],
            "cost_usd_this_run": round(stats.cost_usd, 6),
            "seconds": round(stats.seconds, 3),
            "errors": dg.MetadataValue.json(stats.errors),
            "stopped": stats.stopped or "",
            "skipped_lines": len(stats.skipped_lines),
            "skipped_where": stats.skipped_note or "",
            "model_fingerprint": fingerprint or "",
            "path": dg.MetadataValue.path(str(store.path(batch, worker_id))),
        }
    )


class RewardMatrixConfig(dg.Config):
    import_path: str | None = None
    """Build from an imported reward-matrix JSONL (DESIGN §4) instead of the collected responses."""


@dg.asset(
    deps=[responses],
    pool=DUCKDB_WRITER_POOL,
    group_name="data",
    kinds={"duckdb"},
    automation_condition=dg.AutomationCondition.eager(),
)
def reward_matrix(context: dg.AssetExecutionContext, config: RewardMatrixConfig, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The graded reward matrix in DuckDB (tables tasks, workers, responses, rewards; view
    reward_wide). The only step that writes the database; built beside the old file and renamed
    into place, so readers never see half a matrix."""
    workers_config = pipeline.load_workers()
    paths = pipeline.paths
    weights_from = reward_source(workers_config, pipeline.workers_config)  # the same words the CLI prints
    try:
        if config.import_path:
            inp = from_import(paths.resolve(config.import_path), workers_config.reward, weights_from)
        else:
            inp = from_collection(paths.benchgen, ResponseStore(paths.responses), workers_config, weights_from)
    except TaskFileError as exc:
        raise dg.Failure(description=str(exc)) from None
    summary = build(inp, paths.reward_db)
    arrays = read_arrays(paths.reward_db)
    health = signal_health(arrays.utility)
    context.log.info(f"reward matrix: {summary}")
    return dg.MaterializeResult(
        metadata={
            **{k: v for k, v in summary.items() if k != "data_version"},
            "complete_rows": len(arrays.task_ids),
            "worker_ids": dg.MetadataValue.json(arrays.worker_ids),
            "mean_utility_by_worker": dg.MetadataValue.json(
                {w: round(float(arrays.utility[:, i].mean()), 4) for i, w in enumerate(arrays.worker_ids)} if len(arrays.task_ids) else {}
            ),
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in health.items()},
            "path": dg.MetadataValue.path(str(paths.reward_db)),
            "source": inp.source,
            "utility_weights": dg.MetadataValue.json(inp.utility.model_dump()),
            "utility": f"{inp.utility.describe()} ({inp.utility_source})",
        },
        data_version=dg.DataVersion(summary["data_version"]),
    )


@dg.asset_check(asset=reward_matrix, description="Every (task, worker) cell holds a graded reward.")
def cells_complete(pipeline: PipelineResource) -> dg.AssetCheckResult:
    arrays = read_arrays(pipeline.paths.reward_db, complete_only=False)
    import numpy as np

    missing = int(np.isnan(arrays.utility).sum())
    return dg.AssetCheckResult(
        passed=missing == 0,
        metadata={"missing_cells": missing, "rows_with_missing": int(np.isnan(arrays.utility).any(axis=1).sum())},
        description=None if missing == 0 else "re-materialize `responses` to retry failed cells",
    )


@dg.asset_check(asset=reward_matrix, description="Worker order in the matrix equals the worker config's order.")
def worker_order_fixed(pipeline: PipelineResource) -> dg.AssetCheckResult:
    import duckdb

    con = duckdb.connect(str(pipeline.paths.reward_db), read_only=True)
    try:
        stored = [r[0] for r in con.execute("SELECT worker_id FROM workers ORDER BY position").fetchall()]
        positions = [r[0] for r in con.execute("SELECT position FROM workers ORDER BY position").fetchall()]
        bad_rows = con.execute(
            "SELECT count(*) FROM rewards r JOIN workers w USING (worker_id) WHERE r.position <> w.position"
        ).fetchone()[0]
        source = con.execute("SELECT value FROM meta WHERE key='source'").fetchone()[0]
    finally:
        con.close()
    expected = stored if source.startswith("import:") else pipeline.load_workers().worker_ids
    passed = stored == expected and positions == list(range(len(stored))) and bad_rows == 0
    return dg.AssetCheckResult(
        passed=passed,
        metadata={"stored": dg.MetadataValue.json(stored), "expected": dg.MetadataValue.json(expected), "misplaced_cells": bad_rows},
    )


@dg.asset_check(asset=reward_matrix, description="No reward is NaN or infinite.")
def no_nan(pipeline: PipelineResource) -> dg.AssetCheckResult:
    bad = check_no_nan(pipeline.paths.reward_db)
    return dg.AssetCheckResult(passed=bad == 0, metadata={"bad_values": bad})


@dg.asset_check(asset=reward_matrix, description="Is there anything to learn? Ties, unique winners, oracle − best-fixed gap.")
def learning_signal(pipeline: PipelineResource) -> dg.AssetCheckResult:
    arrays = read_arrays(pipeline.paths.reward_db)
    health = signal_health(arrays.utility)
    problem = little_to_learn(health)
    return dg.AssetCheckResult(
        passed=problem is None,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={k: round(v, 4) if isinstance(v, float) else v for k, v in health.items()},
        description=f"little to learn: {problem}" if problem else None,
    )


def sync_worker_partitions(instance: dg.DagsterInstance, worker_ids: list[str]) -> list[str]:
    """Add missing worker partitions (retired workers keep theirs: their history stays visible)."""
    have = set(instance.get_dynamic_partitions(workers.name))
    new = [w for w in worker_ids if w not in have]
    if new:
        instance.add_dynamic_partitions(workers.name, new)
    return new


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def benchgen_batch_sensor(context: dg.SensorEvaluationContext, pipeline: PipelineResource) -> dg.SensorResult | dg.SkipReason:
    """Watches the BenchGen batch folder. A new (or changed) batch file becomes a `task_batches`
    partition, and its runs are requested: `tasks` for the batch and `responses` for every
    worker (a backfill over the new batch). Worker partitions follow the worker config."""
    cursor = json.loads(context.cursor) if context.cursor else {}
    config = pipeline.load_workers()
    new_workers = sync_worker_partitions(context.instance, config.worker_ids)
    known = set(context.instance.get_dynamic_partitions(task_batches.name))
    added, requests = [], []
    for path in list_batch_files(pipeline.paths.benchgen):
        try:
            b = batch_name(path)
        except TaskFileError as exc:
            context.log.warning(str(exc))
            continue
        digest = _file_hash(path)
        if cursor.get(b) == digest and b in known:
            continue
        if b not in known:
            added.append(b)
        cursor[b] = digest
        requests.append(dg.RunRequest(run_key=f"tasks:{b}:{digest}", partition_key=b, asset_selection=[tasks.key]))
        for w in config.worker_ids:
            requests.append(dg.RunRequest(
                run_key=f"responses:{b}:{w}:{digest}",
                partition_key=dg.MultiPartitionKey({"batch": b, "worker": w}),
                asset_selection=[responses.key],
            ))
    for w in new_workers:  # a worker added to the config: collect it on every known batch
        for b in sorted(known):
            requests.append(dg.RunRequest(
                run_key=f"responses:{b}:{w}:new-worker",
                partition_key=dg.MultiPartitionKey({"batch": b, "worker": w}),
                asset_selection=[responses.key],
            ))
    if not requests:
        return dg.SkipReason("no new or changed batch files, no new workers")
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[task_batches.build_add_request(added)] if added else [],
        cursor=json.dumps(cursor, sort_keys=True),
    )


reward_matrix_automation = dg.AutomationConditionSensorDefinition(
    "reward_matrix_automation",
    target=dg.AssetSelection.assets(reward_matrix),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Rebuilds the reward matrix once the responses partitions it reads are done (eager).",
)
