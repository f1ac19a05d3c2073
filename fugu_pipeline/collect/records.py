"""The record of one graded (task, worker) call: one JSON line in a responses partition file.

The numbers a record may hold are the ones a call can produce: quality in [0, 1] (required when the status is ok), costs
and latencies finite, non-negative and at most `MAX_AMOUNT`, counts within a 32-bit integer (the
matrix's column type). A line holding anything else (NaN, a negative cost, a string where a number
belongs) is not a call record: the store's reader skips it as damage and the cell is called again,
rather than a NaN or negative figure reaching the reward matrix. A field given as `null` that has a
default takes its default, as a missing one does (the bulk build cannot tell the two apart).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fugu_pipeline.reward import MAX_AMOUNT

CostSource = Literal["usage", "catalog", "configured", "mock", "none"]

MAX_COUNT = 2**31 - 1  # the INTEGER columns of the matrix

Quality = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Amount = Annotated[float, Field(ge=0.0, le=MAX_AMOUNT, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]

# Fields with a default whose `null` means "not given" (see the module docstring).
_NULL_IS_DEFAULT = ("cost_usd", "cost_source", "judge_cost_usd", "latency_s", "attempts", "finished_at")


class CallRecord(BaseModel):
    """One (task, worker) call, graded (every call records all of this)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    worker_id: str
    batch: str
    prompt_hash: str
    status: Literal["ok", "failed"]
    answer: str | None = None
    quality: Quality | None = None
    grade_detail: str | None = None
    cost_usd: Amount = 0.0
    cost_source: CostSource = "none"
    judge_cost_usd: Amount = 0.0
    latency_s: Amount = 0.0
    ttft_s: Amount | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: str | None = None
    requested_model: str | None = None
    served_model: str | None = None
    provider: str | None = None
    attempts: Count = 1
    error: str | None = None
    model_fingerprint: str | None = None
    finished_at: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    call_id: str | None = None  # the id its cost line in the cost ledger carries (`ledger.py`)

    @model_validator(mode="after")
    def _graded_if_ok(self) -> "CallRecord":
        if self.status == "ok" and self.quality is None:  # no reward comes of it, yet the cell would count as done
            raise ValueError("an 'ok' record needs a quality (the grade of its answer)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(data.get(k, 0) is None for k in _NULL_IS_DEFAULT):
            data = {k: v for k, v in data.items() if not (k in _NULL_IS_DEFAULT and v is None)}
        return data
