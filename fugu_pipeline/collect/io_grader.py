"""The `io_tests` grader: run a worker's program on input/output test cases (LiveCodeBench's public
tests) in the sandbox (`collect/sandbox.py`), every case of a task in one sandboxed run.

- `stdin`: the program runs as `__main__` once per case with the case's input on stdin; its stdout
  must equal the expected output token by token (whitespace ignored; two numbers within 1e-6
  count as equal).
- `functional` (LeetCode style): the program defines `class Solution`; each case's input is one
  JSON value per line (the arguments), and `Solution().<func_name>(*args)` must equal the
  expected output's JSON value (tuples compare as lists).
The program is handed to the harness as a string (never run at import), so a `stdin` program that
reads its input at the top level runs only inside a case. Quality 1.0 when every case passes.
"""

from __future__ import annotations

import json

from fugu_pipeline.collect.code_grader import _HOSTILE, _WEAK, MAX_ANSWER_CHARS, SandboxUnavailable, _last_line, extract_code
from fugu_pipeline.collect.sandbox import Limits, run_untrusted
from fugu_pipeline.tasks.schema import IOTestsGrader

_STDIN_HARNESS = r'''
import io as _io, json as _json, sys as _sys
def _same(a, b):
    x, y = a.split(), b.split()
    if len(x) != len(y):
        return False
    for p, q in zip(x, y):
        if p == q:
            continue
        try:
            if abs(float(p) - float(q)) <= 1e-6 * max(1.0, abs(float(q))):
                continue
        except ValueError:
            pass
        return False
    return True
_code = compile(__fugu_program__, "solution.py", "exec")
for _i, _case in enumerate(_json.loads(__fugu_cases__)):
    _out = _io.StringIO()
    _sys.stdin, _sys.stdout = _io.StringIO(_case["input"]), _out
    try:
        exec(_code, {"__name__": "__main__"})
    except SystemExit as _e:
        if _e.code not in (None, 0):
            raise AssertionError(f"test {_i + 1}: exit status {_e.code}")
    finally:
        _sys.stdin, _sys.stdout = _sys.__stdin__, _sys.__stdout__
    if not _same(_out.getvalue(), _case["output"]):
        raise AssertionError(f"test {_i + 1}: wrong output")
'''

_FUNCTIONAL_HARNESS = r'''
import json as _json
def _plain(v):
    if isinstance(v, tuple):
        v = list(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v
for _i, _case in enumerate(_json.loads(__fugu_cases__)):
    _args = [_json.loads(_line) for _line in _case["input"].split("\n") if _line.strip()]
    _got = _plain(getattr(Solution(), __fugu_func__)(*_args))
    if _got != _plain(_json.loads(_case["output"])):
        raise AssertionError(f"test {_i + 1}: wrong result")
'''


def harness(program: str, spec: IOTestsGrader) -> tuple[str, str]:
    """(code, test) for `run_untrusted`: the code defines the program text (stdin) or the program
    itself (functional); the test runs every case."""
    cases = json.dumps([c.model_dump() for c in spec.tests])
    if spec.mode == "stdin":
        return f"__fugu_program__ = {program!r}\n__fugu_cases__ = {cases!r}\n", _STDIN_HARNESS
    return f"{program}\n\n__fugu_cases__ = {cases!r}\n__fugu_func__ = {spec.func_name!r}\n", _FUNCTIONAL_HARNESS


def grade_io_tests(answer_text: str | None, spec: IOTestsGrader | dict) -> tuple[float, str]:
    """(quality, detail). Raises only `SandboxUnavailable` (the sandbox could not start)."""
    spec = spec if isinstance(spec, IOTestsGrader) else IOTestsGrader.model_validate(spec)
    if not answer_text or not answer_text.strip():
        return 0.0, "no answer"
    if len(answer_text) > MAX_ANSWER_CHARS:
        return 0.0, f"answer longer than {MAX_ANSWER_CHARS} characters"
    program = extract_code(answer_text, "Solution" if spec.mode == "functional" else None)
    try:
        compile(program, "<candidate>", "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return 0.0, "no compilable Python code in the answer"
    code, test = harness(program, spec)
    result = run_untrusted(code, test, Limits(timeout_s=spec.timeout_s * len(spec.tests), memory_mb=spec.memory_mb))
    if result.reason == "error":
        raise SandboxUnavailable(result.detail)
    weak = " (no namespaces here: best-effort audit-hook sandbox)" if _WEAK in result.isolation else ""
    if result.passed:
        return 1.0, f"{len(spec.tests)} test case(s) passed in {result.seconds:.2f}s{weak}"
    note = " (stopped)" if result.reason in _HOSTILE else ""
    return 0.0, f"{result.reason}{note}: {_last_line(result)}{weak}"
