"""The three roles of a multi-turn session (TinyRouter): what each is told, how a Verifier's verdict
is read, and which turn's text counts as an answer.

- Thinker: plans, never answers. Worker: answers. Verifier: checks the latest answer and ends
  with `VERDICT: ACCEPT` or `VERDICT: REVISE`.
- A verdict is the LAST `VERDICT: ACCEPT|REVISE` in the Verifier's text (case does not matter,
  markdown around it does not matter); a text with none, or in another language, means REVISE.
  A REVISE's objection (`objection`) is what follows the verdict, else the Verifier's whole text;
  the next Worker turn is handed it (`transcript.worker_messages`).
- An answer is extractable from a Worker turn when the task's grader could read one (a number for
  `numeric`, a non-empty final line for `exact`, any text otherwise); from a Thinker turn only when
  it explicitly commits (`\\boxed{...}` or "answer is ..."/"Final answer: ..."); never from a
  Verifier turn.

Every role's system message starts with a `Role: <Name>` line: workers (and the mock pool,
`workers/mock_roles.py`) read the role from it.
"""

from __future__ import annotations

import re
from typing import Literal

from fugu_pipeline.tasks.answers import FINAL, extract_final_number, final_line, last_boxed

Role = Literal["thinker", "worker", "verifier"]
ROLES: tuple[Role, ...] = ("thinker", "worker", "verifier")
ROLE_NAMES = {"thinker": "Thinker", "worker": "Worker", "verifier": "Verifier"}
PROMPT_VERSION = "roles-v2"  # bump when a role prompt changes: stored trajectories are keyed by it

ROLE_PROMPTS: dict[str, str] = {
    "thinker": (
        "Role: Thinker\n"
        "You are the Thinker in a small team of models solving the task below together. Write a short plan: "
        "the steps to take, the traps to avoid, what to check at the end. Do not solve the task and do not "
        "state a final answer: another model will do the work."
    ),
    "worker": (
        "Role: Worker\n"
        "You are the Worker in a small team of models solving the task below together. Solve it. Use the "
        "plan in the transcript when there is one; when a Verifier rejected the latest answer, fix what it "
        "objected to. End with one line of the form `Final answer: <answer>`."
    ),
    "verifier": (
        "Role: Verifier\n"
        "You are the Verifier in a small team of models solving the task below together. Check the latest "
        "answer in the transcript step by step. End with exactly one line: `VERDICT: ACCEPT` when it is "
        "correct and complete, or `VERDICT: REVISE: <what is wrong>` (the next Worker is given your objection)."
    ),
}

# spaces, one separator and bold stars before the word, each space read one way
_VERDICT = re.compile(r"VERDICT\s*(?:[:：=\-]\s*)?(?:\*+\s*)?(ACCEPT|REVISE)\b", re.IGNORECASE)


def parse_verdict(text: str | None) -> tuple[Literal["accept", "revise"], str]:
    """(verdict, how it was read). The last verdict in the text wins; none means REVISE."""
    found = [m.group(1).lower() for m in _VERDICT.finditer(text or "")]
    if not found:
        return "revise", "no verdict line: counted as REVISE"
    if len(set(found)) > 1:
        return found[-1], f"{len(found)} verdicts that disagree: the last one ({found[-1].upper()}) counts"
    return found[-1], "verdict line"


def objection(text: str | None, limit: int = 2000) -> str:
    """What a REVISE verdict objects to: the text after the last verdict, else everything before it."""
    text = text or ""
    found = list(_VERDICT.finditer(text))
    if found:
        after = text[found[-1].end():].strip(" \t:：-—*\n")
        text = after or text[: found[-1].start()]
    text = text.strip() or "(no reason given)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def extractable_answer(text: str | None, role: str, grader_type: str | None) -> bool:
    """Whether this turn's text holds an answer the task's grader could read (module docstring)."""
    if not text or not text.strip() or role == "verifier":
        return False
    if role == "thinker":
        return last_boxed(text) is not None or bool(FINAL.search(text))
    if grader_type == "numeric":
        return extract_final_number(text) is not None
    if grader_type == "exact":
        return bool(final_line(text).strip())
    return True
