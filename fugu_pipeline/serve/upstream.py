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

Kept out. A worker whose key is refused (401 unauthorized, 402 out of credits, 403 forbidden for
this key or model: `FatalWorkerError`) would fail every request the same way, and every request
routed to it would wait for that answer before falling back. So it is kept out for `cooldown_s`
(`fugu-lite serve --auth-cooldown-s`, default 60 s): calls to it fail at once with
`WorkerKeptOut` (the app lists it among the fallback errors without calling it), `/health` shows
it under the worker's `kept_out`, and the first request after the cooldown calls it again.
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
from fugu_pipeline.workers.contract import Completion, FatalWorkerError, WorkerCallError

log = logging.getLogger("fugu_pipeline.serve")

_END = object()
DEFAULT_AUTH_COOLDOWN_S = 60.0


class WorkerKeptOut(WorkerCallError):
    """A call not made: the worker's key was refused lately and its cooldown has not run out."""


@dataclass
class KeptOut:
    status: int | None
    reason: str  # the worker's error (scrubbed of keys by its client)
    until: float  # time.monotonic()
    until_wall: float  # time.time(), for /health


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
        yield {"choices": [{"index": 0, "delta": {"content": self._comp.answer}, "finish_reason": None}]}
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
    worker's concurrency and rate limits, all on the worker loop. `start()` and `close()` from the
    serving loop (the app's lifespan)."""

    def __init__(self, config: WorkersConfig, attempts: int | None, cooldown_s: float = DEFAULT_AUTH_COOLDOWN_S):
        self.config = config.model_copy(update={"max_attempts": attempts}) if attempts else config
        self.cooldown_s = cooldown_s
        self.kept_out: dict[str, KeptOut] = {}  # worker id -> why and until when (read on both loops)
        self.specs = {w.id: w for w in self.config.workers}
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
        """Why `wid` is not to be called now (its key was refused within `cooldown_s`), else None."""
        k = self.kept_out.get(wid)
        left = None if k is None else k.until - time.monotonic()
        if left is None or left <= 0:
            return None
        return WorkerKeptOut(f"not called: it answered HTTP {k.status} {self.cooldown_s - left:.0f} s ago and is kept "
                             f"out for {left:.0f} s more ({k.reason})", status=k.status, attempts=0)

    def _keep_out(self, wid: str, exc: FatalWorkerError) -> None:  # worker loop
        if self.cooldown_s <= 0:
            return
        now = time.monotonic()
        if wid not in self.kept_out or self.kept_out[wid].until <= now:
            log.warning("worker %s answered HTTP %s: kept out for %g s (every request would fail the same way "
                        "before falling back): %s", wid, exc.status, self.cooldown_s, exc)
        self.kept_out[wid] = KeptOut(exc.status, str(exc), now + self.cooldown_s, time.time() + self.cooldown_s)

    def kept_out_info(self, wid: str, detail: bool) -> dict | None:
        """`/health`'s `kept_out` of a worker: status, seconds left, until when (and why, with `detail`)."""
        k = self.kept_out.get(wid)
        left = None if k is None else k.until - time.monotonic()
        if left is None or left <= 0:
            return None
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(k.until_wall))
        return {"status": k.status, "seconds_left": round(left, 1), "until": until, **({"reason": k.reason} if detail else {})}

    async def complete(self, wid: str, messages: list[dict], params: dict, timing: CallTiming) -> Completion:
        """One plain call on the worker loop; `timing` is filled in, also when it raises.
        WorkerKeptOut, without a call, while the worker is kept out."""
        if (kept := self.kept_out_error(wid)) is not None:
            raise kept
        return await self.loop.run(self._complete(wid, messages, params, timing))

    async def _complete(self, wid: str, messages: list[dict], params: dict, timing: CallTiming) -> Completion:
        client, msgs = self.clients[wid], self._messages(wid, messages)
        t0 = time.perf_counter()
        async with self._slots[wid]:
            await self._limits[wid].wait()
            t1 = time.perf_counter()
            timing.queue_s += t1 - t0
            try:
                if self.specs[wid].kind == "mock":
                    return await client.complete(msgs)
                return await client.complete(msgs, params=params)
            except FatalWorkerError as exc:
                self._keep_out(wid, exc)
                raise
            finally:
                timing.upstream_s += time.perf_counter() - t1

    async def open_stream(self, wid: str, messages: list[dict], params: dict, timing: CallTiming) -> RelayedStream:
        """An open stream whose first chunk with content has arrived. It holds the worker's
        concurrency slot until `await stream.aclose()`, which the caller must call; when this
        raises, nothing is held."""
        if (kept := self.kept_out_error(wid)) is not None:
            raise kept
        serving = asyncio.get_running_loop()
        return await self.loop.run(self._open(wid, messages, params, timing, serving), discard=RelayedStream._close)

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
                inner = CompletionStream(await client.complete(msgs))
            else:
                inner = await client.open_stream(msgs, params)
        except BaseException as exc:
            self._slots[wid].release()
            if isinstance(exc, FatalWorkerError):
                self._keep_out(wid, exc)
            raise
        finally:
            if t1 is not None:
                timing.upstream_s += time.perf_counter() - t1
        relayed = RelayedStream(self, wid, inner, timing, serving)
        relayed._start()
        return relayed
