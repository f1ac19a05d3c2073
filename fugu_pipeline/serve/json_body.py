"""Strict JSON request bodies, parsed by orjson and held to limits, so that no body, however it is
built, costs the server more than a bounded amount of work.

What a body must be (anything else is a `BodyError` naming the limit, the place and what to send):
- strict JSON (RFC 8259): no NaN or Infinity, no number beyond float range (400 `invalid_json`);
  no integer beyond 64 bits (a worker's API could not hold it);
- valid UTF-8 text, with no lone UTF-16 surrogate such as `"\\ud800"` (400 `invalid_unicode`: it
  cannot be encoded as UTF-8, so neither the tokenizer nor a worker could take it);
- nested at most `MAX_JSON_DEPTH` levels (400 `invalid_json`);
- at most `max_values` JSON values in all (strings, numbers, objects, lists, ... at any depth;
  413 `too_many_json_values`, `fugu-lite serve --max-json-values`). The byte limit alone does not
  bound the work: 2 MB of `[0,0,0,...]` is a million values.

Why orjson: Python's own parser, with the hooks that made it strict (`parse_int`, `parse_float`,
`parse_constant`: a Python call per number), and a walk over every value took about a second of
CPU for 2 MB of small values; orjson is strict by itself (it refuses NaN, Infinity, numbers that
overflow a double, invalid UTF-8 and lone surrogates) and parses it in some 20 ms, and the walk
(`check_json_tree`) counts a container's values before stacking them, so it stops at the limit
(`benchmarks/bench_serve.py --json-flood-only --old-parser` measures both). orjson's refusals
carry a position but not a path; for a lone surrogate the body is parsed once more by Python's
parser, without hooks, to name the field (`messages[0].content`), but only when the body cannot
hold more values than the limit (its commas and brackets say so), so that second parse is bounded.

The app runs `load_json` outside the serving event loop for bodies over `INLINE_BYTES`
(`serve/app.py`); a body up to that size holds at most a few thousand values and is cheaper to
parse in place than to hand to a thread.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

MAX_JSON_DEPTH = 64  # OpenAI request bodies nest a few levels; JSON schemas in response_format a few more
DEFAULT_MAX_JSON_VALUES = 20_000  # ~6,000 chat messages; a body of small values reaches it in ~60 KB
INLINE_BYTES = 8 << 10  # bodies up to this size are parsed on the event loop (at most ~4,000 values)
_INT_LIMIT = 2**63  # an integer a worker's API can hold (int64); a bigger one is refused with a 400


class BodyError(ValueError):
    """A body refused: HTTP `status`, the OpenAI error `code` and `param` (the field, when known)."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def load_json(raw: bytes, max_values: int = DEFAULT_MAX_JSON_VALUES) -> Any:
    """The parsed body, or BodyError (see the module docstring)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _refusal(raw, exc, max_values) from None
    check_json_tree(body, max_values)
    return body


def value_bound(raw: bytes) -> int:
    """An upper bound on the number of JSON values in `raw`: every value but the first follows a
    comma or opens a container's first slot (commas inside strings only raise the bound)."""
    return 1 + raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def _refusal(raw: bytes, exc: orjson.JSONDecodeError, max_values: int) -> BodyError:
    why, at = str(exc).split(": line ")[0], f"line {exc.lineno} column {exc.colno}"
    if "UTF-8" in why:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            why = f"{bad.reason}: byte {raw[bad.start:bad.start + 1]!r} at offset {bad.start}"
        return BodyError(400, f"the body is not valid UTF-8 text ({why}); send the JSON encoded as UTF-8",
                         "invalid_json")
    if "surrogate" in why:
        if value_bound(raw) <= max_values:  # bounded: name the field
            try:
                check_json_tree(json.loads(raw), max_values, text=True)
            except BodyError as found:
                return found
            except (ValueError, RecursionError):
                pass
        return BodyError(400, f"the body holds text that is not valid Unicode (a lone UTF-16 surrogate, {at}); send "
                         "UTF-8 text", "invalid_unicode")
    if "depth" in why or "recursion" in why:  # orjson's own limit (1,024 levels)
        return BodyError(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels ({at})", "invalid_json")
    rest = raw[exc.pos:exc.pos + 9].lstrip(b"-")
    if rest.startswith((b"NaN", b"Infinity")):
        word = rest[:3] if rest.startswith(b"NaN") else rest[:8]
        return BodyError(400, f"{word.decode()} is not valid JSON ({at}); use a finite number", "invalid_json")
    if "infinity" in why:
        return BodyError(400, f"the number at {at} is out of range (beyond a double); use a finite number",
                         "invalid_json")
    return BodyError(400, f"could not parse the JSON body of the request: {why} ({at})", "invalid_json")


def check_json_tree(body: Any, max_values: int, *, text: bool = False) -> None:
    """BodyError for more than `max_values` values, nesting deeper than MAX_JSON_DEPTH, an integer
    beyond 64 bits or a non-finite number; with `text`, also for a string (value or key) that is
    not valid Unicode (orjson refuses those itself). Iterative, stops at the first problem, and a
    node's path is only spelled out for the error: a deep or wide body costs one pass over at most
    `max_values` values, whatever its keys."""
    stack: list[tuple[Any, tuple | None, int]] = [(body, None, 0)]
    counted = 1  # values met so far: counted when their container is opened, before they are stacked
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, (dict, list)):
            counted += len(value)
            if counted > max_values:
                raise BodyError(413, f"the JSON body holds more than {max_values:,} values (strings, numbers, objects, "
                                "lists, at any depth), the limit of this server (`fugu-lite serve --max-json-values`); "
                                "send fewer", "too_many_json_values")
        if depth > MAX_JSON_DEPTH:
            path = _path(where)
            raise BodyError(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels (at {path or 'the top'})",
                            "invalid_json", path or None)
        if isinstance(value, dict):
            for k, v in value.items():
                if text:
                    _check_text(k, where)
                stack.append((v, (where, k), depth + 1))
        elif isinstance(value, list):
            stack.extend((v, (where, i), depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str):
            if text:
                _check_text(value, where)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if abs(value) >= _INT_LIMIT:
                path = _path(where)
                raise BodyError(400, f"the integer at {path or 'the top'} is out of range (beyond 64 bits)",
                                "invalid_json", path or None)
        elif isinstance(value, float) and not math.isfinite(value):
            path = _path(where)
            raise BodyError(400, f"the number at {path or 'the top'} is not finite; use a finite number",
                            "invalid_json", path or None)


def _path(where: tuple | None) -> str:
    """`messages[0].content` from the (parent, key) chain; long keys are shortened."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else "." + (key if len(key) <= 40 else key[:37] + "..."))
    return "".join(reversed(parts)).lstrip(".")


def _check_text(text: str, where: tuple | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        path = _path(where)
        raise BodyError(400, f"{path or 'the body'} holds text that is not valid Unicode (a lone surrogate "
                        f"{text[exc.start]!r} at character {exc.start}); send UTF-8 text", "invalid_unicode",
                        path or None) from None
