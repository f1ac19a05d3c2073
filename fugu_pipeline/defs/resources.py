"""Resources: where the project's files live and which worker config is in force."""


from pathlib import Path

import dagster as dg

from fugu_pipeline.paths import ProjectPaths
from fugu_pipeline.workers.config import WorkerConfigError, WorkersConfig, load_workers_config


def config_skip(exc: WorkerConfigError) -> str:
    """A sensor's skip reason for a broken worker config: the error in one line, and what to do.
    (A sensor that raises fails every tick; skipping keeps its cursor until the file is fixed.)"""
    return f"{' '.join(str(exc).split())[:500]}; nothing requested until the worker config is fixed"


class PipelineResource(dg.ConfigurableResource):
    """Project folders and the worker config. Every path is relative to `project_dir`."""

    project_dir: str = "."
    workers_config: str = "configs/workers.mock.yaml"

    @property
    def paths(self) -> ProjectPaths:
        return ProjectPaths(Path(self.project_dir).resolve())

    def load_workers(self) -> WorkersConfig:
        return load_workers_config(self.paths.resolve(self.workers_config))
