"""Math answers graded by equivalence (math-verify behind the `exact`/`numeric` graders of math
tasks): every variant that was marked wrong is graded right, wrong answers stay wrong, decisions
are cached per (reference, answer), and tasks without `math: true` grade as before."""

from __future__ import annotations

import time

import pytest

from fugu_pipeline.collect import math_equivalence
from fugu_pipeline.collect.grading import grade_local
from fugu_pipeline.tasks.references import math_reference
from fugu_pipeline.tasks.schema import Task


def task(ref: str) -> Task:
    r, grader = math_reference(ref)  # what the MATH-500 converter writes
    return Task(task_id="m", prompt="Solve it.", reference_answer=r, grader=grader)


# (reference, a right answer written another way, a wrong answer): the five classes and more
CASES = [
    ("\\frac{3}{4}", "\\dfrac{3}{4}", "\\dfrac{4}{3}"),
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}", "\\dfrac{\\sqrt2}{2}"),
    ("2\\sqrt{2}", "2\\sqrt2", "2\\sqrt3"),
    ("(-1,1)", "(-1, 1)", "[-1, 1]"),
    ("(3, -2)", "(3,-2)", "(-2, 3)"),
    ("90^\\circ", "90", "45"),
    ("east", "\\text{east}", "\\text{west}"),
    ("\\text{Evelyn}", "Evelyn", "\\text{Ana}"),
    ("x^2 + 7x + 10", "(x+5)(x+2)", "x^2 + 7x + 12"),
    ("52_8", "52_{8}", "52_9"),  # math-verify drops a number's base: checked here
    ("15\\mbox{ cm}^2", "15", "15\\mbox{ cm}^3"),  # ... and a unit's power
    (".0000672", "0.0000672", ".0000673"),  # compared to 10 decimal places, not 6
    ("-1./3", "-\\frac{1}{3}", "-1./3x"),  # a bare trailing point: the LaTeX reader would stop at it
]


@pytest.mark.parametrize("ref,right,wrong", CASES)
def test_variants_are_graded_right_and_wrong_answers_stay_wrong(ref, right, wrong):
    t = task(ref)
    plain = t.model_copy(update={"grader": t.grader.model_copy(update={"math": False})})
    assert grade_local(t, f"So the answer is \\boxed{{{right}}}.").quality == 1.0
    assert grade_local(t, f"So the answer is \\boxed{{{wrong}}}.").quality == 0.0
    if ref not in ("(3, -2)", "52_8"):  # before: the plain grader marked the variant wrong
        assert grade_local(plain, f"So the answer is \\boxed{{{right}}}.").quality == 0.0


def test_numeric_math_tasks_read_fractions_the_plain_number_reader_cannot():
    t = task("0.75")
    assert t.grader.type == "numeric" and t.grader.math
    assert grade_local(t, "The answer is \\dfrac{3}{4}.").quality == 1.0
    assert grade_local(t, "The answer is \\dfrac{4}{3}.").quality == 0.0
    assert grade_local(t, "The answer is 0.75").detail.startswith("got 0.75")  # the plain path first, no helper


def test_non_math_tasks_are_untouched():
    t = Task(task_id="s", prompt="Symbol for gold?", reference_answer="Au",
             grader={"type": "exact", "case_sensitive": True})
    assert grade_local(t, "AU").quality == 0.0 and grade_local(t, "Au").quality == 1.0


def test_decisions_are_cached_per_reference_and_answer(monkeypatch):
    math_equivalence.cache_clear()
    t = task("\\frac{1}{2}")
    for _ in range(3):
        assert grade_local(t, "\\boxed{\\dfrac12}").quality == 1.0
    assert (math_equivalence.Stats.misses, math_equivalence.Stats.hits) == (1, 2)


def runs_away(reference: str, candidate: str) -> tuple[bool, str]:
    """A check that never answers in time (run in the helper process, which imports it by name)."""
    time.sleep(600)
    return True, "too late"


def test_a_runaway_check_is_not_equivalent_and_the_helper_is_replaced(monkeypatch):
    helper = math_equivalence._helper()  # up and warmed, before the check is swapped
    # The helper runs `runs_away`: it overruns any timeout, whatever the load (a real check with a tiny
    # timeout could still finish first when this thread is descheduled between sending it and waiting).
    monkeypatch.setattr(math_equivalence, "check", runs_away)
    monkeypatch.setattr(math_equivalence, "TIMEOUT_S", 0.5)
    math_equivalence.cache_clear()
    ok, how = math_equivalence.equivalent("\\frac{1}{7}", "\\boxed{\\dfrac{1}{7}}")
    assert not ok and "ran over 0.5s" in how
    assert math_equivalence._pool is not helper  # the runaway helper was killed and let go
    monkeypatch.undo()
    math_equivalence.cache_clear()
    assert math_equivalence.equivalent("\\frac{1}{7}", "\\boxed{\\dfrac{1}{7}}")[0]  # a new helper decides


def test_a_number_math_verify_falls_back_to_is_not_a_reading_of_an_expression():
    """math-verify reads `\\hbar \\omega(v+1/2) - \\frac{E_0^2 e^2}{2 m \\omega^2}` as 2 (SymPy cannot take
    it and it falls back to a number); any answer it also reads as 2 was graded right."""
    ref = "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}"
    t = task(ref)
    assert grade_local(t, f"\\boxed{{{ref}}}").quality == 1.0  # the same text: the plain comparison
    assert grade_local(t, f"\\boxed{{{ref}x}}").quality == 0.0
    assert grade_local(t, "\\boxed{2}").quality == 0.0
    assert "holds symbols" in grade_local(t, "\\boxed{2}").detail
