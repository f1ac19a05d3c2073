"""Graders: turn a worker's answer into a quality in [0, 1] (the task format's grader types).

`exact`, `contains`, `numeric`, `regex` are local and deterministic; an `exact` or `numeric` grader
with `math: true` (what the math converters write) falls back to mathematical equivalence
(`math_equivalence.py`, math-verify) when the plain comparison fails. `python_tests` and `io_tests`
run the answer's code against the task's tests in the sandbox (local, but slow: `grade` runs them in
a thread, at most `SANDBOX_CONCURRENCY` at a time); `llm_judge` asks the judge worker to score the
answer against a rubric.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fugu_pipeline.tasks.answers import extract_final_number, final_line, parse_number
from fugu_pipeline.workers.contract import WorkerCallError

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.contract import WorkerClient


@dataclass
class Grade:
    quality: float
    detail: str
    judge_cost_usd: float = 0.0


def _norm(s: str, case_sensitive: bool) -> str:
    s = " ".join(s.split())
    return s if case_sensitive else s.lower()


def grade_local(task: "Task", answer: str) -> Grade:
    """Grade with a local grader. Raises ValueError for llm_judge (use `grade`)."""
    g = task.grader
    ref = task.reference_answer or ""
    if answer is None:
        return Grade(0.0, "no answer")
    if g.type == "exact":
        cand = [answer, final_line(answer)]
        want = _norm(ref, g.case_sensitive)
        for c in cand:
            c2 = c.strip().strip(".").strip() if g.strip else c
            if _norm(c2, g.case_sensitive) == want:
                return Grade(1.0, "exact match")
        if g.math:
            return _equivalent(ref, answer, "no exact match")
        return Grade(0.0, "no exact match")
    if g.type == "contains":
        ok = _norm(ref, g.case_sensitive) in _norm(answer, g.case_sensitive)
        return Grade(float(ok), "contains reference" if ok else "reference not found")
    if g.type == "numeric":
        want = parse_number(ref)
        got = extract_final_number(answer)
        if got is None:
            return _equivalent(ref, answer, "no number in answer") if g.math else Grade(0.0, "no number in answer")
        if not math.isfinite(got) or want is None or not math.isfinite(want):
            return Grade(0.0, f"got {got:g}, want {want}: not a finite number")
        tol = g.tolerance * (abs(want) if g.relative else 1.0)
        ok = abs(got - want) <= tol + 1e-12 * max(1.0, abs(want))
        if not ok and g.math:
            return _equivalent(ref, answer, f"got {got:g}, want {want:g} ± {tol:g}")
        return Grade(float(ok), f"got {got:g}, want {want:g} ± {tol:g}")
    if g.type == "regex":
        flags = 0
        for f in g.flags:
            flags |= getattr(re, f)
        pattern = g.pattern if g.pattern is not None else ref
        ok = _regex_matches(task.task_id, pattern, flags, answer.strip() if g.full_match else answer, g.full_match)
        return Grade(float(ok), "regex matched" if ok else "regex did not match")
    if g.type == "python_tests":
        from fugu_pipeline.collect.code_grader import grade_python_tests

        quality, detail = grade_python_tests(answer, g, task.prompt)
        return Grade(quality, detail)
    if g.type == "io_tests":
        from fugu_pipeline.collect.io_grader import grade_io_tests

        quality, detail = grade_io_tests(answer, g)
        return Grade(quality, detail)
    raise ValueError(f"grader {g.type!r} is not local")


def _equivalent(reference: str, answer: str, before: str) -> Grade:
    """The math fallback: equivalent by math-verify, else the plain grader's reason."""
    from fugu_pipeline.collect.math_equivalence import equivalent

    ok, how = equivalent(reference, answer)
    return Grade(1.0, f"equivalent ({how})") if ok else Grade(0.0, f"{before}; not equivalent ({how})")


REGEX_TIMEOUT_S = 5.0
_REGEX_CHILD = (
    "import json,re,sys\n"
    "a=json.load(sys.stdin)\n"
    "rx=re.compile(a['pattern'],a['flags'])\n"
    "sys.stdout.write('1' if (rx.fullmatch(a['text']) if a['full'] else rx.search(a['text'])) else '0')"
)


# an unescaped group repeated by *, + or {m,n}: what exponential backtracking needs ("(a+)+$")
_REPEATED_GROUP = re.compile(r"(?<!\\)\)[*+{]")
IN_PROCESS_MAX_CHARS = 20_000
AMBIGUOUS_IN_PROCESS_MAX_CHARS = 2_000  # a pattern that may take quadratic time (`tasks/regex_safety.py`)


def _in_process(pattern: str, flags: int, text: str) -> bool:
    if _REPEATED_GROUP.search(pattern):
        return False
    from fugu_pipeline.tasks.regex_safety import problems

    try:
        ambiguous = bool(problems(pattern, flags))
    except Exception:  # noqa: BLE001 - a pattern re cannot parse fails where it is compiled, with its reason
        ambiguous = False
    return len(text) <= (AMBIGUOUS_IN_PROCESS_MAX_CHARS if ambiguous else IN_PROCESS_MAX_CHARS)


def _regex_matches(task_id: str, pattern: str, flags: int, text: str, full: bool) -> bool:
    """A pattern that repeats a group runs in a child process killed after `REGEX_TIMEOUT_S`:
    Python's `re` cannot be interrupted, and nested quantifiers backtrack exponentially on some
    answers. Any other pattern (the converters' answer-letter patterns) on an answer of at most
    `IN_PROCESS_MAX_CHARS` runs here: a child process per grade cost ~50 ms, ~20 minutes for MMLU-STEM.
    A pattern whose repeats can split a run of characters more than one way (quadratic on some answers;
    an older task file's answer-letter pattern) runs here on answers up to `AMBIGUOUS_IN_PROCESS_MAX_CHARS`."""
    if _in_process(pattern, flags, text):
        try:
            rx = re.compile(pattern, flags)
        except re.error as exc:
            raise ValueError(f"task {task_id}: the regex grader failed: {exc}") from None
        return bool(rx.fullmatch(text) if full else rx.search(text))
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _REGEX_CHILD],
            input=json.dumps({"pattern": pattern, "flags": flags, "text": text, "full": full}),
            capture_output=True, text=True, timeout=REGEX_TIMEOUT_S, env={},
        )
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"task {task_id}: the regex grader's pattern {pattern[:80]!r} ran over {REGEX_TIMEOUT_S:g}s on a "
            f"{len(text)}-character answer (catastrophic backtracking): simplify the pattern in the task file"
        ) from None
    if done.returncode != 0 or done.stdout not in ("0", "1"):
        raise ValueError(f"task {task_id}: the regex grader failed: {done.stderr.strip()[-200:]}")
    return done.stdout == "1"


SANDBOX_CONCURRENCY = max(1, min(4, (os.cpu_count() or 2) // 2))
_sandbox_slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


async def _grade_code(task: "Task", answer: str) -> Grade:
    """`python_tests` and `io_tests` off the event loop, bounded per loop. A sandbox that cannot start fails the
    cell (retried on the next run) instead of scoring the answer 0."""
    from fugu_pipeline.collect.code_grader import SandboxUnavailable

    loop = asyncio.get_running_loop()
    slots = _sandbox_slots.setdefault(loop, asyncio.Semaphore(SANDBOX_CONCURRENCY))
    async with slots:
        try:
            return await asyncio.to_thread(grade_local, task, answer)
        except SandboxUnavailable as exc:
            raise WorkerCallError(f"task {task.task_id}: the code sandbox could not run ({exc}); "
                                  "the cell is retried on the next run") from None


JUDGE_TEMPLATE = """You are grading an answer against a rubric.

Task:
{prompt}

Rubric:
{rubric}

Reference answer (may be partial):
{reference}

Answer to grade:
<answer>{answer}</answer>

Reply with one line of the form `SCORE: n` where n is an integer from 0 to {scale}."""

_SCORE = re.compile(r"SCORE\s*[:=]\s*(-?\d+(?:\.\d+)?)(?![\deE]|\.\d)", re.IGNORECASE)


async def grade(task: "Task", answer: str, judge: "WorkerClient | None" = None) -> Grade:
    """Grade any task; `llm_judge` needs the judge worker. A judge reply without a score is an
    error (the cell fails and is retried on the next run) rather than a silent zero."""
    if task.grader.type in ("python_tests", "io_tests"):
        return await _grade_code(task, answer)
    if task.grader.type == "regex":  # a child process, up to REGEX_TIMEOUT_S: off the event loop
        return await asyncio.to_thread(grade_local, task, answer)
    if task.grader.type != "llm_judge":
        return grade_local(task, answer)
    if judge is None:
        raise ValueError(
            f"task {task.task_id} uses the llm_judge grader but no judge is configured: add a "
            "'judge:' worker to the worker YAML"
        )
    g = task.grader
    prompt = JUDGE_TEMPLATE.format(
        prompt=task.prompt, rubric=g.rubric, reference=task.reference_answer or "(none)",
        answer=answer, scale=g.scale,
    )
    done = await judge.complete([{"role": "user", "content": prompt}], task=task)
    reply = done.answer or ""
    scores = {float(x) for x in _SCORE.findall(reply)}
    if len(scores) != 1:
        what = "no 'SCORE: n'" if not scores else f"several different scores {sorted(scores)}"
        raise WorkerCallError(f"judge reply holds {what}: {reply[:120]!r}")
    score = scores.pop()
    if not 0.0 <= score <= g.scale:
        raise WorkerCallError(f"judge score {score:g} is outside 0..{g.scale}: {reply[:120]!r}")
    return Grade(score / g.scale, f"judge score {score:g}/{g.scale}", judge_cost_usd=done.cost_usd)
