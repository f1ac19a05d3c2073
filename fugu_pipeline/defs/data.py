"""The data path: BenchGen batches -> tasks -> responses (batch x worker) -> reward_matrix."""


import warnings
from pathlib import Path
from typing import Any

import dagster as dg

from fugu_pipeline.collect.partition import collect_partition_sync, summarize_cells
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.defs.catalog import run_model_fingerprint
from fugu_pipeline.defs.failures import batch_failure, explained_failure, first_problem
from fugu_pipeline.defs.metadata import LIVE_KIND, LIVE_WORKERS, tidy
from fugu_pipeline.defs.partitions import (
    DUCKDB_WRITER_POOL,
    WORKER_CALLS_POOL,
    batch_x_worker,
    task_batches,
)
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.settings import config_reward
from fugu_pipeline.defs.shared import SharedStore
from fugu_pipeline.defs.versions import RESPONSES_VERSION, file_version, responses_version
from fugu_pipeline.matrix.build import build, from_import
from fugu_pipeline.steps.versions import code_version
from fugu_pipeline.matrix.bulk import build_collection
from fugu_pipeline.matrix.bulk_tasks import refused_batches
from fugu_pipeline.matrix.read import (
    RewardMatrixError,
    check_no_nan,
    little_to_learn,
    open_read_only,
    read_arrays,
    signal_health,
)
from fugu_pipeline.tasks.loading import TaskFileError, load_tasks, scan_batch_files
from fugu_pipeline.workers.catalog import load_latest
from fugu_pipeline.workers.config import reward_source
from fugu_pipeline.workers.contract import FatalWorkerError


def _batch_file(pipeline: PipelineResource, batch: str) -> Path:
    path = pipeline.paths.benchgen / f"{batch}.jsonl"
    if not path.exists():
        raise explained_failure(f"batch file {path} not found: partition {batch!r} has no file in {pipeline.paths.benchgen}")
    return path


def _load_batch(pipeline: PipelineResource, batch: str):
    """The batch's tasks; a bad line, or a task id another batch holds (which batch keeps an id:
    `tasks/loading.py`), fails the run before anything is called, naming both files and lines."""
    path = _batch_file(pipeline, batch)
    try:
        loaded = load_tasks(path)
    except TaskFileError as exc:
        raise batch_failure(exc) from None
    settled = ResponseStore(pipeline.paths.responses).collected_batches()
    for exc in refused_batches(pipeline.paths.benchgen, settled):
        if exc.path == path:
            raise batch_failure(exc)
    return loaded


@dg.asset(partitions_def=task_batches, group_name="data", kinds={"jsonl"}, code_version=code_version("fugu_pipeline.tasks.loading"))
def tasks(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """One BenchGen batch, parsed and validated (the BenchGen task format). A bad line fails the whole batch with
    its file and line; nothing of the batch is used until the file is fixed."""
    path = _batch_file(pipeline, context.partition_key)
    version = file_version(path)  # before reading: a file changed meanwhile only causes one more run
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
            "dagster/row_count": dg.MetadataValue.int(len(loaded)),
        },
        data_version=dg.DataVersion(version),
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


with warnings.catch_warnings():  # marked beta in Dagster; it is the mapping that says "this batch's tasks"
    warnings.simplefilter("ignore", dg.BetaWarning)
    _BATCH_OF_PARTITION = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="batch")


@dg.asset(
    partitions_def=batch_x_worker,
    deps=[dg.AssetDep(tasks, partition_mapping=_BATCH_OF_PARTITION)],
    pool=WORKER_CALLS_POOL,
    group_name="data",
    kinds={"jsonl", LIVE_KIND},
    tags=LIVE_WORKERS,
)
def responses(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Calls the configured workers: each answers each task of the batch once, graded at once and
    durable at once.
    A re-run calls only missing or failed cells (and cells answered by an older version of the
    worker's model, when the catalog sensor passes a new fingerprint)."""
    keys = context.partition_key.keys_by_dimension
    batch, worker_id = keys["batch"], keys["worker"]
    config = pipeline.load_workers()
    if worker_id not in config.worker_ids:
        raise explained_failure(f"worker {worker_id!r} is no longer in {pipeline.workers_config}; it is retired and not collected")
    loaded = _load_batch(pipeline, batch)
    store = ResponseStore(pipeline.paths.responses)
    shared = SharedStore.of(pipeline.paths)  # FUGU_DATA_URL: resume from (and publish to) the shared store
    if shared and shared.pull_responses(batch, worker_id):
        context.log.info(f"took {batch}/{worker_id}.jsonl from {shared.data_url}")
    # the worker's model version: cells answered by an older one are collected again
    fingerprint = run_model_fingerprint(context.run.tags, pipeline, config.worker(worker_id))
    catalog = load_latest(pipeline.paths.catalog)  # catalog prices for cost when usage has none
    from fugu_pipeline.ledger import CostLedger, project_ledger

    ledger = CostLedger(project_ledger(pipeline.paths.root))  # every paid call, hash-chained (receipts cite it)
    try:
        stats = collect_partition_sync(loaded, batch, worker_id, config, store, model_fingerprint=fingerprint, catalog=catalog,
                                       ledger=ledger)
    except FatalWorkerError as exc:
        raise explained_failure(f"worker {worker_id}: {exc}") from None
    finally:
        ledger.close()
        if shared:  # what was paid for is published even when the run fails
            shared.push_responses(batch, worker_id)
    if stats.stopped:
        context.log.warning(stats.stopped)
    if stats.skipped_note:
        context.log.warning(stats.skipped_note)
    cells = summarize_cells(store.read(batch, worker_id))
    context.log.info(f"{batch} x {worker_id}: called {stats.n_called}, ok {stats.n_ok}, failed {stats.n_failed}, "
                     f"already done {stats.n_already_done}")
    return dg.MaterializeResult(
        metadata=tidy({
            "called": stats.n_called,
            "already_done": stats.n_already_done,
            "ok_this_run": stats.n_ok,
            "failed_this_run": stats.n_failed,
            "dagster/row_count": dg.MetadataValue.int(cells["ok"] + cells["failed"]),  # cells in the file
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
        }),
        data_version=dg.DataVersion(file_version(store.path(batch, worker_id))),  # unchanged when nothing was called
    )


REWARDS_SCHEMA = dg.TableSchema(columns=[
    dg.TableColumn("task_id", "VARCHAR", description="the task (tasks.task_id)"),
    dg.TableColumn("worker_id", "VARCHAR", description="the worker (workers.worker_id)"),
    dg.TableColumn("position", "INTEGER", description="the worker's fixed position (workers.position)"),
    dg.TableColumn("quality", "DOUBLE", description="graded quality in [0, 1]"),
    dg.TableColumn("cost_usd", "DOUBLE", description="call cost, judge included"),
    dg.TableColumn("latency_s", "DOUBLE", description="seconds from request to answer, judge included"),
    dg.TableColumn("utility", "DOUBLE", description="the reward: quality minus weighted cost and latency"),
])


def _tables_md(db: Path) -> str:
    """Every table of the matrix with its row count (one literal query: no SQL built from names)."""
    with open_read_only(db) as con:
        rows = con.execute(
            "SELECT 'tasks', count(*) FROM tasks UNION ALL SELECT 'workers', count(*) FROM workers "
            "UNION ALL SELECT 'responses', count(*) FROM responses UNION ALL SELECT 'rewards', count(*) FROM rewards "
            "UNION ALL SELECT 'reward_wide', count(*) FROM reward_wide UNION ALL SELECT 'meta', count(*) FROM meta"
        ).fetchall()
    return "\n".join(["| table | rows |", "|---|---|"] + [f"| {n} | {c:,} |" for n, c in rows])


class RewardMatrixConfig(dg.Config):
    import_path: str | None = None
    """Build from imported routing data instead of the collected responses: a reward-matrix JSONL
    (one row per task: task_id, prompt, domain, worker_ids, quality...), or a file (folder) of the kind `import_kind` names."""
    import_kind: str = "jsonl"
    """jsonl, table (one column per worker), long (one row per call), dcrouter, routellm-gsm8k,
    routellm-mmlu or routellm-csv: the kinds of `fugu-lite import`."""
    import_options: dict[str, Any] = {}
    """The importer's options, named as `fugu-lite import`'s flags with underscores, e.g.
    {worker_column: model_name, score_column: label, id_column: prompt_id, test_file: test.csv}.
    Relative paths are taken from the project folder."""


def _imported(config: RewardMatrixConfig, paths, utility, weights_from: str):
    """The matrix input of `config`'s import, through the same importers as `fugu-lite import`."""
    path = paths.resolve(config.import_path)
    folder_kind = config.import_kind in ("dcrouter", "routellm-gsm8k", "routellm-mmlu", "routellm-mtbench")
    if not (path.is_dir() if folder_kind else path.is_file()):
        what = "the folder" if folder_kind else "the file"
        raise explained_failure(f"import_path {config.import_path!r}: {'not found' if not path.exists() else 'not ' + what} "
                         f"({path}); give {what} to import ({config.import_kind}), relative to the project folder")
    if config.import_kind == "jsonl" and not config.import_options:
        return from_import(path, utility, weights_from), {}
    from fugu_pipeline.matrix.import_common import option_errors
    from fugu_pipeline.matrix.importers import KINDS, path_options, read_source

    if config.import_kind not in KINDS:
        raise explained_failure(f"import_kind {config.import_kind!r}: use one of {', '.join(KINDS)}")
    named_files = path_options()
    opts = {k: (str(paths.resolve(v)) if k in named_files and isinstance(v, str) else v)
            for k, v in config.import_options.items()}
    try:
        rows, notes = read_source(config.import_kind, path, **opts)
    except TypeError as exc:  # an option this kind's importer does not take
        raise explained_failure(f"import_options: {exc}") from None
    except ValueError as exc:  # pydantic's ValidationError too: name the option, say why
        if isinstance(exc, TaskFileError):
            raise
        raise explained_failure(f"import {config.import_kind}: {option_errors(exc, lambda f: 'import_options.' + f)}") from None
    return from_import(path, utility, weights_from, rows=rows), notes


@dg.asset(
    deps=[responses, config_reward],
    pool=DUCKDB_WRITER_POOL,
    group_name="data",
    kinds={"duckdb"},
    code_version=code_version("fugu_pipeline.matrix.build", "fugu_pipeline.matrix.bulk"),
)
def reward_matrix(context: dg.AssetExecutionContext, config: RewardMatrixConfig, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The graded reward matrix in DuckDB (tables tasks, workers, responses, rewards; view
    reward_wide). The only step that writes the database; built beside the old file and renamed
    into place, so readers never see half a matrix. Rebuilt by itself once a batch's collection
    runs have ended (`reward_matrix_automation`); a batch file that cannot be read is left out and
    listed under `refused_batch_files`."""
    built_from = responses_version(context.instance)  # before reading any file: what this build holds at least
    workers_config = pipeline.load_workers()
    paths = pipeline.paths
    refused = scan_batch_files(paths.benchgen)[1]
    for exc in refused:
        context.log.warning(str(exc))
    weights_from = reward_source(workers_config, pipeline.workers_config)  # the same words the CLI prints
    try:
        import_notes: dict = {}
        if config.import_path:
            inp, import_notes = _imported(config, paths, workers_config.reward, weights_from)
            summary = build(inp, paths.reward_db)
            source, utility, utility_source = inp.source, inp.utility, inp.utility_source
        else:
            shared = SharedStore.of(paths)
            if shared:  # rebuilt here from the shared responses (defs/shared.py says why not shared as a file)
                context.log.info(f"{shared.pull_all_responses()} response file(s) taken from {shared.data_url}")
            timings: dict = {}  # in bulk: DuckDB reads every response file at once (matrix/bulk.py)
            bad_batches: list[TaskFileError] = []
            summary = build_collection(paths.benchgen, paths.responses, workers_config, paths.reward_db, weights_from, timings,
                                       refused=bad_batches)
            if summary["skipped_where"]:  # the cells of those lines are missing (collected again next run)
                context.log.warning(f"response lines skipped: {summary['skipped_where']}")
            for exc in bad_batches:  # each left out whole; the matrix holds the other batches
                context.log.warning(f"batch file left out of the matrix: {first_problem(exc)}")
            refused = [*refused, *bad_batches]
            context.log.info(f"built in {sum(timings.values()):.2f}s: {timings}")
            source, utility = "collection", workers_config.reward
            utility_source = f"computed from each cell's quality, cost and latency; weights: {weights_from}"
    except TaskFileError as exc:
        raise batch_failure(exc, "then materialize reward_matrix again") from None
    except RewardMatrixError as exc:
        raise explained_failure(str(exc)) from None
    arrays = read_arrays(paths.reward_db)
    health = signal_health(arrays.utility)
    context.log.info(f"reward matrix: {summary}")
    return dg.MaterializeResult(
        metadata=tidy({
            "dagster/row_count": dg.MetadataValue.int(summary["cells_filled"]),  # graded cells (rows of `rewards`)
            "dagster/column_schema": REWARDS_SCHEMA,
            "tables": dg.MetadataValue.md(_tables_md(paths.reward_db)),
            **{k: v for k, v in summary.items() if k != "data_version"},
            "complete_rows": len(arrays.task_ids),
            "worker_ids": dg.MetadataValue.json(arrays.worker_ids),
            "mean_utility_by_worker": dg.MetadataValue.json(
                {w: round(float(arrays.utility[:, i].mean()), 4) for i, w in enumerate(arrays.worker_ids)} if len(arrays.task_ids) else {}
            ),
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in health.items()},
            "path": dg.MetadataValue.path(str(paths.reward_db)),
            "source": source,
            **({"import": dg.MetadataValue.json({"kind": config.import_kind, **import_notes})} if import_notes else {}),
            "refused_batch_files": dg.MetadataValue.json({e.path.name: first_problem(e) for e in refused}),
            RESPONSES_VERSION: built_from,
            "utility_weights": dg.MetadataValue.json(utility.model_dump()),
            "utility": f"{utility.describe()} ({utility_source})",
        }),
        data_version=dg.DataVersion(summary["data_version"]),
    )


# The first three checks are blocking: in a run that also trains (build_and_train, the main job), a
# failure stops every asset after the matrix, so no head is trained on an incomplete, reordered or
# NaN-holding matrix. learning_signal only warns.
@dg.asset_check(asset=reward_matrix, blocking=True, description="Every (task, worker) cell holds a graded reward.")
def cells_complete(pipeline: PipelineResource) -> dg.AssetCheckResult:
    arrays = read_arrays(pipeline.paths.reward_db, complete_only=False)
    import numpy as np

    missing = int(np.isnan(arrays.utility).sum())
    return dg.AssetCheckResult(
        passed=missing == 0,
        metadata={"missing_cells": missing, "rows_with_missing": int(np.isnan(arrays.utility).any(axis=1).sum())},
        description=None if missing == 0 else "re-materialize `responses` to retry failed cells",
    )


@dg.asset_check(asset=reward_matrix, blocking=True, description="Worker order in the matrix equals the worker config's order.")
def worker_order_fixed(pipeline: PipelineResource) -> dg.AssetCheckResult:
    with open_read_only(pipeline.paths.reward_db) as con:
        stored = [r[0] for r in con.execute("SELECT worker_id FROM workers ORDER BY position").fetchall()]
        positions = [r[0] for r in con.execute("SELECT position FROM workers ORDER BY position").fetchall()]
        bad_rows = con.execute(
            "SELECT count(*) FROM rewards r JOIN workers w USING (worker_id) WHERE r.position <> w.position"
        ).fetchone()[0]
        source = con.execute("SELECT value FROM meta WHERE key='source'").fetchone()[0]
    expected = stored if source.startswith("import:") else pipeline.load_workers().worker_ids
    passed = stored == expected and positions == list(range(len(stored))) and bad_rows == 0
    return dg.AssetCheckResult(
        passed=passed,
        metadata={"stored": dg.MetadataValue.json(stored), "expected": dg.MetadataValue.json(expected), "misplaced_cells": bad_rows},
    )


@dg.asset_check(asset=reward_matrix, blocking=True, description="No reward is NaN or infinite.")
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
