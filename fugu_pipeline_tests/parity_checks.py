"""What the parity tests share: vectors computed two ways (alone and batched, served and cached)
agree within the dtype's tolerance on every machine, and bit for bit where this machine's kernels
give a row the same bits alone as in a batch (`features/parity.py`); routes agree except for ties
to within rounding.

    assert_vector_parity(got, want, "float32", lambda: encoder_batch_invariance(enc, texts))

Bits that differ are a failure when the probe finds the kernels batch-invariant (then the code
broke it). Where it does not, the test passes on the tolerance and reports what it measured: the
vectors' difference and the probe's reason, printed and as a warning in the run's summary (never a
skip: the measured figure is the result on such a CPU)."""

from __future__ import annotations

from collections.abc import Callable

import warnings

import numpy as np

from fugu_pipeline.features.parity import VectorParity, compare_vectors, routes_agree


def assert_vector_parity(got: np.ndarray, want: np.ndarray, dtype: str, kernels: Callable[[], str | None]) -> VectorParity:
    p = compare_vectors(got, want, dtype)
    assert p.within, p.describe()
    if p.bit_equal == p.rows:
        print(f"vector parity: {p.describe()}")
        return p
    why = kernels()  # run only when the bits differ: free where they do not
    assert why is not None, f"not bit for bit, although this machine's kernels give every batch its bits alone: {p.describe()}"
    message = f"vector parity within tolerance ({p.describe()}); bit equality not checked: {why}"
    print(message)
    warnings.warn(message, stacklevel=2)
    return p


def assert_routes_agree(cached_scores: np.ndarray, served_scores: list[np.ndarray], routes: dict[str, list[int]]) -> None:
    """Every path's routes (worker indices) are the cached ones, or ties to within what the
    `served_scores` (the same rows scored from vectors computed alone and batched) moved."""
    for name, chosen in routes.items():
        ok = routes_agree(cached_scores, served_scores, np.asarray(chosen))
        assert ok.all(), f"{name}: {int((~ok).sum())} of {len(ok)} routes differ from the cached path's beyond a tie"
