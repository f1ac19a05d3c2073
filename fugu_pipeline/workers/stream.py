"""A worker's open reply stream, relayed chunk by chunk by the server (`HTTPWorkerClient.open_stream`)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from fugu_pipeline.workers.contract import WorkerCallError
from fugu_pipeline.workers.replies import (
    SSE_DONE,
    UpstreamErrors,
    as_int,
    as_str,
    chunk_choices,
    clean_text,
    drain_after_done,
    empty_answer,
    message_text,
    sse_chunk,
    sse_lines,
    tool_calls_of,
)
from fugu_pipeline.workers.retry import Retryable

CostFn = Callable[[dict, "int | None", "int | None", "str | None"], "tuple[float, str]"]


class UpstreamStream:
    """One worker's open reply stream whose first content has arrived (`first()`). `async for chunk
    in stream` yields the parsed `chat.completion.chunk` dicts, the first included; an error after
    that raises WorkerCallError. `served_model`, `usage`, `finish_reason` and `cost()` are filled
    in as chunks pass."""

    def __init__(self, errors: UpstreamErrors, cost_fn: CostFn, response: httpx.Response, key: str | None,
                 chunks: list[dict] | None = None, max_tokens: int | None = None, max_bytes: int = 16_000_000):
        self.errors, self._cost_fn, self.response, self._key = errors, cost_fn, response, key
        self._lines = sse_lines(response, max_bytes, errors.where) if chunks is None else None
        self._high = ""  # a high surrogate that ended the last content piece, held for its pair
        self._buffer = list(chunks or [])
        self.served_model: str | None = None
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self._done = chunks is not None  # [DONE] seen (a reply given as chunks is whole)
        self.attempts, self.ttft_s = 1, None
        self._max_tokens = max_tokens

    async def first(self) -> dict:
        """Read until the reply has content (delta text that is not blank, or a tool call), keeping
        every chunk for the relay. A reply that ends before any is an empty answer: the same rule as for a plain
        reply (`replies.empty_answer`), so a streamed request falls back exactly when a plain one
        would. Returns the first chunk."""
        seen: list[dict] = []
        text = ""
        while not text.strip():
            chunk = await self._next()
            if chunk is None:
                if not seen:
                    raise Retryable("an HTTP 200 reply stream with no chunks")
                raise empty_answer(self.finish_reason, self.errors.where, self._max_tokens)
            seen.append(chunk)
            for c in chunk_choices(chunk):
                text += message_text(c["delta"].get("content"))
                if tool_calls_of(c["delta"].get("tool_calls")):
                    text += "tool_calls"
        self._buffer[:0] = seen
        return seen[0]

    async def _next(self) -> dict | None:
        """The next chunk, None at the end. Raises Retryable or WorkerCallError on an error chunk."""
        if self._buffer:
            return self._buffer.pop(0)
        while self._lines is not None:
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                break
            chunk = sse_chunk(line)
            if chunk is None:
                continue
            if chunk is SSE_DONE:  # the reply is whole: what the upstream sends after it is not waited for
                self._done = True
                await drain_after_done(self._lines)
                break
            if chunk.get("error"):
                self.errors.raise_embedded(chunk["error"], self._key)
            for c in chunk_choices(chunk):
                if c.get("error"):
                    self.errors.raise_embedded(c["error"], self._key)
                if c.get("finish_reason") == "error":
                    raise Retryable("the upstream ended the stream with finish_reason=error")
                self.finish_reason = as_str(c.get("finish_reason")) or self.finish_reason
                if isinstance(c["delta"].get("content"), str):
                    c["delta"]["content"] = self._whole_text(c["delta"]["content"])
            self.served_model = as_str(chunk.get("model")) or self.served_model
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            return chunk
        self._lines = None
        return None

    def _whole_text(self, piece: str) -> str:
        """A content piece without lone surrogates: a high one at its end waits for its pair in the
        next piece (an emoji split across two chunks, as JS proxies do), others become U+FFFD."""
        piece, self._high = self._high + piece, ""
        if piece and "\ud800" <= piece[-1] <= "\udbff":
            piece, self._high = piece[:-1], piece[-1]
        return clean_text(piece)

    async def __aiter__(self):
        while True:
            try:
                chunk = await self._next()
            except Retryable as r:
                raise WorkerCallError(f"{r} ({self.errors.where}; after the stream had started)", status=r.status,
                                      transient=True) from None
            except (httpx.TimeoutException, httpx.TransportError, httpx.StreamError, httpx.DecodingError) as exc:
                raise WorkerCallError(f"stream broke after it had started: {type(exc).__name__} "
                                      f"({self.errors.where})", transient=True) from None
            if chunk is None:
                if not self._done and self.finish_reason is None:  # the connection closed mid-answer
                    raise WorkerCallError(f"the reply stream ended without a finish_reason or [DONE]: cut short "
                                          f"({self.errors.where}; after the stream had started)", transient=True)
                return
            yield chunk

    def cost(self) -> tuple[float, str]:
        """(USD, source) from the usage seen so far, as `complete()` computes it."""
        usage = self.usage if isinstance(self.usage, dict) else {}
        return self._cost_fn(usage, as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens")),
                             self.served_model)

    async def aclose(self) -> None:
        await self.response.aclose()
