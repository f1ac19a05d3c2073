"""The cascade policy: ordered steps of workers, an accept rule after each, the last step always answers.

A cascade (FrugalGPT; AutoMix; answer-consistency cascades) reads the answers before paying for a
better one. Each step calls one or more workers at once; after it, the cascade stops when
- `agree`: at least that many of the final answers so far are the same (the extracted answers,
  `tasks/final_answer.py`; a reply with no readable answer agrees with nothing), or
- `examples`: one of this step's replies is code that passes every example its prompt shows (run in
  the sandbox, `policies/cascade/code_examples.py`; a prompt that shows none never stops here), or
- `verify`: the best verifier score among this step's answers reaches the threshold (a learned
  P(correct | prompt, answer), `policies/cascade/verifier.py`),
whichever holds, in that order (a step may have several rules). The last step is always accepted.

The answer returned: the agreed answer (its first worker in call order) when agreement stopped
the cascade, the first of the step's replies that passes its examples when they did, else the
best-scored answer of the step when the verifier did; at the last step, the
answer most of that step's workers give (ties: the first listed, so a one-worker last step gives
its own). A step's cost is paid only when the cascade reaches it; its latency is its slowest call.

`simulate` runs a plan offline on recorded answers, vectorised over rows; `decide` is the same
rule for one request, step by step (policies/cascade/route.py runs it live). Both read only answers and
verifier scores, never a cost or a quality: the costs a plan is chosen by are expected ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fugu_pipeline.workers.config import IMPORT_WORKER_ID_PATTERN


class CascadeStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workers: list[str] = Field(min_length=1, max_length=8)
    agree: int | None = Field(None, ge=2, description="stop when this many answers so far are the same")
    verify: float | None = Field(None, ge=0.0, le=1.0, description="stop when the step's best verifier score reaches this")
    examples: bool = Field(False, description="stop when one of the step's replies is code that passes every example "
                           "its prompt shows (run in the sandbox)")

    @model_validator(mode="after")
    def _ids(self) -> "CascadeStep":
        import re

        bad = [w for w in self.workers if not re.fullmatch(IMPORT_WORKER_ID_PATTERN, w)]
        if bad:
            raise ValueError(f"worker id {bad[0][:80]!r} is not a worker id")
        return self

    def rule(self) -> str:
        parts = ([f"{self.agree} agree"] if self.agree else []) + (["its code passes the prompt's examples"]
                                                                   if self.examples else []) \
            + ([f"verifier ≥ {self.verify:.3f}"] if self.verify is not None else [])
        return " or ".join(parts) or "never stops here"


class CascadePlan(BaseModel):
    """Steps in order; the last is always accepted (its rule is ignored)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[CascadeStep] = Field(min_length=1, max_length=6)

    @model_validator(mode="after")
    def _distinct(self) -> "CascadePlan":
        seen = [w for s in self.steps for w in s.workers]
        if len(set(seen)) != len(seen):
            raise ValueError(f"a worker is called twice in one cascade: {seen}")
        return self

    @property
    def workers(self) -> list[str]:
        return [w for s in self.steps for w in s.workers]

    @property
    def uses_verifier(self) -> bool:
        return any(s.verify is not None for s in self.steps[:-1])

    def describe(self) -> str:
        out = []
        for k, s in enumerate(self.steps):
            head = "[" + ", ".join(s.workers) + "]"
            out.append(head if k == len(self.steps) - 1 else f"{head} stop if {s.rule()}")
        return " → ".join(out)


class CascadePolicy(BaseModel):
    """A plan for every domain: `per_domain` where chosen, `default` for the others (and unknown ones)."""

    model_config = ConfigDict(extra="forbid")

    default: CascadePlan
    per_domain: dict[str, CascadePlan] = Field(default_factory=dict)

    def plan_for(self, domain: str | None) -> CascadePlan:
        return self.per_domain.get(domain or "", self.default)

    @property
    def workers(self) -> list[str]:
        out: list[str] = []
        for p in [self.default, *self.per_domain.values()]:
            out += [w for w in p.workers if w not in out]
        return out

    @property
    def uses_verifier(self) -> bool:
        return any(p.uses_verifier for p in [self.default, *self.per_domain.values()])

    def describe(self) -> str:
        if not self.per_domain:
            return self.default.describe()
        from fugu_pipeline.train.groups import CLUSTER_PREFIX

        rest = "other prompts" if all(d.startswith(CLUSTER_PREFIX) for d in self.per_domain) else "other domains"
        return "; ".join([f"{d}: {p.describe()}" for d, p in sorted(self.per_domain.items())]
                         + [f"{rest}: {self.default.describe()}"])


# --------------------------------------------------------------------------- one request


@dataclass
class Decision:
    accept: bool
    answer_index: int | None  # index into the answers so far (call order) of the answer returned
    reason: str


def decide(step: CascadeStep, last: bool, finals: list[str | None], scores: list[float | None], n_step: int,
           passed: list[bool] | None = None) -> Decision:
    """The accept rule after a step, for one request. `finals` and `scores` hold every answer so
    far in call order (None: no readable answer / not scored); the last `n_step` are this step's;
    `passed`: whether each reply so far passes its prompt's examples (None: not run)."""
    this = range(len(finals) - n_step, len(finals))
    codes = {}
    for i, f in enumerate(finals):
        if f is not None:
            codes.setdefault(f, []).append(i)
    top = max(codes.values(), key=len, default=[])
    if not last and step.agree is not None and len(top) >= step.agree:
        return Decision(True, top[0], f"{len(top)} of {len(finals)} answers agree (needs {step.agree})")
    if not last and step.examples and passed is not None:
        ok = [i for i in this if passed[i]]
        if ok:
            return Decision(True, ok[0], "its code passes every example its prompt shows")
    if not last and step.verify is not None:
        scored = [(scores[i], i) for i in this if scores[i] is not None and finals[i] is not None]
        if scored:
            best, i = max(scored, key=lambda t: (t[0], -t[1]))
            if best >= step.verify:
                return Decision(True, i, f"verifier score {best:.3f} ≥ {step.verify:.3f}")
    if not last:
        return Decision(False, None, f"no stop rule held ({step.rule()})")
    mine = {}
    for i in this:
        if finals[i] is not None:
            mine.setdefault(finals[i], []).append(i)
    pick = max(mine.values(), key=lambda ix: (len(ix), -ix[0]))[0] if mine else len(finals) - n_step
    return Decision(True, pick, "last step: always accepted")


# --------------------------------------------------------------------------- offline, vectorised


@dataclass
class Outcome:
    """Per row: the worker whose answer is returned, its quality, the cost and latency paid, the
    step the cascade stopped at (0-based) and the number of calls made."""

    answer_worker: np.ndarray  # int (N,)
    quality: np.ndarray
    cost: np.ndarray
    latency: np.ndarray
    stop_step: np.ndarray  # int (N,)
    calls: np.ndarray  # int (N,)


def answer_codes(finals: np.ndarray) -> np.ndarray:
    """(N, W) int codes of the final answers, equal within a row where the answers are equal; -1: none."""
    codes = np.full(finals.shape, -1, dtype=np.int64)
    for i in range(finals.shape[0]):
        seen: dict[str, int] = {}
        for j in range(finals.shape[1]):
            f = finals[i, j]
            if f is not None:
                codes[i, j] = seen.setdefault(f, len(seen))
    return codes


def simulate(plan: CascadePlan, worker_ids: list[str], codes: np.ndarray, scores: np.ndarray, quality: np.ndarray,
             cost: np.ndarray, latency: np.ndarray, rows: np.ndarray | None = None,
             passed: np.ndarray | None = None) -> Outcome:
    """The plan on recorded answers. `codes` (N, W) from `answer_codes`; `scores` (N, W) verifier
    scores (NaN: none), or scores read at a point of the plan (an object whose `at(called columns)`
    gives (N, W): `policies/cascade/verifier_context.ContextScores`); `quality` (N, W); `cost` and `latency`
    (N, W) per call, or (W,) expected per worker (the same for every row); `passed` (N, W) bool:
    the reply passes its prompt's examples (None: not run, so an `examples` rule never stops). Only
    the rows in `rows` when given."""
    rows = np.arange(len(codes)) if rows is None else np.asarray(rows)
    n = len(rows)
    col = {w: j for j, w in enumerate(worker_ids)}
    in_context = hasattr(scores, "at")  # scores given the replies paid so far
    C, S, Q = codes[rows], (None if in_context else scores[rows]), quality[rows]
    per_row = lambda a: np.broadcast_to(a, (len(codes), len(worker_ids)))[rows] if np.ndim(a) == 1 else a[rows]  # noqa: E731
    K, L = per_row(cost), per_row(latency)
    active = np.ones(n, bool)
    pick = np.full(n, -1, dtype=np.int64)
    paid, waited = np.zeros(n), np.zeros(n)
    stop = np.zeros(n, dtype=np.int64)
    calls = np.zeros(n, dtype=np.int64)
    called: list[int] = []
    last_k = len(plan.steps) - 1
    for k, step in enumerate(plan.steps):
        idx = [col[w] for w in step.workers]
        called += idx
        paid[active] += K[np.ix_(active, idx)].sum(axis=1)
        waited[active] += L[np.ix_(active, idx)].max(axis=1)
        calls[active] += len(idx)
        stop[active] = k
        if k == last_k:
            pick[active] = _majority_first(C[:, idx], idx)[active]
            break
        decided = np.zeros(n, bool)
        if step.agree is not None and len(called) >= step.agree:
            count, first = _modal(C[:, called], called)
            ok = active & (count >= step.agree)
            pick[ok] = first[ok]
            decided |= ok
        if step.examples and passed is not None:
            P = passed[rows][:, idx]
            ok = active & ~decided & P.any(axis=1)
            pick[ok] = np.asarray(idx)[np.argmax(P, axis=1)][ok]
            decided |= ok
        if step.verify is not None:
            Sk = scores.at(called)[rows] if in_context else S
            s = np.where(C[:, idx] >= 0, Sk[:, idx], -np.inf)
            s = np.where(np.isnan(s), -np.inf, s)
            best = s.max(axis=1)
            ok = active & ~decided & (best >= step.verify)
            pick[ok] = np.asarray(idx)[np.argmax(s, axis=1)][ok]
            decided |= ok
        active &= ~decided
        if not active.any():
            break
    return Outcome(pick, Q[np.arange(n), pick], paid, waited, stop, calls)


def _modal(C: np.ndarray, cols: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: how many of these answers share the most common one, and the worker (column of the
    full grid) giving it first in call order."""
    eq = (C[:, :, None] == C[:, None, :]) & (C[:, :, None] >= 0)
    count = eq.sum(axis=2)  # (n, m): answers equal to answer j
    j = np.argmax(count, axis=1)  # first on ties: call order
    return count.max(axis=1), np.asarray(cols)[j]


def _majority_first(C: np.ndarray, cols: list[int]) -> np.ndarray:
    """The last step's answer: the most common within the step (ties and no answer: the first listed)."""
    if C.shape[1] == 1:
        return np.full(len(C), cols[0], dtype=np.int64)
    count, first = _modal(C, cols)
    return np.where(count > 0, first, cols[0])
