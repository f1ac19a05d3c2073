"""The worker-call contract and the deterministic mock pool.

Every worker (mock, OpenRouter, OpenAI-compatible) is an object with an async
`complete(messages, task=None) -> Completion`. Failures raise `WorkerCallError` (this cell failed,
later cells may succeed) or `FatalWorkerError` (401/402/403: every later call would fail the same
way, so the run stops). Real HTTP clients live in `clients.py`; `make_client` picks one.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fugu_pipeline.worker_config import MockWorker, WorkersConfig, WorkerSpec

if TYPE_CHECKING:
    from fugu_pipeline.schemas import Task


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


class WorkerCallError(Exception):
    """A call that failed after its retries. Safe to print: never holds a key."""

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None):
        super().__init__(message)
        self.attempts = attempts
        self.status = status


class FatalWorkerError(WorkerCallError):
    """401/402/403 and the like: stop the run, tell the user what to fix."""


class BudgetExceededError(Exception):
    """The run's USD budget would be passed by the next call."""


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


def _unit(*parts: str) -> float:
    """A deterministic number in [0, 1) from strings."""
    h = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class MockClient:
    """A deterministic simulated expert. Whether it answers a task correctly depends only on
    (worker id, task id) and its strength for the task's domain, so every run of the mock pool
    produces the same reward matrix. Its wrong answers are really wrong (graders see them)."""

    def __init__(self, spec: MockWorker):
        self.spec = spec
        self.worker_id = spec.id
        self.calls = 0

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None) -> Completion:
        b = self.spec.mock
        self.calls += 1
        if b.sleep_s:
            await asyncio.sleep(b.sleep_s)
        key = task.task_id if task else messages[-1]["content"]
        if b.fail_rate and _unit("fail", self.worker_id, key, str(self.calls)) < b.fail_rate:
            raise WorkerCallError(f"mock worker {self.worker_id}: simulated failure", attempts=1, status=503)
        if task is None:
            answer = f"[{self.worker_id}] I would answer: {messages[-1]['content'][:80]}"
        else:
            p = b.strengths.get(task.domain, b.default_strength)
            correct = _unit("correct", self.worker_id, task.task_id) < p
            answer = _mock_answer(task, correct, self.worker_id)
        jitter = 0.5 + _unit("latency", self.worker_id, key)
        prompt_tokens = max(1, sum(len(m["content"]) for m in messages) // 4)
        completion_tokens = max(1, len(answer) // 4)
        return Completion(
            answer=answer,
            cost_usd=round(b.cost_usd * (0.8 + 0.4 * _unit("cost", self.worker_id, key)), 8),
            cost_source="mock",
            latency_s=round(b.latency_s * jitter, 4),
            ttft_s=round(b.latency_s * jitter * 0.3, 4),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason="stop",
            requested_model=f"mock/{self.worker_id}",
            served_model=f"mock/{self.worker_id}",
            provider="mock",
        )

    async def aclose(self) -> None:
        return None


def _mock_answer(task: "Task", correct: bool, worker_id: str) -> str:
    ref = task.reference_answer or ""
    g = task.grader
    if g.type == "llm_judge":
        if correct:
            return f"A careful answer. {ref}".strip()
        return "A vague answer that misses the point."
    if g.type == "regex" and g.pattern is not None and not correct:
        return "I am not sure."
    if g.type == "regex" and g.pattern is not None:
        return ref or "no answer"
    if correct:
        return f"The answer is {ref}"
    if g.type == "numeric":
        from fugu_pipeline.grading import parse_number

        x = parse_number(ref) or 0.0
        return f"The answer is {x + 1 + int(_unit('off', worker_id, task.task_id) * 9):g}"
    return "I am not sure."


class MockJudge(MockClient):
    """Scores an answer by whether it contains the exemplar answer: deterministic."""

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None) -> Completion:
        self.calls += 1
        text = messages[-1]["content"]
        ref = (task.reference_answer or "") if task else ""
        answer = text.split("<answer>", 1)[-1].split("</answer>", 1)[0]
        good = bool(ref) and ref.strip().lower() in answer.lower()
        scale = task.grader.scale if task is not None and task.grader.type == "llm_judge" else 10
        score = scale if good else int(_unit("judge", answer) * scale * 0.3)
        return Completion(
            answer=f"SCORE: {score}",
            cost_usd=self.spec.mock.cost_usd,
            cost_source="mock",
            latency_s=self.spec.mock.latency_s,
            requested_model="mock/judge",
            served_model="mock/judge",
            provider="mock",
        )


def cost_ceiling(spec: WorkerSpec, task: "Task", catalog=None) -> float | None:
    """A worst-case USD cost of one call, for the budget guard; None when the price is unknown.
    Prompt tokens are over-estimated (3 characters a token); the answer is taken at max_tokens."""
    if spec.kind == "mock":
        return spec.mock.cost_usd * 1.2  # the mock's cost jitter is at most +20%
    prompt_tokens = len(task.prompt) / 3 + 32
    if spec.kind == "openai_compatible":
        return (prompt_tokens * spec.price_in_per_mtok + spec.max_tokens * spec.price_out_per_mtok) / 1e6
    price = catalog.price_per_token(spec.model) if catalog is not None else None
    if price is None:
        return None
    return prompt_tokens * price[0] + spec.max_tokens * price[1]


def make_client(spec: WorkerSpec, config: WorkersConfig, *, judge: bool = False, catalog=None) -> WorkerClient:
    """The client for one worker spec. Real HTTP clients are imported only when needed."""
    if spec.kind == "mock":
        return MockJudge(spec) if judge else MockClient(spec)
    from fugu_pipeline.clients import make_http_client

    return make_http_client(spec, config, catalog=catalog)


class RateLimiter:
    """At most `per_minute` starts in any 60 s window, spaced evenly."""

    def __init__(self, per_minute: float | None):
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            await asyncio.sleep(delay)
