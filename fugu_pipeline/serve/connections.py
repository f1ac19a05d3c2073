"""Connection hygiene: what keeps slow or idle clients from taking the server down.

uvicorn times out only a keep-alive connection between requests, and only once a response has
been sent: a client that connects and sends nothing, or half a request line, or half a body, holds
its socket (and a file descriptor) for ever. Enough of them exhaust the process's open-file limit,
and then nothing is answered at all, `/health` included. So the server runs uvicorn's own HTTP
protocol (httptools, or h11 without it) with a guard around it (`guarded_protocol`):

- header read timeout (`header_timeout_s`): a request's headers must be whole this long after the
  connection opened (a new connection) or after its first byte (a kept-alive one); else a 408 when
  part of a request came, and the connection is closed;
- body read timeout (`body_timeout_s`): a request's whole body must arrive this long after its
  headers; else a 408 (when no response has begun) and the connection is closed, so a slow body
  is cut; the app sees the client leave;
- idle keep-alive (`keep_alive_s`): uvicorn's `timeout_keep_alive`, counted here;
- open connections (`max_connections`, lowered to what the open-file limit leaves, see
  `connection_cap`): a connection over the cap first closes the oldest connection that has no
  request with the app (idle, or still sending its headers), so `/health` and real requests keep
  being answered while a flood of half-open connections churns; only when every connection has a
  request with the app is the new one answered 503 with `Retry-After` and closed;
- requests in flight (`max_in_flight`, `RequestGate`, an ASGI middleware): over it, a 503
  `server_busy` with `Retry-After`; `/health` and `/metrics` are not counted, so they answer.

Every drop and refusal is counted (`/metrics`: `fugu_connections_closed_total{reason}`,
`fugu_requests_refused_total{reason}`) and logged by `DropLog`: the first of a kind at once, the
rest summed in one line per reason and period, so a flood does not flood the log.

Why a protocol subclass rather than another server: uvicorn has no header or body timeout (asked
for since 2018; ASGI middleware cannot help, it runs only once the headers are whole), hypercorn's
`read_timeout` is a per-read idle timeout a client trickling one byte at a time never trips, and
neither has a connection cap that closes the oldest idle connection; the subclass keeps uvicorn's
parser, shutdown and the rest of the server as they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import time
from collections import Counter, OrderedDict

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("fugu_pipeline.serve")

FD_SLACK = 32  # descriptors for logs, the model's files, threads' pipes: beyond those open at start


class ConnectionLimitError(ValueError):
    """The limits cannot be kept (the open-file limit leaves too little room); the message says what to do."""


LIMIT_HELP = {
    "header_timeout_s": "seconds a request's headers may take, from the connection (or a kept-alive one's first byte); "
                        "then a 408 and the connection is closed",
    "body_timeout_s": "seconds a request's body may take after its headers; then a 408 and the connection is closed",
    "keep_alive_s": "seconds an idle kept-alive connection stays open",
    "max_connections": "open client connections; a new one past it closes the oldest idle or half-open one "
                       "(lowered to what the open-file limit leaves)",
    "max_in_flight": "requests answered at once (/health and /metrics not counted); more get a 503 with Retry-After",
    "backlog": "connections the kernel queues before the server accepts them",
    "retry_after_s": "the Retry-After (seconds) of a 503 at a limit",
}


class ConnectionLimits(BaseModel):
    """The server's connection and request limits (`LIMIT_HELP` says each); `fugu-lite serve`
    has a flag of each name (`--header-timeout-s`, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    keep_alive_s: float = Field(5.0, gt=0)
    max_connections: int = Field(4096, ge=1)
    max_in_flight: int = Field(256, ge=1)
    backlog: int = Field(256, ge=1)
    retry_after_s: int = Field(1, ge=0)


def connection_cap(limits: ConnectionLimits) -> tuple[int, str]:
    """(the open-connection cap, why), within the open-file limit. Each client connection is a file
    descriptor, and so is each connection to a worker; when accept() finds no descriptor left the
    connection waiting in the kernel's queue is lost, whoever sent it. The soft limit is raised
    toward the hard one as far as the caps need; the cap then leaves room for the descriptors open
    now, a listen backlog accepted at once, two upstream connections per request in flight, and
    `FD_SLACK`. ConnectionLimitError when it leaves fewer than 16 connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = _open_fds()
    reserve = in_use + limits.backlog + 2 * limits.max_in_flight + FD_SLACK
    need = limits.max_connections + reserve
    if soft != resource.RLIM_INFINITY and soft < need and (hard == resource.RLIM_INFINITY or hard > soft):
        new = need if hard == resource.RLIM_INFINITY else min(hard, need)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return limits.max_connections, f"at most {limits.max_connections:,} open connections"
    cap = soft - reserve
    why = (f"at most {cap:,} open connections: the open-file limit {soft:,} less {in_use} descriptors open now, the "
           f"listen backlog {limits.backlog}, 2 per request in flight ({limits.max_in_flight}) and {FD_SLACK} spare")
    if cap < 16:
        raise ConnectionLimitError(f"{why}; raise the open-file limit (ulimit -n, LimitNOFILE= in a systemd unit) "
                                   "or lower --max-in-flight / --backlog")
    return cap, why


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: a guess
        return 64


class DropLog:
    """Logs drops and refusals without flooding: the first of a reason at once, the next ones
    summed into one line per reason when `every_s` has passed since its last line; `flush()` at
    shutdown says what is still unsaid, so the log's counts add up to /metrics'. On the serving
    loop only."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self.pending: Counter = Counter()
        self._flush = None

    def note(self, reason: str, detail: str) -> None:
        now = time.monotonic()
        if not self.pending[reason] and now - self.last.get(reason, -1e18) >= self.every_s:
            self.last[reason] = now
            log.warning("%s (%s; more of these are summed every %g s)", detail, reason, self.every_s)
            return
        self.pending[reason] += 1
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.every_s, self.flush)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self._flush = None
        said = {r: n for r, n in self.pending.items() if n}
        if said:
            log.warning("dropped or refused since the last line of their kind: %s",
                        ", ".join(f"{n:,} {r}" for r, n in sorted(said.items())))
            now = time.monotonic()
            self.last.update({r: now for r in said})
        self.pending.clear()


def raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written under the app (no request to
    answer through it): an OpenAI-shaped error body."""
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": reason}}).encode()
    head = (f"HTTP/1.1 {status} {_PHRASES[status]}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode() + body


_PHRASES = {408: "Request Timeout", 503: "Service Unavailable"}


class ConnectionGuard:
    """Every open client connection of one server: the cap, the oldest-idle-first eviction, the
    counts. Connections that have no request with the app (`waiting`) are kept in the order they
    became so: the first is the one to close when a new connection finds the server full."""

    def __init__(self, limits: ConnectionLimits, cap: int | None = None, drop_log: DropLog | None = None):
        self.limits = limits
        self.cap = cap if cap is not None else limits.max_connections
        self.open: set = set()
        self.waiting: OrderedDict = OrderedDict()
        self.closed: Counter = Counter()  # reason -> connections closed by the guard (and idle keep-alives)
        self.log = drop_log or DropLog()

    def admit(self, conn) -> bool:
        """A new connection: room is made by closing the oldest waiting one; False when there is
        none to close (every connection has a request with the app)."""
        if len(self.open) >= self.cap:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.drop(conn, "over_capacity", f"all {self.cap:,} connections have a request being answered")
                return False
            self.drop(victim, "evicted", f"the server holds its cap of {self.cap:,} connections and this was the "
                                         "oldest without a request (idle, or still sending its headers)")
            victim.transport.abort()
            self.forget(victim)
        self.open.add(conn)
        self.waiting[conn] = None
        return True

    def forget(self, conn) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)

    def busy(self, conn) -> None:
        self.waiting.pop(conn, None)

    def idle(self, conn) -> None:
        if conn in self.open:
            self.waiting[conn] = None
            self.waiting.move_to_end(conn)

    def drop(self, conn, reason: str, why: str) -> None:
        self.closed[reason] += 1
        peer = conn.transport.get_extra_info("peername") if conn.transport is not None else None
        who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "a client"
        self.log.note(reason, f"closed the connection from {who}: {why}")


def guarded_protocol(guard: ConnectionGuard, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (`base`, default: the one uvicorn picks) with the guard's
    timeouts and cap (see the module docstring); pass it as `uvicorn.Config(http=...)`."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    limits = guard.limits

    class Guarded(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            # "head": waiting for a request's headers (header clock running); "app": a request is with
            # the app (body clock running while its body comes); "idle": answered, under keep-alive
            self._fg_state, self._fg_timer, self._fg_body = "head", None, False
            self._fg_seen = None  # the request cycle last handed to the app
            self._fg_partial = False  # bytes of a request whose headers are not whole have come
            if not guard.admit(self):
                transport.write(raw_response(503, "server_busy", "every connection is busy; retry shortly",
                                             f"retry-after: {limits.retry_after_s}\r\n"))
                transport.close()
                return
            self._fg_arm(limits.header_timeout_s, self._fg_header_timeout)

        def connection_lost(self, exc) -> None:
            guard.forget(self)
            self._fg_cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._fg_state == "idle":  # a kept-alive connection's next request: its header clock starts now
                self._fg_state = "head"
                self._fg_arm(limits.header_timeout_s, self._fg_header_timeout)
            if self._fg_state == "head":
                self._fg_partial = True
            super().data_received(data)
            self._fg_sync()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._fg_sync()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                guard.closed["idle"] += 1
            super().timeout_keep_alive_handler()

        def _fg_sync(self) -> None:
            """Where the connection stands after uvicorn has read or answered."""
            if self.transport is None or self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:  # a request is with the app
                if cycle is not self._fg_seen:  # its headers just came whole
                    self._fg_seen, self._fg_state, self._fg_partial = cycle, "app", False
                    guard.busy(self)
                    self._fg_cancel()
                    if cycle.more_body:
                        self._fg_arm(limits.body_timeout_s, self._fg_body_timeout)
                        self._fg_body = True
                elif self._fg_body and not cycle.more_body:  # the body is whole
                    self._fg_cancel()
            elif self._fg_state == "app":  # answered: idle until the next byte, under uvicorn's keep-alive timer
                self._fg_state = "idle"
                self._fg_cancel()
                guard.idle(self)

        def _fg_arm(self, seconds: float, then) -> None:
            self._fg_cancel()
            self._fg_timer = self.loop.call_later(seconds, then)

        def _fg_cancel(self) -> None:
            if self._fg_timer is not None:
                self._fg_timer.cancel()
                self._fg_timer = None
            self._fg_body = False

        def _fg_header_timeout(self) -> None:
            self._fg_timer = None
            if self.transport.is_closing():
                return
            guard.drop(self, "header_timeout", f"its request headers were not whole within {limits.header_timeout_s:g} s "
                                               "(--header-timeout-s)")
            if self._fg_partial:
                self.transport.write(raw_response(408, "request_timeout", "the request headers did not arrive in time"))
                self.transport.close()
            else:
                self.transport.abort()

        def _fg_body_timeout(self) -> None:
            self._fg_timer, self._fg_body = None, False
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or not cycle.more_body:
                return
            guard.drop(self, "body_timeout", f"its request body was not whole {limits.body_timeout_s:g} s after its "
                                             "headers (--body-timeout-s)")
            if not cycle.response_started:
                self.transport.write(raw_response(408, "request_timeout", "the request body did not arrive in time"))
            cycle.disconnected = True  # the app's next receive() says the client has gone
            cycle.message_event.set()
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def uvicorn_options(app, limits: ConnectionLimits, cap: int | None = None) -> dict:
    """`uvicorn.Config` keyword arguments serving `app` behind a `ConnectionGuard` with `limits`
    (and `cap`, default `limits.max_connections`), whose figures go to the app's `/metrics`."""
    metrics = getattr(app.state, "fugu_metrics", None)
    guard = ConnectionGuard(limits, cap, drop_log=metrics.gate.log if metrics is not None else None)
    if metrics is not None:
        metrics.guard = guard
    return {"http": guarded_protocol(guard), "timeout_keep_alive": limits.keep_alive_s, "backlog": limits.backlog}


class RequestGate:
    """The cap on requests in flight (`max_in_flight`), shared by the app's middleware and
    `/metrics`. `exempt` paths are neither counted nor refused."""

    def __init__(self, limits: ConnectionLimits, drop_log: DropLog | None = None,
                 exempt: tuple[str, ...] = ("/health", "/metrics")):
        self.limit, self.retry_after_s, self.exempt = limits.max_in_flight, limits.retry_after_s, exempt
        self.in_flight = 0
        self.refused: Counter = Counter()
        self.log = drop_log or DropLog()


class GateMiddleware:
    """ASGI middleware: a request over `gate.limit` in flight gets a 503 `server_busy` with `Retry-After`."""

    def __init__(self, app, gate: RequestGate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send) -> None:
        gate = self.gate
        if scope["type"] != "http" or scope["path"] in gate.exempt:
            return await self.app(scope, receive, send)
        if gate.in_flight >= gate.limit:
            from fugu_pipeline.serve.protocol import APIError, error_response

            gate.refused["in_flight"] += 1
            client = scope.get("client") or ("a client", 0)
            gate.log.note("in_flight", f"refused {scope['method']} {scope['path']} from {client[0]} with a 503: "
                                       f"{gate.limit} requests are in flight (--max-in-flight)")
            await error_response(APIError(
                503, f"the server is answering its limit of {gate.limit} requests at once; retry after "
                     f"{gate.retry_after_s} s", type="server_error", code="server_busy",
                headers={"Retry-After": str(gate.retry_after_s)}))(scope, receive, send)
            return
        gate.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            gate.in_flight -= 1
