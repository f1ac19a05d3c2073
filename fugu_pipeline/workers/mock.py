"""The deterministic mock pool: simulated experts that need no key and no network.

Whether a mock worker answers a task correctly depends only on (worker id, task id) and its
strength for the task's domain, so every run of the mock pool produces the same reward matrix.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import TYPE_CHECKING

from fugu_pipeline.tasks.answers import parse_number
from fugu_pipeline.workers.config import MockWorker
from fugu_pipeline.workers.contract import Completion, WorkerCallError
from fugu_pipeline.workers.mock_roles import parse_role_request, role_answer
from fugu_pipeline.workers.mock_tools import answers_tool_result, tool_call, tool_result_answer, wants_tool_call

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task


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

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None, *,
                       params: dict | None = None) -> Completion:
        """`params` may carry `seed` (the sampling seed of a multi-turn session), and `tools` /
        `tool_choice` (a tool call comes back, `mock_tools.py`); a request that names a role
        (`mock_roles.py`) gets the role behaviour, deterministic per (task, worker, role,
        transcript, seed), failures included."""
        b = self.spec.mock
        self.calls += 1
        if b.sleep_s:
            await asyncio.sleep(b.sleep_s)
        key = task.task_id if task else messages[-1]["content"]
        role = parse_role_request(messages)
        draw = str(self.calls) if role is None else f"{role.role}/{len(role.blocks)}/{(params or {}).get('seed', 0)}"
        if b.fail_rate and _unit("fail", self.worker_id, key, draw) < b.fail_rate:
            raise WorkerCallError(f"mock worker {self.worker_id}: simulated failure", attempts=1, status=503)
        calls = None
        if task is None and wants_tool_call(messages, params):
            calls, answer = [tool_call(self.worker_id, messages, params)], ""
        elif task is None and answers_tool_result(messages):
            answer = tool_result_answer(self.worker_id, messages)
        elif role is not None:
            answer = role_answer(role, b, self.worker_id, task, int((params or {}).get("seed", 0)),
                                 lambda t: _mock_answer(t, True, self.worker_id),
                                 lambda t: _mock_answer(t, False, self.worker_id))
        elif task is None:
            answer = f"[{self.worker_id}] I would answer: {messages[-1]['content'][:80]}"
        else:
            p = b.strengths.get(task.domain, b.default_strength)
            correct = _unit("correct", self.worker_id, task.task_id) < p
            answer = _mock_answer(task, correct, self.worker_id, b)
        jitter = 0.5 + _unit("latency", self.worker_id, key)
        prompt_tokens = max(1, sum(len(m["content"]) for m in messages) // 4)
        completion_tokens = max(1, len(answer or json.dumps(calls)) // 4)
        return Completion(
            answer=answer,
            cost_usd=round(b.cost_usd * (0.8 + 0.4 * _unit("cost", self.worker_id, key)), 8),
            cost_source="mock",
            latency_s=round(b.latency_s * jitter, 4),
            ttft_s=round(b.latency_s * jitter * 0.3, 4),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason="tool_calls" if calls else "stop",
            requested_model=f"mock/{self.worker_id}",
            served_model=f"mock/{self.worker_id}",
            provider="mock",
            tool_calls=calls,
        )

    async def aclose(self) -> None:
        return None


# Words a wrong answer may give instead of the reference: each worker picks its own by a hash, so
# two wrong workers rarely agree (1 in 12), as real models' wrong answers rarely do.
DECOYS = ("Lyon", "Berlin", "Madrid", "cobalt", "Tokyo", "granite", "Nile", "Mars", "Oslo", "argon", "Rome", "quartz")


def _wrong_value(task: "Task", who: str) -> str:
    """A wrong final answer of worker `who` for `task`: another number near a numeric reference, else
    a decoy word the task's grader refuses."""
    import re

    ref = task.reference_answer or ""
    g = task.grader
    x = parse_number(ref)
    if x is not None or g.type == "numeric":
        off = 1 + int(_unit("off", who, task.task_id) * 9)
        for k in range(20):
            value = f"{(x or 0.0) + off + 10 * k:g}"
            if not (g.type == "regex" and g.pattern is not None and re.search(g.pattern, f"the answer is {value}")):
                return value
    start = int(_unit("decoy", who, task.task_id) * len(DECOYS))
    for k in range(len(DECOYS)):
        word = DECOYS[(start + k) % len(DECOYS)]
        if ref and ref.strip().lower() in word.lower():
            continue
        if g.type == "regex" and g.pattern is not None and re.search(g.pattern, f"the answer is {word}"):
            continue
        return word
    return "no idea"


def _mock_answer(task: "Task", correct: bool, worker_id: str, behaviour=None) -> str:
    """A one-step reply. Right replies agree across workers; wrong ones differ by worker (unless
    `shared_wrong_answer`). A reply is stated with confidence or hedged ("I am not sure, but ...")
    with a chance that depends on whether it is right (`confident_when_right` / `_wrong`): a signal
    a verifier can learn from the reply's text, but not a perfect one. The committed final answer
    (what graders and cascades read) is the last thing said either way."""
    ref = task.reference_answer or ""
    g = task.grader
    p = (getattr(behaviour, "confident_when_right", 0.9) if correct else getattr(behaviour, "confident_when_wrong", 0.15))
    confident = _unit("confident", worker_id, task.task_id) < p
    who = "shared" if getattr(behaviour, "shared_wrong_answer", False) else worker_id
    lead = "" if confident else "I am not sure, but "
    if g.type == "llm_judge":
        if correct:
            return f"{lead}A careful answer. {ref}".strip()
        return f"{lead}A vague answer that misses the point: {_wrong_value(task, who)}."
    if g.type == "python_tests":  # the reference is a working solution where the batch has one
        hedge = "" if confident else "This might work, I am not sure:\n"
        if correct and ref:
            return f"{hedge}```python\n{ref}\n```"
        k = int(_unit("stub", who, task.task_id) * 9)
        return f"{hedge}```python\ndef {g.entry_point}(*args, **kwargs):\n    return {k}\n```"
    if g.type == "regex" and g.pattern is not None:
        return f"{lead}the answer is {ref or 'no answer'}" if correct else f"{lead}the answer is {_wrong_value(task, who)}"
    if correct:
        return f"{lead}The answer is {ref}" if lead else f"The answer is {ref}"
    return f"{lead}the answer is {_wrong_value(task, who)}" if lead else f"The answer is {_wrong_value(task, who)}"


class MockJudge(MockClient):
    """Scores an answer by whether it contains the exemplar answer: deterministic."""

    async def complete(self, messages: list[dict[str, str]], task: "Task | None" = None, *,
                       params: dict | None = None) -> Completion:
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
