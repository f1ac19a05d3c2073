"""API keys: read from the environment (or a `.env` file) only, and scrubbed from any text that
may reach a log, a metadata entry, an exception or a reply (DESIGN §6)."""

from __future__ import annotations

import os
import re

_KEY_PATTERNS = [
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]+"), "Bearer [redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "[redacted]"),
    (re.compile(r"(?i)((?:authorization|x-api-key|api[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"), r"\1[redacted]"),
]


def scrub_secrets(text: str, *secrets: str | None) -> str:
    """`text` without the given secrets, bearer tokens, `sk-...` keys or `api_key=...` values."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "[redacted]")
    for pat, repl in _KEY_PATTERNS:
        text = pat.sub(repl, text)
    return text


def load_env_file(path: str | os.PathLike | None = None) -> bool:
    """Load `.env` (from `path`, or the nearest one above the working directory) into the
    environment without overriding variables that are already set. True when a file was read."""
    from dotenv import find_dotenv, load_dotenv

    target = path if path is not None else find_dotenv(usecwd=True)
    return bool(target) and load_dotenv(target, override=False)
