"""The triage head (the seed's first milestone): a prompt's domain and difficulty from its frozen
features, for dashboards and as an input to routing.

    x̂ = x / ‖x‖                                   (the cached feature vector, L2-normalised)
    p(domain | x)     = softmax(W_domain · x̂)       W_domain:     (n_domains, D), no bias
    p(difficulty | x) = softmax(W_difficulty · x̂)   W_difficulty: (n_buckets, D), no bias

Two bias-free linear maps, each with its own softmax, trained together (the sum of the two
cross-entropies, AdamW, early stopping on the mean of the two validation accuracies, seeded).
With Qwen3-0.6B (D = 1,024), 3 domains and 3 buckets: 6,144 parameters.

Difficulty labels come from the reward matrix: a task's solve share is the share of workers whose
quality on it is ≥ `solve_threshold` (0.5); `difficulty_edges` (default [1/3, 2/3]) cut the share
into buckets, named by `difficulty_names` from the hardest up: share < 1/3 → `hard`, < 2/3 →
`medium`, else `easy` (with 3 workers: none solves it → hard, one → medium, two or three → easy). The
labels therefore depend on the worker pool, which the manifest records. A matrix without quality
cannot give difficulty labels and is refused.

Attentive pooling (the seed's optional learned pooling over token states) is left out: it needs
every prompt's token states, while the embedding cache and the feature contract carry one pooled
vector per prompt; it would need a token-state cache (max_length × D per prompt instead of D) and
a pooling kind in the contract that the encoder computes at serving time. The head reads the
same pooled features the routers read, so it fits the same contract.

Checkpoints: `models/triage/<content hash>/{head.safetensors, manifest.json}`, the same layout
and guarantees as the routers' (safetensors, hash-named folder written atomically, contract
checked on load), with a manifest of its own (`TriageManifest`: domains, buckets, edges).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.files import fsync_dir
from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.train.checkpoints import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    WEIGHTS_FILE,
    CheckpointError,
    known_format,
    read_capped,
    weights_limit,
)
from fugu_pipeline.train.loop import seeded

_logger = logging.getLogger(__name__)
HEAD_KIND = "triage_linear"
METHOD = "triage"


class TriageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    lr: float = Field(1e-2, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    epochs: int = Field(200, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(20, ge=1)
    solve_threshold: float = Field(0.5, gt=0, le=1, description="a worker solves a task when its quality is at least this")
    difficulty_edges: list[float] = Field([1 / 3, 2 / 3], description="solve-share cut points, ascending")
    difficulty_names: list[str] = Field(["hard", "medium", "easy"], description="bucket names, hardest first")

    @field_validator("difficulty_edges")
    @classmethod
    def _ascending(cls, v: list[float]) -> list[float]:
        if not v or any(b <= a for a, b in zip(v, v[1:])) or v[0] <= 0 or v[-1] > 1:
            raise ValueError("difficulty_edges must be ascending values in (0, 1]")
        return v

    @model_validator(mode="after")
    def _names(self) -> "TriageConfig":
        if len(self.difficulty_names) != len(self.difficulty_edges) + 1:
            raise ValueError(f"difficulty_names needs {len(self.difficulty_edges) + 1} names for {len(self.difficulty_edges)} edges")
        return self


class TriageHead(nn.Module):
    kind = HEAD_KIND

    def __init__(self, dim: int, n_domains: int, n_difficulty: int):
        super().__init__()
        if dim < 1 or n_domains < 1 or n_difficulty < 2:
            raise ValueError(f"a triage head needs dim >= 1, n_domains >= 1, n_difficulty >= 2; got {dim}, {n_domains}, {n_difficulty}")
        self.domain = nn.Linear(dim, n_domains, bias=False)
        self.difficulty = nn.Linear(dim, n_difficulty, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(domain logits, difficulty logits); each its own softmax."""
        z = F.normalize(x, dim=-1)
        return self.domain(z), self.difficulty(z)

    def probabilities(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d, h = self(x)
        return torch.softmax(d, dim=-1), torch.softmax(h, dim=-1)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


def difficulty_labels(quality: np.ndarray, cfg: TriageConfig) -> tuple[np.ndarray, np.ndarray]:
    """(bucket index per task, solve share per task) from the (N, W) quality matrix."""
    share = (np.asarray(quality, float) >= cfg.solve_threshold).mean(axis=1)
    bucket = np.searchsorted(np.asarray(cfg.difficulty_edges), share + 1e-9, side="right")
    return bucket.astype(np.int64), share


class TriageManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    method: str = METHOD
    head_kind: str = HEAD_KIND
    dim: int
    domains: list[str]
    difficulty_names: list[str]
    difficulty_edges: list[float]
    solve_threshold: float
    worker_ids: list[str]  # the pool whose solve share defined the difficulty labels
    param_count: int
    feature_contract: FeatureContract
    contract_fingerprint: str
    data_version: str
    training_config: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    curves: dict[str, list[float]] = {}
    tensors: dict[str, list[int]]
    weights_sha256: str
    content_hash: str = ""
    created_at: str = ""
    wall_s: float | None = None

    @field_validator("format_version")
    @classmethod
    def _a_format_this_code_reads(cls, v: int) -> int:
        return known_format(v)


@dataclass
class TriageResult:
    head: TriageHead
    manifest: TriageManifest
    best_epoch: int

    @property
    def metrics(self) -> dict:
        return self.manifest.metrics

    @property
    def param_count(self) -> int:
        return self.manifest.param_count

    def save(self, models_dir: str | Path) -> Path:
        return save_triage(models_dir, self.head, self.manifest)


@dataclass
class TriageCheckpoint:
    path: Path
    manifest: TriageManifest
    head: TriageHead


def _accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(dim=1) == y).float().mean()) if len(y) else float("nan")


def train_triage(data: RoutingData, cfg: TriageConfig | None = None, log: Callable[[str], None] | None = None) -> TriageResult:
    """Train a triage head on the train split, early-stopped on the validation split."""
    cfg, log = cfg or TriageConfig(), log or _logger.info
    data.validate(require=("train", "val"), force=True)  # triage needs no difference between workers
    if data.quality is None or np.isnan(data.quality).any():
        raise TrainingDataError("the triage head's difficulty labels come from each worker's quality on a task, "
                                "but this matrix has no quality: load rewards with quality")
    domains = sorted(set(data.domains))
    dom = torch.tensor([domains.index(d) for d in data.domains])
    diff = torch.from_numpy(difficulty_labels(data.quality, cfg)[0])
    tr, va = (torch.from_numpy(np.flatnonzero(data.splits == s)) for s in ("train", "val"))
    x = torch.from_numpy(data.features)
    t0 = time.perf_counter()
    with seeded(cfg.seed) as gen:
        head = TriageHead(data.dim, len(domains), len(cfg.difficulty_names))
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        log(f"triage: {head.param_count():,} params (dim {data.dim}, {len(domains)} domains, "
            f"{len(cfg.difficulty_names)} difficulty buckets), {len(tr)} train / {len(va)} val tasks")
        curves: dict[str, list[float]] = {"train_loss": [], "val_domain_accuracy": [], "val_difficulty_accuracy": [], "val_accuracy": []}
        best = (-1.0, 0, {k: v.clone() for k, v in head.state_dict().items()})
        for epoch in range(1, cfg.epochs + 1):
            head.train()
            perm, total = tr[torch.randperm(len(tr), generator=gen)], 0.0
            for i in range(0, len(perm), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                ld, lh = head(x[idx])
                loss = F.cross_entropy(ld, dom[idx]) + F.cross_entropy(lh, diff[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
            head.eval()
            with torch.no_grad():
                ld, lh = head(x[va])
            a_d, a_h = _accuracy(ld, dom[va]), _accuracy(lh, diff[va])
            v = (a_d + a_h) / 2
            for k, val in (("train_loss", total / len(tr)), ("val_domain_accuracy", a_d),
                           ("val_difficulty_accuracy", a_h), ("val_accuracy", v)):
                curves[k].append(float(val))
            if v > best[0] + 1e-12:
                best = (v, epoch, {k: t.clone() for k, t in head.state_dict().items()})
            elif epoch - best[1] >= cfg.patience:
                log(f"triage: early stop at epoch {epoch}; keeping epoch {best[1]} (val accuracy {best[0]:.4f})")
                break
        head.load_state_dict(best[2])
        head.eval()
    with torch.no_grad():
        ld, lh = head(x[tr])
        metrics = {"train_domain_accuracy": _accuracy(ld, dom[tr]), "train_difficulty_accuracy": _accuracy(lh, diff[tr]),
                   "val_domain_accuracy": curves["val_domain_accuracy"][best[1] - 1],
                   "val_difficulty_accuracy": curves["val_difficulty_accuracy"][best[1] - 1],
                   "best_epoch": best[1], "n_train": len(tr), "n_val": len(va)}
    contract = data.contract
    manifest = TriageManifest(
        dim=data.dim, domains=domains, difficulty_names=list(cfg.difficulty_names),
        difficulty_edges=list(cfg.difficulty_edges), solve_threshold=cfg.solve_threshold, worker_ids=list(data.worker_ids),
        param_count=head.param_count(), feature_contract=contract, contract_fingerprint=contract.fingerprint(),
        data_version=data.data_version, training_config=cfg.model_dump(), metrics=metrics, curves=curves,
        tensors={k: list(v.shape) for k, v in head.state_dict().items()}, weights_sha256="",
        wall_s=round(time.perf_counter() - t0, 3),
    )
    return TriageResult(head=head, manifest=manifest, best_epoch=best[1])


# --------------------------------------------------------------------------- checkpoints


def triage_problems(state: dict[str, torch.Tensor], m: TriageManifest) -> list[str]:
    """Why these weights do not fit this manifest (empty when they do)."""
    want = {"domain.weight": [len(m.domains), m.dim], "difficulty.weight": [len(m.difficulty_names), m.dim]}
    problems = [f"missing tensor {k}" for k in want if k not in state]
    problems += [f"unexpected tensor {k}" for k in state if k not in want]
    for k, shape in want.items():
        t = state.get(k)
        if t is None:
            continue
        if list(t.shape) != shape:
            problems.append(f"{k} has shape {list(t.shape)}, this manifest needs {shape}")
        elif not bool(torch.isfinite(t).all()):
            problems.append(f"{k} holds non-finite values")
        elif not bool(t.ne(0).any()):
            problems.append(f"{k} is all zero")
    return problems


def save_triage(models_dir: str | Path, head: TriageHead, manifest: TriageManifest) -> Path:
    """Write `models_dir/triage/<hash>/` atomically and return it."""
    from safetensors.torch import save as st_save

    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in head.state_dict().items()}
    problems = triage_problems(state, manifest)
    if problems:
        raise CheckpointError("refusing to save these triage weights: " + "; ".join(problems))
    weights = st_save(state, metadata={"format": "pt"})
    m = manifest.model_copy(update={"weights_sha256": hashlib.sha256(weights).hexdigest(),
                                    "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    body = {k: v for k, v in m.model_dump(mode="json").items() if k not in ("created_at", "wall_s", "content_hash")}
    m.content_hash = hashlib.sha256(weights + canonical_json(body).encode()).hexdigest()[:16]
    parent = Path(models_dir) / METHOD
    target = parent / m.content_hash
    if (target / MANIFEST_FILE).exists():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{m.content_hash}-", dir=parent))
    try:
        os.chmod(tmp, 0o755)
        for name, raw in ((WEIGHTS_FILE, weights), (MANIFEST_FILE, (json.dumps(m.model_dump(mode="json"), indent=2) + "\n").encode())):
            with open(tmp / name, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / MANIFEST_FILE).exists():
                raise
        fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_triage(path: str | Path, expected_contract: FeatureContract | None = None) -> TriageCheckpoint:
    """Load a triage checkpoint; refuses a changed weights file, malformed weights, and a feature
    contract other than `expected_contract` (naming each differing field)."""
    from safetensors.torch import load as st_load

    path = Path(path)
    path = path.parent if path.is_file() else path
    try:
        m = TriageManifest.model_validate_json(read_capped(path / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest"))
        raw = read_capped(path / WEIGHTS_FILE, weights_limit(m.tensors), "the manifest's tensors")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a triage checkpoint ({str(exc)[:300]})") from None
    if hashlib.sha256(raw).hexdigest() != m.weights_sha256:
        raise CheckpointError(f"{path}: {WEIGHTS_FILE} does not match the manifest's weights_sha256 (changed after saving)")
    if expected_contract is not None:
        diffs = m.feature_contract.differences(expected_contract)
        if diffs:
            raise CheckpointError(f"{path}: feature contract does not match the encoder: " + "; ".join(diffs))
    try:
        state = st_load(raw)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: {WEIGHTS_FILE} is not readable safetensors: {exc}") from None
    problems = triage_problems(state, m)
    if problems:
        raise CheckpointError(f"{path}: refusing these triage weights: " + "; ".join(problems))
    head = TriageHead(m.dim, len(m.domains), len(m.difficulty_names))
    head.load_state_dict(state)
    head.eval()
    return TriageCheckpoint(path=path, manifest=m, head=head)


def triage_probabilities(head: TriageHead, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(domain probabilities (N, n_domains), difficulty probabilities (N, n_buckets)): the
    triage head as features for a router or a dashboard."""
    with torch.inference_mode():
        d, h = head.probabilities(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)))
    return d.numpy(), h.numpy()
