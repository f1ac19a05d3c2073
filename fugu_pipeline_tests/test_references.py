"""Reference answers and grader choices (no data needed)."""

from __future__ import annotations

import re

import pytest

from fugu_pipeline.collect.grading import grade_local
from fugu_pipeline.tasks.answers import last_boxed
from fugu_pipeline.tasks.references import (
    choice_pattern,
    choices_block,
    format_number,
    math_reference,
)
from fugu_pipeline.tasks.schema import Task


def _grade(pattern_letter: str, answer: str) -> float:
    task = Task(
        task_id="t",
        prompt="Which?\n\nA. x\nB. y\nC. z\nD. w\n\nAnswer with the letter of the correct choice.",
        reference_answer=pattern_letter,
        grader={"type": "regex", "pattern": choice_pattern(pattern_letter)},
    )
    return grade_local(task, answer).quality


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        " (B) ",
        "B.",
        "[B]",
        "B) y",
        "B. y",
        "The answer is B",
        "The answer is (B).",
        "the correct answer is **B**",
        "Answer: B",
        "ANSWER: (B)",
        "Let me think. y holds, so the answer is B.",
        "\\boxed{B}",
        "So \\boxed{\\text{(B)}}.",
        "First I thought the answer is A, but checking again, the answer is B.",
    ],
)
def test_choice_pattern_accepts(answer: str) -> None:
    assert _grade("B", answer) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "A",
        "(C)",
        "The answer is A",
        "Answer: D",
        "\\boxed{C}",
        "The answer is Because of y, C",
        "b",
        "The answer is B. Hmm, no: the answer is C.",
        "Both A and C look right",
        "ABBA",
    ],
)
def test_choice_pattern_rejects(answer: str) -> None:
    assert _grade("B", answer) == 0.0


def test_choice_pattern_letter_is_case_sensitive() -> None:
    assert _grade("A", "The answer is a bit unclear, so C") == 0.0
    with pytest.raises(ValueError):
        choice_pattern("Z")


def test_last_boxed_handles_nested_braces() -> None:
    assert last_boxed("x \\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{3}} end") == "\\frac{\\sqrt{3}}{3}"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{\\frac{1}{2}") is None


def test_math_reference_chooses_per_row() -> None:
    assert math_reference("42") == ("42", {"type": "numeric", "tolerance": 0.0, "math": True})
    assert math_reference("\\frac{14}{3}")[1]["type"] == "numeric"
    assert math_reference("-50")[1]["type"] == "numeric"
    assert math_reference("\\left( 3, \\frac{\\pi}{2} \\right)")[1] == {"type": "exact", "math": True}
    assert math_reference("90^\\circ")[1] == {"type": "exact", "math": True}
    ref, grader = math_reference("\\text{(C)}")
    assert ref == "C" and grader["type"] == "regex" and re.search(grader["pattern"], "\\boxed{\\text{(C)}}")
    with pytest.raises(ValueError):
        math_reference("  ")


def test_format_number_and_choices_block() -> None:
    assert (format_number(27.0), format_number(0.5), format_number(-3)) == ("27", "0.5", "-3")
    assert choices_block(["x", "y"]) == "A. x\nB. y"
    with pytest.raises(ValueError):
        choices_block(["only one"])
    with pytest.raises(ValueError):
        choices_block(["x", " "])


def test_exact_reference_with_a_leading_dot_keeps_its_dot() -> None:
    ref, grader = math_reference(".0000672")
    assert grader == {"type": "exact", "strip": False, "math": True}
    task = Task(task_id="t", prompt="Convert to a decimal.", reference_answer=ref, grader=grader)
    assert grade_local(task, "So \\boxed{.0000672}.").quality == 1.0
    assert grade_local(task, "So \\boxed{0.0000672}.").quality == 1.0  # equivalent
    assert grade_local(task, "So \\boxed{0.000672}.").quality == 0.0
