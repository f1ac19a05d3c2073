"""Lexical statistics of a prompt: a small block of cheap, language-agnostic numbers (length, numbers,
structure, code and multiple-choice markers) appended to the encoder's vector when
`EncoderSettings.lexical` is on.

Why: a frozen sentence embedding says what a prompt is about, not how hard it is. In the routing
study on public data, ridge regression on these statistics alone ranked GSM8K prompts for routing as well as the
embedding did, and an ensemble of both did better than either (README, "Heads and selection").

The block is computed from the exact text the encoder reads (prompt rules and template applied), in
training and in serving alike, so it is part of the feature contract (`lexical: true`). Each value
is mapped into about [0, 1] by a fixed transform and the block is scaled by 1/4, so its norm stays
near that of one pooled, normalised layer: cosine heads read only the embedding columns
(`KNNHead.cosine_dims`), heads that standardise their inputs (ridge, MLP) see every column.
Changing a statistic changes the vectors: bump `LEXICAL_VERSION` (it is in the cache fingerprint).
"""

from __future__ import annotations

import math
import re

import numpy as np

LEXICAL_VERSION = 1
LEXICAL_NAMES = (
    "log characters", "log words", "digit share", "log numbers", "log newlines", "question marks",
    "log code markers", "choice markers", "upper-case share", "non-ASCII share", "log sentences",
    "log distinct numbers", "log largest number", "percent or fraction", "log mean word length",
    "log words per sentence",
)
LEXICAL_DIM = len(LEXICAL_NAMES)
BLOCK_SCALE = 0.25

_NUM = re.compile(r"\d[\d,]*(?:\.\d*)?")  # every character read one way (features.md, "Untrusted text")
_SENT = re.compile(r"[.!?](?:\s|$)")
_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport |[{};]|==|->")
_CHOICE = re.compile(r"(?m)^[^\S\n]*\(?[A-Ha-h][).:]\s")  # blank lines before an option: its own line counts it
# divisors that bring each raw statistic to about [0, 1] on real prompts (a 20k-character prompt is
# log1p = 9.9; 40 sentences log1p = 3.7; numbers are capped at 1e12); values beyond are kept, not clipped
_DIVISORS = np.array([10, 9, 1, 5, 6, 5, 6, 10, 1, 1, 4, 5, 28, 1, 3, 5], dtype=np.float64)


def _row(t: str) -> list[float]:
    n = max(len(t), 1)
    words = t.split()
    nums = _NUM.findall(t)
    vals = []
    for x in nums:
        try:
            vals.append(abs(float(x.replace(",", ""))))
        except ValueError:
            pass
    sents = max(len(_SENT.findall(t)), 1)
    largest = max(vals, default=0.0)
    return [
        math.log1p(len(t)), math.log1p(len(words)),
        sum(map(str.isdigit, t)) / n, math.log1p(len(nums)),
        math.log1p(t.count("\n")), min(t.count("?"), 10), math.log1p(len(_CODE.findall(t))),
        min(len(_CHOICE.findall(t)), 10), sum(map(str.isupper, t)) / n,
        (len(t) - sum(map(str.isascii, t))) / n,
        math.log1p(sents), math.log1p(len(set(nums))), math.log1p(min(largest, 1e12)),
        float("%" in t or "/" in t or "percent" in t.lower()),
        math.log1p(len(t.replace(' ', '').replace('\n', '')) / len(words)) if words else 0.0, math.log1p(len(words) / sents),
    ]


def lexical_features(texts: list[str]) -> np.ndarray:
    """(N, LEXICAL_DIM) float32: the scaled statistics of each text (names in LEXICAL_NAMES)."""
    if not texts:
        return np.zeros((0, LEXICAL_DIM), np.float32)
    raw = np.asarray([_row(t) for t in texts], dtype=np.float64)
    return (BLOCK_SCALE * raw / _DIVISORS).astype(np.float32)
