"""Every trainer's hyperparameters, one pydantic config per stage (seeded; the same seed on CPU gives
byte-identical weights), and loading them from YAML with errors naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fugu_pipeline.config_files import load_yaml_model
from fugu_pipeline.train.heads import HEAD_KINDS

# --------------------------------------------------------------------------- configs


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    head: str = Field("layernorm_linear", description=f"one of {HEAD_KINDS}")

    @field_validator("head")
    @classmethod
    def _known_head(cls, v: str) -> str:
        if v not in HEAD_KINDS:
            raise ValueError(f"unknown head {v!r}; choose one of {list(HEAD_KINDS)}")
        return v


class SFTConfig(_Config):
    temperature: float = Field(0.2, gt=0, description="soft targets softmax(U / temperature)")
    loss: Literal["ce", "kl"] = "ce"
    lr: float = Field(5e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    epochs: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(15, ge=1, description="epochs without a better validation utility before stopping")
    quality_cost_weight: float | None = Field(
        None, ge=0, description="quality head only: lambda in quality - lambda*cost; None = w_c/w_q of the utility config"
    )


class RLConfig(_Config):
    estimator: Literal["reinforce", "expected_reward"] = "reinforce"
    samples_per_task: int = Field(8, ge=1, description="REINFORCE actions sampled per task and step")
    entropy_coef: float = Field(0.01, ge=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epochs: int = Field(50, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(10, ge=1)


class ESConfig(_Config):
    population_size: int | None = Field(
        None, ge=2, description="None = the cmaes default 4 + floor(3 ln n), n = number of evolved weights"
    )
    sigma0: float = Field(0.02, gt=0, description="initial step size; small when warm-started")
    generations: int = Field(300, ge=1)
    val_every: int = Field(10, ge=1, description="evaluate the mean and the generation's best on val this often")


class ConfigError(ValueError):
    """A training config file is broken; the message names the file and the field."""


def load_config(path: str | Path, cls: type[BaseModel]) -> Any:
    """A trainer config from YAML (an empty file means all defaults); errors name file and field."""
    return load_yaml_model(path, cls, ConfigError, what="config file", empty_ok=True)
