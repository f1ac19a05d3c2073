"""What a router raises: a request or checkpoint it cannot route."""

from __future__ import annotations


class RouterError(RuntimeError):
    """A request or checkpoint the router cannot route. `param` names the request field at fault
    (the server's OpenAI-shaped error carries it) and `code` says what kind of fault; both None
    when no request field is to blame. `server_fault`: the checkpoint or its files are at fault,
    not the request (a server answers 5xx). `public`: the message for a client of a server, when
    the message itself names server paths (it names the checkpoint by its tag instead)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 server_fault: bool = False, public: str | None = None):
        super().__init__(message)
        self.param, self.code, self.server_fault, self.public = param, code, server_fault, public


class BudgetUnavailable(RouterError):
    """This checkpoint cannot route under a budget (no quality estimate, or no calibration; a
    calibration file that cannot be used is a `server_fault`)."""
