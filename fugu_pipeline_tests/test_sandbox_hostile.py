"""Hostile answers and task files against the sandbox and the graders (review rv23b)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from fugu_pipeline.collect import grading, sandbox
from fugu_pipeline.collect.code_grader import grade_python_tests
from fugu_pipeline.collect.grading import grade, grade_local
from fugu_pipeline.collect.sandbox import Limits, run_untrusted
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.contract import WorkerCallError

WRONG_TEST = {"type": "python_tests", "entry_point": "f", "test": "def check(candidate):\n    assert candidate(1) == 2\n"}


def _task(grader: dict, ref: str | None = None) -> Task:
    return Task(task_id="t1", prompt="Solve it.", reference_answer=ref, grader=grader)


@pytest.mark.parametrize("patch", [
    "builtins.exec = lambda *a, **k: None",
    "_c = builtins.compile\nbuiltins.compile = lambda s, fn, m, *a, **k: _c('pass', fn, m)",
])
def test_answer_replacing_exec_or_compile_does_not_fake_a_pass(patch):
    answer = f"```python\nimport builtins\n{patch}\ndef f(x):\n    return x\n```"
    quality, detail = grade_python_tests(answer, WRONG_TEST)
    assert quality == 0.0, detail
    assert "AssertionError" in detail


def test_test_program_that_does_not_compile_is_the_tasks_fault():
    bad = dict(WRONG_TEST, test="def check(candidate):\n    assert candidate(1) == 1 +\n")
    with pytest.raises(ValidationError, match=r"test program does not compile \(line 2"):
        _task(bad)


@pytest.mark.parametrize("ref", ["1e999", "9" * 400])
def test_numeric_reference_must_be_finite(ref):
    with pytest.raises(ValidationError, match="finite numeric reference_answer"):
        _task({"type": "numeric", "tolerance": 0.1, "relative": True}, ref)


def test_numeric_answer_that_overflows_scores_zero():
    g = grade_local(_task({"type": "numeric", "tolerance": 0.1, "relative": True}, "5"), "\\boxed{1e999}")
    assert g.quality == 0.0


def test_regex_catastrophic_backtracking_is_bounded_and_off_the_loop(monkeypatch):
    monkeypatch.setattr(grading, "REGEX_TIMEOUT_S", 0.5)
    task = _task({"type": "regex", "pattern": "(a+)+$"})
    assert grade_local(task, "aaa").quality == 1.0
    assert grade_local(_task({"type": "regex", "pattern": "AB", "flags": ["IGNORECASE"]}), "xaby").quality == 1.0

    async def both():
        ticks = 0

        async def ticker():
            nonlocal ticks
            for _ in range(5):
                await asyncio.sleep(0.05)
                ticks += 1

        t = asyncio.create_task(ticker())
        with pytest.raises(ValueError, match="catastrophic backtracking"):
            await grade(task, "a" * 40 + "b")
        during = ticks  # the event loop went on while the regex was graded
        await t
        return during

    assert asyncio.run(both()) >= 1


class _Judge:
    def __init__(self, reply):
        self.reply = reply

    async def complete(self, messages, task=None):
        return SimpleNamespace(answer=self.reply, cost_usd=0.0)


@pytest.mark.parametrize("reply", ["SCORE: 15", "SCORE: -3", "SCORE: 2\nSCORE: 9", "SCORE: 1e3", None])
def test_judge_reply_out_of_scale_or_ambiguous_is_an_error(reply):
    with pytest.raises(WorkerCallError):
        asyncio.run(grade(_task({"type": "llm_judge", "rubric": "r"}), "ans", _Judge(reply)))


def test_judge_repeating_one_score_is_fine():
    g = asyncio.run(grade(_task({"type": "llm_judge", "rubric": "r"}), "ans", _Judge("SCORE: 7\nso SCORE: 7.")))
    assert g.quality == pytest.approx(0.7)


def test_full_isolation_keeps_secrets_network_and_project_out(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-hostile-probe")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    code = f"""import os, glob, socket
leaks = []
for p in glob.glob('/proc/[0-9]*/environ'):
    try:
        if b'sk-or-hostile' in open(p, 'rb').read():
            leaks.append(p)
    except OSError:
        pass
print('LEAKS', leaks)
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=1)
    print('CONNECTED')
except OSError:
    pass
print('PROJECT', os.path.exists({str(sandbox._CHECKOUT / 'pyproject.toml')!r}))
"""
    res = run_untrusted(code, "", Limits(timeout_s=10))
    srv.settimeout(0.05)
    with pytest.raises(OSError):
        srv.accept()
    srv.close()
    assert res.passed, res
    assert "LEAKS []" in res.stdout_tail and "CONNECTED" not in res.stdout_tail
    if "private-tmp" in res.isolation:
        assert "PROJECT False" in res.stdout_tail


_FALLBACK = """#!/bin/sh
# the sandbox child with unshare() failing: the no-namespace fallback
exec {python} -I -B -c '
import sys
child, fd = sys.argv[1], sys.argv[2]
sys.argv = [child, fd]
g = {{"__name__": "fallback", "__file__": child}}
exec(compile(open(child).read(), child, "exec"), g)
real = g["_libc"]
class NoNS:
    def __getattr__(self, n):
        return (lambda *a: -1) if n == "unshare" else getattr(real, n)
g["_libc"] = NoNS()
g["main"]()
' "$3" "$4"
"""


@pytest.fixture
def fallback():
    """A `python` for run_untrusted that makes the child's namespaces fail, and a secret file in
    a folder the run hides; both in a world-readable temp folder (the run's fresh uid must get in)."""
    base = tempfile.mkdtemp(prefix="fugu-hostile-")
    os.chmod(base, 0o755)
    wrapper, secret = os.path.join(base, "python"), os.path.join(base, "project", ".env")
    with open(wrapper, "w") as f:
        f.write(_FALLBACK.format(python=sandbox.interpreter()))
    os.chmod(wrapper, 0o755)
    os.makedirs(os.path.dirname(secret), mode=0o755)
    with open(secret, "w") as f:
        f.write("OPENROUTER_API_KEY=sk-or-in-dotenv\n")
    os.chmod(secret, 0o644)
    yield SimpleNamespace(python=wrapper, secret=secret,
                          limits=Limits(timeout_s=10, hide_paths=(os.path.dirname(secret),)))
    shutil.rmtree(base, ignore_errors=True)


def test_fallback_audit_hook_blocks_native_network(fallback):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    native = f"""import ctypes, gc, struct
lib = [o for o in gc.get_objects() if isinstance(o, ctypes.CDLL)][0]
fd = lib.socket(2, 1, 0)
addr = struct.pack('<H', 2) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))
print('CONNECT', lib.connect(fd, addr, 16))
"""
    res = run_untrusted(native, "", fallback.limits, python=fallback.python)
    srv.settimeout(0.05)
    with pytest.raises(OSError):
        srv.accept()
    srv.close()
    assert "audit-hook(best-effort)" in res.isolation and "netns" not in res.isolation, res
    assert not res.passed and "CONNECT" not in res.stdout_tail and "ctypes" in res.stderr_tail, res


def test_fallback_audit_hook_hides_project_files(fallback):
    res = run_untrusted(f"print(open({fallback.secret!r}).read())", "", fallback.limits, python=fallback.python)
    assert "private-tmp" not in res.isolation, res
    assert not res.passed and "sk-or-in-dotenv" not in res.stdout_tail, res
    assert "is hidden" in res.stderr_tail, res


def test_fallback_says_so_in_the_grade_detail(fallback, monkeypatch):
    monkeypatch.setattr(sandbox, "interpreter", lambda: fallback.python)
    ok = dict(WRONG_TEST, test="def check(candidate):\n    assert candidate(1) == 1\n")
    quality, detail = grade_python_tests("```python\ndef f(x):\n    return x\n```", ok)
    assert quality == 1.0 and "best-effort" in detail, detail


def test_looping_boxed_reply_is_graded_in_linear_time():
    """A reply stuck repeating `\\boxed{` (2,000 of them took ~0.8 s, 20,000 minutes) on the event loop.
    100,000 of them: a quadratic scan would run for over half an hour, past the suite's timeout, which
    names this test; the linear one takes about a second."""
    from fugu_pipeline.tasks.answers import boxed_contents

    assert boxed_contents(r"a \boxed{\frac{1}{2}} b \fbox {3} } { \boxed{4 } \boxed{5") == [r"\frac{1}{2}", "3", "4"]
    task = _task({"type": "numeric"}, "7")
    assert grade_local(task, "\\boxed{" * 100_000).quality == 0.0
    assert grade_local(task, "\\boxed{" * 50_000 + "7" + "}" * 50_000).quality == 1.0
