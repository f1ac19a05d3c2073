"""The BenchGen batch sensor: a new batch file becomes a partition and its runs (a backfill)."""

from __future__ import annotations

import json

import dagster as dg

from fugu_pipeline.defs.data import responses, tasks
from fugu_pipeline.defs.distributed import single_step_executor
from fugu_pipeline.defs.failures import RUN_CONSOLE_CONFIG
from fugu_pipeline.defs.partitions import (
    batch_x_worker,
    ensure_worker_calls_limit,
    partition_run_request,
    task_batches,
    workers,
)
from fugu_pipeline.defs.resources import PipelineResource, config_skip
from fugu_pipeline.defs.versions import EMPTY_VERSION, file_version, latest_data_versions
from fugu_pipeline.tasks.loading import TaskFileError, load_tasks, scan_batch_files, shown_name
from fugu_pipeline.workers.config import WorkerConfigError
from fugu_pipeline.settings import settings

BATCH_SENSOR_INTERVAL_S = settings().batch_sensor_interval_s
_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}  # path -> ((inode, size, mtime ns), digest): this process's


def batch_digest(path) -> str:
    """A batch file's content version, hashed again only when its inode, size or modification time
    changed since this code server last hashed it: a tick over an unchanged folder reads no file
    (the sensor checks every 10 s; a folder of large batches was read whole on every tick)."""
    try:
        st = path.stat()
    except FileNotFoundError:  # deleted since it was listed
        return EMPTY_VERSION
    key, stamp = str(path), (st.st_ino, st.st_size, st.st_mtime_ns)
    known = _DIGESTS.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    digest = file_version(path)
    _DIGESTS[key] = (stamp, digest)
    return digest


# One job per partitions definition: a sensor's run requests need a job that holds the asset.
load_batch_job = dg.define_asset_job(
    "load_batch", selection=[tasks], executor_def=single_step_executor(),
    config=RUN_CONSOLE_CONFIG,
    description="Parse and validate one BenchGen batch (the `tasks` partition).",
)
collect_responses_job = dg.define_asset_job(
    "collect_responses", selection=[responses], executor_def=single_step_executor(),
    config=RUN_CONSOLE_CONFIG,
    description="One worker answers one batch (a `responses` partition); only missing or stale cells are called.",
)


def sync_worker_partitions(instance: dg.DagsterInstance, worker_ids: list[str]) -> list[str]:
    """Add missing worker partitions (retired workers keep theirs: their history stays visible)."""
    have = set(instance.get_dynamic_partitions(workers.name))
    new = [w for w in worker_ids if w not in have]
    if new:
        instance.add_dynamic_partitions(workers.name, new)
    return new


def register_partitions(instance: dg.DagsterInstance, pipeline: PipelineResource, worker_ids: list[str] | None = None):
    """Every batch file of the batch folder as a `task_batches` partition and every configured worker
    as a `workers` partition, added where missing (none is ever removed here: a deleted file's history
    stays visible). What the definitions do when they load, and `fugu-lite pipeline` before it
    runs, so a partition can be materialized alone on a fresh instance (`dagster asset materialize
    --select tasks --partition sample`); the batch sensor still requests each new or changed file's
    runs. Returns (batch name and path of each file found, the entries refused for their name)."""
    found, refused = scan_batch_files(pipeline.paths.benchgen)
    have = set(instance.get_dynamic_partitions(task_batches.name))
    new = [b for b, _ in found if b not in have]
    if new:
        instance.add_dynamic_partitions(task_batches.name, new)
    sync_worker_partitions(instance, worker_ids if worker_ids is not None else pipeline.load_workers().worker_ids)
    return found, refused


def _cursor_workers(context: dg.SensorEvaluationContext) -> set[str] | None:
    """The config's worker ids at the last tick (None: unknown, a cursor without them)."""
    try:
        ids = json.loads(context.cursor).get("workers") if context.cursor else None
    except (ValueError, AttributeError):
        return None  # named by _read_cursor
    return set(ids) if isinstance(ids, list) and all(isinstance(w, str) for w in ids) else None


def _read_cursor(context: dg.SensorEvaluationContext) -> tuple[dict[str, str], set[str]]:
    """(batch -> file digest already requested, names already refused) from the cursor. A cursor
    that cannot be read (hand-edited, truncated, another version's) is named in one line and the
    tick starts afresh: materialized batches are compared with their files, and a batch requested
    but not yet run is requested again under the same run key, which the daemon drops."""
    if not context.cursor:
        return {}, set()
    try:
        cursor = json.loads(context.cursor)
    except ValueError as exc:
        cursor, why = None, f"not JSON: {exc}"
    else:
        why = f"a JSON {'null' if cursor is None else type(cursor).__name__}, not an object"
    if isinstance(cursor, dict) and "batches" not in cursor and all(isinstance(v, str) for v in cursor.values()):
        cursor = {"batches": cursor}  # the first format: {batch: digest}
    batches = cursor.get("batches") if isinstance(cursor, dict) else None
    if isinstance(batches, dict):
        seen = {k: v for k, v in batches.items() if isinstance(v, str)}
        if len(seen) == len(batches):
            refused = cursor.get("refused")
            return seen, {r for r in refused if isinstance(r, str)} if isinstance(refused, list) else set()
        why = "a batch without a file digest"
    elif isinstance(cursor, dict):
        why = "no 'batches' map"
    context.log.warning(f"benchgen_batch_sensor: cursor unreadable ({why[:200]}); starting afresh from the materialized "
                        "batches (runs already requested keep their run keys, so none is launched twice)")
    return {}, set()


def _loads(path) -> bool:
    """Whether a batch file loads (the `tasks` asset's own parse and checks)."""
    try:
        load_tasks(path)
    except (TaskFileError, OSError):
        return False
    return True


def _responses_request(batch: str, worker: str, why: str) -> dg.RunRequest:
    key = dg.MultiPartitionKey({"batch": batch, "worker": worker})
    return partition_run_request(batch_x_worker, key, run_key=f"responses:{batch}:{worker}:{why}",
                                 job_name=collect_responses_job.name)


@dg.sensor(
    jobs=[load_batch_job, collect_responses_job],
    minimum_interval_seconds=BATCH_SENSOR_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Watches the BenchGen batch folder (data/benchgen/*.jsonl). A new or changed batch file becomes a "
        "`task_batches` partition, and `tasks` for it and `responses` for every worker are requested (a "
        "backfill over the batch; a re-run calls only missing cells). A file with a bad line gets its load only, "
        "which fails naming the line (no worker is called for it). A worker added to the config is "
        "collected on every known batch. A file whose name cannot be a partition key is refused with its "
        "name and the rule; the other files go on."
    ),
)
def benchgen_batch_sensor(context: dg.SensorEvaluationContext, pipeline: PipelineResource) -> dg.SensorResult:
    """See the description above (it is what the UI shows)."""
    seen, warned = _read_cursor(context)
    if ensure_worker_calls_limit(context.instance):
        context.log.info("pool worker_calls: limit set to 8 partition runs at a time (change it in the UI's Deployment tab)")
    try:
        config = pipeline.load_workers()
    except WorkerConfigError as exc:  # nothing is requested (a batch needs its workers' runs); the cursor stays
        return dg.SensorResult(skip_reason=config_skip(exc), cursor=context.cursor)
    known_workers = set(context.instance.get_dynamic_partitions(workers.name))
    missing_workers = [w for w in config.worker_ids if w not in known_workers]
    # a worker joins when its partition is missing, or when it was not in the config at the last tick (put back
    # after a removal: its partition stayed, and the batches that came meanwhile were never collected for it)
    before = _cursor_workers(context)
    joined = [w for w in config.worker_ids if w not in known_workers or (before is not None and w not in before)]
    known = set(context.instance.get_dynamic_partitions(task_batches.name))
    materialized = latest_data_versions(context.instance, tasks.key)  # batch -> hash of the file it read

    found, refused = scan_batch_files(pipeline.paths.benchgen)
    for exc in refused:
        if exc.path.name not in warned:
            context.log.warning(str(exc))
    added, requests = [], []
    for batch, path in found:
        try:
            digest = batch_digest(path)
        except OSError as exc:  # unreadable, or gone since it was listed: the next tick looks again
            context.log.warning(f"{shown_name(path.name)}: not read this tick ({type(exc).__name__}: {exc.strerror or exc}); "
                                "check the file's permissions; the other files go on")
            continue
        if digest == EMPTY_VERSION:  # deleted since it was listed
            continue
        if batch not in known:  # new, or its partition deleted (in the UI, or an instance reset): the folder rules
            added.append(batch)
        if materialized.get(batch) == digest or (batch in known and seen.get(batch) == digest):
            seen[batch] = digest
            continue  # already materialized from this very file, or already requested
        seen[batch] = digest
        # the key names the change (materialized content -> file content): a re-tick repeats it, so the daemon
        # drops the repeat, while a file reverted to an earlier content (v1 -> v2 -> v1) is a new change
        change = f"{materialized.get(batch, 'none')}->{digest}"
        requests.append(partition_run_request(task_batches, batch, run_key=f"tasks:{batch}:{change}", job_name=load_batch_job.name))
        if not _loads(path):  # its load fails and says why, in one run; its workers' runs would fail the same way, each
            context.log.warning(f"{shown_name(path.name)} cannot be loaded: only its load is requested (the run names the "
                                "line and what to do), no worker is called for it")
            continue
        requests.extend(_responses_request(batch, w, change) for w in config.worker_ids)
    if joined:  # collect it on every batch known before this tick; the key holds the partition's data version,
        collected = latest_data_versions(context.instance, responses.key)  # so a second join is a new request
        requested = {str(r.partition_key) for r in requests}  # a batch changed this tick already has its run
        for w in joined:
            requests.extend(_responses_request(b, w, f"joined@{collected.get(f'{b}|{w}', 'none')}")
                            for b in sorted(known) if f"{b}|{w}" not in requested)

    partition_requests = []
    if added:
        partition_requests.append(task_batches.build_add_request(added))
    if missing_workers:
        partition_requests.append(workers.build_add_request(missing_workers))
    new_cursor = json.dumps({"batches": seen, "refused": sorted(e.path.name for e in refused),
                             "workers": list(config.worker_ids)}, sort_keys=True)
    skip = None
    if not requests and not partition_requests:
        skip = "no new or changed batch files, no new workers"
        if refused:
            skip += f"; refused: {', '.join(shown_name(e.path.name) for e in refused)}"
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=partition_requests,
        cursor=new_cursor,
        skip_reason=skip,
    )
