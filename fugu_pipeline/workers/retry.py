"""The one retry policy for every HTTP call: worker calls, streamed calls and the catalog.

Retried: connection errors, timeouts, HTTP 408, 429 and 5xx (and the same codes inside a 200
body), malformed replies. Waits honour `Retry-After` (seconds or an HTTP date), else jittered
exponential backoff. `max_attempts` bounds the tries and `deadline_s` the whole call, waits
included: no call takes longer than its deadline. An attempt signals "try again" by raising
`Retryable`; anything else it raises ends the call at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fugu_pipeline.workers.contract import WorkerCallError

T = TypeVar("T")


class Retryable(Exception):
    """One attempt failed in a way that another attempt may fix."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


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


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    deadline_s: float = 120.0
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt `attempt + 1`."""
        if retry_after is not None:
            return retry_after + random.uniform(0.0, min(1.0, 0.1 * retry_after))
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)


@dataclass
class Attempted(Generic[T]):
    value: T
    attempts: int
    elapsed_s: float  # from the start of the call, waits included
    last_attempt_s: float
    retried: list[str] = field(default_factory=list)


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    where: str,
    waiting_for: str = "no answer",
    error: type[WorkerCallError] = WorkerCallError,
) -> Attempted[T]:
    """Run `attempt()` until it returns, raises something other than `Retryable`, runs out of
    attempts or passes the deadline. Failures raise `error` (a WorkerCallError) naming `where`,
    the attempts made and the last reason; a WorkerCallError from the attempt gets its count."""
    t0 = time.monotonic()
    n = 0
    retried: list[str] = []
    try:
        async with asyncio.timeout(policy.deadline_s):
            while True:
                n += 1
                t_attempt = time.monotonic()
                try:
                    value = await attempt()
                except Retryable as r:
                    retried.append(str(r))
                    if n >= policy.max_attempts:
                        raise error(f"{r} ({where}; gave up after {n} attempts)", attempts=n, status=r.status,
                                    transient=True, retry_after=r.retry_after) from None
                    delay = policy.delay(n, r.retry_after)
                    if delay >= policy.deadline_s - (time.monotonic() - t0):
                        raise error(f"{r} ({where}; the next attempt would start after the overall deadline of "
                                    f"{policy.deadline_s:g}s, timeout_s)", attempts=n, status=r.status, transient=True,
                                    retry_after=r.retry_after) from None
                    await asyncio.sleep(delay)
                    continue
                except WorkerCallError as exc:
                    exc.attempts = n
                    raise
                now = time.monotonic()
                return Attempted(value, n, now - t0, now - t_attempt, retried[-5:])
    except TimeoutError:
        last = f"; last error: {retried[-1]}" if retried else ""
        raise error(f"deadline: {waiting_for} within timeout_s={policy.deadline_s:g}s after {n} attempt(s) "
                    f"({where}){last}", attempts=n, transient=True) from None
