"""TinyRouter's SVF adapter: one learnable scale per singular value of the linear matrices of the
encoder's second-to-last layer (Qwen3: q, k, v, o, gate, up and down projections, 7 x 1,024 =
7,168 scales for Qwen3-0.6B; 384 for the tiny encoder).

Each matrix is factored once, W = U diag(s) V^T (in float32); scales z give W' = U diag(s * z) V^T
(z = 1 is the original encoder). The trainer keeps z positive and near 1: z = exp(u), with u moved
by its own step size (`RolesConfig.svf_sigma`, 0.1 by default), apart from the head's.

Two ways to run it:
- `applied(z)`: W' written into the encoder in place for the duration (one candidate; serving).
- `SVFRunner`: many candidates at once without re-running what does not change. The layers BELOW
  the adapted one never see a scale, so their output (the hidden states entering the adapted
  layer) is computed once per transcript (`bottom`) and cached; per (candidate, transcript) only
  the adapted layer and the ones above it run (`tail`), every candidate of a batch with its own
  scales in one forward: each adapted linear map computes U ((s * z_row) * (V^T x)) with z_row the
  scales of that row's candidate. For Qwen3-0.6B that is 2 of 28 layers per candidate.
Because it changes the encoder's features, a coordinator with SVF has its transcripts encoded per
candidate (`session/featurize.py`). Off by default (`RolesConfig.svf`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads when an adapter is built, not when this module is imported
    import torch
    from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of transformer layers (Qwen3 and Llama-like: `.layers`; BERT-like: `.encoder.layer`)."""
    return _layer_list(model)[2]


def _layer_list(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    from torch import nn

    n = getattr(model.config, "num_hidden_layers", None)
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n and n:
            parent_name, _, attr = name.rpartition(".")
            return model.get_submodule(parent_name) if parent_name else model, attr, mod
    raise ValueError(f"cannot find the {n} transformer layers of {type(model).__name__} for the SVF adapter")


class SVFAdapter:
    """Singular-value scales on every nn.Linear of one layer (default: the second-to-last)."""

    def __init__(self, model: nn.Module, layer: int = -2):
        import torch
        from torch import nn

        self.model = model
        layers = decoder_layers(model)
        self.index = layer % len(layers)
        block = layers[self.index]
        self.block = block
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

    def groups(self) -> dict[str, slice]:
        """Each adapted matrix's slice of the scale vector (its parameter group)."""
        out, at = {}, 0
        for name, k in zip(self.names, self.sizes):
            out[name] = slice(at, at + k)
            at += k
        return out

    def apply(self, scales: np.ndarray | None) -> None:
        """Write W' = U diag(s * z) V^T into the encoder (None: the original weights)."""
        key = None if scales is None else np.asarray(scales, np.float32).tobytes()
        if key == self._applied:
            return
        if scales is not None and len(scales) != self.size:
            raise ValueError(f"the SVF adapter has {self.size} singular values, got {len(scales)} scales")
        import torch

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


class _Stop(Exception):
    """Raised by the capture hook: the layers above the adapted one are not needed for the bottom."""


@functools.cache
def _row_scaled_linear() -> type:
    """The row-scaled linear module class, defined on first use (torch loads then)."""
    import torch
    from torch import nn

    class RowScaledLinear(nn.Module):
        """W' x with a different z per batch row: U ((s * z_row) * (V^T x)) + b."""

        def __init__(self, mod: nn.Linear, u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor):
            super().__init__()
            dev, dt = mod.weight.device, mod.weight.dtype
            self.u, self.s, self.vh = u.to(dev, dt), s.to(dev, torch.float32), vh.to(dev, dt)
            self.bias = mod.bias
            self.scale: torch.Tensor | None = None  # (B, r), set per batch

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = x @ self.vh.T
            scale = self.scale.to(a.dtype)
            a = a * scale.view(scale.shape[0], *([1] * (a.dim() - 2)), scale.shape[1])
            y = a @ self.u.T
            return y + self.bias if self.bias is not None else y

    return RowScaledLinear


class SVFRunner:
    """Bottom once per transcript, tail per (candidate, transcript) (module docstring)."""

    def __init__(self, adapter: SVFAdapter):
        self.adapter = adapter
        self.model = adapter.model
        self.parent, self.attr, self.layers = _layer_list(self.model)
        self._rows = {name: _row_scaled_linear()(mod, u, s, vh) for name, mod, u, s, vh, _ in adapter.parts}

    def bottom(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The hidden states entering the adapted layer (B, W, H), computed by the unchanged layers."""
        import torch

        got: dict[str, torch.Tensor] = {}

        def capture(mod, args, kwargs):
            got["h"] = args[0] if args else kwargs["hidden_states"]
            raise _Stop

        hook = self.adapter.block.register_forward_pre_hook(capture, with_kwargs=True)
        try:
            with torch.inference_mode():
                self.model(input_ids=tokens, attention_mask=mask, use_cache=False)
        except _Stop:
            pass
        finally:
            hook.remove()
        return got["h"]

    def tail(self, hidden: torch.Tensor, mask: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The model's last hidden state (B, W, H) from `hidden` entering the adapted layer, row b
        with scales[b] (B, S) on the adapted layer's singular values."""
        import torch
        from torch import nn

        offset = 0
        swapped = []
        types = None
        try:
            for (name, _, _, s, _, _), k in zip(self.adapter.parts, self.adapter.sizes):
                row = self._rows[name]
                row.scale = s.to(scales.device)[None, :] * scales[:, offset:offset + k]
                offset += k
                parent_name, _, attr = name.rpartition(".")
                parent = self.adapter.block.get_submodule(parent_name) if parent_name else self.adapter.block
                swapped.append((parent, attr, getattr(parent, attr)))
                setattr(parent, attr, row)
            setattr(self.parent, self.attr, nn.ModuleList(list(self.layers)[self.adapter.index:]))
            config = self.model.config
            types = getattr(config, "layer_types", None)
            if isinstance(types, list):  # per-layer attention types are read by position in the list
                config.layer_types = types[self.adapter.index:]
            with torch.inference_mode():
                return self.model(inputs_embeds=hidden, attention_mask=mask, use_cache=False).last_hidden_state
        finally:
            if isinstance(types, list):
                config.layer_types = types
            setattr(self.parent, self.attr, self.layers)
            for parent, attr, mod in reversed(swapped):
                setattr(parent, attr, mod)
            for row in self._rows.values():
                row.scale = None
