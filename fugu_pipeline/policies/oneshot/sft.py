"""SFT: the supervised warm start. Targets are soft, softmax(U / temperature) over the workers'
utilities (cross-entropy or KL); the `quality` head instead regresses each worker's quality.
Early-stopped on validation utility of the greedy route."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.nn.functional as F

from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.policies.oneshot.configs import SFTConfig
from fugu_pipeline.policies.oneshot.heads import QualityHead, build_head
from fugu_pipeline.train.loop import (
    EarlyStop,
    Log,
    prepare,
    seeded,
    state_of,
    val_utility,
)
from fugu_pipeline.train.result import TrainResult, make_result

_logger = logging.getLogger(__name__)


def _set_cost_buffers(head: QualityHead, train: RoutingData, cfg: SFTConfig, log: Log) -> None:
    """Quality head: expected normalised cost per worker (train mean of min(C/C0, cap)) and lambda."""
    ucfg = train.utility_config or UtilityConfig()
    lam = cfg.quality_cost_weight
    if lam is None:
        lam = ucfg.cost_weight / ucfg.quality_weight if ucfg.quality_weight > 0 else 0.0
    if train.cost_usd is None:
        cost, lam = np.zeros(train.n_workers), 0.0
        log("sft: no cost data; the quality head routes on predicted quality alone")
    else:
        cost = np.minimum(np.maximum(train.cost_usd, 0.0) / ucfg.cost_scale_usd, ucfg.cap).mean(axis=0)
    head.expected_cost.copy_(torch.tensor(cost, dtype=torch.float32))
    head.cost_weight.fill_(float(lam))


def train_sft(data: RoutingData, cfg: SFTConfig | None = None, log: Log | None = None, force: bool = False) -> TrainResult:
    cfg, log = cfg or SFTConfig(), log or _logger.info
    train, val = prepare(data, force)
    if cfg.head == "quality" and train.quality is None:
        raise TrainingDataError(
            "head 'quality' learns each worker's quality, but this data has no quality matrix; "
            "use head 'layernorm_linear' or load rewards with quality"
        )
    t0 = time.perf_counter()
    with seeded(cfg.seed) as gen:
        x, u = torch.from_numpy(train.features), torch.from_numpy(train.utility).float()
        xv = torch.from_numpy(val.features)
        head = build_head(cfg.head, data.dim, data.n_workers)
        if cfg.head == "quality":
            target = torch.from_numpy(train.quality).float()
            _set_cost_buffers(head, train, cfg, log)
        else:
            target = torch.softmax(u / cfg.temperature, dim=1)
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        log(f"sft: head {cfg.head}, {head.param_count():,} params, dim {data.dim}, {data.n_workers} workers, "
            f"{len(x)} train / {len(xv)} val tasks")

        curves: dict[str, list[float]] = {"train_loss": [], "val_utility": []}
        early = EarlyStop("sft", cfg.patience, log, state_of(head))
        head.train()
        for epoch in range(1, cfg.epochs + 1):
            perm, total = torch.randperm(len(x), generator=gen), 0.0
            for i in range(0, len(x), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                logits = head.linear(head.frozen(x[idx]))
                if cfg.head == "quality":
                    loss = F.binary_cross_entropy_with_logits(logits, target[idx])
                elif cfg.loss == "ce":
                    loss = -(target[idx] * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
                else:
                    loss = F.kl_div(F.log_softmax(logits, dim=1), target[idx], reduction="batchmean")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
            v = val_utility(head, xv, val.utility)
            curves["train_loss"].append(total / len(x))
            curves["val_utility"].append(v)
            log(f"sft epoch {epoch:3d}  loss {total / len(x):.4f}  val utility {v:.4f}")
            if early.stop(epoch, v, head):
                break
    return make_result("sft", cfg, head, early.best_state, data, train, val, curves, early.best_epoch, t0)
