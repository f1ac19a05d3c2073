"""Resources: where the project's files live and which worker config is in force."""


from pathlib import Path

import dagster as dg

from fugu_pipeline.paths import ProjectPaths
from fugu_pipeline.workers.config import WorkersConfig, load_workers_config


class PipelineResource(dg.ConfigurableResource):
    """Project folders and the worker config. Every path is relative to `project_dir`."""

    project_dir: str = "."
    workers_config: str = "configs/workers.mock.yaml"

    @property
    def paths(self) -> ProjectPaths:
        return ProjectPaths(Path(self.project_dir).resolve())

    def load_workers(self) -> WorkersConfig:
        return load_workers_config(self.paths.resolve(self.workers_config))
