"""The triage head (TinyRouter's first milestone): a prompt's domain and difficulty from its frozen
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

Attentive pooling (TinyRouter's optional learned pooling over token states) is left out: it needs
every prompt's token states, while the embedding cache and the feature contract carry one pooled
vector per prompt; it would need a token-state cache (max_length × D per prompt instead of D) and
a pooling kind in the contract that the encoder computes at serving time. The head reads the
same pooled features the routers read, so it fits the same contract.

Checkpoints: `models/triage/<content hash>/{head.safetensors, manifest.json}`, written and loaded
by the one checkpoint code (`train/checkpoints.py`: `save_checkpoint`, `load_checkpoint`), with the
checkpoint `Manifest` every head has. The head kind is `triage_linear`; its label vocabulary
(domains, difficulty names and edges, solve threshold) is `head_params`, inside the content hash:
a manifest with reordered `domains` (every prediction mislabelled) no longer hashes to its
`content_hash` and is refused on load, like any edited manifest. `load_triage` is that loader plus
a check that the head is a triage head.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.train.checkpoints import Checkpoint, CheckpointError, Manifest, load_checkpoint, save_checkpoint
from fugu_pipeline.train.loop import seeded
from fugu_pipeline.policies.triage.head import HEAD_KIND, MAX_PARAMS, TriageCheckpointHead, TriageHead  # noqa: F401 (this module's API too)

_logger = logging.getLogger(__name__)
METHOD = "triage"


class TriageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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


def difficulty_labels(quality: np.ndarray, cfg: TriageConfig) -> tuple[np.ndarray, np.ndarray]:
    """(bucket index per task, solve share per task) from the (N, W) quality matrix."""
    share = (np.asarray(quality, float) >= cfg.solve_threshold).mean(axis=1)
    bucket = np.searchsorted(np.asarray(cfg.difficulty_edges), share + 1e-9, side="right")
    return bucket.astype(np.int64), share


@dataclass
class TriageResult:
    head: TriageHead
    best_epoch: int
    domains: list[str]
    difficulty_names: list[str]
    difficulty_edges: list[float]
    solve_threshold: float
    worker_ids: list[str]
    contract: FeatureContract
    data_version: str
    training_config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float | None = None

    @property
    def param_count(self) -> int:
        return self.head.param_count()

    def head_params(self) -> dict[str, Any]:
        return {"domains": self.domains, "difficulty_names": self.difficulty_names,
                "difficulty_edges": self.difficulty_edges, "solve_threshold": self.solve_threshold}

    def save(self, models_dir: str | Path) -> Path:
        return save_triage(models_dir, self)


@dataclass
class TriageCheckpoint:
    """A loaded triage checkpoint: the checkpoint (manifest, weights) and its label vocabulary."""

    checkpoint: Checkpoint

    @property
    def path(self) -> Path:
        return self.checkpoint.path

    @property
    def manifest(self) -> Manifest:
        return self.checkpoint.manifest

    @property
    def head(self) -> TriageHead:
        return self.checkpoint.head

    @property
    def state_dict(self) -> dict:
        return self.checkpoint.state_dict

    def __getattr__(self, name: str):
        params = self.__dict__["checkpoint"].manifest.head_params
        if name in ("domains", "difficulty_names", "difficulty_edges", "solve_threshold"):
            return params[name]
        if name in ("worker_ids", "param_count", "dim", "content_hash", "method", "feature_contract"):
            return getattr(self.__dict__["checkpoint"].manifest, name)
        raise AttributeError(name)


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
    from fugu_pipeline.train.exchange import training_cost

    cost = training_cost(data)
    if cost is not None:
        metrics["data_cost_usd"] = cost
    return TriageResult(head=head, best_epoch=best[1], domains=domains, difficulty_names=list(cfg.difficulty_names),
                        difficulty_edges=list(cfg.difficulty_edges), solve_threshold=cfg.solve_threshold,
                        worker_ids=list(data.worker_ids), contract=data.contract, data_version=data.data_version,
                        training_config=cfg.model_dump(), metrics=metrics, curves=curves,
                        wall_s=round(time.perf_counter() - t0, 3))


# --------------------------------------------------------------------------- checkpoints


def save_triage(models_dir: str | Path, result: TriageResult) -> Path:
    """Write `models_dir/triage/<hash>/` (the one checkpoint writer) and return it."""
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in result.head.state_dict().items()}
    return save_checkpoint(models_dir, METHOD, HEAD_KIND, state, {
        "head_params": result.head_params(), "worker_ids": list(result.worker_ids), "feature_contract": result.contract,
        "data_version": result.data_version, "training_config": result.training_config, "metrics": result.metrics,
        "curves": result.curves, "wall_s": result.wall_s})


def load_triage(path: str | Path, expected_contract: FeatureContract | None = None) -> TriageCheckpoint:
    """Load a triage checkpoint with every check any checkpoint gets (`load_checkpoint`: weights
    against their hash, the manifest against its content hash, the folder against its name, the
    feature contract against `expected_contract`), refusing a checkpoint of another head kind."""
    ckpt = load_checkpoint(path, expected_contract=expected_contract)
    if ckpt.manifest.head_kind != HEAD_KIND:
        raise CheckpointError(f"{ckpt.path}: a {ckpt.manifest.head_kind!r} head, not a triage head ({HEAD_KIND})")
    return TriageCheckpoint(ckpt)


def triage_probabilities(head: TriageHead, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(domain probabilities (N, n_domains), difficulty probabilities (N, n_buckets)): the
    triage head as features for a router or a dashboard."""
    with torch.inference_mode():
        d, h = head.probabilities(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)))
    return d.numpy(), h.numpy()
