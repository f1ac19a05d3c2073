"""Routing heads: small trainable modules over frozen encoder features, and the registry of every
head kind (`HEADS`, `build_head`).

Each head maps features (N, D) to scores (N, W), one per worker; the greedy route is the argmax.
The linear heads here split into a `frozen` part (no trainable choice made by CMA-ES) and a final
linear layer `linear`; `scores_from_logits` turns that layer's output into routing scores. CMA-ES
evolves only `linear` over the cached `frozen(x)`. The quality predictors (kNN, domain prior, MLP,
ensemble) live in `predictors.py` and `ensemble.py` and register here on import; the base class
and the domain-aware calls (`call_head`, `head_quality`) are in `head_base.py`.

Only training and serving code imports this module (it imports torch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fugu_pipeline.train import cascade_head, ensemble, predictors, ridge, triage_head  # noqa: F401  (register the quality predictors, the triage head, the cascade)
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

    kind = "layernorm_linear"

    def __init__(self, dim: int, n_workers: int):
        super().__init__(dim, n_workers)
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, n_workers)

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@register
class NormedLinearHead(RoutingHead):
    """`normed_linear`: a bias-free Linear(D, W) over L2-normalised features (cosine-like scores)."""

    kind = "normed_linear"

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

    kind = "quality"

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


@register
class RolesHead(RoutingHead):
    """`roles_linear`: the multi-turn coordinator. One bias-free Linear(D, S x W + 3) over
    the encoded transcript: the first S x W outputs are worker logits, the last 3 role logits
    (Thinker, Worker, Verifier), each group its own softmax (`session/policy.py`). `worker_sets`
    S (the manifest's `head_shape`) is 1 (one worker softmax whatever the role) or 3 (one worker
    softmax per role, in role order: the worker is picked given the role, so "verify here, on the
    careful checker" is one decision, not a role flip and a worker flip that must coincide).
    Zero-initialised: the uniform policy. 12 x 1,024 = 12,288 parameters with 3 workers, per-role
    worker sets and Qwen3-0.6B.

    The transcript vector is standardised first with two frozen buffers, `feature_center` and
    `feature_scale` (per-dimension mean and spread of the vectors met by exploration rollouts;
    identity until training sets them): an LLM's hidden states share one large direction (the
    coordinator's transcripts have cosine 0.96-0.99 with each other under the tiny encoder), and
    CMA-ES's per-coordinate steps only find the small directions that tell states apart once
    every dimension has unit spread. Not a one-step router: `forward` gives the W + 3 logits, and
    `route/roles.py` runs it."""

    kind = "roles_linear"
    n_roles = 3

    def __init__(self, dim: int, n_workers: int, worker_sets: int = 1):
        super().__init__(dim, n_workers)
        if worker_sets not in (1, self.n_roles):
            raise ValueError(f"a roles head has 1 worker set (shared by the roles) or {self.n_roles} (one per role), "
                             f"not {worker_sets}")
        self.worker_sets = worker_sets
        self.linear = nn.Linear(dim, n_workers * worker_sets + self.n_roles, bias=False)
        nn.init.zeros_(self.linear.weight)
        self.register_buffer("feature_center", torch.zeros(dim))
        self.register_buffer("feature_scale", torch.ones(dim))

    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.feature_center) / self.feature_scale


@register
class RolesSVFHead(RolesHead):
    """`roles_linear_svf`: the roles head plus TinyRouter's SVF adapter, one learnable scale per singular
    value of the encoder's second-to-last layer (`features/svf.py`): 12,288 + 7,168 = 19,456 parameters
    with 3 workers, a worker softmax per role and Qwen3-0.6B (13,312 with one shared worker softmax).
    `svf_size` (the encoder's count) is in the manifest's `head_shape`."""

    kind = "roles_linear_svf"

    def __init__(self, dim: int, n_workers: int, svf_size: int = 0, worker_sets: int = 1):
        super().__init__(dim, n_workers, worker_sets)
        if svf_size < 1:
            raise ValueError(f"a roles_linear_svf head needs svf_size >= 1 (the encoder's singular values), got {svf_size}")
        self.svf_scales = nn.Parameter(torch.ones(svf_size))


LINEAR_HEAD_KINDS = (LinearHead.kind, NormedLinearHead.kind, QualityHead.kind)  # what SFT / RL / ES train
HEAD_KINDS = LINEAR_HEAD_KINDS  # (main's name for the same set)
ROLES_KINDS = (RolesHead.kind, RolesSVFHead.kind)  # multi-turn coordinators (route/roles.py), not one-step routers
TRIAGE_KINDS = (triage_head.HEAD_KIND,)  # domain and difficulty labels (train/triage.py), not a router
CASCADE_KINDS = (cascade_head.KIND,)  # cascades: run step by step (route/cascade.py), not one-step routers
ROUTER_HEAD_KINDS = tuple(k for k in HEADS if k not in ROLES_KINDS + TRIAGE_KINDS + CASCADE_KINDS)  # one-step routers: linear heads and quality predictors
