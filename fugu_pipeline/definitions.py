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

from dotenv import load_dotenv

from fugu_pipeline.defs.assemble import build_defs

load_dotenv(override=False)  # OPENROUTER_API_KEY may live in .env; never written anywhere

defs = build_defs()
gc.freeze()


def collect_responses_celery():
    """The Celery job, reconstructable by name (`dg.reconstructable(collect_responses_celery)`):
    what a run process and the Celery workers load to run its steps."""
    return defs.resolve_job_def("collect_responses_celery")
