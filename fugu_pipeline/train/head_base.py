"""The routing-head base class and the registry of head kinds.

Every head maps features (N, D) to scores (N, W), one per worker; the greedy route is the argmax.
Every kind of router's heads share this base and this table (each kind's head module registers its
own; `policies/registry.heads` imports them all). The one-step heads (`policies/oneshot/`) come in
two families:

- linear heads (`heads.py`): a `frozen` part and a final linear layer `linear` that SFT, RL and
  CMA-ES train; called as `head(x)`;
- quality predictors (`predictors.py`, `ensemble.py`): k-nearest neighbours, a per-domain prior,
  a small MLP and ensembles of those. They predict each worker's quality in [0, 1] and utility,
  take the task's domain at routing time (`uses_domains = True`; `head(x, domains)`), and are
  fitted in closed form or by a short training run, then chosen by cross-validation
  (`train/selection.py`, `fit.py`).

A kind may say more to the shared gates by class attributes: `final_layers` (the tensors that must
not be all zero, `checkpoints.weight_sanity`), `max_params` (a size cap, `evaluate/preflight.py`)
and `not_probed_offline` (why preflight cannot read its behaviour from the kept probe inputs).

A kind's constructor takes `(dim, n_workers, **params)`; `params` (JSON: sizes, hyperparameters,
the domain vocabulary) are saved in the checkpoint manifest as `head_params`, so a checkpoint
rebuilds its head before loading the tensors. `call_head` / `head_quality` are the one way code
outside training calls any head, with or without domains.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

import torch
from torch import nn

HEADS: dict[str, type["RoutingHead"]] = {}


def register(cls: type["RoutingHead"]) -> type["RoutingHead"]:
    HEADS[cls.kind] = cls
    return cls


class RoutingHead(nn.Module):
    kind = ""
    uses_domains = False  # True: forward(x, domains) and the domain is an input at routing time

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

    def head_params(self) -> dict[str, Any]:
        """The constructor's keyword arguments (JSON) that rebuild this head; {} for linear heads."""
        return {}

    def sanity(self) -> list[str]:
        """Kind-specific problems with the loaded tensors (empty when sane)."""
        return []


def _is_whole(value: Any) -> bool:
    """An int, or a float with no fraction (JSON writes 3 as 3.0 at times); never a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


@functools.lru_cache(maxsize=None)
def _whole_number_arguments(cls: type) -> frozenset[str]:
    """The constructor's arguments annotated `int` (or `int | None`): a manifest's 2.5 there would
    be truncated to 2 by `int()`, a different head than the one saved."""
    hints = typing.get_type_hints(cls.__init__)
    return frozenset(name for name, hint in hints.items()
                     if hint is int or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                                        and set(typing.get_args(hint)) <= {int, type(None)} and int in typing.get_args(hint)))


def build_head(kind: str, dim: int, n_workers: int, params: dict[str, Any] | None = None, **shape: int) -> RoutingHead:
    """A head of this kind and size. `params` (a manifest's `head_params`: the quality predictors'
    constructor arguments) and `shape` (a manifest's `head_shape`: extra sizes such as the roles
    head's `svf_size`) both reach the constructor."""
    try:
        cls = HEADS[kind]
    except KeyError:
        raise ValueError(f"unknown head kind {kind!r}; choose one of {list(HEADS)}") from None
    for where, given in (("head_params", params or {}), ("head_shape", shape)):
        for name, value in given.items():
            if name in _whole_number_arguments(cls) and value is not None and not _is_whole(value):
                raise ValueError(f"{where}.{name} is {value!r}: a {kind!r} head takes a whole number there "
                                 "(the checkpoint was edited or made by other code; save it again)")
    try:
        return cls(dim, n_workers, **(params or {}), **shape)
    except (TypeError, KeyError, OverflowError, AttributeError) as exc:  # params from a manifest: any JSON
        raise ValueError(f"head_params {params or {}} / head_shape {shape} do not fit a {kind!r} head: "
                         f"{type(exc).__name__}: {exc}") from None


def expected_shapes(kind: str, dim: int, n_workers: int, params: dict[str, Any] | None = None,
                    **shape: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the state dict of a head of this kind, size and params.
    The head is built on the meta device (no memory behind its tensors): the sizes come from a
    manifest, and a crafted one (10**12 neighbours) must be refused by comparing shapes, not by
    allocating them."""
    with torch.device("meta"):
        head = build_head(kind, dim, n_workers, params, **shape)
    return {k: tuple(v.shape) for k, v in head.state_dict().items()}


def _domains_for(head: RoutingHead, domains, n: int):
    if domains is None:
        return None
    domains = list(domains)
    if len(domains) != n:
        raise ValueError(f"{n} feature rows but {len(domains)} domains")
    return domains


def call_head(head: RoutingHead, x: torch.Tensor, domains=None) -> torch.Tensor:
    """Routing scores (N, W); the domains (one per row, None = unknown) reach heads that use them."""
    if head.uses_domains:
        return head(x, _domains_for(head, domains, len(x)))
    return head(x)


def head_quality(head: RoutingHead, x: torch.Tensor, domains=None) -> torch.Tensor | None:
    """Predicted quality (N, W) in [0, 1] from a head that predicts it, else None."""
    fn = getattr(head, "predict_quality", None)
    if fn is None:
        return None
    if head.uses_domains:
        return fn(x, _domains_for(head, domains, len(x)))
    return fn(x)
