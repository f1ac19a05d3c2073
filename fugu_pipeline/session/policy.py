"""Policies: whatever maps a transcript to a distribution over workers and one over roles.

The session loop takes any object with `distributions(steps) -> (worker_probs, role_probs (N, 3))`,
a `name` (the key its trajectories are stored under), `worker_ids`, `max_turns` (None: the
session's limit) and `featurizer` (a shared `TranscriptFeaturizer`, or None). `worker_probs` is
(N, L), one worker distribution whatever the role, or (N, 3, L), one per role (role order): then
the worker is drawn from the picked role's row.

- `LinearRolesPolicy`: the roles head, one linear map W (S x L + 3, D) over the encoded
  transcript: its first S x L logits are S softmaxes over workers (S = 1: shared by the roles;
  S = 3: one per role), the last 3 a softmax over roles (Thinker, Worker, Verifier). All-zero W
  is the uniform policy.
- `FixedPolicy`: always one worker in one role; `one_step=True` stops after one turn, which makes
  "always Worker on worker k" the best-fixed-worker baseline.
- `ScriptedPolicy`: a fixed (worker, role) per turn.

`pick` turns the two distributions into an action (the role first, then the worker from that
role's distribution when there is one per role): greedy (argmax, first on ties) or sampled by
inverse CDF from a given uniform number, so candidates that share the uniforms (common random
numbers) take the same action wherever their distributions agree closely.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fugu_pipeline.session.roles import ROLES
from fugu_pipeline.session.transcript import HeadInput, head_input

if TYPE_CHECKING:
    from fugu_pipeline.session.featurize import TranscriptFeaturizer
    from fugu_pipeline.session.records import TurnRecord


@dataclass
class Step:
    """What a policy sees before a pick: the task and the turns so far."""

    prompt: str
    domain: str | None
    turns: list["TurnRecord"] = field(default_factory=list)

    @property
    def head(self) -> HeadInput:
        return head_input(self.prompt, self.domain, self.turns)


class Policy(Protocol):
    name: str
    worker_ids: list[str]
    max_turns: int | None
    featurizer: "TranscriptFeaturizer | None"

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]: ...


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def head_hash(weight: np.ndarray, worker_ids: list[str], extra: np.ndarray | None = None) -> str:
    """The name a head's trajectories are stored under: its float32 weights and worker order."""
    h = hashlib.sha256()
    h.update("\x1f".join(worker_ids).encode() + b"\x00")
    w = np.ascontiguousarray(weight, dtype=np.float32)
    h.update(repr(w.shape).encode() + w.tobytes())
    if extra is not None:
        e = np.ascontiguousarray(extra, dtype=np.float32)
        h.update(b"svf" + repr(e.shape).encode() + e.tobytes())
    return h.hexdigest()[:16]


def _stats(center, scale):
    if center is None and scale is None:
        return None
    return np.concatenate([np.zeros(0) if center is None else center, np.zeros(0) if scale is None else scale])


class LinearRolesPolicy:
    """The roles head over a featurizer's vectors: logits = features @ W.T, softmax groups (the
    worker sets and the roles). The number of worker sets (1 or 3) follows from W's rows."""

    def __init__(self, weight: np.ndarray, worker_ids: list[str], featurizer: "TranscriptFeaturizer", *,
                 center: np.ndarray | None = None, scale: np.ndarray | None = None,
                 name: str | None = None, max_turns: int | None = None):
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        n, r = len(worker_ids), len(ROLES)
        fits = [(s * n + r, featurizer.dim) for s in (1, r)]
        if weight.shape not in fits:
            raise ValueError(f"roles head weight has shape {weight.shape}; {n} workers and {featurizer.dim}-d "
                             f"features need {fits[0]} (one worker set) or {fits[1]} (one per role)")
        self.weight = weight
        self.worker_sets = 1 if weight.shape == fits[0] else r
        self.center = None if center is None else np.asarray(center, np.float32)
        self.scale = None if scale is None else np.asarray(scale, np.float32)
        self.worker_ids = list(worker_ids)
        self.featurizer = featurizer
        svf = getattr(featurizer, "scales", None)  # an SVF candidate's encoder scales are part of the head
        extra = _stats(self.center, self.scale)
        if svf is not None:
            extra = np.concatenate([extra if extra is not None else np.zeros(0), np.asarray(svf, np.float32)])
        self.name = name or head_hash(weight, self.worker_ids, extra)
        self.max_turns = max_turns

    def logits(self, steps: list[Step]) -> np.ndarray:
        x = self.featurizer.features([s.head for s in steps])
        if self.center is not None:
            x = x - self.center
        if self.scale is not None:
            x = x / self.scale
        return x @ self.weight.T

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
        z = self.logits(steps)
        n, s = len(self.worker_ids), self.worker_sets
        pw = softmax(z[:, : s * n].reshape(len(z), s, n))
        return (pw[:, 0] if s == 1 else pw), softmax(z[:, s * n:])


class FixedPolicy:
    """Always `role` on one worker. `one_step=True`: one turn per session (the one-step baseline)."""

    featurizer = None

    def __init__(self, worker_ids: list[str], worker: str, role: str = "worker", *, one_step: bool = True):
        if worker not in worker_ids:
            raise ValueError(f"unknown worker {worker!r}; known: {worker_ids}")
        self.worker_ids = list(worker_ids)
        self.k, self.r = worker_ids.index(worker), ROLES.index(role)  # type: ignore[arg-type]
        self.max_turns = 1 if one_step else None
        self.name = f"fixed:{worker}:{role}" + (":1" if one_step else "")

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
        pw = np.zeros((len(steps), len(self.worker_ids)))
        pr = np.zeros((len(steps), len(ROLES)))
        pw[:, self.k] = 1.0
        pr[:, self.r] = 1.0
        return pw, pr


class ScriptedPolicy:
    """Plays `script[k]` = (worker, role) at turn k + 1 (the last entry from then on): a fixed
    multi-turn baseline, e.g. Worker, Verifier, Worker, Worker (a Worker after a Worker answer commits)."""

    featurizer = None
    max_turns = None

    def __init__(self, worker_ids: list[str], script: list[tuple[str, str]], name: str):
        unknown = [w for w, _ in script if w not in worker_ids]
        if unknown or not script:
            raise ValueError(f"a script needs known workers ({worker_ids}); got {[w for w, _ in script]}")
        self.worker_ids, self.script, self.name = list(worker_ids), list(script), name

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
        pw = np.zeros((len(steps), len(self.worker_ids)))
        pr = np.zeros((len(steps), len(ROLES)))
        for i, s in enumerate(steps):
            w, r = self.script[min(len(s.turns), len(self.script) - 1)]
            pw[i, self.worker_ids.index(w)] = 1.0
            pr[i, ROLES.index(r)] = 1.0  # type: ignore[arg-type]
        return pw, pr


@dataclass
class Pick:
    worker: int
    role: int
    ranking: list[int]  # workers best first (the fallback order), the pick first


def _sample(p: np.ndarray, u: float) -> int:
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))


def pick(pw: np.ndarray, pr: np.ndarray, *, greedy: bool, u_worker: float = 0.0, u_role: float = 0.0,
         allowed: np.ndarray | None = None) -> Pick:
    """An action from the two distributions (module docstring). `allowed` masks workers out."""
    r = int(np.argmax(pr)) if greedy else _sample(np.asarray(pr, dtype=np.float64), u_role)
    pw = np.asarray(pw, dtype=np.float64)
    if pw.ndim == 2:  # one worker distribution per role: the picked role's
        pw = pw[r]
    if allowed is not None:
        pw = np.where(allowed, pw, 0.0)
        if pw.sum() <= 0:  # the head puts no weight on any allowed worker: uniform over them
            pw = allowed.astype(np.float64)
    w = int(np.argmax(pw)) if greedy else _sample(pw, u_worker)
    order = [int(i) for i in np.argsort(-pw, kind="stable") if allowed is None or allowed[i]]
    return Pick(worker=w, role=r, ranking=[w] + [i for i in order if i != w])
