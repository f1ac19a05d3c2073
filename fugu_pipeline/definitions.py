"""Dagster entry point: `dagster dev -w workspace.yaml` loads `defs` from here.

Thin: it only assembles assets, checks, sensors and resources from `fugu_pipeline.defs`.
torch and transformers are not imported while loading (DESIGN §2).
"""

from __future__ import annotations

import os

import dagster as dg
from dotenv import load_dotenv

from fugu_pipeline.defs import data
from fugu_pipeline.defs.resources import PipelineResource

load_dotenv(override=False)  # OPENROUTER_API_KEY may live in .env; never written anywhere


def build_defs(project_dir: str | None = None, workers_config: str | None = None) -> dg.Definitions:
    pipeline = PipelineResource(
        project_dir=project_dir or os.environ.get("FUGU_PROJECT_DIR", "."),
        workers_config=workers_config or os.environ.get("FUGU_WORKERS_CONFIG", "configs/workers.mock.yaml"),
    )
    return dg.Definitions(
        assets=[data.tasks, data.responses, data.reward_matrix],
        asset_checks=[data.cells_complete, data.worker_order_fixed, data.no_nan, data.learning_signal],
        sensors=[data.benchgen_batch_sensor],
        resources={"pipeline": pipeline},
    )


defs = build_defs()
