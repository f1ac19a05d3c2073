"""The python_tests grader: spec, code extraction, answer shapes, hostile answers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import fugu_pipeline.collect.code_grader as cg
from fugu_pipeline.collect.code_grader import (
    SandboxUnavailable,
    candidate_programs,
    extract_code,
    grade_python_tests,
)
from fugu_pipeline.collect.sandbox import SandboxResult
from fugu_pipeline.tasks.schema import PythonTestsGrader

STUB = (
    'from typing import List\n\n\ndef add_all(xs: List[int]) -> int:\n    """Sum the list.\n'
    '    >>> add_all([1, 2])\n    3\n    """\n'
)
PROMPT = f"Complete the following Python function.\n\n```python\n{STUB}```"
TEST = "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"
SPEC = {"type": "python_tests", "test": TEST, "entry_point": "add_all", "timeout_s": 3, "memory_mb": 256}


def test_spec_is_strict() -> None:
    spec = PythonTestsGrader.model_validate(SPEC)
    assert (spec.timeout_s, spec.memory_mb) == (3, 256)
    assert PythonTestsGrader.model_validate({"type": "python_tests", "test": TEST, "entry_point": "f"}).timeout_s == 10
    for bad in (
        {**SPEC, "extra": 1},
        {**SPEC, "entry_point": "not valid"},
        {**SPEC, "test": "assert True"},
        {**SPEC, "timeout_s": 0},
        {**SPEC, "memory_mb": 1},
        {**SPEC, "type": "exact"},
    ):
        with pytest.raises(ValidationError):
            PythonTestsGrader.model_validate(bad)


def test_extract_code_prefers_the_block_defining_the_entry_point() -> None:
    answer = (
        "Here you go:\n```python\ndef add_all(xs):\n    return sum(xs)\n```\n"
        "Usage:\n```python\nprint(add_all([1]))\n```"
    )
    assert extract_code(answer, "add_all") == "def add_all(xs):\n    return sum(xs)"
    assert extract_code("<think>```python\nwrong\n```</think>```py\nright\n```") == "right"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off
    assert extract_code("```bash\nls\n```\n    return 1\n") == "```bash\nls\n```\n    return 1"
    assert extract_code("\n\n    return sum(xs)\n") == "    return sum(xs)"  # indentation kept
    assert extract_code("Reply in one ```python block.\n\n```python\nx = 1\n```") == "x = 1"  # inline ``` is no fence


def test_candidate_programs_order_and_compile_filter() -> None:
    labels = [label for label, _ in candidate_programs("    return sum(xs)", PROMPT, "add_all")]
    assert labels == ["prompt+answer"]  # a bare body does not compile alone
    labels = [label for label, _ in candidate_programs("return sum(xs)", PROMPT, "add_all")]
    assert labels == ["prompt+indented answer"]
    assert candidate_programs("", PROMPT, "add_all") == []
    assert candidate_programs("def (", PROMPT, "add_all") == []


@pytest.mark.parametrize(
    "answer",
    [
        "    return sum(xs)\n",  # body continuing the prompt
        "return sum(xs)",  # body that lost its indentation
        "```python\ndef add_all(xs):\n    return sum(xs)\n```",  # whole function, no import
        f"```python\n{STUB}    return sum(xs)\n```",  # the prompt repeated with the body
        "```python\nfrom __future__ import annotations\n\ndef add_all(xs: List[int]) -> int:\n    return sum(xs)\n```",
    ],
)
def test_correct_answers_in_any_shape_pass(answer: str) -> None:
    quality, detail = grade_python_tests(answer, SPEC, PROMPT)
    assert quality == 1.0, detail


def test_answer_alone_without_prompt() -> None:
    assert grade_python_tests("def add_all(xs):\n    return sum(xs)", SPEC)[0] == 1.0
    assert grade_python_tests("    return sum(xs)", SPEC)[0] == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "",
        "I cannot help with that.",
        "    return 42\n",
        "```python\ndef add_all(xs):\n    return None\n```",
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "    raise SystemExit(0)\n",
        "    while True:\n        pass\n",
        "    x = bytearray(10**10)\n",
        "    import os\n    os.kill(os.getpid(), 9)\n",
        "x" * (cg.MAX_ANSWER_CHARS + 1),
    ],
)
def test_wrong_or_hostile_answers_score_zero(answer: str | None) -> None:
    quality, detail = grade_python_tests(answer, SPEC, PROMPT)
    assert quality == 0.0 and detail


def test_a_hostile_answer_is_not_rerun() -> None:
    quality, detail = grade_python_tests("while True:\n    pass\n", {**SPEC, "timeout_s": 1}, PROMPT)
    assert quality == 0.0 and detail.count("timeout") == 1


def test_sandbox_failure_raises_instead_of_scoring_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cg, "run_untrusted", lambda *a, **k: SandboxResult(False, "error", 0.0, detail="no python"))
    with pytest.raises(SandboxUnavailable, match="no python"):
        grade_python_tests("    return sum(xs)", SPEC, PROMPT)


def test_code_tasks_are_collected_and_graded_in_the_sandbox(tmp_path):
    """A `python_tests` batch through the real collection path: the mock pool's correct answers
    pass in the sandbox, its wrong ones fail, and every cell is stored graded."""
    import json

    from fugu_pipeline.collect.partition import collect_partition_sync
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.tasks.loading import load_tasks
    from fugu_pipeline.workers.config import WorkersConfig

    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    rows = [{"task_id": f"add-{i}", "prompt": "Write a Python function add(a, b) that returns a + b.",
             "domain": "code", "reference_answer": "def add(a, b):\n    return a + b",
             "grader": {"type": "python_tests", "test": test, "entry_point": "add", "timeout_s": 10}} for i in range(6)]
    batch = tmp_path / "code.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(batch)
    config = WorkersConfig.model_validate({"workers": [
        {"id": "coder", "kind": "mock", "mock": {"strengths": {"code": 1.0}}},
        {"id": "poet", "kind": "mock", "mock": {"strengths": {"code": 0.0}}}]})
    store = ResponseStore(tmp_path / "responses")
    for wid, want in (("coder", 1.0), ("poet", 0.0)):
        stats = collect_partition_sync(tasks, "code", wid, config, store)
        assert (stats.n_ok, stats.n_failed) == (6, 0)
        recs = store.read("code", wid)
        assert {r.quality for r in recs.values()} == {want}
        assert all(("tests passed" in r.grade_detail) == (want == 1.0) for r in recs.values())
