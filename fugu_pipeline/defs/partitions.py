"""Partition sets, defined once and imported everywhere else."""

from datetime import timedelta

import dagster as dg

from fugu_pipeline.defs.failures import RUN_CONSOLE_CONFIG
from fugu_pipeline.settings import settings

task_batches = dg.DynamicPartitionsDefinition(name="task_batches")
workers = dg.DynamicPartitionsDefinition(name="workers")
batch_x_worker = dg.MultiPartitionsDefinition({"batch": task_batches, "worker": workers})

# Dagster pools (concurrency limits live in dagster.yaml / `dagster instance concurrency set`).
WORKER_CALLS_POOL = "worker_calls"
DUCKDB_WRITER_POOL = "duckdb_writer"
GPU_POOL = "gpu"
DEFAULT_WORKER_CALLS_LIMIT = 8
MAIN_JOB_TAGS = {"fugu/launched_by": "fugu-lite pipeline"}  # the runs of `fugu-lite pipeline` (defs/runner.py)


def ensure_worker_calls_limit(instance: dg.DagsterInstance) -> bool:
    """Give the `worker_calls` pool its default limit (8 partition runs at a time) unless it has
    one; dagster.yaml's `default_limit: 1` is for the other pools. True when it was set now."""
    storage = instance.event_log_storage
    if WORKER_CALLS_POOL in storage.get_concurrency_keys():
        return False
    storage.set_concurrency_slots(WORKER_CALLS_POOL, DEFAULT_WORKER_CALLS_LIMIT)
    return True


def partition_run_request(partitions_def: dg.PartitionsDefinition, partition_key: str, **kwargs) -> dg.RunRequest:
    """A sensor's run request for one partition of a dynamic partition set, with its partition
    tags filled in here. Dagster otherwise checks the key against the instance while it resolves
    the request, which a sensor context built from an instance (tests, tick checks) cannot do;
    the sensors only request partitions they add in the same result or that already exist. The
    run prints through the project's console (`run_console`: a failure in one line, once)."""
    tags = {**kwargs.pop("tags", {}), **partitions_def.get_tags_for_partition_key(partition_key)}
    return dg.RunRequest(partition_key=partition_key, tags=tags, run_config=kwargs.pop("run_config", RUN_CONSOLE_CONFIG),
                         **kwargs)


# Freshness (evaluated by the daemon; shown on each asset's page): the catalog is refreshed hourly
# once its schedule is on, so warn after 2 h and fail after FUGU_CATALOG_MAX_AGE_H (26 h); a
# router is promoted or re-confirmed at least weekly: warn after 7 days, fail after
# FUGU_ROUTER_MAX_AGE_D (30 days).
CATALOG_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(hours=settings().catalog_max_age_h), warn_window=timedelta(hours=2))
ROUTER_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(days=settings().router_max_age_d), warn_window=timedelta(days=7))
