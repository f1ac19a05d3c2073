"""Routing heads: small trainable modules over frozen encoder features.

Each head maps features (N, D) to scores (N, W), one per worker; the greedy route is the argmax.
Every head splits into a `frozen` part (no trainable choice made by CMA-ES) and a final linear
layer `linear`; `scores_from_logits` turns that layer's output into routing scores. CMA-ES
evolves only `linear` over the cached `frozen(x)`.

Only training and serving code imports this module (it imports torch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RoutingHead(nn.Module):
    kind = ""

    def __init__(self, dim: int, n_workers: int):
        super().__init__()
        if dim < 1 or n_workers < 2:
            raise ValueError(f"a routing head needs dim >= 1 and n_workers >= 2, got dim={dim}, n_workers={n_workers}")
        self.dim, self.n_workers = dim, n_workers

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def scores_from_logits(self, z: torch.Tensor) -> torch.Tensor:
        return z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scores_from_logits(self.linear(self.frozen(x)))

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class LinearHead(RoutingHead):
    """`layernorm_linear` (the default): LayerNorm(D), then Linear(D, W)."""

    kind = "layernorm_linear"

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, n_workers)

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class NormedLinearHead(RoutingHead):
    """`normed_linear`: a bias-free Linear(D, W) over L2-normalised features (cosine-like scores)."""

    kind = "normed_linear"

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.linear = nn.Linear(dim, n_workers, bias=False)

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


class QualityHead(RoutingHead):
    """`quality`: predicts each worker's quality in [0, 1] (LayerNorm, Linear, sigmoid) and routes
    by argmax(quality - cost_weight * expected_cost). The two routing constants are buffers, saved
    with the weights; training sets them from the data (DESIGN §4 utility)."""

    kind = "quality"

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, n_workers)
        self.register_buffer("cost_weight", torch.zeros(1))
        self.register_buffer("expected_cost", torch.zeros(n_workers))

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def predict_quality(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(self.frozen(x)))

    def route_scores(self, x: torch.Tensor, cost_weight: float | torch.Tensor, expected_cost: torch.Tensor) -> torch.Tensor:
        return self.predict_quality(x) - cost_weight * expected_cost

    def scores_from_logits(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z) - self.cost_weight * self.expected_cost


HEADS: dict[str, type[RoutingHead]] = {h.kind: h for h in (LinearHead, NormedLinearHead, QualityHead)}
HEAD_KINDS = tuple(HEADS)


def build_head(kind: str, dim: int, n_workers: int) -> RoutingHead:
    try:
        cls = HEADS[kind]
    except KeyError:
        raise ValueError(f"unknown head kind {kind!r}; choose one of {list(HEADS)}") from None
    return cls(dim, n_workers)


def expected_shapes(kind: str, dim: int, n_workers: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the state dict of a head of this kind and size."""
    return {k: tuple(v.shape) for k, v in build_head(kind, dim, n_workers).state_dict().items()}
