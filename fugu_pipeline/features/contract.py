"""The feature contract: everything that decides what a feature vector means (DESIGN §3).

A checkpoint pins one; loading refuses a checkpoint whose contract differs from the encoder it is
given. dtype is not part of it (a bf16-GPU checkpoint serves on an fp32 CPU); it is part of the
embedding cache's fingerprint instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from fugu_pipeline.hashing import canonical_json, sha256_text


class FeatureContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoder_id: str
    revision: str | None = None
    pooling: Literal["last", "mean", "position"] = "mean"
    token_position: int | None = None  # for pooling="position", e.g. -2 = penultimate token
    layer: int = -1  # hidden_states index; -1 = last layer
    normalize: bool = True
    max_length: int = 512
    prompt_template: str = "{prompt}"
    dim: int

    def fingerprint(self) -> str:
        return sha256_text(canonical_json(self.model_dump()))[:16]

    def differences(self, other: "FeatureContract") -> list[str]:
        a, b = self.model_dump(), other.model_dump()
        return [f"{k}: checkpoint has {a[k]!r}, encoder has {b[k]!r}" for k in a if a[k] != b[k]]
