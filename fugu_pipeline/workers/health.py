"""Worker health while serving: a worker that keeps failing is not called for a while (a cooldown).

Every request would otherwise try a dead or throttled worker first and wait for its failure before
falling back. The rules (settings: the worker YAML's `cooldown:` block, `config.CooldownConfig`;
the key cooldown: `fugu-lite serve --auth-cooldown-s`):

- A transient failure counts: a timeout, a connection error, HTTP 408, 429 or 5xx, a malformed
  reply (`WorkerCallError.transient`, or such a status). `after_failures` of them in a row start a
  cooldown of `first_s`; each further transient failure in a row doubles it, up to `max_s`. The
  first call after a cooldown is a probe: if it fails too, the next, longer, cooldown starts at once.
- A `Retry-After` the upstream sent (seconds or an HTTP date) keeps the worker out at least that
  long (capped at `max_s`), from the first failure: it said when to come back.
- A refused key (401, 402, 403: `FatalWorkerError`) keeps it out for `auth_cooldown_s` at once:
  every call would fail the same way until someone fixes the key.
- A success ends any cooldown and resets the count. Other failures (a 400 for this request, an
  answer cut at max_tokens) say nothing about the worker and change nothing.

`blocked(wid)` is the `WorkerKeptOut` a caller raises instead of calling; `snapshot()` is every
worker's state for `/health`, a reply's routing details and metrics. Time comes from `clock`
(monotonic seconds) and `wall` (epoch seconds), injected, so tests never sleep. Thread-safe: the
worker loop records outcomes while the serving loop reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fugu_pipeline.workers.config import CooldownConfig
from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError
from fugu_pipeline.workers.retry import retryable_status

log = logging.getLogger("fugu_pipeline.workers")

REASON_CHARS = 300
OK, COOLING, KEPT_OUT = "ok", "cooling_down", "kept_out"  # `state` values: kept_out is a refused key


class WorkerKeptOut(WorkerCallError):
    """A call not made: the worker is in a cooldown (its key was refused, or it kept failing)."""


def is_transient(exc: WorkerCallError) -> bool:
    """Whether a failure says the worker is unwell now (and may recover): see the module docstring."""
    if isinstance(exc, (FatalWorkerError, WorkerKeptOut)):
        return False
    return bool(getattr(exc, "transient", False)) or (exc.status is not None and retryable_status(exc.status))


@dataclass
class _State:
    failures: int = 0  # transient failures in a row
    state: str = OK
    until: float = 0.0  # clock()
    until_wall: float = 0.0  # wall()
    since: float = 0.0  # clock() when this cooldown began
    status: int | None = None
    reason: str | None = None
    cooldowns: int = 0  # cooldowns begun since start


class WorkerHealth:
    """The health of the workers of one server (module docstring)."""

    def __init__(self, policy: CooldownConfig | None = None, auth_cooldown_s: float = 60.0, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.policy = policy or CooldownConfig()
        self.auth_cooldown_s = auth_cooldown_s
        self.clock, self.wall = clock, wall
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def succeeded(self, wid: str) -> None:
        with self._lock:
            s = self._states.get(wid)
            if s is not None and (s.failures or s.state != OK):
                if s.state != OK:
                    log.info("worker %s answered again: its cooldown has ended", wid)
                s.failures, s.state, s.reason, s.status = 0, OK, None, None

    def failed(self, wid: str, exc: WorkerCallError) -> None:
        """Record a failed call of `wid` (one that was made: never a `WorkerKeptOut`)."""
        if isinstance(exc, FatalWorkerError):
            if self.auth_cooldown_s > 0:
                self._cool(wid, KEPT_OUT, self.auth_cooldown_s, exc, "its key was refused")
            return
        if not is_transient(exc):
            return
        p = self.policy
        with self._lock:
            s = self._states.setdefault(wid, _State())
            s.failures += 1
            n = s.failures
        seconds, why = 0.0, ""
        if n >= p.after_failures and p.first_s > 0:
            seconds = min(p.max_s, p.first_s * 2 ** (n - p.after_failures))
            why = f"{n} transient failures in a row"
        ra = getattr(exc, "retry_after", None)
        if ra is not None and min(ra, p.max_s) > seconds:
            seconds, why = min(ra, p.max_s), f"the upstream asked to wait {ra:g} s (Retry-After)"
        if seconds > 0:
            self._cool(wid, COOLING, seconds, exc, why)

    def _cool(self, wid: str, state: str, seconds: float, exc: WorkerCallError, why: str) -> None:
        now, wall = self.clock(), self.wall()
        with self._lock:
            s = self._states.setdefault(wid, _State())
            active = s.state != OK and s.until > now
            if active and s.state == state and s.until >= now + seconds:  # a longer one of its kind runs
                return
            if not active:
                s.cooldowns += 1
                s.since = now
                log.warning("worker %s is kept out for %g s (%s): %s", wid, seconds, why, exc)
            s.state, s.until, s.until_wall, s.status = state, now + seconds, wall + seconds, exc.status
            s.reason = f"{why}; last: {str(exc)[:REASON_CHARS]}"

    def _active(self, wid: str, now: float) -> _State | None:
        s = self._states.get(wid)
        return s if s is not None and s.state != OK and s.until > now else None

    def blocked(self, wid: str) -> WorkerKeptOut | None:
        """Why `wid` is not to be called now, else None."""
        now = self.clock()
        with self._lock:
            s = self._active(wid, now)
            if s is None:
                return None
            left, ago, reason, status = s.until - now, now - s.since, s.reason, s.status
        return WorkerKeptOut(f"not called: kept out for {left:.0f} s more (since {ago:.0f} s ago): {reason}",
                             status=status, attempts=0)

    def state(self, wid: str) -> dict:
        """One worker's health: `state` (ok, cooling_down, kept_out), `until` (UTC, ISO 8601) and
        `seconds_left` while out, `consecutive_failures`, `status` and `reason` of the last failure
        that put it out, and `cooldowns` (how many began since the server started)."""
        now = self.clock()
        with self._lock:
            s = self._states.get(wid) or _State()
            active = self._active(wid, now) is not None
            return {"state": s.state if active else OK,
                    "until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.until_wall)) if active else None,
                    "seconds_left": round(s.until - now, 1) if active else 0.0,
                    "consecutive_failures": s.failures, "status": s.status if active else None,
                    "reason": s.reason if active else None, "cooldowns": s.cooldowns}

    def snapshot(self, wids: Iterable[str]) -> dict[str, dict]:
        """{worker id: `state(worker id)`} for each of `wids`."""
        return {w: self.state(w) for w in wids}
