"""Records shared by every layer: tasks, graders, call records, reward rows, utility weights,
and the feature contract that ties a checkpoint to the encoder that made its features.

Plain pydantic, no dagster, no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Split = Literal["train", "val", "test"]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- graders


class ExactGrader(Strict):
    type: Literal["exact"]
    case_sensitive: bool = False
    strip: bool = True


class ContainsGrader(Strict):
    type: Literal["contains"]
    case_sensitive: bool = False


class NumericGrader(Strict):
    type: Literal["numeric"]
    tolerance: float = Field(0.0, ge=0.0)
    relative: bool = False


class RegexGrader(Strict):
    type: Literal["regex"]
    pattern: str | None = None  # default: the reference answer is the pattern
    flags: list[Literal["IGNORECASE", "MULTILINE", "DOTALL"]] = []
    full_match: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regex {v!r}: {exc}") from None
        return v


class LLMJudgeGrader(Strict):
    type: Literal["llm_judge"]
    rubric: str = Field(min_length=1)
    scale: int = Field(10, ge=1, description="the judge scores 0..scale; quality = score/scale")


Grader = Annotated[
    ExactGrader | ContainsGrader | NumericGrader | RegexGrader | LLMJudgeGrader,
    Field(discriminator="type"),
]

GRADER_TYPES = ("exact", "contains", "numeric", "regex", "llm_judge")


# --------------------------------------------------------------------------- tasks


class Task(Strict):
    """One BenchGen task (DESIGN §4). Only the grader ever sees `reference_answer`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1, max_length=256)
    prompt: str = Field(min_length=1)
    domain: str = "general"
    reference_answer: str | None = None
    grader: Grader
    split: Split = "train"
    tags: list[str] = []

    @field_validator("reference_answer", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Task":
        g = self.grader
        ref = self.reference_answer
        if g.type in ("exact", "contains", "numeric") and (ref is None or ref.strip() == ""):
            raise ValueError(f"grader '{g.type}' needs a non-empty reference_answer")
        if g.type == "regex":
            if g.pattern is None and not ref:
                raise ValueError("grader 'regex' needs grader.pattern or a reference_answer to use as the pattern")
            if g.pattern is None:
                try:
                    re.compile(ref)  # type: ignore[arg-type]
                except re.error as exc:
                    raise ValueError(f"reference_answer is used as the regex and does not compile: {exc}") from None
        if g.type == "numeric":
            from fugu_pipeline.grading import parse_number

            if parse_number(ref or "") is None:
                raise ValueError(f"grader 'numeric' needs a numeric reference_answer, got {ref!r}")
        if ref and g.type != "regex" and len(ref.strip()) >= 1 and _leaks(self.prompt, ref):
            raise ValueError(
                "prompt contains its own reference_answer; only the grader may see the answer "
                "(remove it from the prompt)"
            )
        return self

    @property
    def prompt_hash(self) -> str:
        return sha256_text(self.prompt)


def _leaks(prompt: str, ref: str) -> bool:
    """True when the answer is visibly in the prompt. Short answers ("4", "B") appear in prompts
    by chance, so only answers of 6+ characters, or a phrase like 'answer is X', count."""
    r = ref.strip()
    p = prompt.lower()
    rl = r.lower()
    if len(r) >= 6 and rl in p:
        return True
    return bool(re.search(r"answer\s*(is|:|=)\s*" + re.escape(rl) + r"\b", p))


# --------------------------------------------------------------------------- utility


class UtilityConfig(Strict):
    """U = w_q*Q - w_c*min(C/C0, cap) - w_l*min(L/L0, cap)   (DESIGN §4)."""

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

    def fingerprint(self) -> str:
        return sha256_text(canonical_json(self.model_dump()))[:16]


# --------------------------------------------------------------------------- calls


CostSource = Literal["usage", "catalog", "configured", "mock", "none"]


class CallRecord(BaseModel):
    """One (task, worker) call, graded. One JSON line in a responses partition file."""

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


# --------------------------------------------------------------------------- imported rows


class RewardRow(BaseModel):
    """One row of an imported reward matrix (DESIGN §4)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    domain: str = "general"
    split: Split = "train"
    worker_ids: list[str] = Field(min_length=1)
    rewards: list[float] | None = None
    quality: list[float] | None = None
    cost_usd: list[float] | None = None
    latency_s: list[float] | None = None

    @model_validator(mode="after")
    def _shape(self) -> "RewardRow":
        n = len(self.worker_ids)
        if len(set(self.worker_ids)) != n:
            raise ValueError("worker_ids has duplicates")
        if self.rewards is None and self.quality is None:
            raise ValueError("row needs 'rewards' or 'quality'")
        for name in ("rewards", "quality", "cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is not None:
                if len(v) != n:
                    raise ValueError(f"'{name}' has {len(v)} values for {n} worker_ids")
                if any(x != x or x in (float("inf"), float("-inf")) for x in v):
                    raise ValueError(f"'{name}' holds NaN or infinite values")
        if self.quality is not None and any(q < 0 or q > 1 for q in self.quality):
            raise ValueError("'quality' values must lie in [0, 1]")
        return self


# --------------------------------------------------------------------------- features


class FeatureContract(Strict):
    """Everything that decides what a feature vector means. A checkpoint pins one; loading
    refuses a checkpoint whose contract differs from the encoder it is given (DESIGN §3)."""

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
