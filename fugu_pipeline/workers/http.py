"""HTTP workers: OpenRouter and any OpenAI-compatible server (vLLM, llama.cpp, Ollama, ...).

`make_http_client(spec, config)` gives an object with `async complete(messages) -> Completion`.

Behaviour:
- One `httpx.AsyncClient` per upstream base URL and event loop (`UpstreamPool`; pass one pool to
  share connections between workers): a client is only ever used on the loop it was made on. `connect_timeout_s` bounds connecting, `read_timeout_s` bounds
  the wait for each byte, and `timeout_s` is the overall deadline of one `complete()` call,
  retries and their waits included: no cell ever takes longer than `timeout_s`.
- Retries follow the one policy in `retry.py` (connection errors, timeouts, 408, 429, 5xx, the
  same codes inside a 200 body, `Retry-After`, jittered backoff, `max_attempts`); also a malformed
  or choice-less 200 reply and an empty answer (both transient provider glitches in practice). An
  empty answer that ended on `length` or `content_filter` is not retried: the same request would
  end the same way. Error replies are mapped onto the contract in `replies.py`.
- A reply body larger than `max_reply_bytes` fails the call without a retry; a stream is read up
  to its `data: [DONE]` and then closed, whatever the upstream sends after it. Bad usage numbers
  (NaN, infinite, negative) are unknown (None), metadata of the wrong type is dropped, and lone
  UTF-16 surrogates in the answer are joined into their pair or replaced.
- Requests stream (`stream: true`) so the time to first token is measured; the answer is still
  returned whole. Pass `stream=False` for servers that cannot stream (ttft is then None).
  `latency_s` and `ttft_s` count from the start of the call, retries and their waits included:
  what a caller waited. `attempts` says how many tries it took.
- OpenRouter-only fields (`usage`, `provider`, `reasoning`, attribution headers) go only to
  `kind: openrouter` workers.
- Cost: OpenRouter's `usage.cost` when it is a finite, non-negative number ("usage"); else
  catalog price x tokens ("catalog"); else the configured per-million-token prices of an
  openai_compatible worker ("configured"); else 0 ("none").
- The API key is read from the environment variable `spec.api_key_env` at call time and sent
  only as an `Authorization` header. Error messages are scrubbed of it and of anything shaped
  like a key, so exceptions and logs are safe to print and store.

Plain Python, no dagster.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from fugu_pipeline.settings import settings
from fugu_pipeline.workers.config import (
    OpenAICompatibleWorker,
    OpenRouterWorker,
    WorkersConfig,
)
from fugu_pipeline.workers.contract import Completion, FatalWorkerError
from fugu_pipeline.workers.replies import (
    DETAIL_CHARS,
    SSE_DONE,
    UpstreamErrors,
    add_tool_call_deltas,
    as_cost,
    as_int,
    as_str,
    chunk_choices,
    clean_text,
    drain_after_done,
    empty_answer,
    excerpt,
    json_object,
    message_text,
    read_capped,
    read_error_text,
    sse_chunk,
    sse_lines,
    tool_calls_of,
)
from fugu_pipeline.workers.retry import Retryable, RetryPolicy, with_retries
from fugu_pipeline.workers.stream import UpstreamStream

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.catalog import CatalogSnapshot

APP_TITLE = "fugu-lite"


class UpstreamPool:
    """One `httpx.AsyncClient` per upstream base URL and event loop, with the config's deadlines.

    An `httpx.AsyncClient` belongs to the loop it first ran on (its connections are that loop's
    transports), so the pool keys its clients by the running loop: a caller that runs the same
    workers on a second loop (one `asyncio.run` per batch) gets new clients there, never one whose
    loop has ended (which failed with `RuntimeError: Event loop is closed`). Clients of a loop that
    has ended are forgotten (their connections ended with it). Callers that make many batches keep
    one loop for the whole run (`session.runner.SessionRunner.call`), so connections are reused
    and `aclose()`, run on that loop, closes every client."""

    def __init__(self, config: WorkersConfig):
        self.timeout = httpx.Timeout(
            connect=config.connect_timeout_s, read=config.read_timeout_s,
            write=config.read_timeout_s, pool=config.timeout_s,
        )
        self.limits = httpx.Limits(max_connections=512, max_keepalive_connections=128, keepalive_expiry=30.0)
        self._clients: dict[tuple[asyncio.AbstractEventLoop, str], httpx.AsyncClient] = {}

    def get(self, base_url: str) -> httpx.AsyncClient:
        """The running loop's client for `base_url` (made on first use)."""
        loop = asyncio.get_running_loop()
        self._forget_ended()
        key = (loop, base_url.rstrip("/"))
        http = self._clients.get(key)
        if http is None or http.is_closed:
            http = self._clients[key] = httpx.AsyncClient(timeout=self.timeout, limits=self.limits)
        return http

    def open_clients(self) -> list[httpx.AsyncClient]:
        """The clients not closed yet (of any loop that is still open)."""
        self._forget_ended()
        return [http for http in self._clients.values() if not http.is_closed]

    def _forget_ended(self) -> None:
        for key in [k for k in self._clients if k[0].is_closed()]:
            del self._clients[key]

    async def aclose(self) -> None:
        """Close the running loop's clients. A client of another loop that is still open cannot be
        closed from here: it stays, for `aclose()` on its own loop."""
        loop = asyncio.get_running_loop()
        self._forget_ended()
        mine = [k for k in self._clients if k[0] is loop]
        for key in mine:
            await self._clients.pop(key).aclose()


class HTTPWorkerClient:
    """A worker reached over the OpenAI Chat Completions protocol (see the module docstring)."""

    def __init__(
        self,
        spec: OpenRouterWorker | OpenAICompatibleWorker,
        config: WorkersConfig,
        *,
        catalog: "CatalogSnapshot | None" = None,
        pool: UpstreamPool | None = None,
        stream: bool = True,
        api_key: str | None = None,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ):
        self.spec = spec
        self.config = config
        self.worker_id = spec.id
        self.catalog = catalog
        self.stream = stream
        self.policy = RetryPolicy(max_attempts=config.max_attempts, deadline_s=config.timeout_s,
                                  backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self.is_openrouter = spec.kind == "openrouter"
        self.url = spec.base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._own_pool = pool is None
        self.pool = pool or UpstreamPool(config)
        self._where = f"worker {spec.id}, model {spec.model} at {urlsplit(spec.base_url).netloc or spec.base_url}"
        self.errors = UpstreamErrors(self._where, spec.model, spec.api_key_env, self.is_openrouter)

    # ------------------------------------------------------------------ request

    def _key(self) -> str | None:
        if self._api_key:
            return self._api_key.strip()
        env = self.spec.api_key_env
        if env is None:
            return None
        key = os.environ.get(env, "").strip()
        if not key:
            raise FatalWorkerError(
                f"API key missing: set {env} in the environment (export {env}=...) or in a .env "
                f"file in the project folder ({self._where})", attempts=0,
            )
        return key

    def _headers(self, key: str | None) -> dict[str, str]:
        h = {"Accept": "text/event-stream" if self.stream else "application/json"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        if self.is_openrouter:
            h["X-Title"] = APP_TITLE
            app_url = settings().app_url
            if app_url:
                h["HTTP-Referer"] = app_url
        return h

    def _body(self, messages: list[dict[str, str]], params: dict | None = None) -> dict:
        s = self.spec
        body: dict = {"model": s.model, "messages": messages, "max_tokens": s.max_tokens,
                      "temperature": s.temperature, **(params or {}), "stream": self.stream}
        if self.is_openrouter:
            body["usage"] = {"include": True}
            if s.provider:
                body["provider"] = s.provider
            if s.reasoning:
                body["reasoning"] = s.reasoning
        elif self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _transport_errors(self, exc: Exception, key: str | None) -> Retryable:
        if isinstance(exc, httpx.DecodingError):  # e.g. `Content-Encoding: gzip` on a body that is not
            return Retryable(f"a reply body that cannot be decoded: {excerpt(str(exc), key, DETAIL_CHARS)}")
        if isinstance(exc, httpx.TimeoutException):
            return Retryable(f"{type(exc).__name__} (connect {self.config.connect_timeout_s:g}s, "
                             f"read {self.config.read_timeout_s:g}s)")
        return Retryable(f"connection error: {type(exc).__name__}: {excerpt(str(exc), key, DETAIL_CHARS)}")

    # ------------------------------------------------------------------ call

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None, *,
                       params: dict | None = None) -> Completion:
        """`params` (e.g. temperature, max_tokens from a server's client) override the spec's."""
        key = self._key()
        body, headers = self._body(messages, params), self._headers(key)
        t0 = time.monotonic()
        done = await with_retries(lambda: self._attempt(body, headers, key, t0), self.policy, where=self._where)
        comp = done.value
        comp.attempts = done.attempts
        comp.latency_s = done.elapsed_s
        comp.extra = {"attempt_latency_s": round(done.last_attempt_s, 4)}
        if done.retried:
            comp.extra["retried"] = done.retried
        return comp

    async def _attempt(self, body: dict, headers: dict, key: str | None, t0: float) -> Completion:
        http = self.pool.get(self.spec.base_url)
        try:
            async with http.stream("POST", self.url, json=body, headers=headers) as r:
                if r.status_code != 200:
                    self.errors.raise_status(r.status_code, r.headers, await read_error_text(r), key)
                if not self.stream or "text/event-stream" not in r.headers.get("content-type", ""):  # plain JSON
                    raw = await read_capped(r, self.config.max_reply_bytes, self._where)
                    return self._from_json(json_object(raw, "an HTTP 200 reply"), key)
                return await self._from_stream(r, key, t0)
        except (httpx.TimeoutException, httpx.TransportError, httpx.StreamError, httpx.DecodingError) as exc:
            raise self._transport_errors(exc, key) from None

    # ------------------------------------------------------------------ replies

    def _from_json(self, data: dict, key: str | None) -> Completion:
        if data.get("error"):
            self.errors.raise_embedded(data["error"], key)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise Retryable("an HTTP 200 reply with no choices")
        c = choices[0]
        if c.get("error"):
            self.errors.raise_embedded(c["error"], key)
        msg = c.get("message") or {}
        if not isinstance(msg, dict):
            raise Retryable("an HTTP 200 reply whose message is not an object")
        if c.get("finish_reason") == "error":  # the same rule as a stream's
            raise Retryable("the upstream ended the reply with finish_reason=error")
        return self._finish(message_text(msg.get("content")), c.get("finish_reason"), data, data.get("usage"), None,
                            tool_calls_of(msg.get("tool_calls")))

    async def _from_stream(self, r: httpx.Response, key: str | None, t0: float) -> Completion:
        parts: list[str] = []
        ttft = None
        finish = None
        usage = None
        meta: dict = {}
        calls: dict[int, dict] = {}
        saw_chunk = False
        lines = sse_lines(r, self.config.max_reply_bytes, self._where)
        async for line in lines:
            chunk = sse_chunk(line)
            if chunk is None:
                continue
            if chunk is SSE_DONE:  # the answer is whole: whatever the upstream sends after it is not waited for
                await drain_after_done(lines)
                break
            if chunk.get("error"):
                self.errors.raise_embedded(chunk["error"], key)
            saw_chunk = True
            for k in ("model", "provider"):
                if as_str(chunk.get(k)):
                    meta[k] = chunk[k]
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk_choices(chunk):
                if c.get("error"):
                    self.errors.raise_embedded(c["error"], key)
                piece = message_text(c["delta"].get("content"))
                add_tool_call_deltas(calls, c["delta"].get("tool_calls"))
                if piece or calls:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    parts.append(piece)
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
        if not saw_chunk:
            raise Retryable("an HTTP 200 reply stream with no chunks")
        if finish == "error":
            raise Retryable("the upstream ended the stream with finish_reason=error")
        return self._finish("".join(parts), finish, meta, usage, ttft, [calls[i] for i in sorted(calls)] or None)

    def _finish(self, answer: str, finish: object, data: dict, usage: dict | None, ttft: float | None,
                tool_calls: list[dict] | None = None) -> Completion:
        finish = as_str(finish)
        answer = clean_text(answer)  # after the join: an emoji split across two chunks is whole again
        if not answer.strip() and not tool_calls:  # tool calls are an answer without text
            raise empty_answer(finish, self._where, self.spec.max_tokens)
        usage = usage if isinstance(usage, dict) else {}
        pt, ct = as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens"))
        served = as_str(data.get("model"))
        cost, source = self._cost(usage, pt, ct, served)
        return Completion(
            answer=answer, cost_usd=cost, cost_source=source, ttft_s=ttft, prompt_tokens=pt,
            completion_tokens=ct, finish_reason=finish, requested_model=self.spec.model, served_model=served,
            provider=as_str(data.get("provider")) if self.is_openrouter else None, tool_calls=tool_calls,
        )

    def _cost(self, usage: dict, pt: int | None, ct: int | None, served: str | None) -> tuple[float, str]:
        """(USD, source) in the order of the module docstring; a NaN, infinite or negative figure is
        unknown and the next source is tried."""
        cost = as_cost(usage.get("cost")) if self.is_openrouter else None
        if cost is not None:
            return cost, "usage"
        if pt is None or ct is None:
            return 0.0, "none"
        if self.is_openrouter and self.catalog is not None:
            for model in (served, self.spec.model):
                price = self.catalog.price_per_token(model) if model else None
                cost = as_cost(pt * price[0] + ct * price[1]) if price else None
                if cost is not None:
                    return cost, "catalog"
        if isinstance(self.spec, OpenAICompatibleWorker) and (self.spec.price_in_per_mtok or self.spec.price_out_per_mtok):
            cost = as_cost((pt * self.spec.price_in_per_mtok + ct * self.spec.price_out_per_mtok) / 1e6)
            if cost is not None:
                return cost, "configured"
        return 0.0, "none"

    async def aclose(self) -> None:
        if self._own_pool:
            await self.pool.aclose()

    # ------------------------------------------------------------------ relayed streams (serve)

    async def open_stream(self, messages: list[dict], params: dict | None = None) -> UpstreamStream:
        """Start a streamed call and return once its first content has arrived, for a server that
        relays the stream and falls back to another worker when this fails before that. A stream
        that ends without content is an empty answer, failed by the same rule as a plain reply
        (`replies.empty_answer`). Failures before the first content are retried like `complete()`
        (the same policy) and then raised as WorkerCallError / FatalWorkerError. After that only
        `read_timeout_s` bounds each wait. Always `await stream.aclose()`."""
        key = self._key()
        body = {**self._body(messages, params), "stream": True}
        if not self.is_openrouter:
            body["stream_options"] = {"include_usage": True}
        headers = {**self._headers(key), "Accept": "text/event-stream"}
        done = await with_retries(lambda: self._open_attempt(body, headers, key), self.policy, where=self._where,
                                  waiting_for="no first chunk")
        stream = done.value
        stream.attempts, stream.ttft_s = done.attempts, done.elapsed_s
        return stream

    async def _open_attempt(self, body: dict, headers: dict, key: str | None) -> UpstreamStream:
        http = self.pool.get(self.spec.base_url)
        r, ok = None, False
        try:
            r = await http.send(http.build_request("POST", self.url, json=body, headers=headers), stream=True)
            if r.status_code != 200:
                self.errors.raise_status(r.status_code, r.headers, await read_error_text(r), key)
            if "text/event-stream" in r.headers.get("content-type", ""):
                stream = UpstreamStream(self.errors, self._cost, r, key, max_tokens=body.get("max_tokens"),
                                        max_bytes=self.config.max_reply_bytes)
            else:  # the server ignored `stream`: relay its whole JSON reply as one chunk
                data = json_object(await read_capped(r, self.config.max_reply_bytes, self._where), "an HTTP 200 reply")
                comp = self._from_json(data, key)
                delta = {"role": "assistant", "content": comp.answer}
                if comp.tool_calls:
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(comp.tool_calls)]
                chunk = {"model": comp.served_model, "usage": data.get("usage"), "choices": [
                    {"index": 0, "delta": delta, "finish_reason": comp.finish_reason}]}
                stream = UpstreamStream(self.errors, self._cost, r, key, chunks=[chunk])
                stream.served_model, stream.usage, stream.finish_reason = comp.served_model, data.get("usage"), comp.finish_reason
            await stream.first()
            ok = True
            return stream
        except (httpx.TimeoutException, httpx.TransportError, httpx.StreamError, httpx.DecodingError) as exc:
            raise self._transport_errors(exc, key) from None
        finally:
            if r is not None and not ok:
                await r.aclose()


def make_http_client(spec: OpenRouterWorker | OpenAICompatibleWorker, config: WorkersConfig,
                     catalog: "CatalogSnapshot | None" = None, **kwargs) -> HTTPWorkerClient:
    """The HTTP client for one `openrouter` or `openai_compatible` worker. Keyword arguments go
    to `HTTPWorkerClient` (`pool`, `stream`, `api_key`, `backoff_s`, `max_backoff_s`)."""
    if spec.kind not in ("openrouter", "openai_compatible"):
        raise ValueError(f"worker {spec.id}: kind {spec.kind!r} is not an HTTP worker")
    return HTTPWorkerClient(spec, config, catalog=catalog, **kwargs)
