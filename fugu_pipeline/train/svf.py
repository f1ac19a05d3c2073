"""The seed's SVF adapter: one learnable scale per singular value of the linear matrices of the
encoder's second-to-last layer (Qwen3: q, k, v, o, gate, up and down projections, 7 x 1,024 =
7,168 scales for Qwen3-0.6B; 384 for the tiny encoder).

Each matrix is factored once, W = U diag(s) V^T (in float32); scales z give W' = U diag(s * z) V^T,
written into the encoder in place (z = 1 is the original encoder). Because it changes the
encoder's features, a coordinator with SVF has its transcripts encoded per candidate, never shared
(`session/featurize.py` takes the adapter and a candidate's scales). Off by default
(`RolesConfig.svf`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of transformer layers (Qwen3 and Llama-like: `.layers`; BERT-like: `.encoder.layer`)."""
    n = getattr(model.config, "num_hidden_layers", None)
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n and n:
            return mod
    raise ValueError(f"cannot find the {n} transformer layers of {type(model).__name__} for the SVF adapter")


class SVFAdapter:
    """Singular-value scales on every nn.Linear of one layer (default: the second-to-last)."""

    def __init__(self, model: nn.Module, layer: int = -2):
        block = decoder_layers(model)[layer]
        self.parts: list[tuple[str, nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for name, mod in block.named_modules():
            if isinstance(mod, nn.Linear):
                w0 = mod.weight.detach().clone()
                u, s, vh = torch.linalg.svd(w0.to(torch.float32), full_matrices=False)
                self.parts.append((name, mod, u, s, vh, w0))
        if not self.parts:
            raise ValueError(f"layer {layer} of {type(model).__name__} has no linear matrices to adapt")
        self.names = [p[0] for p in self.parts]
        self.sizes = [int(p[3].numel()) for p in self.parts]
        self.size = sum(self.sizes)
        self._applied: bytes | None = None

    def apply(self, scales: np.ndarray | None) -> None:
        """Write W' = U diag(s * z) V^T into the encoder (None: the original weights)."""
        key = None if scales is None else np.asarray(scales, np.float32).tobytes()
        if key == self._applied:
            return
        if scales is not None and len(scales) != self.size:
            raise ValueError(f"the SVF adapter has {self.size} singular values, got {len(scales)} scales")
        offset = 0
        with torch.no_grad():
            for (_, mod, u, s, vh, w0), k in zip(self.parts, self.sizes):
                if scales is None:
                    mod.weight.copy_(w0)
                else:
                    z = torch.as_tensor(np.asarray(scales[offset:offset + k], np.float32))
                    mod.weight.copy_(((u * (s * z)) @ vh).to(mod.weight.dtype))
                offset += k
        self._applied = key

    @contextlib.contextmanager
    def applied(self, scales: np.ndarray | None):
        """The encoder with these scales for the duration; the original weights after."""
        self.apply(scales)
        try:
            yield
        finally:
            self.apply(None)
