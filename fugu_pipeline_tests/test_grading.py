"""Every grader's edge cases, and the utility formula."""

import asyncio

import pytest

from fugu_pipeline.collect.grading import grade, grade_local
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.answers import extract_final_number, parse_number
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.config import MockWorker
from fugu_pipeline.workers.contract import WorkerCallError
from fugu_pipeline.workers.mock import MockJudge


def T(grader: dict, ref: str | None, prompt: str = "question?") -> Task:
    return Task(task_id="t", prompt=prompt, reference_answer=ref, grader=grader)


@pytest.mark.parametrize("text, value", [
    ("42", 42.0), ("-3.5", -3.5), ("1,234", 1234.0), ("3/4", 0.75), ("1e-3", 0.001), ("$12", 12.0),
    ("50%", 50.0), ("\\frac{1}{2}", 0.5), ("abc", None), ("1/0", None), ("", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("answer, value", [
    ("so the total is 17 apples. The answer is 18", 18.0),
    ("we get \\boxed{3/4} finally 7", 0.75),
    ("Answer: 1,250", 1250.0),
    ("first 3 then 4", 4.0),
    ("no digits here", None),
])
def test_extract_final_number(answer, value):
    assert extract_final_number(answer) == value


def test_numeric_tolerance_absolute_and_relative():
    g = T({"type": "numeric", "tolerance": 0.01}, "3.14")
    assert grade_local(g, "about 3.149").quality == 1.0
    assert grade_local(g, "3.16").quality == 0.0
    r = T({"type": "numeric", "tolerance": 0.1, "relative": True}, "100")
    assert grade_local(r, "109").quality == 1.0
    assert grade_local(r, "111").quality == 0.0
    exact = T({"type": "numeric"}, "0.3")
    assert grade_local(exact, "0.1 + 0.2 = 0.30000000000000004").quality == 1.0  # float noise
    assert grade_local(exact, "I can't say").quality == 0.0


def test_exact_case_whitespace_and_final_line():
    g = T({"type": "exact"}, "New Delhi")
    assert grade_local(g, "  new   delhi. ").quality == 1.0
    assert grade_local(g, "The answer is New Delhi").quality == 1.0
    assert grade_local(g, "New Delhi is big").quality == 0.0
    cs = T({"type": "exact", "case_sensitive": True}, "Au")
    assert grade_local(cs, "AU").quality == 0.0
    assert grade_local(cs, "Au").quality == 1.0


def test_contains():
    g = T({"type": "contains"}, "[::-1]")
    assert grade_local(g, "use s[::-1] here").quality == 1.0
    assert grade_local(g, "use reversed(s)").quality == 0.0


def test_regex_pattern_flags_and_full_match():
    g = T({"type": "regex", "pattern": r"def\s+add\(", "flags": ["IGNORECASE"]}, None)
    assert grade_local(g, "DEF  add(a, b)").quality == 1.0
    full = T({"type": "regex", "pattern": r"\d+", "full_match": True}, None)
    assert grade_local(full, " 123 ").quality == 1.0
    assert grade_local(full, "x 123").quality == 0.0
    ref_as_pattern = T({"type": "regex"}, r"^(yes|y)$")
    assert grade_local(ref_as_pattern, "y").quality == 1.0


def test_llm_judge_through_mock_judge():
    task = T({"type": "llm_judge", "rubric": "mentions sunlight", "scale": 10}, "sunlight")
    judge = MockJudge(MockWorker(id="j", kind="mock", mock={"cost_usd": 0.0007}))
    good = asyncio.run(grade(task, "plants use sunlight", judge))
    bad = asyncio.run(grade(task, "no idea", judge))
    assert good.quality == 1.0 and 0.0 <= bad.quality < 0.5
    # each judged answer carries the judge call's own cost (one call each); a local grader costs nothing
    assert good.judge_cost_usd == bad.judge_cost_usd == pytest.approx(0.0007) and judge.calls == 2
    assert asyncio.run(grade(T({"type": "contains"}, "sunlight"), "sunlight", judge)).judge_cost_usd == 0.0


def test_llm_judge_needs_a_judge_and_a_score():
    task = T({"type": "llm_judge", "rubric": "r"}, "x")
    with pytest.raises(ValueError, match="no judge is configured"):
        asyncio.run(grade(task, "a", None))

    class Mute:
        async def complete(self, messages, task=None):
            from fugu_pipeline.workers.contract import Completion
            return Completion(answer="I think it's fine")

    with pytest.raises(WorkerCallError, match="SCORE"):
        asyncio.run(grade(task, "a", Mute()))


def test_utility_formula_and_caps():
    u = UtilityConfig(quality_weight=1, cost_weight=0.1, latency_weight=0.05, cost_scale_usd=0.01, latency_scale_s=10)
    assert u.utility(1.0, 0.01, 10.0) == pytest.approx(1 - 0.1 - 0.05)
    assert u.utility(0.0, 1.0, 1000.0) == pytest.approx(-0.1 * 5 - 0.05 * 5)  # both capped at 5
    assert u.utility(0.5, 0.0, 0.0) == 0.5
