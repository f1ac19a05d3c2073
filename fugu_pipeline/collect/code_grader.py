"""The `python_tests` grader: run a worker's code answer against a HumanEval-style test program
(`def check(candidate): ...`) in the sandbox. Quality is 1.0 when `check(entry_point)` returns,
0.0 otherwise (wrong answer, crash, timeout, memory, no code)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

from fugu_pipeline.collect.sandbox import Limits, SandboxResult, run_untrusted
from fugu_pipeline.tasks.schema import PythonTestsGrader

MAX_ANSWER_CHARS = 200_000
# the opening line is read once (possessive): a fence line without a newline took quadratic time
_FENCE = re.compile(r"^[ \t]{0,3}```[ \t]*+([A-Za-z0-9_+.-]*+)[^\n]*+\n(.*?)(?:```|\Z)", re.DOTALL | re.MULTILINE)
_PY_TAGS = {"", "python", "py", "python3", "py3"}
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_TOP_LEVEL = re.compile(r"(?:async\s+def|def|class|import|from)\b|@")
_WEAK = "audit-hook(best-effort)"  # README: a run without namespaces says so in the grade detail
_HOSTILE = {"timeout", "memory", "crashed", "killed"}  # never re-run code that ended like this


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not run (not the answer's fault): retry the cell, do not score 0."""


def _clean(code: str) -> str:
    """Drop leading blank lines and trailing whitespace; keep the first line's indentation."""
    return re.sub(r"\A(?:[ \t]*\r?\n)+", "", code).rstrip()


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a model answer (or a prompt): among fenced python (or untagged) blocks (the
    opening fence at the start of a line), the
    last one that defines `entry_point`, else the longest; without fences, the raw text.
    `<think>` sections are ignored; an unclosed fence (a cut-off answer) runs to the end."""
    text = _THINK.sub("", text or "")
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PY_TAGS]
    if not blocks:
        return _clean(text)
    if entry_point:
        defining = [
            b for b in blocks if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)
        ]
        if defining:
            return _clean(defining[-1])
    return _clean(max(blocks, key=len))


def _compiles(source: str) -> bool:
    try:
        compile(source, "<candidate>", "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return False
    return True


def candidate_programs(answer: str, prompt: str | None = None, entry_point: str | None = None) -> list[tuple[str, str]]:
    """(label, program) pairs to try, in order, keeping only those that compile: the prompt's
    code followed by the answer (a body continuing the prompt, or a whole function that replaces
    the stub), the answer alone, and the prompt followed by the answer re-indented as a body."""
    code = extract_code(answer, entry_point)
    if not code.strip():
        return []
    stub = extract_code(prompt, entry_point) + "\n" if prompt else ""
    options = [("answer", code)]
    if stub:
        options.insert(0, ("prompt+answer", stub + code))
        if not code[:1].isspace() and not _TOP_LEVEL.match(code):
            options.append(("prompt+indented answer", stub + textwrap.indent(code, "    ")))
    seen: set[str] = set()
    out = []
    for label, program in options:
        if program not in seen and _compiles(program):
            seen.add(program)
            out.append((label, program))
    return out


def _last_line(result: SandboxResult) -> str:
    lines = [ln for ln in result.stderr_tail.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else result.detail


def grade_python_tests(
    answer_text: str | None, spec: PythonTestsGrader | dict[str, Any], prompt: str | None = None
) -> tuple[float, str]:
    """Grade a code answer: (quality, detail). `prompt` is the task prompt; its code (the fenced
    block, else the text) is prepended for answers that only continue it. Raises only
    `SandboxUnavailable` (the sandbox could not start), never on hostile code."""
    spec = spec if isinstance(spec, PythonTestsGrader) else PythonTestsGrader.model_validate(spec)
    if not answer_text or not answer_text.strip():
        return 0.0, "no answer"
    if len(answer_text) > MAX_ANSWER_CHARS:
        return 0.0, f"answer longer than {MAX_ANSWER_CHARS} characters"
    programs = candidate_programs(answer_text, prompt, spec.entry_point)
    if not programs:
        return 0.0, "no compilable Python code in the answer"
    limits = Limits(timeout_s=spec.timeout_s, memory_mb=spec.memory_mb)
    test = f"{spec.test}\n\ncheck({spec.entry_point})\n"
    details = []
    for label, program in programs:
        result = run_untrusted(program, test, limits)
        if result.reason == "error":
            raise SandboxUnavailable(result.detail)
        weak = " (no namespaces here: best-effort audit-hook sandbox)" if _WEAK in result.isolation else ""
        if result.passed:
            return 1.0, f"{label}: tests passed in {result.seconds:.2f}s{weak}"
        details.append(f"{label}: {result.reason}: {_last_line(result)}{weak}")
        if result.reason in _HOSTILE:
            break
    return 0.0, "; ".join(details)
