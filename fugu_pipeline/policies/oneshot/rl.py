"""RL: an offline contextual bandit over the full reward matrix, warm-started from SFT. Every
(task, worker) reward is known, so REINFORCE uses the exact expected reward under the policy as
its baseline; `expected_reward` maximises that expectation directly (lower variance)."""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.policies.oneshot.configs import RLConfig
from fugu_pipeline.policies.oneshot.heads import build_head
from fugu_pipeline.train.loop import (
    EarlyStop,
    Log,
    prepare,
    seeded,
    state_of,
    val_utility,
)
from fugu_pipeline.train.result import TrainResult, load_head, make_result

_logger = logging.getLogger(__name__)


def train_rl(
    data: RoutingData,
    cfg: RLConfig | None = None,
    init_state: dict[str, torch.Tensor] | None = None,
    log: Log | None = None,
    force: bool = False,
) -> TrainResult:
    cfg, log = cfg or RLConfig(), log or _logger.info
    if cfg.head == "quality":
        raise ValueError("RL trains a softmax policy; the 'quality' head is a quality regressor. "
                         "Train it with SFT, or use head 'layernorm_linear' or 'normed_linear' for RL")
    train, val = prepare(data, force)
    t0 = time.perf_counter()
    with seeded(cfg.seed) as gen:
        x, u = torch.from_numpy(train.features), torch.from_numpy(train.utility).float()
        xv = torch.from_numpy(val.features)
        head = build_head(cfg.head, data.dim, data.n_workers)
        if init_state is not None:
            head = load_head(init_state, cfg.head, data.dim, data.n_workers)
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        log(f"rl ({cfg.estimator}): head {cfg.head}, {head.param_count():,} params, "
            f"{'warm start' if init_state is not None else 'fresh init'}, {len(x)} train / {len(xv)} val tasks")

        curves: dict[str, list[float]] = {"train_loss": [], "train_expected_utility": [], "val_utility": []}
        early = EarlyStop("rl", cfg.patience, log, state_of(head), best_val=val_utility(head, xv, val.utility))
        log(f"rl epoch   0  val utility {early.best_val:.4f} (start)")
        head.train()
        for epoch in range(1, cfg.epochs + 1):
            perm, total, expected = torch.randperm(len(x), generator=gen), 0.0, 0.0
            for i in range(0, len(x), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                logp = F.log_softmax(head(x[idx]), dim=1)
                p, ub = logp.exp(), u[idx]
                value = (p * ub).sum(dim=1)  # exact expected utility under the policy
                entropy = -(p * logp).sum(dim=1).mean()
                if cfg.estimator == "reinforce":
                    a = torch.multinomial(p.detach(), cfg.samples_per_task, replacement=True, generator=gen)
                    advantage = ub.gather(1, a) - value.detach()[:, None]
                    objective = (advantage * logp.gather(1, a)).mean()
                else:
                    objective = value.mean()
                loss = -objective - cfg.entropy_coef * entropy
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
                expected += value.sum().item()
            v = val_utility(head, xv, val.utility)
            curves["train_loss"].append(total / len(x))
            curves["train_expected_utility"].append(expected / len(x))
            curves["val_utility"].append(v)
            log(f"rl epoch {epoch:3d}  loss {total / len(x):.4f}  E[U] {expected / len(x):.4f}  val utility {v:.4f}")
            if early.stop(epoch, v, head):
                break
    return make_result("rl", cfg, head, early.best_state, data, train, val, curves, early.best_epoch, t0)
