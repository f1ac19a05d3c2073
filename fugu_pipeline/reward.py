"""The utility of one answer: what the reward matrix holds and every head maximises.

`U = w_q·Q − w_c·min(C/C0, cap) − w_l·min(L/L0, cap)`, Q in [0, 1], C in USD, L in seconds. The
weights come from the worker YAML's `reward:` block; the matrix stores them, and training,
evaluation and the command line read them back from there, so one setting has one meaning.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.hashing import canonical_json, sha256_text

MAX_AMOUNT = 1e6  # USD or seconds: beyond this a call's cost or latency is a unit error or damage, not a call


class UtilityConfig(BaseModel):
    """U = w_q*Q - w_c*min(C/C0, cap) - w_l*min(L/L0, cap)  ."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    quality_weight: float = Field(1.0, ge=0)
    cost_weight: float = Field(0.1, ge=0)
    latency_weight: float = Field(0.05, ge=0)
    cost_scale_usd: float = Field(0.01, gt=0)
    latency_scale_s: float = Field(10.0, gt=0)
    cap: float = Field(5.0, gt=0)

    def utility(self, quality: float, cost_usd: float, latency_s: float) -> float:
        return (
            self.quality_weight * quality
            - self.cost_weight * min(max(cost_usd, 0.0) / self.cost_scale_usd, self.cap)
            - self.latency_weight * min(max(latency_s, 0.0) / self.latency_scale_s, self.cap)
        )

    def describe(self) -> str:
        """The formula with these weights, e.g. `U = 1·Q − 0.1·min(C/$0.01, 5) − 0.05·min(L/10s, 5)`."""
        return (f"U = {self.quality_weight:g}·Q − {self.cost_weight:g}·min(C/${self.cost_scale_usd:g}, {self.cap:g}) "
                f"− {self.latency_weight:g}·min(L/{self.latency_scale_s:g}s, {self.cap:g})")

    def fingerprint(self) -> str:
        return sha256_text(canonical_json(self.model_dump()))[:16]


MAX_COST_WEIGHT = 1e6  # λ in quality − λ·cost at routing time: beyond this the scores lose every quality term
