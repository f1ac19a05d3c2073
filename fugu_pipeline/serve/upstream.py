"""The serving side of the workers: one client per configured worker, sharing one connection
pool, with each worker's concurrency and rate limits, all on the worker loop.

The worker loop. Every worker call runs on an event loop of its own, in its own thread
(`WorkerLoop`), not on the loop that serves HTTP. That is what lets the server measure a call
right: under load the serving loop is busy parsing requests and writing replies, and a reply that
has arrived waits there until the loop gets to it; timed on the serving loop, that queueing
counted as the worker's time. On the worker loop a call is timed from the request being handed to
the client to the reply having been read (`CallTiming.upstream_s`), the wait for the worker's
concurrency slot and rate limit separately (`CallTiming.queue_s`), and whatever passes between
the serving loop asking and getting the answer back is the router's own time.

The timings every reply reports (`fugu_lite`, milliseconds):
- `route_ms`: receipt to route decision (the wait for a routing batch and the encoder pass).
- `queue_ms`: waiting for a worker's concurrency slot (`max_concurrency`) or rate limit.
- `upstream_ms`: inside worker calls, every attempt, failed ones included: from handing the request
  to the worker's client to its reply having been read. For a stream: until its first content
  (first chunk), until its end (last chunk).
- `latency_ms`: the server's total, from receipt to the reply being ready (a stream: its first
  byte in the first chunk, its end in the last).
- `overhead_ms` = `latency_ms` - `upstream_ms`: everything the router adds: parsing, routing,
  `queue_ms`, the hand-over to the worker loop and back (where a busy server queues), and building
  the reply.

A relayed stream (`RelayedStream`) is read on the worker loop by a pump task that hands each chunk
to the serving loop, which wakes once for however many chunks have arrived.

Kept out, skipped. `Workers.admit` decides, before a call, whether a worker may take a request:
- a worker in a cooldown (`workers/health.py`: its key was refused, 401/402/403, for
  `cooldown_s`, `fugu-lite serve --auth-cooldown-s`, default 60 s; or it kept failing with
  timeouts, connection errors, 408, 429 or 5xx, or asked to wait with `Retry-After`, by the worker
  YAML's `cooldown:` block) is not called: `WorkerKeptOut`, which the app lists among the fallback
  errors. `/health` shows it, `Workers.health()` gives every worker's state (for metrics), and the
  first request after the cooldown calls it again;
- a worker that cannot take this request (tools without `supports_tools`, a prompt that does not
  fit its context window: `workers/limits.py`) is not called: `WorkerSkipped`, listed under the
  reply's `skipped`;
- a `max_tokens` over the worker's output limit, or over the room the prompt leaves in its
  context window, is lowered (`Admitted.note` says so).
`complete` and `open_stream` admit too, so cascades and multi-turn sessions, which call through
them, skip such a worker as a failed call and go on. Every call's outcome feeds the cooldowns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fugu_pipeline.tasks.messages import content_text
from fugu_pipeline.workers.budget import RateLimiter
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import Completion, WorkerCallError
from fugu_pipeline.workers.health import WorkerHealth, WorkerKeptOut
from fugu_pipeline.workers.limits import (
    TOOLS_UNSUPPORTED,
    WorkerSkipped,
    prompt_tokens_estimate,
    size_call,
    uses_tools,
    worker_limits,
)

log = logging.getLogger("fugu_pipeline.serve")

_END = object()
DEFAULT_AUTH_COOLDOWN_S = 60.0
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # what a mock worker is handed of the params


def project_catalog():
    """The project's latest catalog snapshot (`data/catalog/latest.json`, written by the
    `openrouter_catalog` asset), for the workers' context windows and output limits; None when
    there is none or it cannot be read (said in the log: the YAML's limits still apply)."""
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.workers.catalog import CatalogError, load_latest

    folder = ProjectPaths.from_env().catalog
    try:
        snap = load_latest(folder)
    except CatalogError as exc:
        log.warning("the catalog's context lengths are not used: %s", exc)
        return None
    if snap is None:
        log.info("no catalog in %s: context windows and output limits come from the worker YAML only", folder)
    return snap


@dataclass(frozen=True)
class Admitted:
    """A worker may take the request: send `params`; `note` says how they differ from the client's."""

    params: dict
    note: str | None = None
    asked: int | None = None  # the client's max_tokens


@dataclass
class CallTiming:
    """Where one worker call's time went, measured on the worker loop (seconds)."""

    queue_s: float = 0.0  # waiting for the worker's concurrency slot and rate limit
    upstream_s: float = 0.0  # inside the call: handed to the client .. reply read (all its attempts)


class WorkerLoop:
    """An event loop running in its own daemon thread; `await loop.run(coro)` from another loop."""

    def __init__(self, name: str = "fugu-workers"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    async def run(self, coro, discard: Callable[[Any], Awaitable] | None = None):
        """`coro`'s result. Cancelling the caller (a client that left, shutdown) cancels `coro` on the
        worker loop, and with it its HTTP request. A result `coro` produced all the same, which
        nobody will read, goes to `discard` (a coroutine function, run on the worker loop), so an
        opened stream is closed however the two loops' timing falls."""
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the worker loop has stopped")
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def orphaned(result) -> None:  # any thread
            if discard is not None:
                self.loop.call_soon_threadsafe(lambda: self.loop.create_task(discard(result)))

        def done(task: asyncio.Task) -> None:  # worker loop
            if not fut.set_running_or_notify_cancel():  # the caller was cancelled first
                if not task.cancelled() and task.exception() is None:
                    orphaned(task.result())
            elif task.cancelled():
                fut.set_exception(concurrent.futures.CancelledError())
            elif task.exception() is not None:
                fut.set_exception(task.exception())
            else:
                fut.set_result(task.result())

        def start() -> None:  # worker loop
            task = self.loop.create_task(coro)
            task.add_done_callback(done)
            fut.add_done_callback(lambda f: f.cancelled() and self.loop.call_soon_threadsafe(task.cancel))

        self.loop.call_soon_threadsafe(start)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            if not fut.cancel():  # too late: the result is set, or being set
                fut.add_done_callback(lambda f: f.exception() is None and orphaned(f.result()))
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class CompletionStream:
    """A whole Completion (e.g. from a mock worker) served as a stream of chunks."""

    def __init__(self, comp: Completion):
        self.served_model = comp.served_model or comp.requested_model
        self.finish_reason = comp.finish_reason or "stop"
        self.usage = usage_of(comp)
        self.attempts, self.ttft_s = comp.attempts, comp.latency_s
        self._comp = comp

    async def __aiter__(self):
        delta: dict = {"content": self._comp.answer}
        if self._comp.tool_calls:  # one delta holding each whole call, as OpenAI streams them (by index)
            delta = {"content": self._comp.answer or None,
                     "tool_calls": [{"index": i, **c} for i, c in enumerate(self._comp.tool_calls)]}
        yield {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason}]}

    def cost(self) -> tuple[float, str]:
        return self._comp.cost_usd, self._comp.cost_source

    async def aclose(self) -> None:
        return None


def usage_of(comp: Completion) -> dict | None:
    if comp.prompt_tokens is None and comp.completion_tokens is None:
        return None
    pt, ct = comp.prompt_tokens or 0, comp.completion_tokens or 0
    return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}


class RelayedStream:
    """A worker's open stream (its first chunk with content has arrived), read on the worker loop
    and iterated on the serving loop: `async for chunk in stream`, then always `await aclose()`,
    which also frees the worker's concurrency slot. `timing.upstream_s` grows as the rest is read."""

    def __init__(self, workers: "Workers", wid: str, stream, timing: CallTiming, serving_loop):
        self._workers, self._wid, self._stream, self.timing = workers, wid, stream, timing
        self._serving = serving_loop
        self._queue: asyncio.Queue = asyncio.Queue()  # used on the serving loop only
        self._pump: asyncio.Task | None = None
        self._closed = False

    # the inner stream's figures, complete once iteration has ended
    served_model = property(lambda self: self._stream.served_model)
    usage = property(lambda self: self._stream.usage)
    finish_reason = property(lambda self: self._stream.finish_reason)

    def cost(self) -> tuple[float, str]:
        return self._stream.cost()

    def _start(self) -> None:  # worker loop
        self._pump = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:  # worker loop
        t = time.perf_counter()
        item: Any = _END
        try:
            async for chunk in self._stream:
                self._serving.call_soon_threadsafe(self._queue.put_nowait, chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # WorkerCallError after the stream had started, or a bug
            item = exc
            if isinstance(exc, WorkerCallError):
                self._workers.tracker.failed(self._wid, exc)
        finally:
            self.timing.upstream_s += time.perf_counter() - t
        self._serving.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self):  # serving loop
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def interrupt(self, exc: BaseException) -> None:  # serving loop
        """End the iteration early: it raises `exc` after the chunks that have already arrived."""
        self._queue.put_nowait(exc)

    async def aclose(self) -> None:  # serving loop
        if self._closed:
            return
        self._closed = True
        try:
            await self._workers.loop.run(self._close())
        except RuntimeError:  # the worker loop has already stopped (server shutdown)
            pass

    async def _close(self) -> None:  # worker loop
        try:
            if self._pump is not None and not self._pump.done():
                self._pump.cancel()
                await asyncio.gather(self._pump, return_exceptions=True)
            await self._stream.aclose()
        finally:
            self._workers._slots[self._wid].release()


class Workers:
    """One client per configured worker (HTTP clients share one connection pool), with each
    worker's concurrency and rate limits, all on the worker loop, its limits (`workers/limits.py`,
    from its YAML or `catalog`) and its health (`tracker`, `workers/health.py`; its `clock` and
    `wall` may be replaced, as tests do). `start()` and `close()` from the serving loop (the app's
    lifespan)."""

    def __init__(self, config: WorkersConfig, attempts: int | None, cooldown_s: float = DEFAULT_AUTH_COOLDOWN_S,
                 catalog=None):
        self.config = config.model_copy(update={"max_attempts": attempts}) if attempts else config
        self.cooldown_s = cooldown_s
        self.tracker = WorkerHealth(self.config.cooldown, cooldown_s)
        self.specs = {w.id: w for w in self.config.workers}
        self.limits = {wid: worker_limits(spec, catalog) for wid, spec in self.specs.items()}
        self.clients: dict[str, Any] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._limits: dict[str, RateLimiter] = {}
        self._pool = None
        self.loop: WorkerLoop | None = None

    async def start(self) -> None:
        self.loop = WorkerLoop()
        await self.loop.run(self._start())

    async def _start(self) -> None:  # worker loop
        from fugu_pipeline.workers.factory import make_client
        from fugu_pipeline.workers.http import UpstreamPool, make_http_client

        self._pool = UpstreamPool(self.config)
        for wid, spec in self.specs.items():
            self.clients[wid] = (make_client(spec, self.config) if spec.kind == "mock"
                                 else make_http_client(spec, self.config, pool=self._pool, stream=False))
            self._slots[wid] = asyncio.Semaphore(spec.max_concurrency)
            self._limits[wid] = RateLimiter(spec.requests_per_minute)

    async def close(self) -> None:
        if self.loop is None:
            return
        try:
            await self.loop.run(self._close())
        finally:
            self.loop.stop()

    async def _close(self) -> None:  # worker loop
        for client in self.clients.values():
            await client.aclose()
        if self._pool is not None:
            await self._pool.aclose()

    def _messages(self, wid: str, messages: list[dict]) -> list[dict]:
        spec = self.specs[wid]
        if spec.kind == "mock":  # the mock pool reads plain-text content
            messages = [{"role": m["role"], "content": content_text(m.get("content"))} for m in messages]
        if spec.system_prompt and not any(m.get("role") in ("system", "developer") for m in messages):
            messages = [{"role": "system", "content": spec.system_prompt}, *messages]
        return messages

    def kept_out_error(self, wid: str) -> WorkerKeptOut | None:
        """Why `wid` is not to be called now (a cooldown: `workers/health.py`), else None."""
        return self.tracker.blocked(wid)

    def kept_out_info(self, wid: str, detail: bool) -> dict | None:
        """`/health`'s `kept_out` of a worker: status, seconds left, until when (and why, with `detail`)."""
        h = self.tracker.state(wid)
        if h["until"] is None:
            return None
        return {"status": h["status"], "seconds_left": h["seconds_left"], "until": h["until"], "state": h["state"],
                **({"reason": h["reason"]} if detail else {})}

    def health(self) -> dict[str, dict]:
        """{worker id: {state, until, seconds_left, consecutive_failures, status, reason, cooldowns}}
        for every configured worker (`WorkerHealth.state`): what `/health` and metrics read."""
        return self.tracker.snapshot(self.specs)

    def admit(self, wid: str, messages: list[dict], params: dict, prompt_tokens: int | None = None) -> Admitted:
        """The params to call `wid` with for this request, or WorkerSkipped (it cannot take it: tools,
        context window) or WorkerKeptOut (a cooldown), checked in that order: a worker that could
        not take the request anyway is reported as skipped, not as failing. `prompt_tokens`: the
        request's estimate, when the caller has it (`workers/limits.py`)."""
        lim = self.limits[wid]
        if not lim.supports_tools and uses_tools(messages, params):
            raise WorkerSkipped("does not support tools (its worker YAML has no supports_tools: true)", TOOLS_UNSUPPORTED)
        if prompt_tokens is None:
            prompt_tokens = prompt_tokens_estimate(messages, params.get("tools"))
        system = self.specs[wid].system_prompt
        if system and not any(m.get("role") in ("system", "developer") for m in messages):  # `_messages` adds it
            prompt_tokens += prompt_tokens_estimate([{"role": "system", "content": system}])
        asked = params.get("max_tokens")
        sized = size_call(lim, prompt_tokens, asked)
        if (kept := self.tracker.blocked(wid)) is not None:
            raise kept
        if sized.max_tokens is None or sized.max_tokens == asked:
            return Admitted(params, sized.note, asked)
        return Admitted({**params, "max_tokens": sized.max_tokens}, sized.note, asked)

    async def complete(self, wid: str, messages: list[dict], params: dict, timing: CallTiming,
                       prompt_tokens: int | None = None) -> Completion:
        """One plain call on the worker loop; `timing` is filled in, also when it raises.
        WorkerSkipped or WorkerKeptOut, without a call, when `admit` refuses; `params` as it admits
        them (`prompt_tokens`: the request's estimate, when the caller has it)."""
        admitted = self.admit(wid, messages, params, prompt_tokens)
        return await self.loop.run(self._complete(wid, messages, admitted.params, timing))

    async def _call(self, wid: str, msgs: list[dict], params: dict) -> Completion:  # worker loop
        if self.specs[wid].kind == "mock":  # the mock reads only the tool fields (`mock_tools.py`)
            return await self.clients[wid].complete(msgs, params={k: params[k] for k in TOOL_FIELDS if k in params})
        return await self.clients[wid].complete(msgs, params=params)

    async def _complete(self, wid: str, messages: list[dict], params: dict, timing: CallTiming) -> Completion:
        msgs = self._messages(wid, messages)
        t0 = time.perf_counter()
        async with self._slots[wid]:
            await self._limits[wid].wait()
            t1 = time.perf_counter()
            timing.queue_s += t1 - t0
            try:
                comp = await self._call(wid, msgs, params)
            except WorkerCallError as exc:
                self.tracker.failed(wid, exc)
                raise
            finally:
                timing.upstream_s += time.perf_counter() - t1
            self.tracker.succeeded(wid)
            return comp

    async def open_stream(self, wid: str, messages: list[dict], params: dict, timing: CallTiming,
                          prompt_tokens: int | None = None) -> RelayedStream:
        """An open stream whose first chunk with content has arrived. It holds the worker's
        concurrency slot until `await stream.aclose()`, which the caller must call; when this
        raises, nothing is held. Refused without a call as `complete` is."""
        admitted = self.admit(wid, messages, params, prompt_tokens)
        serving = asyncio.get_running_loop()
        return await self.loop.run(self._open(wid, messages, admitted.params, timing, serving),
                                   discard=RelayedStream._close)

    async def _open(self, wid: str, messages: list[dict], params: dict, timing: CallTiming, serving) -> RelayedStream:
        client, msgs = self.clients[wid], self._messages(wid, messages)
        t0 = time.perf_counter()
        await self._slots[wid].acquire()
        t1 = None
        try:
            await self._limits[wid].wait()
            t1 = time.perf_counter()
            timing.queue_s += t1 - t0
            if self.specs[wid].kind == "mock":
                inner = CompletionStream(await self._call(wid, msgs, params))
            else:
                inner = await client.open_stream(msgs, params)
        except BaseException as exc:
            self._slots[wid].release()
            if isinstance(exc, WorkerCallError):
                self.tracker.failed(wid, exc)
            raise
        finally:
            if t1 is not None:
                timing.upstream_s += time.perf_counter() - t1
        self.tracker.succeeded(wid)
        relayed = RelayedStream(self, wid, inner, timing, serving)
        relayed._start()
        return relayed
