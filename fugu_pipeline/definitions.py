"""Dagster entry point: `dagster dev -w workspace.yaml` loads `defs` from here.

Thin: the Definitions are assembled in `fugu_pipeline.defs.assemble`. torch and transformers are
not imported while loading (the code server starts in seconds).

The processes that load this module (the code server, each run's process) keep the definitions
until they exit, so once built they are moved out of the cyclic garbage collector's sight
(`gc.freeze()`). At exit Python otherwise collects over every object of the process first: under
load that took the code server about five seconds, and `dagster dev` waits for it on Ctrl-C.
Objects are still freed by reference counting; only cycles among these long-lived ones are no
longer searched for.
"""

import gc
import logging
import os

from dotenv import load_dotenv

from fugu_pipeline.defs.assemble import build_defs

load_dotenv(override=False)  # OPENROUTER_API_KEY may live in .env; never written anywhere

defs = build_defs()
gc.freeze()


def register_partitions_on_load() -> None:
    """The batch folder's files and the configured workers as partitions of the instance this process
    serves (DAGSTER_HOME), added where missing, so a partition materializes alone on a fresh instance
    (`dagster asset materialize -m fugu_pipeline.definitions --select tasks --partition sample`) and
    the UI lists every batch at once. Best effort: a problem is one logged line, never a failed load
    (the batch sensor adds what is missing on its next tick)."""
    if not os.environ.get("DAGSTER_HOME"):
        return  # an ephemeral instance: nothing lasts past this process
    from dagster import DagsterInstance

    from fugu_pipeline.defs.sensors import register_partitions
    from fugu_pipeline.workers.config import WorkerConfigError

    pipeline = defs.resources["pipeline"]
    try:
        try:
            worker_ids = pipeline.load_workers().worker_ids
        except WorkerConfigError:
            worker_ids = []  # the sensor says what is wrong with the file; the batches are registered all the same
        register_partitions(DagsterInstance.get(), pipeline, worker_ids)
    except Exception as exc:  # noqa: BLE001  (the instance unreachable: the load goes on)
        logging.getLogger("fugu_pipeline").warning(f"partitions not registered at load ({type(exc).__name__}: {exc}); "
                                                   "the batch sensor adds them on its next tick")


register_partitions_on_load()


def collect_responses_celery():
    """The Celery job, reconstructable by name (`dg.reconstructable(collect_responses_celery)`):
    what a run process and the Celery workers load to run its steps."""
    return defs.resolve_job_def("collect_responses_celery")
