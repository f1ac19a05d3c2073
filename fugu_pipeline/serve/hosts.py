"""Which `Host` headers the server answers: the defence against DNS rebinding.

A web page on `http://evil.example` can make its own name resolve to 127.0.0.1 a moment after it
has loaded; the browser then lets its scripts talk to the server on your machine as if it were
evil.example, and without a token (the loopback default) they could spend the workers' budget
and read every answer. The browser still sends `Host: evil.example`, so the server answers only
the names it is bound to and refuses any other with a 400 `host_not_allowed` (OpenAI-shaped),
before any route runs:

- bound to a loopback address (127.0.0.1, ::1, localhost): `localhost`, `127.0.0.1`, `::1` and
  the bound address;
- bound to one other address or name: that address or name;
- bound to every interface (0.0.0.0, ::): any IP address written as such (a page cannot rebind
  a bare address: its origin then is the address itself), `localhost` and the machine's host name;
- plus the names given with `fugu-lite serve --allowed-host NAME` (repeatable; `*.example.com`
  allows its subdomains, `*` any name: behind a proxy that checks names itself).

The port in the header is not compared (a rebinding page uses the server's own port). A request
without a `Host` header (HTTP/1.0 tools) is let through: browsers always send one.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Iterable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

log = logging.getLogger("fugu_pipeline.serve")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ALL_INTERFACES = ("0.0.0.0", "::", "")
_LOGGED_MAX = 100  # refused names logged once each, up to this many


def host_name(header: str) -> str | None:
    """The name in a `Host` header, lower case, without port, brackets or a final dot; None when
    it is not a host[:port] at all."""
    h = header.strip().lower()
    if h.startswith("["):  # [::1]:8080
        end = h.find("]")
        if end < 0 or (h[end + 1:] and not (h[end + 1] == ":" and h[end + 2:].isdigit())):
            return None
        return h[1:end] or None
    name, sep, port = h.rpartition(":") if h.count(":") == 1 else (h, "", "")
    if sep and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name if name and all(c.isalnum() or c in "-._" for c in name) else None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class HostPolicy:
    """The names a server bound to `bind_host` answers (module docstring), plus `extra`."""

    def __init__(self, bind_host: str = "127.0.0.1", extra: Iterable[str] = ()):
        bind = (host_name(bind_host) or bind_host.strip("[]").lower()) if bind_host else ""
        ip = _ip(bind)
        self.any_ip = bind in ALL_INTERFACES
        self.names = {bind} if bind not in ALL_INTERFACES else {"localhost", socket.gethostname().lower()}
        if bind == "localhost" or (ip is not None and ip.is_loopback):
            self.names.update(LOOPBACK_NAMES)
        self.suffixes: list[str] = []
        self.anything = False
        for e in extra:
            e = e.strip().lower().rstrip(".")
            if e == "*":
                self.anything = True
            elif e.startswith("*."):
                self.suffixes.append(e[1:])
            elif e:
                self.names.add(host_name(e) or e)

    def allows(self, header: str | None) -> bool:
        if header is None or self.anything:
            return True
        name = host_name(header)
        if name is None:
            return False
        if name in self.names or any(name.endswith(s) for s in self.suffixes):
            return True
        return self.any_ip and _ip(name) is not None

    def describe(self) -> str:
        shown = sorted(self.names) + [f"*{s}" for s in self.suffixes]
        if self.anything:
            return "any host name"
        return ", ".join(shown) + (" and any IP address" if self.any_ip else "")


class HostGuard:
    """ASGI middleware: a request whose `Host` the policy does not allow gets a 400 before any
    route (or `/health`) runs."""

    def __init__(self, app, policy: HostPolicy):
        self.app, self.policy = app, policy
        self._logged: set[str] = set()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = Headers(scope=scope).get("host")
        if self.policy.allows(header):
            return await self.app(scope, receive, send)
        shown = repr(header[:80])
        if len(self._logged) < _LOGGED_MAX and header not in self._logged:
            self._logged.add(header)
            log.warning("refused a request for Host %s (this server answers %s; a DNS-rebinding page sends another "
                        "name): allow it with --allowed-host if it is yours", shown, self.policy.describe())
        body = {"error": {"message": f"this server does not answer to the host name {shown} (it answers to "
                                     f"{self.policy.describe()}): a page that reaches it under another name is refused. "
                                     "If the name is yours, start the server with --allowed-host NAME",
                          "type": "invalid_request_error", "param": None, "code": "host_not_allowed"}}
        await JSONResponse(body, status_code=400)(scope, receive, send)
