"""What a worker can take while serving: tool calls, a prompt of some length, a `max_tokens`.

- Tools: a request that carries `tools`, or tool messages (`role: tool`, assistant `tool_calls`),
  goes only to workers whose YAML says `supports_tools: true` (default false; true for mock
  workers, which answer such a request with a tool call, `mock.py`).
- Context window: the YAML's `context_window`, else (an `openrouter` worker) the catalog's
  `context_length` for its model, else unknown (no check). A request goes to a worker only when
  the prompt's estimated tokens plus the completion it asks for fit: the client's `max_tokens`
  when it sent one within the worker's output limit, else `MIN_COMPLETION_TOKENS` (the worker's
  default `max_tokens` is then lowered to the room the prompt leaves).
- Output limit: the YAML's `max_output_tokens`, else the catalog's
  `top_provider.max_completion_tokens`, else `GLOBAL_MAX_OUTPUT_TOKENS`. A larger `max_tokens`
  is lowered to it (so is one larger than the room left in the context window), and the reply's
  routing details say so.

The prompt's tokens are estimated without the worker's tokenizer (the server does not have it):
UTF-8 bytes / 3, rounded up, plus `MESSAGE_TOKENS` per message (role and chat-template markers),
`PART_TOKENS` per non-text content part (an image) and the `tools` definitions' JSON bytes / 3.
Tokenizers of current models average 3.5 to 4.5 bytes per token on English prose and code and
about 3 bytes (one CJK character) per token on Chinese or Japanese, so the estimate is above the
real count for ordinary text: a prompt near a window's edge is kept from a worker that might just
have taken it, rather than sent to fail there. Text of digits or symbols can take more tokens than
estimated; a worker that then refuses the prompt fails the call, and the next worker is tried.
Plain Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fugu_pipeline.workers.contract import WorkerCallError

if TYPE_CHECKING:
    from fugu_pipeline.workers.catalog import CatalogSnapshot
    from fugu_pipeline.workers.config import WorkerSpec

GLOBAL_MAX_OUTPUT_TOKENS = 131_072  # no worker limit known: the largest output current models offer
MIN_COMPLETION_TOKENS = 256  # the room a prompt must leave when the client did not say how much
BYTES_PER_TOKEN = 3
MESSAGE_TOKENS = 8
PART_TOKENS = 1_600  # a non-text part: a high-detail image costs models in the order of 1,000-1,600 tokens
TOOLS_UNSUPPORTED, CONTEXT_EXCEEDED = "tools_unsupported", "context_length_exceeded"


class WorkerSkipped(WorkerCallError):
    """A call not made: this request does not suit this worker (`code`: `TOOLS_UNSUPPORTED` or
    `CONTEXT_EXCEEDED`). Says nothing about the worker's health."""

    def __init__(self, message: str, code: str):
        super().__init__(message, attempts=0)
        self.code = code


@dataclass(frozen=True)
class WorkerLimits:
    supports_tools: bool
    context_window: int | None
    context_from: str  # where the window came from, in words
    max_output_tokens: int
    output_from: str
    default_max_tokens: int  # the YAML's max_tokens: sent when the client sets none


@dataclass(frozen=True)
class Sizing:
    max_tokens: int | None  # what to send; None: leave the request as it is
    note: str | None  # why it differs from what the client asked, if it does


def worker_limits(spec: "WorkerSpec", catalog: "CatalogSnapshot | None" = None) -> WorkerLimits:
    """A worker's limits from its YAML, else the catalog entry of its model (openrouter workers)."""
    entry = catalog.models.get(spec.model) if catalog is not None and spec.kind == "openrouter" else None
    if spec.context_window is not None:
        window, window_from = spec.context_window, "the worker YAML's context_window"
    elif entry is not None and entry.context_length:
        window, window_from = entry.context_length, f"the catalog's context_length of {spec.model}"
    else:
        window, window_from = None, "unknown"
    if spec.max_output_tokens is not None:
        most, most_from = spec.max_output_tokens, "the worker YAML's max_output_tokens"
    elif entry is not None and entry.max_completion_tokens:
        most, most_from = entry.max_completion_tokens, f"the catalog's max_completion_tokens of {spec.model}"
    else:
        most, most_from = GLOBAL_MAX_OUTPUT_TOKENS, "the server's global cap"
    return WorkerLimits(spec.supports_tools, window, window_from, most, most_from, spec.max_tokens)


def uses_tools(messages: list[dict], params: dict) -> bool:
    """Whether a request needs a worker that supports tools."""
    return params.get("tools") is not None or any(
        m.get("role") == "tool" or m.get("tool_calls") for m in messages if isinstance(m, dict))


def _text_bytes(v: object) -> int:
    return len(v.encode("utf-8", "surrogatepass")) if isinstance(v, str) else 0


def prompt_tokens_estimate(messages: list[dict], tools: list | None = None) -> int:
    """The prompt's tokens, estimated from above for ordinary text (module docstring)."""
    size, parts = 0, 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for p in content:
                if isinstance(p, dict) and p.get("type", "text") == "text":
                    size += _text_bytes(p.get("text"))
                else:
                    parts += 1
        else:
            size += _text_bytes(content)
        size += _text_bytes(m.get("name")) + _text_bytes(m.get("tool_call_id"))
        calls = m.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            f = call.get("function") if isinstance(call, dict) else None
            if isinstance(f, dict):
                size += _text_bytes(call.get("id")) + _text_bytes(f.get("name")) + _text_bytes(f.get("arguments"))
    if tools:
        size += len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    return -(-size // BYTES_PER_TOKEN) + MESSAGE_TOKENS * len(messages) + PART_TOKENS * parts


def size_call(limits: WorkerLimits, prompt_tokens: int, asked: int | None) -> Sizing:
    """The `max_tokens` to send one worker (module docstring); `asked`: the client's, if any.
    Raises WorkerSkipped when the prompt leaves too little room in the worker's context window."""
    cap = limits.max_output_tokens
    clamped = asked is not None and asked > cap
    want = min(asked, cap) if asked is not None else min(limits.default_max_tokens, cap)
    need = asked if asked is not None and not clamped else min(MIN_COMPLETION_TOKENS, want)
    notes = [f"max_tokens {asked} lowered to {cap}, {limits.output_from}"] if clamped else []
    if limits.context_window is not None:
        room = limits.context_window - prompt_tokens
        if room < need:
            raise WorkerSkipped(
                f"the prompt (about {prompt_tokens} tokens, estimated at {BYTES_PER_TOKEN} bytes a token) and "
                f"{need} completion tokens do not fit its context window of {limits.context_window} tokens "
                f"({limits.context_from})", CONTEXT_EXCEEDED)
        if want > room:
            notes.append(f"max_tokens lowered to {room}: the room the prompt (about {prompt_tokens} tokens) leaves "
                         f"in its context window of {limits.context_window} ({limits.context_from})")
            want = room
    if asked is None and want == limits.default_max_tokens:
        return Sizing(None, None)
    if asked is None and not notes:
        notes.append(f"max_tokens {limits.default_max_tokens} (the worker's default) lowered to {cap}, "
                     f"{limits.output_from}")
    return Sizing(want, "; ".join(notes) or None)
