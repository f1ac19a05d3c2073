"""What a training stage returns (`TrainResult`) and how a head is scored on a split."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.train.checkpoints import save_checkpoint
from fugu_pipeline.train.head_base import RoutingHead, build_head

# --------------------------------------------------------------------------- results


@dataclass
class TrainResult:
    method: str  # sft | rl | es
    head_kind: str
    state_dict: dict[str, torch.Tensor]
    worker_ids: list[str]
    dim: int
    param_count: int
    config: dict[str, Any]
    curves: dict[str, list[float]]
    best_epoch: int  # epoch (SFT, RL) or generation (ES) of the kept weights; 0 = the warm start
    metrics: dict[str, Any]
    contract: FeatureContract
    utility_config: dict[str, Any] | None
    data_version: str
    wall_s: float

    def head(self) -> RoutingHead:
        return load_head(self.state_dict, self.head_kind, self.dim, len(self.worker_ids))

    def manifest_fields(self) -> dict[str, Any]:
        return {
            "worker_ids": self.worker_ids, "feature_contract": self.contract, "dim": self.dim,
            "utility_config": self.utility_config, "data_version": self.data_version,
            "training_config": self.config, "metrics": {**self.metrics, "best_epoch": self.best_epoch},
            "curves": self.curves, "wall_s": self.wall_s,
        }

    def save(self, models_dir: str | Path) -> Path:
        return save_checkpoint(models_dir, self.method, self.head_kind, self.state_dict, self.manifest_fields())




def greedy_utility(scores: np.ndarray | torch.Tensor, utility: np.ndarray) -> float:
    """Mean utility of routing each row to its highest-scoring worker (first on ties)."""
    s = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    if len(s) == 0:
        return float("nan")
    return float(np.asarray(utility)[np.arange(len(s)), s.argmax(axis=1)].mean())


def load_head(state: dict[str, torch.Tensor], kind: str, dim: int, n_workers: int) -> RoutingHead:
    head = build_head(kind, dim, n_workers)
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"these weights do not fit a {kind!r} head of dim {dim} with {n_workers} workers "
            f"(set `head:` in the config to the kind the weights were trained as): {exc}"
        ) from None
    return head.eval()


def evaluate_head(
    head_state: dict[str, torch.Tensor], kind: str, data_split: RoutingData, train: RoutingData | None = None
) -> dict[str, Any]:
    """Router, oracle, random and best-fixed utility on one split. The best fixed worker is chosen
    on `train` when given (the honest baseline); `best_fixed_utility_optimistic` is chosen on the
    split itself."""
    head = load_head(head_state, kind, data_split.dim, data_split.n_workers)
    u = data_split.utility
    with torch.no_grad():
        scores = head(torch.from_numpy(data_split.features))
    means = u.mean(axis=0)
    fixed = int(np.argmax(train.utility.mean(axis=0))) if train is not None else int(np.argmax(means))
    return {
        "n": len(u),
        "router_utility": greedy_utility(scores, u),
        "oracle_utility": float(u.max(axis=1).mean()),
        "random_utility": float(u.mean()),
        "best_fixed_worker": data_split.worker_ids[fixed],
        "best_fixed_utility": float(means[fixed]),
        "best_fixed_utility_optimistic": float(means.max()),
    }


def make_result(
    method: str,
    cfg,  # the stage's config (SFTConfig, RLConfig or ESConfig): its `head` and `model_dump()`
    head: RoutingHead,
    state: dict[str, torch.Tensor],
    data: RoutingData,
    train: RoutingData,
    val: RoutingData,
    curves: dict[str, list[float]],
    best_epoch: int,
    t0: float,
    extra: dict[str, Any] | None = None,
) -> TrainResult:
    """Package the kept weights with their metrics on val (best fixed chosen on train) and train."""
    ev_val = evaluate_head(state, cfg.head, val, train)
    ev_train = evaluate_head(state, cfg.head, train, train)
    metrics = {
        "val_utility": ev_val["router_utility"],
        "val_best_fixed_utility": ev_val["best_fixed_utility"],
        "val_oracle_utility": ev_val["oracle_utility"],
        "val_random_utility": ev_val["random_utility"],
        "train_utility": ev_train["router_utility"],
        "best_fixed_worker": ev_val["best_fixed_worker"],
        "n_train": len(train.task_ids),
        "n_val": len(val.task_ids),
        # what the worker calls behind the rows this head learnt from cost (its training receipt)
        "data_cost_usd": None if data.cost_usd is None else float(np.nansum(train.cost_usd) + np.nansum(val.cost_usd)),
        **(extra or {}),
    }
    return TrainResult(
        method=method, head_kind=cfg.head, state_dict=state, worker_ids=list(data.worker_ids), dim=data.dim,
        param_count=head.param_count(), config=cfg.model_dump(), curves=curves, best_epoch=best_epoch,
        metrics=metrics, contract=data.contract,
        utility_config=data.utility_config.model_dump() if data.utility_config else None,
        data_version=data.data_version, wall_s=round(time.perf_counter() - t0, 3),
    )
