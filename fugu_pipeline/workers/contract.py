"""The worker-call contract every worker (mock, OpenRouter, OpenAI-compatible) keeps.

A worker is an object with an async `complete(messages, task=None) -> Completion` and
`aclose()`. Failures raise `WorkerCallError` (this cell failed, later cells may succeed) or
`FatalWorkerError` (401/402/403: every later call would fail the same way, so the run stops).
The mock pool is in `mock.py`, the HTTP clients in `http.py`; `factory.make_client` picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task


@dataclass
class Completion:
    answer: str
    cost_usd: float = 0.0
    cost_source: str = "none"
    latency_s: float = 0.0
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    requested_model: str | None = None
    served_model: str | None = None
    provider: str | None = None
    attempts: int = 1
    extra: dict = field(default_factory=dict)
    tool_calls: list[dict] | None = None  # the reply's OpenAI `tool_calls`, as the worker sent them (then
    # `answer` may be empty and `finish_reason` is "tool_calls")


class WorkerCallError(Exception):
    """A call that failed after its retries. Safe to print: never holds a key. `transient`: it
    failed the way another try later might not (a timeout, a connection error, 408, 429, 5xx, a
    malformed reply); `retry_after`: the seconds the upstream asked to wait (`Retry-After`)."""

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None, transient: bool = False,
                 retry_after: float | None = None):
        super().__init__(message)
        self.attempts = attempts
        self.status = status
        self.transient = transient
        self.retry_after = retry_after


class FatalWorkerError(WorkerCallError):
    """401/402/403 and the like: stop the run, tell the user what to fix."""


class WorkerClient(Protocol):
    worker_id: str

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None) -> Completion: ...

    async def aclose(self) -> None: ...


def task_messages(task: "Task", system_prompt: str | None = None) -> list[dict[str, str]]:
    msgs = []
    if system_prompt:
        msgs.append({"role": "system", "content": system_prompt})
    msgs.append({"role": "user", "content": task.prompt})
    return msgs
