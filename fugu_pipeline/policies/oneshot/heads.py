"""Routing heads: small trainable modules over frozen encoder features, and the registry of every
head kind (`HEADS`, `build_head`).

Each head maps features (N, D) to scores (N, W), one per worker; the greedy route is the argmax.
The linear heads here split into a `frozen` part (no trainable choice made by CMA-ES) and a final
linear layer `linear`; `scores_from_logits` turns that layer's output into routing scores. CMA-ES
evolves only `linear` over the cached `frozen(x)`. The quality predictors (kNN, domain prior, MLP,
ensemble) live in `predictors.py` and `ensemble.py` and register here on import; the base class
and the domain-aware calls (`call_head`, `head_quality`) are in `head_base.py`. The other kinds'
heads (the coordinator's, the cascade's, the triage head) register from their own modules; the
policies registry (`policies/registry.py`) imports every kind's.

Only training and serving code imports this module (it imports torch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fugu_pipeline.policies.oneshot import ensemble, kinds, predictors, ridge  # noqa: F401  (register the quality predictors)
from fugu_pipeline.train.head_base import (  # noqa: F401  (re-exported: the one registry)
    HEADS,
    RoutingHead,
    build_head,
    call_head,
    expected_shapes,
    head_quality,
    register,
)


@register
class LinearHead(RoutingHead):
    """`layernorm_linear` (the default): LayerNorm(D), then Linear(D, W)."""

    kind = kinds.LAYERNORM_LINEAR

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, n_workers)

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@register
class NormedLinearHead(RoutingHead):
    """`normed_linear`: a bias-free Linear(D, W) over L2-normalised features (cosine-like scores)."""

    kind = kinds.NORMED_LINEAR

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.linear = nn.Linear(dim, n_workers, bias=False)

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


@register
class QualityHead(RoutingHead):
    """`quality`: predicts each worker's quality in [0, 1] (LayerNorm, Linear, sigmoid) and routes
    by argmax(quality - cost_weight * expected_cost). The two routing constants are buffers, saved
    with the weights; training sets them from the data."""

    kind = kinds.QUALITY

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, n_workers)
        self.register_buffer("cost_weight", torch.zeros(1))
        self.register_buffer("expected_cost", torch.zeros(n_workers))

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def predict_quality(self, x: torch.Tensor, domains=None) -> torch.Tensor:
        """(N, W) in [0, 1]; `domains` is accepted for a uniform interface and not used."""
        return torch.sigmoid(self.linear(self.frozen(x)))

    def route_scores(self, x: torch.Tensor, cost_weight: float | torch.Tensor, expected_cost: torch.Tensor) -> torch.Tensor:
        return self.predict_quality(x) - cost_weight * expected_cost

    def scores_from_logits(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z) - self.cost_weight * self.expected_cost


LINEAR_HEAD_KINDS = kinds.LINEAR_HEAD_KINDS  # what SFT / RL / ES train (the names, torch-free, in kinds.py)
HEAD_KINDS = LINEAR_HEAD_KINDS  # (main's name for the same set)
# every quality predictor registered above (kNN, domain prior, MLP, ridge, ensemble): no other kind's head is one
QUALITY_PREDICTOR_KINDS = tuple(k for k, cls in HEADS.items() if issubclass(cls, predictors.QualityPredictor))
ROUTER_HEAD_KINDS = LINEAR_HEAD_KINDS + QUALITY_PREDICTOR_KINDS  # one-step routers: linear heads and quality predictors
