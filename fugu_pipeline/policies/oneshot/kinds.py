"""The linear heads' kind names, without torch: the configs check a `head:` field against them
before anything loads torch, and `heads.py` gives its classes these names."""

from __future__ import annotations

LAYERNORM_LINEAR = "layernorm_linear"
NORMED_LINEAR = "normed_linear"
QUALITY = "quality"
LINEAR_HEAD_KINDS = (LAYERNORM_LINEAR, NORMED_LINEAR, QUALITY)  # what SFT / RL / ES train
