"""One way for a test to wait for something another process or thread does.

`wait_until` polls a condition until it holds and returns its value. It has no deadline of its own:
how long a machine takes is not a verdict (a loaded CI box is slow, not wrong). A wait that never
ends is a hang, and the suite's timeout (pytest-timeout, `timeout` in pyproject.toml, or a test's own
`@pytest.mark.timeout`) stops it with every thread's stack, this frame's `what` among them. `alive`
ends the wait at once when the thing waited on has died: it returns None while all is well, or the
failure's text (a server's exit code and log tail).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, *, every: float = 0.05,
               alive: Callable[[], str | None] | None = None) -> T:
    """Poll `condition` every `every` seconds until it returns a true value; return that value."""
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and (problem := alive()):
            pytest.fail(f"while waiting for {what}: {problem}")
        time.sleep(every)
