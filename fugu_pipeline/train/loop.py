"""The pieces every training loop shares: seeding, the train/val split, validation utility of the
greedy route, and early stopping that keeps the best validation epoch's weights."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.train.heads import RoutingHead
from fugu_pipeline.train.result import greedy_utility
from fugu_pipeline.train.threads import HEAD_THREADS, torch_threads

Log = Callable[[str], None]


@contextlib.contextmanager
def seeded(seed: int, threads: int | None = HEAD_THREADS):
    """Seed torch, make CPU kernels deterministic and use `threads` intra-op threads (None: leave
    torch's setting) for the duration, and hand out a generator."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        with torch_threads(threads):
            yield torch.Generator().manual_seed(seed)
    finally:
        torch.use_deterministic_algorithms(previous)


def prepare(data: RoutingData, force: bool) -> tuple[RoutingData, RoutingData]:
    data.validate(require=("train", "val"), force=force)
    return data.split("train"), data.split("val")


def val_utility(head: RoutingHead, x: torch.Tensor, u: np.ndarray) -> float:
    head.eval()
    with torch.no_grad():
        v = greedy_utility(head(x), u)
    head.train()
    return v


def state_of(head: RoutingHead) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()}


@dataclass
class EarlyStop:
    """Keeps the weights of the best validation epoch and says when patience has run out."""

    method: str
    patience: int
    log: Log
    best_state: dict[str, torch.Tensor]
    best_val: float = -float("inf")
    best_epoch: int = 0

    def stop(self, epoch: int, val_utility: float, head: RoutingHead) -> bool:
        if val_utility > self.best_val + 1e-12:
            self.best_val, self.best_epoch, self.best_state = val_utility, epoch, state_of(head)
            return False
        if epoch - self.best_epoch >= self.patience:
            self.log(f"{self.method}: early stop at epoch {epoch}; keeping epoch {self.best_epoch} "
                     f"(val utility {self.best_val:.4f})")
            return True
        return False
