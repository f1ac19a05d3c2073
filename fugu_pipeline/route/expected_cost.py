"""Expected cost. Every cost-aware decision uses `ExpectedCost`, fitted on TRAINING rows only:

    ĉ(x, w) = per_token[w] · tokens(x) + offset[domain(x)][w]

tokens(x) = ceil(len(prompt) / 4) is known before any call. Per worker, the training cost is fitted
by least squares on tokens (slope kept >= 0; a negative one becomes 0 and the mean is used); the
per-domain offsets are the training residual means shrunk towards 0 with `SHRINK` pseudo-rows (a
domain unseen in training gets the pooled offset). Where the cost is catalog price × prompt
tokens (the dcrouter import) this recovers the price exactly; where it also holds output tokens
(collected answers) the offset carries each domain's mean output cost. The held-out row's actual
cost is never an input: it is used only to REPORT realised cost.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

CHARS_PER_TOKEN = 4.0
SHRINK = 20.0  # pseudo-rows pulling a domain's cost offset towards the pooled one
ALL = "*"


class BudgetError(ValueError):
    """Budget mode cannot run as asked; the message says why and what to do."""


def prompt_tokens(prompts: list[str], chars_per_token: float = CHARS_PER_TOKEN) -> np.ndarray:
    return np.array([math.ceil(len(p) / chars_per_token) for p in prompts], dtype=np.float64)


class ExpectedCost(BaseModel):
    """ĉ(x, w) in USD from what is known before the call: the prompt's length and its domain."""

    model_config = ConfigDict(extra="forbid")

    worker_ids: list[str]
    chars_per_token: float = CHARS_PER_TOKEN
    per_token: list[float]  # USD per prompt token, per worker
    offset: dict[str, list[float]]  # USD per request, per domain and worker; '*' = pooled
    n_train: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> "ExpectedCost":
        w = len(self.worker_ids)
        if not (math.isfinite(self.chars_per_token) and self.chars_per_token > 0):
            raise ValueError(f"chars_per_token must be a positive number, got {self.chars_per_token!r}")
        if len(self.per_token) != w or not all(math.isfinite(p) and p >= 0 for p in self.per_token):
            raise ValueError(f"per_token must hold one finite price >= 0 per worker ({w})")
        if ALL not in self.offset:
            raise ValueError(f"offset has no pooled entry {ALL!r} (the one for a domain unseen in training)")
        bad = [d for d, v in self.offset.items() if len(v) != w or not all(math.isfinite(x) for x in v)]
        if bad:
            raise ValueError(f"offset {bad[0][:60]!r} must hold one finite number per worker ({w})")
        return self

    def predict(self, prompts: list[str], domains: list[str] | None = None) -> np.ndarray:
        """(N, W) expected cost in USD."""
        t = prompt_tokens(prompts, self.chars_per_token)
        pooled = np.asarray(self.offset[ALL])
        doms = domains if domains is not None else [None] * len(prompts)
        off = np.stack([np.asarray(self.offset.get(d, pooled)) if d is not None else pooled for d in doms]) \
            if len(prompts) else np.zeros((0, len(self.worker_ids)))
        return np.maximum(t[:, None] * np.asarray(self.per_token)[None, :] + off, 0.0)

    def describe(self) -> str:
        """Each worker's price per million prompt tokens AND its pooled per-request offset: a worker whose
        cost does not grow with the prompt (a flat fee, mostly output) has its whole cost there."""
        parts = []
        for w, p, b in zip(self.worker_ids, self.per_token, self.offset[ALL]):
            text = f"{w} ${p * 1e6 if p > 1e-15 else 0:.3g}/M prompt tok"
            if abs(b) > 1e-12:
                text += f" {'+' if b > 0 else '-'} ${abs(b):.3g}/request"
            parts.append(text)
        return (f"expected cost = per-token price x ceil(chars/{self.chars_per_token:g}) + per-request offset (per domain; "
                f"pooled shown), fitted on {self.n_train} training rows ({', '.join(parts)})")


def fit_expected_cost(prompts: list[str], domains: list[str], cost: np.ndarray, worker_ids: list[str],
                      *, shrink: float = SHRINK) -> ExpectedCost:
    """Fit on TRAINING rows (see the module docstring)."""
    cost = np.asarray(cost, dtype=np.float64)
    if cost.shape != (len(prompts), len(worker_ids)):
        raise ValueError(f"cost has shape {cost.shape}, expected {(len(prompts), len(worker_ids))}")
    if len(prompts) == 0:
        raise BudgetError("no training rows to fit the expected cost on")
    cost = np.nan_to_num(cost, nan=0.0)
    t = prompt_tokens(prompts)
    slope, intercept = np.zeros(len(worker_ids)), np.zeros(len(worker_ids))
    tc = t - t.mean()
    for j in range(len(worker_ids)):
        c = cost[:, j]
        var = float((tc * tc).sum())
        a = float((tc * (c - c.mean())).sum() / var) if var > 0 else 0.0
        if a < 0:
            a = 0.0
        slope[j], intercept[j] = a, float(c.mean() - a * t.mean())
    resid = cost - (t[:, None] * slope[None, :] + intercept[None, :])
    offset = {ALL: intercept.tolist()}
    doms = np.asarray(domains)
    for d in sorted(set(domains)):
        rows = doms == d
        offset[d] = (intercept + resid[rows].sum(axis=0) / (rows.sum() + shrink)).tolist()
    return ExpectedCost(worker_ids=list(worker_ids), per_token=slope.tolist(), offset=offset, n_train=len(prompts))
