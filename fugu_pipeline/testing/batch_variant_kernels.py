"""Kernels whose last bits depend on the batch shape, on any CPU: what an Intel Xeon's AMX/oneDNN
kernels do (they pick their blocking, and so the order of the additions, by the number of rows);
and `batch_invariant_kernels`, kernels whose bits do not, on any CPU.

Every `torch.nn.functional.linear` of a batch of more than one sequence adds its inner products in
two halves (float32, rounded once to the input's dtype); a single sequence adds them in one pass.
The values are the same to rounding; the bits of a prompt alone and in a batch are not.

    with batch_variant_kernels(): ...          # a test, or `benchmarks/batch_parity.py --emulate`
    pytest -p fugu_pipeline_tests.batch_variant_kernels ...   # a whole test run on such kernels
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def batch_variant_kernels():
    import torch
    import torch.nn.functional as F

    plain = F.linear

    def linear(x, weight, bias=None):
        if x.dim() < 3 or x.shape[0] < 2 or weight.shape[1] < 2:
            return plain(x, weight, bias)
        k = weight.shape[1] // 2
        x32, w32 = x.to(torch.float32), weight.to(torch.float32)
        y = plain(x32[..., :k], w32[:, :k]) + plain(x32[..., k:], w32[:, k:])
        if bias is not None:
            y = y + bias.to(torch.float32)
        return y.to(x.dtype)

    F.linear = linear
    try:
        yield
    finally:
        F.linear = plain


@contextlib.contextmanager
def batch_invariant_kernels():
    """The opposite, on any CPU: every `torch.nn.functional.linear` of a batch runs one sequence at
    a time, so a sequence's matrix multiplies have the same shape, and its bits, alone as in any
    batch. A test that must tell the code's bits from the kernels' runs under it."""
    import torch
    import torch.nn.functional as F

    plain = F.linear

    def linear(x, weight, bias=None):
        if x.dim() < 3 or x.shape[0] < 2:
            return plain(x, weight, bias)
        return torch.cat([plain(x[i:i + 1], weight, bias) for i in range(x.shape[0])])

    F.linear = linear
    try:
        yield
    finally:
        F.linear = plain
