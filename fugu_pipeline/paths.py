"""Where every input and output of the pipeline lives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fugu_pipeline.settings import settings


@dataclass(frozen=True)
class ProjectPaths:
    root: Path

    @classmethod
    def from_env(cls) -> "ProjectPaths":
        return cls(settings().project_dir.resolve())

    def resolve(self, p: str | Path) -> Path:
        p = Path(p)
        return p if p.is_absolute() else self.root / p

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def benchgen(self) -> Path:
        """Incoming BenchGen batch files, one partition each."""
        return self.data / "benchgen"

    @property
    def responses(self) -> Path:
        return self.data / "responses"

    @property
    def reward_db(self) -> Path:
        return self.data / "reward_matrix.duckdb"

    @property
    def embeddings(self) -> Path:
        return self.data / "embeddings"

    @property
    def catalog(self) -> Path:
        return self.data / "catalog"

    @property
    def imports(self) -> Path:
        return self.data / "imports"

    @property
    def models(self) -> Path:
        return self.root / "models"

    # The shared store (fugu_pipeline/storage.py): object-store URLs other machines read and
    # write too; the local folders above stay this machine's working copies.

    @property
    def data_url(self) -> str | None:
        """FUGU_DATA_URL: the shared `data/` (responses, embeddings), e.g. s3://bucket/fugu/data."""
        return settings().data_url

    @property
    def models_url(self) -> str | None:
        """FUGU_MODELS_URL: the shared `models/` (checkpoints, the promoted pointer)."""
        return settings().models_url
