"""Content hashes: the one canonical JSON form and the one text digest every stage hashes with."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: equal data gives equal text, so equal hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
