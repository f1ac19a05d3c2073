"""What a multi-turn session records: every turn (who, which role, what it said, what it cost) and
the whole trajectory (the committed answer, its grade, why the session stopped). A trajectory is
one JSON line in the trajectory store (`store.py`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

StopReason = Literal["accepted", "committed", "max_turns", "all_workers_failed", "budget", "fatal"]


class TurnRecord(BaseModel):
    """One turn: the head's pick, the call that served it (after any fallback) and its result."""

    model_config = ConfigDict(extra="ignore")

    index: int  # 1-based
    role: Literal["thinker", "worker", "verifier"]
    chosen_worker: str  # the head's pick
    served_by: str | None = None  # who answered (differs after a fallback); None when every worker failed
    status: Literal["ok", "failed"] = "ok"
    text: str | None = None
    extractable: bool = False  # holds an answer the grader could read (session/roles.py)
    verdict: Literal["accept", "revise"] | None = None
    verdict_detail: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float = 0.0
    cost_source: str = "none"
    latency_s: float = 0.0
    attempts: int = 0  # worker calls made for this turn, fallbacks included
    served_model: str | None = None
    fallback_errors: list[dict] = Field(default_factory=list)  # {worker, error, status, fatal}
    worker_probs: dict[str, float] = Field(default_factory=dict)
    role_probs: dict[str, float] = Field(default_factory=dict)
    request_sha: str = ""  # hash of (worker, messages, seed) of the served call: the turn memo's key
    reused: bool = False  # served from the run's turn memo (common random numbers), no new call


class Trajectory(BaseModel):
    """One finished session. `status`: ok (graded), failed (grading failed, or no worker could be
    reached), budget (stopped by the budget guard; its paid turns are kept)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    prompt_hash: str
    domain: str = "general"
    head: str  # head hash, or a fixed policy's name
    seed: int
    greedy: bool = True
    status: Literal["ok", "failed", "budget"] = "ok"
    stop_reason: StopReason = "max_turns"
    turns: list[TurnRecord] = Field(default_factory=list)
    committed_turn: int | None = None
    answer: str | None = None
    quality: float | None = None
    grade_detail: str | None = None
    judge_cost_usd: float = 0.0
    cost_usd: float = 0.0  # every turn's calls plus the judge
    latency_s: float = 0.0  # the turns one after another
    error: str | None = None
    finished_at: float = 0.0

    @property
    def n_turns(self) -> int:
        return len(self.turns)

    @property
    def n_calls(self) -> int:
        return sum(t.attempts for t in self.turns)

    @property
    def correct(self) -> bool:
        return (self.quality or 0.0) >= 1.0 - 1e-9
