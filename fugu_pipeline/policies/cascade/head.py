"""A cascade as a checkpoint: `models/cascade/<content hash>/` with `manifest.json` and
`head.safetensors`, the same format, content hash, weight checks and pointer as every other head
(`checkpoints.py`).

The manifest's `head_params` hold the policy (steps, accept rules, plans per domain), the budget
points chosen on validation (the frontier: one plan per cost level, for a request's cap) and the
answer-text format and the reply statistics (`answer_stats`, by name; a manifest without them
means the first ten, `STATS_V1`) the verifier reads, and the context verifier (`context`, JSON: a
small model reading each reply with the replies already paid for; absent: each reply alone); the safetensors hold the verifier's weights (a logistic
model over prompt features, reply features and the worker, with its standardisation). A cascade
whose plans never consult the verifier saves a verifier of zeros (`verifier.used` 0). When the
verifier reads a cross-encoder's score (the reply statistic `cross_encoder`), `head_params.cross_encoder`
is its contract and `cross_encoder.safetensors` in the same folder its weights
(`cascade_cross_encoder_use.py`). A cascade that plans per prompt cluster (`groups.py`) holds the
cluster names in `head_params.clusters` and the centroids with their standardisation in the
safetensors (`cluster_center`, `cluster_scale`, `centroids`).

It is not a one-step router: `policies/cascade/route.py` runs it step by step, `policies/cascade/evaluate.py`
scores it from recorded answers; `save.py` writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from fugu_pipeline.policies.cascade.policy import CascadePolicy
from fugu_pipeline.train.head_base import RoutingHead, register

KIND = "cascade"


@register
class CascadeHead(RoutingHead):
    """Holds a `CascadePolicy` (as `policy`, JSON) and its verifier. `answer_dim` is the size of the
    reply's features (encoder features + statistics)."""

    kind = KIND
    uses_domains = True  # the plan depends on the request's domain (and the kind's own checks run on load)
    not_probed_offline = "a cascade's behaviour is read from the host's recorded replies (validate checks it)"

    def __init__(self, dim: int, n_workers: int, policy: dict | None = None, answer_dim: int = 0,
                 frontier: list | None = None, answer_format: str = "", domains_frontier: dict | None = None,
                 answer_stats: list[str] | None = None, context: dict | None = None, cross_encoder: dict | None = None,
                 cap_usd: float | None = None, cap_z: float | None = None, clusters: dict | None = None,
                 group_caps: dict | None = None):
        from fugu_pipeline.policies.cascade.answer_features import STATS, STATS_V1
        from fugu_pipeline.policies.cascade.cross_encoder import CROSS_STAT

        super().__init__(dim, n_workers)
        if answer_dim < 0:
            raise ValueError(f"answer_dim must be >= 0, got {answer_dim}")
        self.answer_stats = tuple(answer_stats) if answer_stats is not None else STATS_V1
        self._stats_named = answer_stats is not None  # an older manifest stays as it was written
        # the cross-encoder's column (cascade_cross_encoder_use.py) is read only with its contract
        self.cross_encoder = dict(cross_encoder) if cross_encoder else None
        unknown = [s for s in self.answer_stats if s not in STATS and (s != CROSS_STAT or not self.cross_encoder)]
        if unknown:
            raise ValueError(f"answer_stats names {unknown}, which this version does not compute (known: {list(STATS)})")
        if answer_stats is not None and len(self.answer_stats) > answer_dim:
            raise ValueError(f"answer_dim {answer_dim} is smaller than its {len(self.answer_stats)} reply statistics")
        self.policy = CascadePolicy.model_validate(policy) if policy is not None else None
        self.answer_dim, self.frontier, self.answer_format = int(answer_dim), list(frontier or []), answer_format
        self.domains_frontier = dict(domains_frontier or {})
        # the cap the policy was chosen under, $ per request (serving keeps its running spend within it:
        # policies/cascade/spend.py); None: no cap
        self.cap_usd = None if cap_usd is None else float(cap_usd)
        # that cap's margin in standard errors (a checkpoint saved before it was recorded: the default margin)
        self.cap_z = None if cap_z is None else float(cap_z)
        # under a pooled cap shared among groups (policies/cascade/groups.share_cap): each group's part of it,
        # $ per request, which its own spend guard keeps to (the pooled cap keeps the rest)
        self.group_caps = {str(g): float(c) for g, c in (group_caps or {}).items()}
        bad = [g for g, c in self.group_caps.items() if not (np.isfinite(c) and c > 0)]
        if bad:
            raise ValueError(f"head_params.group_caps holds a cap that is not a positive number for {bad[:5]}")
        # the context verifier (policies/cascade/verifier_context.py; None: each reply is scored alone)
        self.context = dict(context) if context else None
        if self.context is not None:
            from fugu_pipeline.policies.cascade.verifier_context import ContextModel

            self.context_model = ContextModel.from_json(self.context)
        in_dim = dim + self.answer_dim + n_workers
        self.weight = nn.Parameter(torch.zeros(n_workers, in_dim))  # one logistic model per worker (policies/cascade/verifier.py)
        self.bias = nn.Parameter(torch.zeros(n_workers))
        self.register_buffer("center", torch.zeros(n_workers, in_dim))
        self.register_buffer("scale", torch.ones(n_workers, in_dim))
        self.register_buffer("used", torch.zeros(1))
        # the prompt clusters the plans are chosen by (policies/cascade/groups.py); None: by the request's domain
        self.clusters = dict(clusters) if clusters else None
        if self.clusters is not None:
            k = len(self.clusters.get("names") or [])
            if k < 2:
                raise ValueError(f"head_params.clusters names {k} cluster(s); a cascade planned per cluster has two or more")
            self.register_buffer("cluster_center", torch.zeros(dim))
            self.register_buffer("cluster_scale", torch.ones(dim))
            self.register_buffer("centroids", torch.zeros(k, dim))

    def head_params(self) -> dict[str, Any]:
        return {"policy": self.policy.model_dump() if self.policy else None, "answer_dim": self.answer_dim,
                "frontier": self.frontier, "answer_format": self.answer_format, "domains_frontier": self.domains_frontier,
                **({"answer_stats": list(self.answer_stats)} if self._stats_named else {}),
                **({"context": self.context} if self.context else {}),
                **({"cross_encoder": self.cross_encoder} if self.cross_encoder else {}),
                **({"cap_usd": self.cap_usd} if self.cap_usd is not None else {}),
                **({"cap_z": self.cap_z} if self.cap_z is not None else {}),
                **({"group_caps": self.group_caps} if self.group_caps else {}),
                **({"clusters": self.clusters} if self.clusters is not None else {})}

    def group_keys(self, domains, prompt_features: np.ndarray | None = None) -> list:
        """The key of each request's plan (`policy.plan_for`): its domain, or for a cascade planned per
        prompt cluster, the nearest cluster of its prompt features (N, dim)."""
        if self.clusters is None:
            return list(domains)
        if prompt_features is None:
            raise ValueError("this cascade plans per prompt cluster: its prompts' features are needed")
        from fugu_pipeline.train.clusters import PromptClusters

        got = PromptClusters(self.cluster_center.numpy().astype(np.float64), self.cluster_scale.numpy().astype(np.float64),
                             self.centroids.numpy().astype(np.float64), list(self.clusters["names"]))
        return [str(g) for g in got.assign(prompt_features)]

    def forward(self, x: torch.Tensor, domains=None) -> torch.Tensor:
        raise TypeError("a cascade is not a one-step router: run it with policies/cascade/route.py (CascadeRouter) or score it "
                        "with policies/cascade/evaluate.py")

    def probe_scores(self, x: torch.Tensor) -> torch.Tensor:
        """The verifier's logit (N, W) for every worker on prompt features `x` with empty reply
        features: what the load-time probe (`probe.py`) checks is finite and bounded."""
        n, n_workers = len(x), self.weight.shape[0]
        answer = torch.zeros(n, self.answer_dim, dtype=x.dtype)
        out = []
        for w in range(n_workers):
            onehot = torch.zeros(n, n_workers, dtype=x.dtype)
            onehot[:, w] = 1
            design = torch.cat([x, answer, onehot], dim=1)
            out.append((((design - self.center[w]) / self.scale[w]) * self.weight[w]).sum(dim=1) + self.bias[w])
        return torch.stack(out, dim=1)

    def verify(self, X: np.ndarray) -> np.ndarray:
        """P(right) of each (prompt features, reply features, worker one-hot) row."""
        from fugu_pipeline.policies.cascade.verifier import score

        return score(X, self.weight.detach().numpy(), self.bias.detach().numpy(), self.center.numpy(), self.scale.numpy())

    def sanity(self) -> list[str]:
        problems = []
        if self.policy is None:
            problems.append("head_params.policy is missing: a cascade checkpoint needs its steps")
        if bool((self.scale <= 0).any()):
            problems.append("scale holds zero or negative values")
        if self.clusters is not None and (bool((self.cluster_scale <= 0).any())
                                          or not bool(torch.isfinite(self.centroids).all())):
            problems.append("the prompt clusters' scale or centroids hold zero, negative or non-finite values")
        if self.policy is not None and self.policy.uses_verifier and float(self.used[0]) != 1.0:
            problems.append("the policy consults the verifier but its weights are marked unused")
        return problems


def cascade_state(verifier, in_dim: int, n_workers: int, clusters=None) -> dict[str, torch.Tensor]:
    """The tensors of a cascade checkpoint from a fitted `policies.cascade.verifier.Verifier` (None: zeros,
    unused), with the prompt clusters' (`train/clusters.PromptClusters`) when it plans per cluster."""
    out = _verifier_state(verifier, in_dim, n_workers)
    if clusters is not None:
        out.update({"cluster_center": torch.from_numpy(np.asarray(clusters.center, np.float32)),
                    "cluster_scale": torch.from_numpy(np.asarray(clusters.scale, np.float32)),
                    "centroids": torch.from_numpy(np.asarray(clusters.centroids, np.float32))})
    return out


def _verifier_state(verifier, in_dim: int, n_workers: int) -> dict[str, torch.Tensor]:
    if verifier is None:
        return {"weight": torch.zeros(n_workers, in_dim), "bias": torch.zeros(n_workers),
                "center": torch.zeros(n_workers, in_dim), "scale": torch.ones(n_workers, in_dim), "used": torch.zeros(1)}
    return {"weight": torch.from_numpy(np.asarray(verifier.weight, np.float32)),
            "bias": torch.from_numpy(np.asarray(verifier.bias, np.float32)),
            "center": torch.from_numpy(np.asarray(verifier.center, np.float32)),
            "scale": torch.from_numpy(np.asarray(verifier.scale, np.float32)), "used": torch.ones(1)}

