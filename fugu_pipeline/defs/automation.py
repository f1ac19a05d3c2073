"""The reward matrix follows the collection: `reward_matrix_automation`, the sensor that rebuilds
`reward_matrix` as soon as the collection runs it reads have finished, and the job it launches.

The rule, checked every FUGU_AUTOMATION_INTERVAL_S seconds (default 5; each check is three
small queries of the instance's run storage, no code is loaded):

- while a collection run (`tasks` or `responses`: a batch's load, a worker's partition, a
  re-collection from the UI or the catalog sensor) is queued or running, wait: one build once the
  wave is over, not one per partition;
- while a `reward_matrix` run is queued or running, wait;
- then build when a collection run has ended, successfully or not, after the latest matrix run
  started. A failed run counts: a batch file with a bad line fails its `tasks` run, and the new
  build lists it under `refused_batch_files`; a retired worker's partition, never collected
  again, holds nothing back. The runs of `fugu-lite pipeline` (same instance) are waited for but
  not followed: the command builds the matrix itself right after its collection.

Level-triggered on the run records, so nothing is lost between two checks (a re-collection that
lands while a build runs gets a build after it), and a failed build is not retried in a loop:
its run started after the collection it followed, so only a new collection run tries again.
The run key names the last collection run followed: a repeated check never launches twice.
Never over a matrix imported from routing data (its `source` metadata starts with `import:`):
the collection is not what it holds; building it once from the collection by hand resumes.

Why not Dagster's `AutomationCondition` sensor: it evaluates the asset graph on the code server
(about a second a tick on a loaded machine), so it ticked every 30 s, and a batch waited for the
batch sensor's poll and then this one (66 s from drop to matrix). This check reacts within one
5 s tick of the last collection run ending.
"""

from __future__ import annotations

from datetime import datetime, timezone

import dagster as dg

from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.distributed import CELERY_JOB, single_step_executor
from fugu_pipeline.defs.failures import RUN_CONSOLE_CONFIG
from fugu_pipeline.defs.partitions import MAIN_JOB_TAGS
from fugu_pipeline.defs.versions import RESPONSES, latest_data_versions
from fugu_pipeline.settings import settings

REWARD_MATRIX = dg.AssetKey("reward_matrix")
COLLECTION = frozenset({dg.AssetKey("tasks"), dg.AssetKey("responses")})
COLLECTION_JOBS = frozenset({"load_batch", "collect_responses", CELERY_JOB})
IMPORT_SOURCE_PREFIX = "import:"  # how an imported matrix's `source` metadata starts (matrix/build.py)
AUTOMATION_INTERVAL_S = settings().automation_interval_s
BUILD_JOB = "build_reward_matrix"
UNFINISHED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]

build_reward_matrix_job = dg.define_asset_job(
    BUILD_JOB, selection=[reward_matrix], executor_def=single_step_executor(), config=RUN_CONSOLE_CONFIG,
    description="The reward matrix from the collected responses, with its checks (what reward_matrix_automation "
                "launches once a batch's collection runs have finished).",
)


def _assets(run: dg.DagsterRun, repo: dg.RepositoryDefinition | None) -> set[dg.AssetKey]:
    """The assets a run materializes: its selection, else its job's assets."""
    if run.asset_selection:
        return set(run.asset_selection)
    if run.job_name in COLLECTION_JOBS:
        return set(COLLECTION)
    if repo is not None and repo.has_job(run.job_name):
        return set(repo.get_job(run.job_name).asset_layer.selected_asset_keys)
    return set()


def _main_job(run: dg.DagsterRun) -> bool:
    """A run of `fugu-lite pipeline`, which builds the matrix itself right after its collection."""
    return all(run.tags.get(k) == v for k, v in MAIN_JOB_TAGS.items())


def _started(instance: dg.DagsterInstance, run_id: str) -> float:
    """When a run started (its creation, if it never started)."""
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        return 0.0
    return record.start_time or record.create_timestamp.timestamp()


def _imported(instance: dg.DagsterInstance) -> bool:
    event = instance.get_latest_materialization_event(REWARD_MATRIX)
    source = event.asset_materialization.metadata.get("source") if event and event.asset_materialization else None
    return source is not None and str(source.value).startswith(IMPORT_SOURCE_PREFIX)


def matrix_request(instance: dg.DagsterInstance, repo: dg.RepositoryDefinition | None = None) -> tuple[dg.RunRequest | None, str]:
    """(the matrix build to launch, or None; why), by the rule in the module docstring."""
    unfinished = [(r, _assets(r, repo)) for r in instance.get_runs(dg.RunsFilter(statuses=UNFINISHED))]
    collecting = [r for r, keys in unfinished if keys & COLLECTION]
    if collecting:
        shown = ", ".join(sorted({r.tags.get("dagster/partition", r.job_name) for r in collecting})[:5])
        return None, f"waiting for {len(collecting)} collection run(s) to finish ({shown})"
    if any(REWARD_MATRIX in keys for _, keys in unfinished):
        return None, "a reward_matrix run is queued or running"
    planned = instance.get_latest_planned_materialization_info(REWARD_MATRIX)
    since = _started(instance, planned.run_id) if planned else 0.0
    # update_timestamp is stored by the database (to the second): look a little further back, then compare end times
    records = instance.get_run_records(dg.RunsFilter(
        statuses=FINISHED, updated_after=datetime.fromtimestamp(max(since - 5.0, 0.0), tz=timezone.utc)))
    ended = [rec for rec in records if rec.end_time and rec.end_time > since and _assets(rec.dagster_run, repo) & COLLECTION
             and not _main_job(rec.dagster_run)]
    if not ended:
        return None, "up to date: no collection run has ended since the latest matrix build started"
    if not latest_data_versions(instance, RESPONSES):
        return None, "no responses partition is collected yet: nothing to build a matrix from"
    if _imported(instance):
        return None, ("the matrix holds imported routing data: the collection does not replace it (materialize "
                      "reward_matrix once without import_path to follow the collection again)")
    last = max(ended, key=lambda rec: rec.end_time or 0.0)
    failed = sum(rec.dagster_run.status != dg.DagsterRunStatus.SUCCESS for rec in ended)
    why = f"{len(ended)} collection run(s) ended since the latest build" + (f", {failed} of them failed" if failed else "")
    return dg.RunRequest(run_key=f"after:{last.dagster_run.run_id}", job_name=BUILD_JOB, run_config=RUN_CONSOLE_CONFIG,
                         tags={"fugu/follows_run": last.dagster_run.run_id}), why


@dg.sensor(
    name="reward_matrix_automation",
    job=build_reward_matrix_job,
    minimum_interval_seconds=AUTOMATION_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Rebuilds reward_matrix once a wave of collection runs (a batch's load and its workers' partitions, a "
        "re-collection) has ended, successfully or not: a refused batch is listed in the new build's "
        "refused_batch_files. Waits while any collection or matrix run is queued or running; never replaces a matrix "
        "imported from routing data. Checks the run records every few seconds (FUGU_AUTOMATION_INTERVAL_S, default 5)."
    ),
)
def reward_matrix_automation(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """See the description above (it is what the UI shows)."""
    request, why = matrix_request(context.instance, context.repository_def)
    if request is None:
        return dg.SensorResult(skip_reason=why)
    context.log.info(f"reward_matrix requested: {why}")
    return dg.SensorResult(run_requests=[request])
