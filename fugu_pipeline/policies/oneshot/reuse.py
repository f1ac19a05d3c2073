"""Validation predictions kept across feature variants: a family's out-of-fold predictions are a
function of the arrays it reads (`Family.reads`), its grid, the folds and the objective, and of
nothing else. `train` fits the head set once per feature variant (prompts as they are or stripped,
each layer setting), and several families read the same arrays in every variant: the domain prior
reads no features at all, ridge on the lexical block reads the same 16 statistics whatever the
encoder's layers. `PredictionMemo` keys each family part's predictions by a digest of exactly those
inputs and hands back the kept ones when the digest matches, so those families are fitted once per
distinct input instead of once per variant; a family whose inputs cannot be named
(`reads` is None: the MLP bag, SFT) is always fitted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from fugu_pipeline.hashing import canonical_json

Preds = dict[str, tuple[np.ndarray | None, np.ndarray]]


def digest(parts: list) -> str:
    """sha256 over JSON-able values and numpy arrays (dtype, shape and bytes of each)."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            a = np.ascontiguousarray(p)
            h.update(f"array {a.dtype.str} {a.shape}".encode())
            h.update(a.view(np.uint8).reshape(-1) if a.dtype != object else canonical_json(a.tolist()).encode())
        else:
            h.update(b"json " + canonical_json(p).encode())
    return h.hexdigest()


class PredictionMemo:
    """{input digest: a family part's validation predictions} for one `train`; `fitted` and `kept`
    count the parts computed and the parts handed back (what the log and the tests read)."""

    def __init__(self) -> None:
        self._kept: dict[str, Preds] = {}
        self.fitted = 0
        self.kept = 0

    def get(self, key: list | None, compute: Callable[[], Preds]) -> tuple[Preds, bool]:
        """(predictions, whether they were kept from an earlier call). `key`: everything the
        predictions read (None: unknown, always computed and never kept)."""
        if key is None:
            self.fitted += 1
            return compute(), False
        d = digest(key)
        if d in self._kept:
            self.kept += 1
            return _copy(self._kept[d]), True
        self.fitted += 1
        out = compute()
        self._kept[d] = out  # the same arrays the candidates hold: keeping them costs no memory
        return out, False


def _copy(preds: Preds) -> Preds:
    """Fresh arrays: the variant that got them may write into them without touching the kept ones."""
    return {k: (None if q is None else q.copy(), s.copy()) for k, (q, s) in preds.items()}
