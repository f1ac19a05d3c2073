"""Reading an upstream's replies: chat-completion JSON, server-sent-event lines, and the errors an
upstream reports (as an HTTP status or inside a 200 body), mapped onto the worker contract.

401, 402 and 403 raise `FatalWorkerError` with what to fix; every later call would fail the same
way. A 403 that OpenRouter's moderation raised for one input (its body lists the flagged reasons)
fails only that cell. 408, 429 and 5xx are `Retryable`; other codes fail the cell.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fugu_pipeline.api_keys import scrub_secrets
from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError
from fugu_pipeline.workers.retry import Retryable, parse_retry_after, retryable_status

RETRYABLE_CODES = {"server_error", "rate_limit_exceeded", "rate_limited", "timeout", "overloaded",
                   "service_unavailable", "bad_gateway", "internal_error"}
NO_RETRY_FINISH = {"length", "content_filter"}
SSE_DONE: dict = {}  # sentinel: the `data: [DONE]` line


def sse_chunk(line: str) -> dict | None:
    """One server-sent-events line of a chat-completions stream: the chunk, `SSE_DONE`, or None
    for lines that carry no data (blank separators, `: keep-alive` comments, event names).
    Malformed JSON is retryable, like a glitch in a non-streamed reply."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return SSE_DONE
    return json_object(payload, "a reply stream chunk")


def json_object(raw: str | bytes, what: str) -> dict:
    """A JSON object, or a retryable error naming what was malformed (provider glitches pass)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise Retryable(f"malformed JSON in {what}") from None
    if not isinstance(data, dict):
        raise Retryable(f"{what} that is not a JSON object")
    return data


def chunk_choices(chunk: dict) -> list[dict]:
    """A stream chunk's choices, each an object with an object `delta` ({} when it has none);
    choices or deltas of another type are a malformed chunk (retryable)."""
    choices = chunk.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise Retryable("a reply stream chunk whose choices are not a list of objects")
    out = []
    for c in choices:
        delta = c.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise Retryable("a reply stream chunk whose delta is not an object")
        out.append(c if isinstance(delta, dict) else {**c, "delta": {}})
    return out


DONE_GRACE_S = 1.0  # after [DONE], how long the rest of a stream is read before the connection is dropped


async def drain_after_done(lines: AsyncIterator[str], grace_s: float = DONE_GRACE_S) -> None:
    """After `data: [DONE]`: read what is left for up to `grace_s`, so that the connection can go back
    to the pool. An upstream that keeps it open (pings, silence, more data) is not waited for: the
    caller closes the response, and the answer stands."""
    try:
        async with asyncio.timeout(grace_s):
            async for _ in lines:
                pass
    except Exception:  # noqa: BLE001 (a timeout, a flood, a reset: the answer is whole already)
        pass


def message_text(content: object) -> str:
    """Message content as text: a string, or a list of `{"type": "text", "text": ...}` parts (parts
    whose text is not a string are skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def tool_calls_of(v: object) -> list[dict] | None:
    """A reply message's `tool_calls` as the upstream sent them: a non-empty list of objects, else None."""
    return v if isinstance(v, list) and v and all(isinstance(c, dict) for c in v) else None


def add_tool_call_deltas(calls: dict[int, dict], deltas: object) -> None:
    """Join a stream chunk's `delta.tool_calls` fragments into whole calls, keyed by their `index`
    (the id, type and name come once, the arguments in pieces)."""
    for d in deltas if isinstance(deltas, list) else ():
        i = d.get("index", 0) if isinstance(d, dict) else None
        if not isinstance(i, int) or isinstance(i, bool):
            continue
        call = calls.setdefault(i, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        for k in ("id", "type"):
            if isinstance(d.get(k), str):
                call[k] = d[k]
        f = d.get("function")
        for k in ("name", "arguments"):
            if isinstance(f, dict) and isinstance(f.get(k), str):
                call["function"][k] += f[k]


def clean_text(text: str) -> str:
    """`text` as valid Unicode: surrogate pairs (an emoji a proxy split across two chunks, joined
    again) become their character, lone surrogates U+FFFD. Lone ones cannot be stored as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def as_str(v: object) -> str | None:
    """A metadata field (model, provider, finish_reason) when it is a non-empty string, else None."""
    return clean_text(v) if isinstance(v, str) and v else None


MAX_TOKENS = 10_000_000  # far above any model's context window: a larger count is a broken upstream


def as_int(v: object) -> int | None:
    """A token count: a finite number in [0, MAX_TOKENS], else None (unknown). A count of 1e30 is
    finite but would price one call at $1e24 and end the run's budget."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return int(v) if 0 <= v <= MAX_TOKENS else None


def as_cost(v: object) -> float | None:
    """A USD cost: a finite, non-negative number, else None (unknown)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def too_big(limit: int, where: str) -> Exception:
    return WorkerCallError(f"the reply is larger than max_reply_bytes={limit} (worker config); not retried: the "
                           f"same request would flood again ({where})")


async def read_capped(response, limit: int, where: str) -> bytes:
    """The whole (decoded) body of an httpx streaming response, failing the call past `limit` bytes."""
    out = bytearray()
    async for data in response.aiter_bytes():
        out += data
        if len(out) > limit:
            raise too_big(limit, where)
    return bytes(out)


ERROR_BODY_BYTES = 65536  # the start of an error reply that is read; the rest is dropped


async def read_error_text(response) -> str:
    """The start of an error reply's body, as text (an error body that floods is cut, not read)."""
    out = bytearray()
    async for data in response.aiter_bytes():
        out += data
        if len(out) >= ERROR_BODY_BYTES:
            break
    return bytes(out[:ERROR_BODY_BYTES]).decode("utf-8", "replace")


_EOL = re.compile(r"\r\n|\r|\n")


async def sse_lines(response, limit: int, where: str) -> AsyncIterator[str]:
    """The lines of a server-sent-events body (CRLF, LF or CR ends one, as SSE says), failing the
    call once more than `limit` bytes arrived: a flood, even one without line breaks, is bounded."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    total, pending = 0, []  # the unterminated tail, in pieces (a long line is joined once, not per read)
    async for data in response.aiter_bytes():
        total += len(data)
        if total > limit:
            raise too_big(limit, where)
        new = decoder.decode(data)
        if not new:
            continue
        if _EOL.search(new) is None and not (pending and pending[-1].endswith("\r")):
            pending.append(new)
            continue
        text = "".join(pending) + new
        end = len(text) - 1 if text.endswith("\r") else len(text)  # a CR may be half of a CRLF
        lines = _EOL.split(text[:end])
        pending = [lines.pop() + text[end:]]
        for line in lines:
            yield line
    rest = "".join(pending) + decoder.decode(b"", final=True)
    if rest:
        lines = _EOL.split(rest)
        for line in lines if lines[-1] else lines[:-1]:
            yield line


DETAIL_CHARS = 300  # how much of an upstream's error text goes into an error message
RAW_CHARS = 150  # how much of OpenRouter's `error.metadata.raw` is added to it


def empty_answer(finish: str | None, where: str, max_tokens: int | None = None) -> Exception:
    """The one rule for a reply with no text, plain or streamed: a failed call. Retryable, unless it
    ended on `length` or `content_filter` (the same request would end the same way)."""
    if finish in NO_RETRY_FINISH:
        hint = ""
        if finish == "length":
            hint = f"; raise max_tokens (now {max_tokens})" if max_tokens else "; raise max_tokens"
        return WorkerCallError(f"empty answer (finish_reason={finish}){hint} ({where})")
    return Retryable(f"empty answer (finish_reason={finish})")


def excerpt(text: str, key: str | None, limit: int) -> str:
    """`text` scrubbed of `key` and key-shaped strings, THEN cut to `limit` characters. The order
    matters: cutting first can split a key, and the half before the cut no longer matches the key
    or a key pattern, so it would pass the scrubber and leak."""
    text = scrub_secrets(text, key).strip()
    return text if len(text) <= limit else text[:limit] + "..."


def error_detail(text: str, key: str | None = None) -> tuple[str, object]:
    """(message, metadata) from an OpenAI/OpenRouter error body, or the start of the raw text;
    the message is scrubbed of `key` before anything is cut (see `excerpt`)."""
    try:
        data = json.loads(text)
    except ValueError:
        return excerpt(text, key, DETAIL_CHARS) or "(empty body)", None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        msg = scrub_secrets(str(err.get("message") or err.get("code") or err), key)
        raw = (err.get("metadata") or {}).get("raw") if isinstance(err.get("metadata"), dict) else None
        if raw and isinstance(raw, str):
            raw = scrub_secrets(raw, key)
            if raw not in msg:
                msg += f" ({excerpt(raw, key, RAW_CHARS)})"
        return excerpt(msg, key, DETAIL_CHARS), err.get("metadata")
    if isinstance(err, str):
        return excerpt(err, key, DETAIL_CHARS), None
    return excerpt(text, key, DETAIL_CHARS) or "(empty body)", None


@dataclass(frozen=True)
class UpstreamErrors:
    """Maps an upstream's error replies onto the worker contract, naming the worker and what to fix."""

    where: str  # "worker X, model Y at host"
    model: str
    api_key_env: str | None
    is_openrouter: bool

    def raise_status(self, status: int, headers, text: str, key: str | None, *, in_body: bool = False) -> None:
        detail, metadata = error_detail(text, key)
        where = f"{'error inside an HTTP 200 reply, code' if in_body else 'HTTP'} {status}"
        who = f"({self.where})"
        env = self.api_key_env or "the api_key_env of this worker"
        if status == 401:
            raise FatalWorkerError(
                f"{where} unauthorized: the API key is invalid, revoked or missing; set {env} "
                f"(environment or .env) to a valid key {who}. Upstream said: {detail}", status=401)
        if status == 402:
            where_to = "https://openrouter.ai/settings/credits" if self.is_openrouter else "the provider"
            raise FatalWorkerError(
                f"{where} payment required: the account is out of credits; add credits at {where_to} "
                f"(or lower max_tokens / max_usd_per_run) {who}. Upstream said: {detail}", status=402)
        if status == 403:
            if isinstance(metadata, dict) and (metadata.get("reasons") or metadata.get("flagged_input")):
                raise WorkerCallError(f"{where} moderation flagged this input: {detail} {who}", status=403)
            raise FatalWorkerError(
                f"{where} forbidden: this key may not use model {self.model!r} (check the model id, "
                f"the key's allowed models/providers, or a moderation block) {who}. Upstream said: {detail}", status=403)
        if retryable_status(status):
            ra = parse_retry_after(headers.get("retry-after") if headers else None)
            raise Retryable(f"{'code' if in_body else 'HTTP'} {status}: {detail}", status=status, retry_after=ra)
        hint = " (check the model id)" if status == 404 else ""
        raise WorkerCallError(f"{where}: {detail}{hint} {who}", status=status)

    def raise_embedded(self, err: object, key: str | None) -> None:
        """An `{"error": ...}` object inside an HTTP 200 body or stream chunk."""
        code = err.get("code") if isinstance(err, dict) else None
        text = json.dumps({"error": err})
        try:
            status = int(code)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            status = None
        if status is not None and 100 <= status <= 599:
            self.raise_status(status, {}, text, key, in_body=True)
        detail = error_detail(text, key)[0]
        if code is None or str(code).lower() in RETRYABLE_CODES:
            raise Retryable(f"error inside an HTTP 200 reply ({code or 'no code'}): {detail}")
        raise WorkerCallError(f"error inside an HTTP 200 reply ({code}): {detail} ({self.where})")
