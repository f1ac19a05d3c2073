"""Converters for LiveCodeBench (public test cases, graded in the sandbox) and the full MMLU (57
subjects, the subject as domain), each on a hand-made file in the public format, through the
command line as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fugu_pipeline.collect.grading import grade_local
from fugu_pipeline.tasks.benchmark_rows import MMLU_SUBJECTS
from fugu_pipeline.tasks.converters import convert
from fugu_pipeline.tasks.schema import Task

from .conftest import REPO

# livecodebench/code_generation_lite rows: test cases and metadata are JSON strings
LCB_ROWS = [
    {"question_title": "Sum of Two", "question_content": "Read two integers A and B and print A+B.",
     "platform": "atcoder", "question_id": "abc999_a", "contest_id": "abc999", "contest_date": "2024-08-03T00:00:00",
     "starter_code": "", "difficulty": "easy",
     "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
                                      {"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}]),
     "private_test_cases": "eJzLSM3JyQcABiwCFQ==", "metadata": "{}"},
    {"question_title": "max-pair-sum", "question_content": "Given nums, return the largest sum of two elements.",
     "platform": "leetcode", "question_id": "3001", "contest_id": "weekly-contest-999",
     "contest_date": "2024-08-04T00:00:00", "difficulty": "medium",
     "starter_code": "class Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n        ",
     "public_test_cases": json.dumps([{"input": "[1, 5, 3]", "output": "8", "testtype": "functional"},
                                      {"input": "[-2, -7]", "output": "-9", "testtype": "functional"}]),
     "private_test_cases": "", "metadata": json.dumps({"func_name": "maxPairSum"})},
    {"question_title": "no tests", "question_content": "x", "platform": "atcoder", "question_id": "q",
     "public_test_cases": "[]", "metadata": "{}"},
]
STDIN_RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
STDIN_WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
FUNC_RIGHT = ("```python\nfrom typing import List\nclass Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n"
              "        s = sorted(nums)\n        return s[-1] + s[-2]\n```")
FUNC_WRONG = FUNC_RIGHT.replace("s[-1] + s[-2]", "s[-1] + s[0]")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_livecodebench_converts_public_tests_and_grades_in_the_sandbox(tmp_path):
    tasks, report = convert("livecodebench", _write(tmp_path / "lcb.jsonl", LCB_ROWS))
    assert len(tasks) == 2 and report.skipped[0][2].startswith("no public test cases")
    stdin, func = (Task.model_validate(t) for t in tasks)
    assert stdin.grader.type == func.grader.type == "io_tests"
    assert (stdin.grader.mode, func.grader.mode, func.grader.func_name) == ("stdin", "functional", "maxPairSum")
    assert "standard input" in stdin.prompt and "class Solution" in func.prompt and stdin.domain == "code"
    assert len(stdin.grader.tests) == 2 and "platform:atcoder" in stdin.tags
    assert grade_local(stdin, STDIN_RIGHT).quality == 1.0
    wrong = grade_local(stdin, STDIN_WRONG)
    assert wrong.quality == 0.0 and "test 1: wrong output" in wrong.detail
    assert grade_local(func, FUNC_RIGHT).quality == 1.0
    assert grade_local(func, FUNC_WRONG).quality == 0.0
    assert grade_local(func, "no code here, sorry").quality == 0.0


MMLU_ROWS = [  # cais/mmlu: question, subject, choices, answer (an index)
    {"question": "Find the degree of Q(sqrt(2)) over Q.", "subject": "abstract_algebra",
     "choices": ["0", "4", "2", "6"], "answer": 2},
    {"question": "Which bone is in the ear?", "subject": "anatomy", "choices": ["femur", "stapes", "ulna", "tibia"],
     "answer": 1},
    {"question": "What orbits the Earth?", "subject": "astronomy", "choices": ["the Moon", "Mars", "Venus", "Io"],
     "answer": 0},
    {"question": "No subject here?", "choices": ["a", "b", "c", "d"], "answer": 0},
    {"question": "A made-up subject?", "subject": "alchemy", "choices": ["a", "b", "c", "d"], "answer": 0},
]


def test_full_mmlu_takes_the_subject_as_domain_and_refuses_a_row_without_one(tmp_path):
    assert len(MMLU_SUBJECTS) == len(set(MMLU_SUBJECTS)) == 57
    src = _write(tmp_path / "test.jsonl", MMLU_ROWS)
    out = tmp_path / "mmlu.jsonl"
    run = subprocess.run([sys.executable, "-m", "fugu_pipeline.cli", "convert", "mmlu", str(src), "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tasks = [Task.model_validate_json(x) for x in out.read_text().splitlines()]
    assert [t.domain for t in tasks] == ["abstract_algebra", "anatomy", "astronomy"]
    assert all("None" not in " ".join(t.tags) for t in tasks)
    assert "test.jsonl:4: skipped mmlu-3: no 'subject'" in run.stderr
    assert "subject 'alchemy' is not one of MMLU's 57 subjects" in run.stderr
    assert grade_local(tasks[0], "The answer is C.").quality == 1.0 and grade_local(tasks[0], "B").quality == 0.0


def test_mmlu_stem_never_tags_subject_none(tmp_path):
    """before: a cais/mmlu row (subject, no `type`) converted with the tag `subject:None`."""
    tasks, report = convert("mmlu_stem", _write(tmp_path / "stem.jsonl", MMLU_ROWS[:1] + MMLU_ROWS[3:4]))
    assert [t["tags"] for t in tasks] == [["source:mmlu_stem", "subject:abstract_algebra"]]
    assert "no 'subject'" in report.skipped[0][2]


@pytest.mark.parametrize("kind", ["livecodebench", "mmlu"])
def test_the_command_line_offers_the_new_kinds(kind):
    out = subprocess.run([sys.executable, "-m", "fugu_pipeline.cli", "convert", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert kind in out.stdout
