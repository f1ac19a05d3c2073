"""The pieces every training loop shares: seeding, the train/val split, validation utility of the
greedy route, and early stopping that keeps the best validation epoch's weights."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.train.head_base import RoutingHead
from fugu_pipeline.train.result import greedy_utility
from fugu_pipeline.train.threads import HEAD_THREADS, torch_threads

Log = Callable[[str], None]


@contextlib.contextmanager
def seeded(seed: int, threads: int | None = HEAD_THREADS):
    """Seed torch, make CPU kernels deterministic and use `threads` intra-op threads (None: leave
    torch's setting) for the duration, and hand out a generator."""
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.manual_seed(seed)
    deterministic(True)
    try:
        with torch_threads(threads):
            yield torch.Generator().manual_seed(seed)
    finally:
        deterministic(*previous)


def deterministic(mode: bool, warn_only: bool = False) -> None:
    """`torch.use_deterministic_algorithms(mode, warn_only=...)` without its import of
    torch._inductor (torch._dynamo, sympy: about 3 CPU-s in a process that has not loaded them).
    The same flag for every eager kernel; Inductor's own `deterministic` setting (which only
    compiled code reads) is set too when Inductor is already loaded, as torch's function does."""
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = mode
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


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
