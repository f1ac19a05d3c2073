"""What is guaranteed about a prompt's vector wherever it is computed (the embedding cache, `route`,
`serve`'s micro-batches), and the probe that says when more holds on this machine.

Guaranteed on every CPU and device (the code's part): a prompt is tokenized, cut and padded the same
way and runs at the same padded length through the same attention path, alone or in any batch
(`encoder.plan_batches`). What a matrix multiply returns for one row of a batch may still depend on
how many rows the batch has: the CPU's kernels (oneDNN, MKL; AMX tiles on Intel Xeons) pick their
blocking, and with it the order of the additions, by the shape. So:

- vectors agree within `vector_tolerance(dtype)` (absolute, per component of an L2-normalised
  vector; `compare_vectors`);
- scores move only as much as the vectors do (a linear head: by at most the tolerance times each
  worker's sum of |weights|, `linear_score_tolerance`), so routes agree except where the two
  choices' scores are closer than that (`routes_agree`: a tie to within rounding may fall either way);
- bit equality holds where the kernels give it: `batch_invariance` runs the model's own forward pass
  at one fixed padded length, each row alone and in its batch, and says whether the bits match.

The tolerances. A component of a normalised vector lies in [-1, 1]. A reduced-precision dtype
stores every hidden state rounded (bfloat16: 8 significant bits, epsilon 2^-7; float16: 11 bits,
2^-10), so a different order of the additions can flip the last bit of any hidden value at every
layer, and the flips carry through the remaining layers: the tolerance is two epsilons, 2^-6 =
0.0156 in bfloat16 (2^-9 in float16). float32 rounds the same way 65,536 times finer; its
tolerance, 1e-5, is some 80 float32 epsilons. Measured on MiniLM (6 layers), prompts alone against
the cache's batches: an Intel Xeon with AMX (amx_bf16) 2e-7 in float32 (23 of 96 prompts not
bit-equal) and 9e-4 in bfloat16 (42 of 96); every linear layer's sums split in two when batched
(`fugu_pipeline/testing/batch_variant_kernels.py`, harsher than the Xeon) 1.8e-7 and
3.1e-3; an AMD EPYC with avx512_bf16 (no AMX) 0: bit-equal.

Plain Python: numpy only; the probe runs the forward it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

VECTOR_TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-6, "float16": 2.0**-9}


def vector_tolerance(dtype: str) -> float:
    """The largest difference of one component of a normalised vector computed in `dtype` alone
    and in a batch (module docstring). Unknown dtypes get float32's."""
    return VECTOR_TOLERANCE.get(str(dtype).removeprefix("torch."), VECTOR_TOLERANCE["float32"])


@dataclass(frozen=True)
class VectorParity:
    """Two computations of the same prompts' vectors, compared."""

    rows: int
    bit_equal: int  # rows equal bit for bit
    max_abs_diff: float
    tolerance: float
    dtype: str

    @property
    def within(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def describe(self) -> str:
        return (f"{self.bit_equal}/{self.rows} vectors bit-equal, max |diff| {self.max_abs_diff:.3g} "
                f"(tolerance {self.tolerance:.3g} in {self.dtype}: {'within' if self.within else 'OUTSIDE'})")


def compare_vectors(a: np.ndarray, b: np.ndarray, dtype: str) -> VectorParity:
    """How far apart two (N, D) arrays of the same prompts' vectors are (NaN counts as outside)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"compare_vectors: shapes {a.shape} and {b.shape} differ")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(len(a), -1)
    worst = float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0
    same = int(np.all(a.reshape(len(a), -1) == b.reshape(len(b), -1), axis=1).sum()) if len(a) else 0
    return VectorParity(len(a), same, worst, vector_tolerance(dtype), str(dtype))


def linear_score_tolerance(weight: np.ndarray, dtype: str) -> np.ndarray:
    """How far a linear head's scores (x @ weight, weight (D, W)) may move when every component of
    x moves by up to the vector tolerance: the tolerance times each column's sum of |weights|
    (Hölder), per worker."""
    return vector_tolerance(dtype) * np.abs(np.asarray(weight, np.float64)).sum(axis=0)


def routes_agree(cached: np.ndarray, served: list[np.ndarray], chosen: np.ndarray) -> np.ndarray:
    """Per row of (N, W) cached scores (higher is better): True where the route another path took
    (`chosen`, worker indices) is the cached best, or where the cached scores of the two choices
    are within twice the row's largest difference between the cached scores and `served` (the same
    rows' scores computed other ways: alone, batched): a tie to within rounding, which each
    computation may break its own way."""
    cached = np.asarray(cached, np.float64)
    rows = np.arange(len(cached))
    a, b = cached.argmax(axis=1), np.asarray(chosen)
    moved = np.max([np.abs(np.asarray(s, np.float64) - cached).max(axis=1) for s in served], axis=0) \
        if served and cached.size else np.zeros(len(cached))
    return (a == b) | (cached[rows, a] - cached[rows, b] <= 2 * moved)


Forward = Callable[[list[list[int]], int], np.ndarray]


def batch_invariance(forward: Forward, batches: list[tuple[list[list[int]], int]], what: str = "") -> str | None:
    """None when `forward` (token id sequences and one padded width -> one row per sequence) gives
    every sequence of every batch the same bits alone as in its batch; else one line saying how many
    differ and by how much. A batch of one proves nothing and is skipped; `what` names the model
    and dtype in the line."""
    rows = differ = 0
    worst = 0.0
    for seqs, width in batches:
        if len(seqs) < 2:
            continue
        together = np.asarray(forward(seqs, width))
        for r, seq in enumerate(seqs):
            alone = np.asarray(forward([seq], width))[0]
            rows += 1
            if not np.array_equal(alone, together[r]):
                differ += 1
                worst = max(worst, float(np.abs(alone.astype(np.float64) - together[r]).max()))
    if not differ:
        return None
    return (f"this machine's kernels give {differ} of {rows} sequences other bits alone than in their batch "
            f"(max |diff| {worst:.3g}{', ' + what if what else ''}): bit equality across batch shapes does not hold here")


def machine_kernels() -> str:
    """The CPU's kernel level as torch reports it (e.g. AVX512, AVX512_BF16, AMX), for messages."""
    import torch

    return f"torch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}"


def encoder_batch_invariance(encoder, texts: list[str]) -> str | None:
    """`batch_invariance` of an `Encoder`'s forward pass on the batches `encoder.encode_texts(texts)`
    forms: None when this machine gives each of them the same bits alone, else why not."""
    model = encoder.settings.model.rstrip("/").rsplit("/", 2)
    name = "/".join(model[-2:]) if len(model) > 1 else model[0]  # a hub id, or a directory's last two parts
    what = f"{name} in {encoder.resolved_dtype} on {encoder.resolved_device}, {machine_kernels()}"
    return batch_invariance(encoder.encode_ids, encoder.batches(texts), what)
