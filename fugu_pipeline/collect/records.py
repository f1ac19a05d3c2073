"""The record of one graded (task, worker) call: one JSON line in a responses partition file."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

CostSource = Literal["usage", "catalog", "configured", "mock", "none"]


class CallRecord(BaseModel):
    """One (task, worker) call, graded (DESIGN §6: every call records all of this)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    worker_id: str
    batch: str
    prompt_hash: str
    status: Literal["ok", "failed"]
    answer: str | None = None
    quality: float | None = None
    grade_detail: str | None = None
    cost_usd: float = 0.0
    cost_source: CostSource = "none"
    judge_cost_usd: float = 0.0
    latency_s: float = 0.0
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    requested_model: str | None = None
    served_model: str | None = None
    provider: str | None = None
    attempts: int = 1
    error: str | None = None
    model_fingerprint: str | None = None
    finished_at: float = 0.0
