"""Dagster entry point: `dagster dev -w workspace.yaml` loads `defs` from here.

Thin: the Definitions are assembled in `fugu_pipeline.defs.assemble`. torch and transformers are
not imported while loading.
"""

from dotenv import load_dotenv

from fugu_pipeline.defs.assemble import build_defs

load_dotenv(override=False)  # OPENROUTER_API_KEY may live in .env; never written anywhere

defs = build_defs()


def collect_responses_celery():
    """The Celery job, reconstructable by name (`dg.reconstructable(collect_responses_celery)`):
    what a run process and the Celery workers load to run its steps."""
    return defs.resolve_job_def("collect_responses_celery")
