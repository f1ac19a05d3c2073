"""The Definitions object: every asset, check, sensor and resource of the pipeline, assembled.

`fugu_pipeline.definitions` (the code location) and the main job (`runner.py`) both build theirs
here. torch and transformers are not imported while loading (the code location loads in seconds).
"""

from __future__ import annotations

import dagster as dg

from fugu_pipeline.defs import (
    automation,
    catalog,
    data,
    distributed,
    models,
    operations,
    reports,
    roles,
    sensors,
    settings,
    triage,
)
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.failures import run_console
from fugu_pipeline.defs.io import step_outputs
from fugu_pipeline.defs.partitions import batch_x_worker
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.settings import settings as env_settings


def build_defs(project_dir: str | None = None, workers_config: str | None = None, encoder: str | None = None) -> dg.Definitions:
    """`encoder`: hub id, local directory or 'tiny' (default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B)."""
    pipeline = PipelineResource(
        project_dir=project_dir or str(env_settings().project_dir),
        workers_config=workers_config or env_settings().workers_config,
    )
    return dg.Definitions(
        assets=[*settings.SETTINGS_ASSETS,
                catalog.openrouter_catalog, data.tasks, data.responses, data.reward_matrix, models.task_embeddings,
                models.router_sft, models.router_rl, models.router_es, models.router_heads, models.router_cascade,
                reports.eval_report_sft, reports.eval_report_rl, reports.eval_report_es, reports.eval_report_heads,
                reports.eval_report_cascade, reports.promoted_router,
                triage.triage_head, triage.eval_report_triage, roles.router_roles, roles.eval_report_roles],
        asset_checks=[data.cells_complete, data.worker_order_fixed, data.no_nan, data.learning_signal],
        sensors=[sensors.benchgen_batch_sensor, catalog.catalog_change_sensor, automation.reward_matrix_automation,
                 operations.catalog_update_sensor, settings.settings_sensor],
        schedules=[operations.openrouter_catalog_schedule],
        jobs=[sensors.load_batch_job, sensors.collect_responses_job, automation.build_reward_matrix_job,
              operations.refresh_catalog_job,
              operations.train_and_promote_job, operations.build_and_train_job, operations.main_job,
              *distributed.celery_jobs(data.responses, batch_x_worker)],
        loggers={"console": run_console},  # what the sensors' jobs print (defs/failures.py)
        executor=distributed.default_executor(),  # FUGU_EXECUTOR: multiprocess (default), celery, k8s
        resources={
            "io_manager": step_outputs,  # Dagster's pickled outputs; a missing input named in one line
            "pipeline": pipeline,
            "openrouter": catalog.OpenRouterResource.from_env(),
            "encoder": EncoderResource(model=encoder or env_settings().encoder),
        },
    )

