"""What runs the pipeline day to day: named jobs, the catalog schedule and the sensor that turns
a refreshed catalog into re-collection, and freshness checks.

- Jobs. Dagster runs one partitions definition per job, so the graph is three kinds of run:
  collection per partition (`load_batch`, `collect_responses`, in sensors.py), `train_and_promote`
  (embeddings -> heads -> reports -> promotion) and `build_and_train` (the matrix and everything
  after it: the whole graph once its partitions are collected; `fugu-lite pipeline` runs both
  kinds in order), `main_job` (what `fugu-lite pipeline` runs after collection: build_and_train and
  the triage head; the UI's way to the main assets), plus `refresh_catalog`.
- `openrouter_catalog_schedule` materializes the catalog (cron FUGU_CATALOG_CRON, default hourly).
  Off by default: once turned on, `catalog_update_sensor` (running by default, inert until the
  catalog is materialized) reads what each new catalog found (`changed_workers`) and requests a
  `responses` run per batch of every changed worker, tagged with the new model fingerprint, so
  only cells answered under the old offer are called again. Re-collection spends money, which
  is why turning the schedule on is the one switch.
- Freshness policies (defs/partitions.py) sit on `openrouter_catalog` and `promoted_router`;
  Dagster's daemon evaluates them, no sensor needed.
"""

from __future__ import annotations

import dagster as dg

from fugu_pipeline.defs.catalog import FINGERPRINT_TAG, RESPONSES_KEY, openrouter_catalog
from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.models import router_cascade, router_es, router_heads, router_rl, router_sft, task_embeddings
from fugu_pipeline.defs.reports import (
    eval_report_cascade,
    eval_report_es,
    eval_report_heads,
    eval_report_rl,
    eval_report_sft,
    promoted_router,
)
from fugu_pipeline.defs.partitions import batch_x_worker, partition_run_request, task_batches, workers
from fugu_pipeline.defs.triage import eval_report_triage, triage_head
from fugu_pipeline.settings import settings

# every asset promoted_router reads: a job without router_heads and eval_report_heads failed on a
# fresh project (no stored heads report) and promoted from a stale one elsewhere. A job run again
# recomputes nothing whose inputs are unchanged: each step finds its record (steps/records.py)
TRAINING = [task_embeddings, router_sft, router_rl, router_es, router_heads, router_cascade, eval_report_sft,
            eval_report_rl, eval_report_es, eval_report_heads, eval_report_cascade, promoted_router]

refresh_catalog_job = dg.define_asset_job(
    "refresh_catalog", selection=[openrouter_catalog],
    description="Fetch the OpenRouter model catalog; the catalog_update_sensor re-collects changed workers.",
)
train_and_promote_job = dg.define_asset_job(
    "train_and_promote", selection=TRAINING,
    description="Embeddings, the SFT -> RL -> CMA-ES heads, the head set and the cascade, their held-out reports and "
                "the promotion decision. A step whose inputs, code and settings are unchanged keeps its earlier output "
                "(nothing trained); \"Materialize stale and missing\" on the graph runs only what is out of date.",
)
# what `fugu-lite pipeline` runs once every batch is collected, in its order (defs/runner.py): the
# main job's assets that take no partition, which the UI materializes in one run
AFTER_COLLECTION = [reward_matrix, *TRAINING, triage_head, eval_report_triage]
main_job = dg.define_asset_job(
    "main_job", selection=AFTER_COLLECTION,
    description="The main job once the batches are collected (the batch sensor collects them): the reward matrix, "
                "embeddings, every head, the held-out reports, the promotion and the triage head, as fugu-lite "
                "pipeline runs them. Launch it from the Jobs page: no partition to pick. The matrix's blocking checks "
                "stop it before training on bad data.",
)
build_and_train_job = dg.define_asset_job(
    "build_and_train", selection=[reward_matrix, *TRAINING],
    description="The reward matrix from the collected responses, then train_and_promote: the whole graph once "
                "its partitions are collected. The matrix's blocking checks (complete, worker order, no NaN) "
                "stop the run before training on bad data.",
)

openrouter_catalog_schedule = dg.ScheduleDefinition(
    name="openrouter_catalog_schedule",
    job=refresh_catalog_job,
    cron_schedule=settings().catalog_cron,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Refreshes openrouter_catalog (FUGU_CATALOG_CRON, default hourly). Off by default: turning it on "
                "lets catalog changes re-collect (and spend money) through catalog_update_sensor.",
)


def _cursor_storage_id(context: dg.SensorEvaluationContext) -> int:
    """The storage id of the last catalog materialization handled. A cursor that is not one is
    named in one line and read as 0: the latest catalog is handled again, and its run requests
    carry the same run keys as before, so the daemon launches none of them twice."""
    if not context.cursor:
        return 0
    try:
        return int(context.cursor)
    except ValueError:
        context.log.warning(f"catalog_update_sensor: cursor unreadable ({context.cursor[:80]!r}, expected a storage id); "
                            "handling the latest catalog again (run keys keep it from launching anything twice)")
        return 0


@dg.sensor(
    name="catalog_update_sensor",
    minimum_interval_seconds=settings().catalog_update_sensor_interval_s,
    asset_selection=[RESPONSES_KEY],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reacts to each new openrouter_catalog materialization (the schedule's, or one launched by hand): "
                "for every worker whose model's offer changed, one responses run per batch, tagged with the new "
                "model fingerprint (only cells answered under the old offer are called again). Inert while the "
                "catalog is never refreshed.",
)
def catalog_update_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """See the description above (it is what the UI shows)."""
    records = context.instance.fetch_materializations(openrouter_catalog.key, limit=1).records
    if not records:
        return dg.SensorResult(skip_reason="openrouter_catalog was never materialized (turn on openrouter_catalog_schedule)")
    record = records[0]
    last = _cursor_storage_id(context)
    if record.storage_id < last:
        context.log.warning(f"catalog_update_sensor: cursor {last} is ahead of the latest catalog ({record.storage_id}): "
                            "the event log was reset; handling the latest catalog")
        last = 0
    if record.storage_id <= last:
        return dg.SensorResult(skip_reason="no new catalog since the last tick", cursor=context.cursor)
    meta = record.asset_materialization.metadata
    changed = meta["changed_workers"].value if "changed_workers" in meta else {}
    batches = context.instance.get_dynamic_partitions(task_batches.name)
    known = set(context.instance.get_dynamic_partitions(workers.name))
    requests = []
    if not isinstance(changed, dict):
        context.log.warning(f"catalog_update_sensor: changed_workers of materialization {record.storage_id} is a "
                            f"{type(changed).__name__}, not a map of workers; left out")
        changed = {}
    for worker_id, pair in sorted(changed.items()):
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(fp, str | None) for fp in pair)
                and pair[1]):  # a materialization reported by hand with other metadata
            context.log.warning(f"catalog_update_sensor: changed_workers[{worker_id[:80]!r}] of materialization "
                                f"{record.storage_id} is not [old fingerprint, new fingerprint]; left out")
            continue
        old_fp, new_fp = pair
        if worker_id not in known:
            continue
        for batch in batches:
            requests.append(partition_run_request(
                batch_x_worker, dg.MultiPartitionKey({"batch": batch, "worker": worker_id}),
                # the materialization's id: unique per catalog refresh (a price flipping back to an earlier
                # offer is a new change), the same on a replay of this one
                run_key=f"catalog:{worker_id}:{batch}:{old_fp}->{new_fp}#{record.storage_id}",
                asset_selection=[RESPONSES_KEY], tags={FINGERPRINT_TAG: new_fp},
            ))
    cursor = str(record.storage_id)
    if requests:
        return dg.SensorResult(run_requests=requests, cursor=cursor)
    return dg.SensorResult(skip_reason=f"catalog refreshed; no configured worker changed ({len(known)} known)", cursor=cursor)
