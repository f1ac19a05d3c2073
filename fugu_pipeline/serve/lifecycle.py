"""How a reply ends early: the client disconnected (`ClientGone`), or the server's shutdown grace
period ran out (`ShuttingDown`, a 503 `server_shutting_down`)."""

from __future__ import annotations

import asyncio
from typing import Awaitable

from starlette.requests import Request
from starlette.responses import Response

from fugu_pipeline.serve.protocol import APIError



class ShuttingDown(Exception):
    """A reply still running when the server's shutdown grace period ran out."""


class ClientGone(Exception):
    """The client disconnected before its reply was ready."""


async def client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_abandoned(request: Request, svc, work: Awaitable[Response]) -> Response:
    """`work`'s reply, unless the client disconnects first (ClientGone) or the shutdown grace period
    runs out (a 503). Then `work` is cancelled, and with it the worker call in flight: `upstream.py`
    cancels it on the worker loop, which closes its connection. uvicorn cancels nothing itself: it
    only tells the app, through `receive()`, that the client has gone."""
    task = asyncio.ensure_future(work)
    gone, over = asyncio.ensure_future(client_gone(request)), asyncio.ensure_future(svc.grace_over.wait())
    try:
        await asyncio.wait([task, gone, over], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        over.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if not task.cancelled():
        return task.result()
    if gone.done() and not gone.cancelled():
        raise ClientGone
    raise shutting_down(svc)


def shutting_down(svc) -> APIError:
    return APIError(503, svc.shutdown_message(), type="server_error", code="server_shutting_down")
