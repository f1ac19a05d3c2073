"""The main job: materialize what is missing or stale in the asset graph, in order, through Dagster,
with the project's persistent instance (so the runs show up in `dagster dev` afterwards).

Used by `fugu-lite pipeline`. It first records the settings that changed (`settings.observe`), then
decides each step by Dagster's stale status (`plan.py`): a fresh step is skipped with one line
saying since which run; the others run as the UI would: one run per partition, one for the matrix
(its blocking checks stop what follows), then one run of the steps after it (each prints its line
as it ends, with why it ran). A re-run with nothing changed starts no run at all.
"""

import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import chdir, contextmanager
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterAssetCheckFailedError  # what a failed blocking check raises

from fugu_pipeline.defs.operations import AFTER_COLLECTION
from fugu_pipeline.defs.partitions import MAIN_JOB_TAGS, ensure_worker_calls_limit


class BlockingCheckFailed(RuntimeError):
    """A blocking check on the reward matrix failed: nothing is trained on it."""


class StepFailed(RuntimeError):
    """A step stopped with an error its asset explains (`dg.Failure`): said in one line."""

    def __init__(self, message: str, failure: dg.Failure | None = None):
        super().__init__(message)
        self.failure = failure

    def one_line(self) -> str:
        """The asset's own line and, when it gave one, what to do (its `fix` metadata)."""
        if self.failure is None:
            return str(self)
        fix = self.failure.metadata.get("fix")
        text = " ".join((self.failure.description or "").split())
        return text + (f"; fix: {fix.value}" if fix is not None and str(fix.value) not in text else "")


class _AssetLogLine(logging.Formatter):
    """One line per message an asset logs: `  warning (reward_matrix): ...`."""

    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None) or {}
        where = meta.get("step_key") or meta.get("job_name") or "dagster"
        return f"  {record.levelname.lower()} ({where}): {meta.get('orig_message', record.getMessage())}"


def _from_an_asset(record: logging.LogRecord) -> bool:
    """Messages the assets log; Dagster's own events (a step's failure with its stack) are left to
    the run's event log, and a failure is printed by the CLI in one line."""
    meta = getattr(record, "dagster_meta", None) or {}
    return meta.get("dagster_event") is None


@dg.logger(description="fugu-lite pipeline's console: each warning an asset logs, in one line")
def cli_console(init_context: dg.InitLoggerContext) -> logging.Logger:
    log = logging.Logger("fugu-lite pipeline", level=logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_AssetLogLine())
    handler.addFilter(_from_an_asset)
    log.addHandler(handler)
    return log


def project_instance(project_dir: Path, echo: Callable[[str], None] = print) -> dg.DagsterInstance:
    """The instance whose dagster.yaml sits in the project (DAGSTER_HOME defaults to it). Runs
    left STARTED by a killed process are marked failed first, and their pool slots freed."""
    from fugu_pipeline.defs.deploy import get_instance
    from fugu_pipeline.defs.launcher import fail_dead_runs

    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = str(project_dir.resolve())
    instance = get_instance()  # one clear line when its database is down (defs/deploy.py)
    for run_id in fail_dead_runs(instance):
        echo(f"  run {run_id} was left STARTED by a process that is gone: marked failed, its pool slots freed")
    ensure_worker_calls_limit(instance)
    return instance


class StopAfterError(ValueError):
    """`--stop-after` names no step the main job can stop after: one line with the valid names."""


class ProjectBusy(RuntimeError):
    """Another `fugu-lite pipeline` run holds the project (its lock file): one line, nothing done."""


class PipelineResults(dict):
    """The materialization metadata of each step, keyed by its label (`reward_matrix`,
    `responses[b|w]`: this run's, or the latest one's for a step skipped as fresh), `fresh`: each
    step skipped and why, `why`: why each step that ran did, and `left_out`: each batch file that
    could not be loaded, with its first problem in one line (the other batches went on; the command
    exits non-zero at the end)."""

    def __init__(self):
        super().__init__()
        self.left_out: dict[str, str] = {}
        self.fresh: dict[str, str] = {}
        self.why: dict[str, str] = {}


LOCK_FILE = ".fugu-pipeline.lock"


@contextmanager
def project_lock(project_dir: Path):
    """Hold the project for one `fugu-lite pipeline` run (a lock file in the project folder, released
    when the run ends or its process dies). Two runs at once on one project raced to create the
    Dagster instance's tables and to write the same partitions: the second is refused at once."""
    from filelock import FileLock, Timeout

    path = project_dir / LOCK_FILE
    info = project_dir / f"{LOCK_FILE}.holder"
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        try:
            holder = info.read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            holder = "unknown"
        raise ProjectBusy(f"another `fugu-lite pipeline` run holds {project_dir} ({holder}); nothing was done. "
                          "Wait for it to finish (or stop it), then run again: it goes on from where the other stopped") from None
    try:
        info.write_text(f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n", encoding="utf-8")
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()


def stoppable_steps(roles: bool = False) -> list[str]:
    """The names `--stop-after` takes: the matrix and every step after it (the coordinator's with --roles)."""
    return ["reward_matrix", *DOWNSTREAM, *(ROLES_STEPS if roles else [])]


def check_stop_after(stop_after: str | None, roles: bool = False) -> None:
    """StopAfterError (one line, the valid names) unless `stop_after` is None or a step it can stop after."""
    if stop_after is None or stop_after in stoppable_steps(roles):
        return
    why = ("a step before the matrix (the batches are always loaded and collected whole)"
           if stop_after in ("tasks", "responses") else
           "a coordinator step: add --roles" if stop_after in ROLES_STEPS else
           "needs the network (the catalog is fetched by its schedule)" if stop_after == "openrouter_catalog" else "not a step")
    raise StopAfterError(f"--stop-after {stop_after!r}: {why}; nothing was run. Use one of: {', '.join(stoppable_steps(roles))}"
                         + ("" if roles else f" (and {', '.join(ROLES_STEPS)} with --roles)"))


def run_pipeline(
    project_dir: Path,
    workers_config: str,
    *,
    encoder: str | None = None,
    stop_after: str | None = None,
    echo: Callable[[str], None] = print,
    roles: bool = False,
    asset_config: dict[str, dict] | None = None,
) -> PipelineResults:
    """Materialize tasks -> responses -> reward_matrix (-> the rest of the graph) for every batch
    file. A batch file that cannot be loaded is left out (named with its line, in `left_out`)
    and the others go on, as the batch sensor does. `asset_config`: run config of some assets, by
    name (e.g. {"router_heads": {"layer_sets": [[-1], [-1, 3]]}}), as the launchpad would give it.
    Returns the materialization metadata of each step, keyed by its label. StopAfterError before
    anything runs when `stop_after` is not a step it can stop after; ProjectBusy when another run
    holds the project."""
    check_stop_after(stop_after, roles)
    project_dir = project_dir.resolve()
    with project_lock(project_dir), chdir(project_dir):  # relative paths are the project's; the caller's cwd comes back
        return _run_locked(project_dir, workers_config, encoder=encoder, stop_after=stop_after, echo=echo, roles=roles,
                           asset_config=asset_config)


def _run_locked(project_dir: Path, workers_config: str, *, encoder, stop_after, echo, roles, asset_config) -> PipelineResults:
    from fugu_pipeline.defs.assemble import build_defs
    from fugu_pipeline.defs.plan import Planner
    from fugu_pipeline.defs.sensors import register_partitions
    from fugu_pipeline.defs.settings import observe

    defs = build_defs(str(project_dir), workers_config, encoder)
    instance = project_instance(project_dir, echo)
    pipeline = defs.resources["pipeline"]
    config = pipeline.load_workers()
    found, refused = register_partitions(instance, pipeline, config.worker_ids)
    for exc in refused:
        echo(f"  skipped {exc}")
    if not found:
        raise SystemExit(f"no batch files in {pipeline.paths.benchgen}: add a BenchGen .jsonl file there")
    changed = observe(instance, pipeline, defs.resources["encoder"])  # settings edited since the last observation
    # the same job the UI runs; only its console differs (the UI's run log keeps every event and stack)
    results = PipelineResults()
    job = defs.resolve_implicit_global_asset_job_def().with_logger_defs(
        {"console": cli_console, "progress": _progress_logger(echo, results)})

    def run(keys: list[str], label: str, partition_key=None, progress: bool = False):
        """One Dagster run of `keys` (in the graph's order), as the UI would launch it; `label`
        names it in an error when the run cannot say which step failed."""
        run_id = str(uuid.uuid4())
        config = {k: {"config": asset_config[k]} for k in keys if k in (asset_config or {})}
        try:
            return job.execute_in_process(
                instance=instance,
                asset_selection=[dg.AssetKey(k) for k in keys],
                partition_key=partition_key,
                run_id=run_id,
                tags=MAIN_JOB_TAGS,
                run_config={"loggers": {"console": {}, **({"progress": {}} if progress else {})},
                            **({"ops": config} if config else {})},
                raise_on_error=True,
            )
        except DagsterAssetCheckFailedError:
            raise BlockingCheckFailed(_blocking_failures(instance, _failed_step(instance, run_id) or label)) from None
        except dg.Failure as exc:  # the asset's own words; anything else is a bug and keeps its stack
            label = (_failed_step(instance, run_id) or label) if len(keys) > 1 else label
            raise StepFailed(f"{label} failed: {exc.description}. The steps before it are kept; put this right and run "
                             "`fugu-lite pipeline` again: it goes on from here", exc) from None

    def skipped(d) -> None:
        results.fresh[d.label] = d.why
        record = instance.get_latest_materialization_event(dg.AssetKey(d.key)) if d.partition is None else None
        if record is not None:  # the figures of what is kept, for the summary
            results[d.label] = {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}
        echo(f"  {d.label:<40} skipped, {d.why}")

    def step(d) -> None:
        if not d.run:
            return skipped(d)
        t0, c0 = time.monotonic(), time.process_time()
        res = run([d.key], d.label, d.partition)
        mats = res.get_asset_materialization_events()
        meta = mats[-1].materialization.metadata if mats else {}
        results[d.label] = {k: getattr(v, "value", v) for k, v in meta.items()}
        detail = ""
        if d.key == "responses":
            detail = f"  called {results[d.label].get('called')}, already done {results[d.label].get('already_done')}"
        echo(f"  {d.label:<40} done in {time.monotonic() - t0:6.2f}s (CPU {time.process_time() - c0:6.2f}s){detail}  [{d.why}]")

    def steps(decisions) -> None:
        """The steps after the matrix: the fresh ones skipped (one line each, with why), the others in
        one run (each prints its line as it ends): one run per step paid Dagster's per-run cost (a run
        record, its event-log database, the job's snapshot) a dozen times, a third of a re-run's time."""
        for d in decisions:
            if not d.run:
                skipped(d)
        todo = [d for d in decisions if d.run]
        if not todo:
            return
        results.why.update({d.key: d.why for d in todo})
        res = run([d.key for d in todo], todo[0].key, progress=True)
        for event in res.get_asset_materialization_events():
            meta = event.materialization.metadata
            results[event.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in meta.items()}

    batches = [b for b, _ in found]
    echo(f"fugu-lite pipeline: {len(batches)} batch(es) x {len(config.worker_ids)} worker(s), workers from {workers_config}"
         + (f"; settings changed since the last run: {', '.join(changed)}" if changed else ""))
    for b, path in found:
        try:
            step(Planner(instance, defs).tasks(b, path))
        except StepFailed as exc:  # a batch that cannot be loaded: left out, the others go on (as the batch sensor does)
            results.left_out[b] = exc.one_line()
            echo(f"  {'tasks[' + b + ']':<40} LEFT OUT: {exc.one_line()}")
            continue
        planner = Planner(instance, defs)
        for w in config.worker_ids:
            step(planner.responses(b, w))
    step(Planner(instance, defs).matrix())
    if stop_after == "reward_matrix":
        return results
    downstream = _downstream_steps(defs)
    keys = downstream[:downstream.index(stop_after) + 1] if stop_after in downstream else downstream
    if roles and stop_after not in downstream:  # the coordinator, after the one-step chain it warm-starts from and compares with
        keys = keys + (ROLES_STEPS[:ROLES_STEPS.index(stop_after) + 1] if stop_after in ROLES_STEPS else ROLES_STEPS)
    steps(Planner(instance, defs).downstream(keys, asset_config))
    return results


class NoSuchTarget(ValueError):
    """`fugu-lite materialize` names an asset or a partition that does not exist: one line, nothing run."""


def materialize_one(project_dir: Path, workers_config: str, key: str, partition: str | None = None, *,
                    encoder: str | None = None, echo: Callable[[str], None] = print) -> dict:
    """Materialize one asset (one partition of a partitioned one) on the project's instance, as the UI
    would: the batch files and workers registered as partitions first, the settings observed. An
    asset or partition that does not exist is NoSuchTarget, one line with the ones that do; a missing
    or stale input is the step's own line (StepFailed). Returns the materialization's metadata."""
    from fugu_pipeline.defs.assemble import build_defs
    from fugu_pipeline.defs.sensors import register_partitions
    from fugu_pipeline.defs.settings import observe

    project_dir = project_dir.resolve()
    with project_lock(project_dir), chdir(project_dir):  # relative paths are the project's; the caller's cwd comes back
        defs = build_defs(str(project_dir), workers_config, encoder)
        graph = defs.resolve_asset_graph()
        names = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        if key not in names:
            raise NoSuchTarget(f"no asset {key!r}; nothing was run. The assets: {', '.join(names)}")
        instance = project_instance(project_dir, echo)
        pipeline = defs.resources["pipeline"]
        found, _refused = register_partitions(instance, pipeline)
        part = _partition_of(graph.get(dg.AssetKey(key)), key, partition, [b for b, _ in found],
                             pipeline.load_workers().worker_ids, pipeline.paths.benchgen)
        observe(instance, pipeline, defs.resources["encoder"])
        job = defs.resolve_implicit_global_asset_job_def().with_logger_defs({"console": cli_console})
        label = f"{key}[{partition}]" if partition else key
        t0 = time.monotonic()
        try:
            res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey(key)], partition_key=part,
                                         tags=MAIN_JOB_TAGS, run_config={"loggers": {"console": {}}}, raise_on_error=True)
        except DagsterAssetCheckFailedError:
            raise BlockingCheckFailed(_blocking_failures(instance, key)) from None
        except dg.Failure as exc:
            raise StepFailed(f"{label} failed: {exc.description}", exc) from None
        mats = res.get_asset_materialization_events()
        echo(f"  {label:<40} done in {time.monotonic() - t0:6.2f}s")
        return {k: getattr(v, "value", v) for k, v in (mats[-1].materialization.metadata.items() if mats else ())}


def _partition_of(node, key: str, partition: str | None, batches: list[str], workers: list[str], folder: Path):
    """The partition key to run, checked against the batch files and the worker config."""
    if not node.is_partitioned:
        if partition is not None:
            raise NoSuchTarget(f"{key} is not partitioned; drop --partition {partition}")
        return None
    if partition is None:
        raise NoSuchTarget(f"{key} is partitioned: give --partition (batches: {', '.join(batches) or 'none'})")
    batch, _, worker = partition.partition("|")
    if batch not in batches:
        raise NoSuchTarget(f"partition {partition!r} of {key} does not exist: no batch file {folder / (batch + '.jsonl')}"
                           f" (batches: {', '.join(batches) or 'none'}); add the file there or name an existing batch")
    if key == "tasks":
        if worker:
            raise NoSuchTarget(f"tasks is partitioned by batch only: --partition {batch}")
        return batch
    if worker not in workers:
        raise NoSuchTarget(f"partition {partition!r} of {key}: give BATCH|WORKER, a worker of the worker config "
                           f"({', '.join(workers)})")
    return dg.MultiPartitionKey({"batch": batch, "worker": worker})


def _progress_logger(echo: Callable[[str], None], results: "PipelineResults | None" = None) -> dg.LoggerDefinition:
    """A logger that prints `  <step>   done in 1.23s (CPU 1.10s)  [why it ran]` as each step of a run
    succeeds (the CPU of this process from the step's start to its end: the steps of one run execute
    in it one after another)."""
    started: dict[str, float] = {}

    class _StepDone(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            event = (getattr(record, "dagster_meta", None) or {}).get("dagster_event")
            if event is None:
                return
            if event.event_type_value == "STEP_START":
                started[event.step_key] = time.process_time()
            elif event.event_type_value == "STEP_SUCCESS":
                cpu = time.process_time() - started.pop(event.step_key, time.process_time())
                why = (results.why.get(event.step_key) if results is not None else None)
                echo(f"  {event.step_key:<40} done in {event.event_specific_data.duration_ms / 1000:6.2f}s (CPU {cpu:6.2f}s)"
                     + (f"  [{why}]" if why else ""))

    @dg.logger(description="fugu-lite pipeline's progress: one line as each step ends")
    def progress(init_context: dg.InitLoggerContext) -> logging.Logger:
        log = logging.Logger("fugu-lite pipeline progress", level=logging.DEBUG)
        log.addHandler(_StepDone())
        return log

    return progress


def _failed_step(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The step of `run_id` that failed (its asset's name), from the run's event log."""
    from dagster._core.events import DagsterEventType

    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        if entry.dagster_event is not None and entry.dagster_event.step_key:
            return entry.dagster_event.step_key
    return None


ROLES_STEPS = ["router_roles", "eval_report_roles"]  # `fugu-lite pipeline --roles`


def _blocking_failures(instance: dg.DagsterInstance, key: str) -> str:
    """One line per failed blocking check of `key`, with its figures."""
    lines = []
    for check in ("cells_complete", "worker_order_fixed", "no_nan"):
        records = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(key), check), limit=1)
        ev = records[0].event.dagster_event.event_specific_data if records and records[0].event else None
        if ev is not None and getattr(ev, "passed", True) is False:
            figures = ", ".join(f"{k} {getattr(v, 'value', v)}" for k, v in ev.metadata.items())
            lines.append(f"{check} failed ({figures})")
    what = "; ".join(lines) or "a blocking check failed"
    return (f"{key}: {what}. Nothing was trained on it. Re-run `fugu-lite pipeline`: it calls only the failed "
            "or missing cells, then checks again.")


# After the reward matrix, in order. The catalog asset is not here: it needs the network.
DOWNSTREAM = [a.key.to_user_string() for a in AFTER_COLLECTION[1:]]  # the steps after the matrix, main_job's


def _downstream_steps(defs: dg.Definitions) -> list[str]:
    present = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    return [k for k in DOWNSTREAM if k in present]
