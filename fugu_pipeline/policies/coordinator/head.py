"""The multi-turn coordinator's heads (`roles_linear`, `roles_linear_svf`), registered in the one
head table (`head_base.HEADS`) when this module is imported.

Only training and serving code imports this module (it imports torch).
"""

from __future__ import annotations

import torch
from torch import nn

from fugu_pipeline.train.head_base import RoutingHead, register


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
    `policies/coordinator/route.py` runs it."""

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
    value of the encoder's second-to-last layer (`session/svf.py`): 12,288 + 7,168 = 19,456 parameters
    with 3 workers, a worker softmax per role and Qwen3-0.6B (13,312 with one shared worker softmax).
    `svf_size` (the encoder's count) is in the manifest's `head_shape`."""

    kind = "roles_linear_svf"

    def __init__(self, dim: int, n_workers: int, svf_size: int = 0, worker_sets: int = 1):
        super().__init__(dim, n_workers, worker_sets)
        if svf_size < 1:
            raise ValueError(f"a roles_linear_svf head needs svf_size >= 1 (the encoder's singular values), got {svf_size}")
        self.svf_scales = nn.Parameter(torch.ones(svf_size))


ROLES_KINDS = (RolesHead.kind, RolesSVFHead.kind)  # multi-turn coordinators (policies/coordinator/route.py), not one-step routers
