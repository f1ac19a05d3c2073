"""Reference answers and grader specs for math and multiple-choice rows.

Per row: a plain number gets the `numeric` grader, a multiple-choice letter gets a `regex`
grader (`choice_pattern`), anything else `exact` on the boxed answer; `numeric` and `exact` carry
`math: true` (mathematical equivalence when the plain comparison fails). "Plain number" means what
the package's own `parse_number` reads, so the grader that checks the answer can read the reference.
"""

from __future__ import annotations

import re
from typing import Any

from fugu_pipeline.tasks.answers import parse_number

MATH_INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
LETTERS = "ABCDEFGHIJ"
_MCQ_ANSWER = re.compile(r"^\s*(?:\\text(?:bf)?\{\s*)?\(([A-J])\)\s*(?:\}\s*)?$")
_ANSWER_WORD = r"(?i:answer)(?:\s+(?i:is)|\s*:)"


def format_number(x: float) -> str:
    """27.0 -> '27', 0.5 -> '0.5'."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def choice_pattern(letter: str) -> str:
    """A regex (for the package's `regex` grader, searched in the answer) that accepts the
    letter as the whole answer ("B", "(B)", "B."), at the start followed by its text ("B) 42"),
    as the last "answer is B" / "Answer: (B)" / "answer is **B**", or boxed (`\\boxed{B}`,
    `\\boxed{\\text{(B)}}`). Case-sensitive for the letter, so "answer is a ..." is no "A". Each run
    of spaces is read one way and "no later answer" looks ahead to the next one only, so a grade
    takes linear time in the answer (`tasks/regex_safety.py`)."""
    if len(letter) != 1 or letter not in LETTERS:
        raise ValueError(f"not a choice letter: {letter!r}")
    lt = re.escape(letter)
    whole = rf"^\s*[(\[]?{lt}[)\]]?\s*(?:\.\s*)?$"
    leading = rf"^\s*[(\[]?{lt}[)\].:]\s"
    stated = rf"{_ANSWER_WORD}\s*(?:\*\*\s*)?[(\[]?{lt}\b(?![\s\S]*?{_ANSWER_WORD})"
    boxed = rf"\\boxed\{{\s*(?:\\text(?:bf)?\{{\s*)?\(?{lt}\)?\s*\}}"
    return "|".join((whole, leading, stated, boxed))


def choice_grader(letter: str) -> dict[str, Any]:
    return {"type": "regex", "pattern": choice_pattern(letter)}


def math_reference(answer: str) -> tuple[str, dict[str, Any]]:
    """(reference_answer, grader) for a math answer string, chosen per row."""
    ans = answer.strip()
    if not ans:
        raise ValueError("empty answer")
    if parse_number(ans) is not None:
        return ans, {"type": "numeric", "tolerance": 0.0, "math": True}
    mcq = _MCQ_ANSWER.match(ans)
    if mcq:
        return mcq.group(1), choice_grader(mcq.group(1))
    # the package's exact grader trims "." from the answer (not the reference): keep it for ".5"
    return ans, ({"type": "exact", "strip": False, "math": True} if ans.strip(".") != ans else {"type": "exact", "math": True})


def choices_block(choices: list[str]) -> str:
    """'A. first\\nB. second ...' for the prompt."""
    if not 2 <= len(choices) <= len(LETTERS):
        raise ValueError(f"{len(choices)} choices; expected 2 to {len(LETTERS)}")
    bad = [i for i, c in enumerate(choices) if not isinstance(c, str) or not c.strip()]
    if bad:
        raise ValueError(f"empty or non-text choice at position(s) {bad}")
    return "\n".join(f"{LETTERS[i]}. {c.strip()}" for i, c in enumerate(choices))
