"""API keys: read from the environment (or a `.env` file) only, and scrubbed from any text that
may reach a log, a metadata entry, an exception or a reply.

A configured key is scrubbed whole and in pieces: any run of `FRAGMENT_CHARS` (12) or more of its
characters is replaced, so a provider that quotes the end of a rejected key ("...the key ending
in 9f3a...") leaks no part of it. Twelve characters of a random key are never met by chance,
and fewer tell an attacker nothing a brute force could use."""

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


FRAGMENT_CHARS = 12  # a run this long of a configured key is scrubbed wherever it appears


def scrub_secrets(text: str, *secrets: str | None) -> str:
    """`text` without the given secrets (in any of `secret_forms`, or any run of FRAGMENT_CHARS
    or more characters of one), bearer tokens, `sk-...` keys or `api_key=...` values."""
    for s in secrets:
        if s and len(s) >= 4:
            for form in secret_forms(s):
                text = text.replace(form, "[redacted]")
            # percent-escapes may come back in either case (%2f or %2F)
            text = re.sub(re.escape(quote(s, safe="")), "[redacted]", text, flags=re.IGNORECASE)
            for form in secret_forms(s):
                text = _scrub_fragments(text, form)
    for pat, repl in _KEY_PATTERNS:
        text = pat.sub(repl, text)
    return text


def _scrub_fragments(text: str, secret: str, n: int = FRAGMENT_CHARS) -> str:
    """`text` with every run of `n` or more characters of `secret` replaced. Only stretches made
    of the secret's own characters can hold such a run, so those are found first (one regex
    pass) and only their windows are looked up among the secret's n-grams."""
    if len(secret) < n:
        return text
    grams = {secret[i:i + n] for i in range(len(secret) - n + 1)}
    spans: list[list[int]] = []
    for run in re.finditer(f"[{re.escape(''.join(sorted(set(secret))))}]{{{n},}}", text):
        s0, chunk = run.start(), run.group()
        for i in range(len(chunk) - n + 1):
            if chunk[i:i + n] in grams:
                if spans and spans[-1][1] >= s0 + i:  # overlaps (or touches) the last one
                    spans[-1][1] = s0 + i + n
                else:
                    spans.append([s0 + i, s0 + i + n])
    for a, b in reversed(spans):
        text = text[:a] + "[redacted]" + text[b:]
    return text


def configured_key(env: str | None) -> str | None:
    """The key held by environment variable `env` (a worker's `api_key_env`), None when unset."""
    return (os.environ.get(env) or "").strip() or None if env else None


def load_env_file(path: str | os.PathLike | None = None) -> bool:
    """Load `.env` (from `path`, or the nearest one above the working directory) into the
    environment without overriding variables that are already set. True when a file was read."""
    from dotenv import find_dotenv, load_dotenv

    target = path if path is not None else find_dotenv(usecwd=True)
    return bool(target) and load_dotenv(target, override=False)
