"""Route parity on any CPU (`features/parity.py`): vectors within the dtype's tolerance and routes
the same (ties to within rounding aside) where the kernels' last bits depend on the batch shape, as
on an Intel Xeon with AMX; bit equality asserted where the kernels give it, and still caught when
the code, not the kernels, breaks it. Kernels that depend on the batch shape are emulated on any
CPU (`fugu_pipeline/testing/batch_variant_kernels.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from fugu_pipeline.features.cache import embed_prompts
from fugu_pipeline.features.encoder import Encoder
from fugu_pipeline.features.parity import (
    compare_vectors,
    encoder_batch_invariance,
    linear_score_tolerance,
    routes_agree,
    vector_tolerance,
)
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.testing.batch_variant_kernels import batch_invariant_kernels, batch_variant_kernels
from fugu_pipeline_tests.parity_checks import assert_vector_parity
from fugu_pipeline_tests.test_encoder import _env, fugu_home, many_lengths  # noqa: F401  (the tiny encoder's home)


def tiny(dtype: str) -> Encoder:
    return Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype=dtype, pooling="mean", layer=(-1, 1)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_that_depend_on_the_batch_shape_keep_vectors_and_routes_within_tolerance(tmp_path, dtype):
    """The symptom of an Intel Xeon with AMX (last bits of a prompt's vector differ alone and in a
    batch), emulated: the vectors stay within the tolerance, the routes of a head on them agree, the
    probe names the kernels, and the bit check reports what it measured with that reason, not a failure."""
    prompts = many_lengths(64)
    enc = tiny(dtype)
    with batch_variant_kernels():
        cached = embed_prompts(prompts, None, enc, tmp_path).vectors
        alone = np.concatenate([enc.encode([p]) for p in prompts])
        why = encoder_batch_invariance(enc, prompts)
        p = compare_vectors(alone, cached, dtype)
        assert p.bit_equal < p.rows and p.within and 0 < p.max_abs_diff <= vector_tolerance(dtype)
        assert why is not None and "other bits alone than in their batch" in why and dtype in why
        with pytest.warns(UserWarning, match="bit equality not checked: this machine's kernels"):
            assert_vector_parity(alone, cached, dtype, lambda: encoder_batch_invariance(enc, prompts))
        order = np.random.default_rng(1).permutation(len(prompts))
        grouped = np.empty_like(cached)
        for part in np.array_split(order, 5):  # a server's micro-batches
            grouped[part] = enc.encode([prompts[i] for i in part])
    weight = np.random.default_rng(0).normal(size=(cached.shape[1], 5))  # a linear head over five workers
    assert (np.abs(alone @ weight - cached @ weight) <= linear_score_tolerance(weight, dtype)).all()
    ok = routes_agree(cached @ weight, [alone @ weight], (grouped @ weight).argmax(axis=1))
    assert ok.all(), f"{int((~ok).sum())} routes flipped beyond a tie"


def test_bits_the_code_breaks_still_fail_where_the_kernels_give_them(monkeypatch):
    """Where the kernels are batch-invariant (on any CPU: `batch_invariant_kernels`), a prompt padded
    one way alone and another way in a batch (a code bug: the vectors stay close, the bits do not)
    fails the parity check."""
    import fugu_pipeline.features.encoder as encoder_module

    enc = tiny("float32")
    prompts = many_lengths(24)
    with batch_invariant_kernels():
        why = encoder_batch_invariance(enc, prompts)
        assert why is None, f"batch_invariant_kernels left bits that depend on the batch: {why}"
        batched = enc.encode(prompts)
        plain = encoder_module.padded_length
        monkeypatch.setattr(encoder_module, "padded_length", lambda n, m, multiple=8: plain(n, m, multiple) + 8)
        alone = np.concatenate([enc.encode([p]) for p in prompts])  # padded 8 tokens further than in the batch
        assert compare_vectors(alone, batched, "float32").within
        with pytest.raises(AssertionError, match="not bit for bit, although this machine's kernels"):
            assert_vector_parity(alone, batched, "float32", lambda: encoder_batch_invariance(enc, prompts))


def test_routes_may_differ_only_in_a_tie_to_within_rounding():
    cached = np.array([[0.50, 0.49, 0.0], [0.50, 0.30, 0.0], [0.2, 0.2 + 1e-9, 0.1]])
    alone = cached + np.array([[-0.006, 0.006, 0], [0, 0, 0], [1e-9, -1e-9, 0]])  # rows 0 and 2: near ties
    assert routes_agree(cached, [alone], np.array([1, 0, 0])).tolist() == [True, True, True]  # a tie flipped
    assert routes_agree(cached, [alone], np.array([0, 1, 2])).tolist() == [True, False, False]  # real changes


def test_vector_comparison_reads_bits_distance_and_nan():
    a = np.array([[0.6, 0.8], [1.0, 0.0]], np.float32)
    p = compare_vectors(a, a.copy(), "bfloat16")
    assert (p.rows, p.bit_equal, p.max_abs_diff, p.within) == (2, 2, 0.0, True)
    b = a.copy()
    b[1, 0] = np.nan
    assert not compare_vectors(a, b, "float32").within
    assert vector_tolerance("torch.bfloat16") == vector_tolerance("bfloat16") > vector_tolerance("float32")
    with pytest.raises(ValueError, match="shapes"):
        compare_vectors(a, a[:1], "float32")
