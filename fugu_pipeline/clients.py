"""HTTP workers: OpenRouter and any OpenAI-compatible server (vLLM, llama.cpp, Ollama, ...).

`make_http_client(spec, config)` gives an object with `async complete(messages) -> Completion`.

Behaviour (DESIGN §6):
- One `httpx.AsyncClient` per upstream base URL (`UpstreamPool`; pass one pool to share
  connections between workers). `connect_timeout_s` bounds connecting, `read_timeout_s` bounds
  the wait for each byte, and `timeout_s` is the overall deadline of one `complete()` call,
  retries and their waits included: no cell ever takes longer than `timeout_s`.
- Retries only connection errors, timeouts, 408, 429 and 5xx, and the same codes when they come
  inside an HTTP 200 body; also a malformed or choice-less 200 reply and an empty answer (both
  transient provider glitches in practice). An empty answer that ended on `length` or
  `content_filter` is not retried: the same request would end the same way. Waits honour
  `Retry-After` (seconds or HTTP date), otherwise jittered exponential backoff, up to
  `max_attempts` attempts.
- 401, 402 and 403 raise `FatalWorkerError` with what to fix; every later call would fail the
  same way. A 403 that OpenRouter's moderation raised for one input (its body lists the flagged
  reasons) fails only that cell.
- Requests stream (`stream: true`) so the time to first token is measured; the answer is still
  returned whole. Pass `stream=False` for servers that cannot stream (ttft is then None).
  `latency_s` and `ttft_s` count from the start of the call, retries and their waits included:
  what a caller waited. `attempts` says how many tries it took.
- OpenRouter-only fields (`usage`, `provider`, `reasoning`, attribution headers) go only to
  `kind: openrouter` workers.
- Cost: OpenRouter's `usage.cost` ("usage"); else catalog price x tokens ("catalog"); else the
  configured per-million-token prices of an openai_compatible worker ("configured"); else 0
  ("none").
- The API key is read from the environment variable `spec.api_key_env` at call time and sent
  only as an `Authorization` header. Error messages are scrubbed of it and of anything shaped
  like a key, so exceptions and logs are safe to print and store.

Plain Python, no dagster.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from fugu_pipeline.worker_config import OpenAICompatibleWorker, OpenRouterWorker, WorkersConfig
from fugu_pipeline.workers import Completion, FatalWorkerError, WorkerCallError

if TYPE_CHECKING:
    from fugu_pipeline.catalog import CatalogSnapshot
    from fugu_pipeline.schemas import Task

APP_TITLE = "fugu-lite"
RETRYABLE_CODES = {"server_error", "rate_limit_exceeded", "rate_limited", "timeout", "overloaded",
                   "service_unavailable", "bad_gateway", "internal_error"}
NO_RETRY_FINISH = {"length", "content_filter"}

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


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if dt is None:
        return None
    return max(0.0, dt.timestamp() - (time.time() if now is None else now))


class _Retry(Exception):
    """One attempt failed in a way that another attempt may fix."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class UpstreamPool:
    """One `httpx.AsyncClient` per upstream base URL, with the config's deadlines. Use it inside
    one event loop; close it with `aclose()`."""

    def __init__(self, config: WorkersConfig):
        self.timeout = httpx.Timeout(
            connect=config.connect_timeout_s, read=config.read_timeout_s,
            write=config.read_timeout_s, pool=config.timeout_s,
        )
        self.limits = httpx.Limits(max_connections=512, max_keepalive_connections=128, keepalive_expiry=30.0)
        self._clients: dict[str, httpx.AsyncClient] = {}

    def get(self, base_url: str) -> httpx.AsyncClient:
        key = base_url.rstrip("/")
        http = self._clients.get(key)
        if http is None or http.is_closed:
            http = self._clients[key] = httpx.AsyncClient(timeout=self.timeout, limits=self.limits)
        return http

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for http in clients:
            await http.aclose()


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
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.is_openrouter = spec.kind == "openrouter"
        self.url = spec.base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._own_pool = pool is None
        self.pool = pool or UpstreamPool(config)
        self._where = f"worker {spec.id}, model {spec.model} at {urlsplit(spec.base_url).netloc or spec.base_url}"

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
            if os.environ.get("FUGU_APP_URL"):
                h["HTTP-Referer"] = os.environ["FUGU_APP_URL"]
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

    # ------------------------------------------------------------------ call

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None, *,
                       params: dict | None = None) -> Completion:
        """`params` (e.g. temperature, max_tokens from a server's client) override the spec's."""
        key = self._key()
        body, headers = self._body(messages, params), self._headers(key)
        timeout = self.config.timeout_s
        t0 = time.monotonic()
        attempt = 0
        retried: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    attempt += 1
                    t_attempt = time.monotonic()
                    try:
                        comp = await self._attempt(body, headers, key, t0)
                    except _Retry as r:
                        retried.append(str(r))
                        if attempt >= self.config.max_attempts:
                            raise WorkerCallError(
                                f"{r} ({self._where}; gave up after {attempt} attempts)",
                                attempts=attempt, status=r.status) from None
                        delay = self._delay(attempt, r.retry_after)
                        left = timeout - (time.monotonic() - t0)
                        if delay >= left:
                            raise WorkerCallError(
                                f"{r} ({self._where}; the next attempt would start after the "
                                f"overall deadline of {timeout:g}s, timeout_s)", attempts=attempt, status=r.status,
                            ) from None
                        await asyncio.sleep(delay)
                        continue
                    except WorkerCallError as exc:
                        exc.attempts = attempt
                        raise
                    comp.attempts = attempt
                    comp.latency_s = time.monotonic() - t0
                    comp.extra = {"attempt_latency_s": round(time.monotonic() - t_attempt, 4)}
                    if retried:
                        comp.extra["retried"] = retried[-5:]
                    return comp
        except TimeoutError:
            last = f"; last error: {retried[-1]}" if retried else ""
            raise WorkerCallError(
                f"deadline: no answer within timeout_s={timeout:g}s after {attempt} attempt(s) "
                f"({self._where}){last}", attempts=attempt) from None

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after + random.uniform(0.0, min(1.0, 0.1 * retry_after))
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)

    async def _attempt(self, body: dict, headers: dict, key: str | None, t0: float) -> Completion:
        http = self.pool.get(self.spec.base_url)
        try:
            if not self.stream:
                r = await http.post(self.url, json=body, headers=headers)
                if r.status_code != 200:
                    self._raise_status(r.status_code, r.headers, r.text, key)
                return self._from_json(self._json(r.content), key)
            async with http.stream("POST", self.url, json=body, headers=headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    self._raise_status(r.status_code, r.headers, text, key)
                if "text/event-stream" not in r.headers.get("content-type", ""):
                    return self._from_json(self._json(await r.aread()), key)  # server ignored stream
                return await self._from_stream(r, key, t0)
        except httpx.TimeoutException as exc:
            raise _Retry(f"{type(exc).__name__} (connect {self.config.connect_timeout_s:g}s, "
                         f"read {self.config.read_timeout_s:g}s)") from None
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _Retry(f"connection error: {type(exc).__name__}: {scrub_secrets(str(exc), key)}"[:300]) from None

    @staticmethod
    def _json(raw: bytes) -> dict:
        return _json_object(raw, "an HTTP 200 reply")

    # ------------------------------------------------------------------ errors

    def _raise_status(self, status: int, headers: httpx.Headers | dict, text: str, key: str | None,
                      *, in_body: bool = False) -> None:
        detail, metadata = _error_detail(text)
        detail = scrub_secrets(detail, key)[:300]
        where = f"{'error inside an HTTP 200 reply, code' if in_body else 'HTTP'} {status}"
        who = f"({self._where})"
        env = self.spec.api_key_env or "the api_key_env of this worker"
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
                f"{where} forbidden: this key may not use model {self.spec.model!r} (check the model id, "
                f"the key's allowed models/providers, or a moderation block) {who}. Upstream said: {detail}", status=403)
        if status in (408, 429) or status >= 500:
            ra = parse_retry_after(headers.get("retry-after") if headers else None)
            raise _Retry(f"{'code' if in_body else 'HTTP'} {status}: {detail}", status=status, retry_after=ra)
        hint = " (check the model id)" if status == 404 else ""
        raise WorkerCallError(f"{where}: {detail}{hint} {who}", status=status)

    def _raise_embedded(self, err: object, key: str | None) -> None:
        """An `{"error": ...}` object inside an HTTP 200 body or stream chunk."""
        code = err.get("code") if isinstance(err, dict) else None
        text = json.dumps({"error": err})
        try:
            status = int(code)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            status = None
        if status is not None and 100 <= status <= 599:
            self._raise_status(status, {}, text, key, in_body=True)
        detail = scrub_secrets(_error_detail(text)[0], key)[:300]
        if code is None or str(code).lower() in RETRYABLE_CODES:
            raise _Retry(f"error inside an HTTP 200 reply ({code or 'no code'}): {detail}")
        raise WorkerCallError(f"error inside an HTTP 200 reply ({code}): {detail} ({self._where})")

    # ------------------------------------------------------------------ replies

    def _from_json(self, data: dict, key: str | None) -> Completion:
        if data.get("error"):
            self._raise_embedded(data["error"], key)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _Retry("an HTTP 200 reply with no choices")
        c = choices[0]
        if c.get("error"):
            self._raise_embedded(c["error"], key)
        msg = c.get("message") or {}
        return self._finish(_text(msg.get("content")), c.get("finish_reason"), data, data.get("usage"), None)

    async def _from_stream(self, r: httpx.Response, key: str | None, t0: float) -> Completion:
        parts: list[str] = []
        ttft = None
        finish = None
        usage = None
        meta: dict = {}
        saw_chunk = False
        done = False
        async for line in r.aiter_lines():  # read to the end, so the connection goes back to the pool
            chunk = None if done else sse_chunk(line)
            if chunk is None:
                continue
            if chunk is SSE_DONE:
                done = True
                continue
            if chunk.get("error"):
                self._raise_embedded(chunk["error"], key)
            saw_chunk = True
            for k in ("model", "provider", "id"):
                if chunk.get(k):
                    meta[k] = chunk[k]
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices") or []:
                if c.get("error"):
                    self._raise_embedded(c["error"], key)
                piece = _text((c.get("delta") or {}).get("content"))
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    parts.append(piece)
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
        if not saw_chunk:
            raise _Retry("an HTTP 200 reply stream with no chunks")
        if finish == "error":
            raise _Retry("the upstream ended the stream with finish_reason=error")
        return self._finish("".join(parts), finish, meta, usage, ttft)

    def _finish(self, answer: str, finish: str | None, data: dict, usage: dict | None, ttft: float | None) -> Completion:
        if not answer.strip():
            if finish in NO_RETRY_FINISH:
                hint = f"; raise max_tokens (now {self.spec.max_tokens})" if finish == "length" else ""
                raise WorkerCallError(f"empty answer (finish_reason={finish}){hint} ({self._where})")
            raise _Retry(f"empty answer (finish_reason={finish})")
        usage = usage if isinstance(usage, dict) else {}
        pt, ct = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        served = data.get("model") or None
        cost, source = self._cost(usage, pt, ct, served)
        return Completion(
            answer=answer, cost_usd=cost, cost_source=source, ttft_s=ttft, prompt_tokens=pt,
            completion_tokens=ct, finish_reason=finish, requested_model=self.spec.model, served_model=served,
            provider=data.get("provider") if self.is_openrouter else None,
        )

    def _cost(self, usage: dict, pt: int | None, ct: int | None, served: str | None) -> tuple[float, str]:
        if self.is_openrouter and isinstance(usage.get("cost"), (int, float)):
            return float(usage["cost"]), "usage"
        if pt is None or ct is None:
            return 0.0, "none"
        if self.is_openrouter and self.catalog is not None:
            for model in (served, self.spec.model):
                price = self.catalog.price_per_token(model) if model else None
                if price:
                    return pt * price[0] + ct * price[1], "catalog"
        if isinstance(self.spec, OpenAICompatibleWorker) and (self.spec.price_in_per_mtok or self.spec.price_out_per_mtok):
            return (pt * self.spec.price_in_per_mtok + ct * self.spec.price_out_per_mtok) / 1e6, "configured"
        return 0.0, "none"

    async def aclose(self) -> None:
        if self._own_pool:
            await self.pool.aclose()

    # ------------------------------------------------------------------ relayed streams (serve)

    async def open_stream(self, messages: list[dict], params: dict | None = None) -> "UpstreamStream":
        """Start a streamed call and return once its first chunk has arrived, for a server that
        relays the stream and falls back to another worker when this fails before that. Failures
        before the first chunk are retried like `complete()` (same codes, backoff, `max_attempts`,
        overall deadline `timeout_s`) and then raised as WorkerCallError / FatalWorkerError. After
        the first chunk only `read_timeout_s` bounds each wait. Always `await stream.aclose()`."""
        key = self._key()
        body = {**self._body(messages, params), "stream": True}
        if not self.is_openrouter:
            body["stream_options"] = {"include_usage": True}
        headers = {**self._headers(key), "Accept": "text/event-stream"}
        timeout, t0, attempt = self.config.timeout_s, time.monotonic(), 0
        retried: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    attempt += 1
                    try:
                        stream = await self._open_attempt(body, headers, key)
                    except _Retry as r:
                        retried.append(str(r))
                        if attempt >= self.config.max_attempts:
                            raise WorkerCallError(f"{r} ({self._where}; gave up after {attempt} attempts)",
                                                  attempts=attempt, status=r.status) from None
                        delay = self._delay(attempt, r.retry_after)
                        if delay >= timeout - (time.monotonic() - t0):
                            raise WorkerCallError(
                                f"{r} ({self._where}; the next attempt would start after the overall "
                                f"deadline of {timeout:g}s, timeout_s)", attempts=attempt, status=r.status) from None
                        await asyncio.sleep(delay)
                        continue
                    except WorkerCallError as exc:
                        exc.attempts = attempt
                        raise
                    stream.attempts, stream.ttft_s = attempt, time.monotonic() - t0
                    return stream
        except TimeoutError:
            last = f"; last error: {retried[-1]}" if retried else ""
            raise WorkerCallError(f"deadline: no first chunk within timeout_s={timeout:g}s after {attempt} "
                                  f"attempt(s) ({self._where}){last}", attempts=attempt) from None

    async def _open_attempt(self, body: dict, headers: dict, key: str | None) -> "UpstreamStream":
        http = self.pool.get(self.spec.base_url)
        r, ok = None, False
        try:
            r = await http.send(http.build_request("POST", self.url, json=body, headers=headers), stream=True)
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                self._raise_status(r.status_code, r.headers, text, key)
            if "text/event-stream" in r.headers.get("content-type", ""):
                stream = UpstreamStream(self, r, key)
            else:  # the server ignored `stream`: relay its whole JSON reply as one chunk
                data = self._json(await r.aread())
                comp = self._from_json(data, key)
                chunk = {"model": comp.served_model, "usage": data.get("usage"), "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": comp.answer},
                     "finish_reason": comp.finish_reason}]}
                stream = UpstreamStream(self, r, key, chunks=[chunk])
                stream.served_model, stream.usage, stream.finish_reason = comp.served_model, data.get("usage"), comp.finish_reason
            await stream.first()
            ok = True
            return stream
        except httpx.TimeoutException as exc:
            raise _Retry(f"{type(exc).__name__} (connect {self.config.connect_timeout_s:g}s, "
                         f"read {self.config.read_timeout_s:g}s)") from None
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _Retry(f"connection error: {type(exc).__name__}: {scrub_secrets(str(exc), key)}"[:300]) from None
        finally:
            if r is not None and not ok:
                await r.aclose()


class UpstreamStream:
    """One worker's open reply stream whose first chunk has arrived (`HTTPWorkerClient.open_stream`).
    `async for chunk in stream` yields the parsed `chat.completion.chunk` dicts, the first included;
    an error after the first chunk raises WorkerCallError. `served_model`, `usage`, `finish_reason`
    and `cost()` are filled in as chunks pass."""

    def __init__(self, client: HTTPWorkerClient, response: httpx.Response, key: str | None,
                 chunks: list[dict] | None = None):
        self.client, self.response, self._key = client, response, key
        self._lines = response.aiter_lines() if chunks is None else None
        self._buffer = list(chunks or [])
        self.served_model: str | None = None
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.attempts, self.ttft_s = 1, None

    async def first(self) -> dict:
        chunk = await self._next()
        if chunk is None:
            raise _Retry("an HTTP 200 reply stream with no chunks")
        self._buffer.insert(0, chunk)
        return chunk

    async def _next(self) -> dict | None:
        """The next chunk, None at the end. Raises _Retry or WorkerCallError on an error chunk."""
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
            if chunk is SSE_DONE:
                async for _ in self._lines:  # read to the end, so the connection goes back to the pool
                    pass
                break
            if chunk.get("error"):
                self.client._raise_embedded(chunk["error"], self._key)
            for c in chunk.get("choices") or []:
                if c.get("error"):
                    self.client._raise_embedded(c["error"], self._key)
                if c.get("finish_reason") == "error":
                    raise _Retry("the upstream ended the stream with finish_reason=error")
                self.finish_reason = c.get("finish_reason") or self.finish_reason
            self.served_model = chunk.get("model") or self.served_model
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            return chunk
        self._lines = None
        return None

    async def __aiter__(self):
        while True:
            try:
                chunk = await self._next()
            except _Retry as r:
                raise WorkerCallError(f"{r} ({self.client._where}; after the stream had started)") from None
            except (httpx.TimeoutException, httpx.TransportError, httpx.StreamError) as exc:
                raise WorkerCallError(f"stream broke after it had started: {type(exc).__name__} "
                                      f"({self.client._where})") from None
            if chunk is None:
                return
            yield chunk

    def cost(self) -> tuple[float, str]:
        """(USD, source) from the usage seen so far, as `complete()` computes it."""
        usage = self.usage if isinstance(self.usage, dict) else {}
        pt, ct = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        return self.client._cost(usage, pt, ct, self.served_model)

    async def aclose(self) -> None:
        await self.response.aclose()


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
    return _json_object(payload, "a reply stream chunk")


def _json_object(raw: str | bytes, what: str) -> dict:
    """A JSON object, or a retryable error naming what was malformed (provider glitches pass)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise _Retry(f"malformed JSON in {what}") from None
    if not isinstance(data, dict):
        raise _Retry(f"{what} that is not a JSON object")
    return data


def _text(content: object) -> str:
    """Message content as text: a string, or a list of `{"type": "text", "text": ...}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _error_detail(text: str) -> tuple[str, object]:
    """(message, metadata) from an OpenAI/OpenRouter error body, or the start of the raw text."""
    try:
        data = json.loads(text)
    except ValueError:
        return (text.strip()[:300] or "(empty body)"), None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        msg = str(err.get("message") or err.get("code") or err)
        raw = (err.get("metadata") or {}).get("raw") if isinstance(err.get("metadata"), dict) else None
        if raw and isinstance(raw, str) and raw not in msg:
            msg += f" ({raw[:150]})"
        return msg, err.get("metadata")
    if isinstance(err, str):
        return err, None
    return text.strip()[:300], None


def make_http_client(spec: OpenRouterWorker | OpenAICompatibleWorker, config: WorkersConfig,
                     catalog: "CatalogSnapshot | None" = None, **kwargs) -> HTTPWorkerClient:
    """The HTTP client for one `openrouter` or `openai_compatible` worker. Keyword arguments go
    to `HTTPWorkerClient` (`pool`, `stream`, `api_key`, `backoff_s`, `max_backoff_s`)."""
    if spec.kind not in ("openrouter", "openai_compatible"):
        raise ValueError(f"worker {spec.id}: kind {spec.kind!r} is not an HTTP worker")
    return HTTPWorkerClient(spec, config, catalog=catalog, **kwargs)
