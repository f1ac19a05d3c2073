"""API keys: read from the environment (or a `.env` file) only, and scrubbed from any text that
may reach a log, a metadata entry, an exception or a reply (DESIGN §6)."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import quote, quote_plus

_KEY_PATTERNS = [
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]+"), "Bearer [redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "[redacted]"),
    (re.compile(r"(?i)((?:authorization|x-api-key|api[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"), r"\1[redacted]"),
]


def secret_forms(secret: str) -> list[str]:
    """The ways `secret` can appear in text an upstream sends back: as is, percent-encoded (a URL
    or query string echoed in an error), form-encoded and JSON-escaped. Longest first, so no
    shorter form leaves a piece of a longer one behind."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1]}
    return sorted((f for f in forms if len(f) >= 4), key=len, reverse=True)


def scrub_secrets(text: str, *secrets: str | None) -> str:
    """`text` without the given secrets (in any of `secret_forms`), bearer tokens, `sk-...` keys
    or `api_key=...` values."""
    for s in secrets:
        if s and len(s) >= 4:
            for form in secret_forms(s):
                text = text.replace(form, "[redacted]")
            # percent-escapes may come back in either case (%2f or %2F)
            text = re.sub(re.escape(quote(s, safe="")), "[redacted]", text, flags=re.IGNORECASE)
    for pat, repl in _KEY_PATTERNS:
        text = pat.sub(repl, text)
    return text


def load_env_file(path: str | os.PathLike | None = None) -> bool:
    """Load `.env` (from `path`, or the nearest one above the working directory) into the
    environment without overriding variables that are already set. True when a file was read."""
    from dotenv import find_dotenv, load_dotenv

    target = path if path is not None else find_dotenv(usecwd=True)
    return bool(target) and load_dotenv(target, override=False)
