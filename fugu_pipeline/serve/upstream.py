"""The serving side of the workers: one client per configured worker, sharing one connection
pool, with each worker's concurrency and rate limits."""

from __future__ import annotations

import asyncio
from typing import Any

from fugu_pipeline.serve.protocol import content_text
from fugu_pipeline.workers.budget import RateLimiter
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import Completion


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


class Workers:
    """One client per configured worker (HTTP clients share one connection pool), with each
    worker's concurrency and rate limits. Start and close inside the serving event loop."""

    def __init__(self, config: WorkersConfig, attempts: int | None):
        self.config = config.model_copy(update={"max_attempts": attempts}) if attempts else config
        self.specs = {w.id: w for w in self.config.workers}
        self.clients: dict[str, Any] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._limits: dict[str, RateLimiter] = {}
        self._pool = None

    async def start(self) -> None:
        from fugu_pipeline.workers.factory import make_client
        from fugu_pipeline.workers.http import UpstreamPool, make_http_client

        self._pool = UpstreamPool(self.config)
        for wid, spec in self.specs.items():
            self.clients[wid] = (make_client(spec, self.config) if spec.kind == "mock"
                                 else make_http_client(spec, self.config, pool=self._pool, stream=False))
            self._slots[wid] = asyncio.Semaphore(spec.max_concurrency)
            self._limits[wid] = RateLimiter(spec.requests_per_minute)

    async def close(self) -> None:
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

    async def complete(self, wid: str, messages: list[dict], params: dict) -> Completion:
        client, msgs = self.clients[wid], self._messages(wid, messages)
        async with self._slots[wid]:
            await self._limits[wid].wait()
            if self.specs[wid].kind == "mock":
                return await client.complete(msgs)
            return await client.complete(msgs, params=params)

    async def open_stream(self, wid: str, messages: list[dict], params: dict):
        """An open stream whose first chunk has arrived. Holds the worker's concurrency slot
        until `release(wid)`, which the caller must call (also when this raises: it does not)."""
        client, msgs = self.clients[wid], self._messages(wid, messages)
        await self._slots[wid].acquire()
        try:
            await self._limits[wid].wait()
            if self.specs[wid].kind == "mock":
                return CompletionStream(await client.complete(msgs))
            return await client.open_stream(msgs, params)
        except BaseException:
            self._slots[wid].release()
            raise

    def release(self, wid: str) -> None:
        self._slots[wid].release()
