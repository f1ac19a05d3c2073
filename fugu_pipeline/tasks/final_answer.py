"""The comparable final answer of a reply: what two workers must both say to agree.

A cascade (FrugalGPT, AutoMix, answer-consistency cascades) stops early when the cheap workers'
answers agree, so every reply is reduced to one canonical string by the task's kind of answer:

- `choice`: a letter (A-J) of a multiple-choice question, from the strongest commitment the reply
  makes: a boxed letter (`\\boxed{B}`, `\\boxed{(C) \\text{city}}`), else a pairwise judge's verdict
  ("Output (a) is better" → "A"), else "The answer is (B)." → "B", else a letter standing alone at
  the end;
- `number`: the final number the reply commits to (`\\boxed{}`, "answer is X", "#### X", else
  the last number), written canonically: "1,200.0" and "1200" → "1200";
- `code`: the last fenced code block, trailing spaces and blank lines dropped;
- `text`: the final line the reply commits to ("answer is X", `\\boxed{}`, a few-shot reply's last
  "A: X" line, else the whole reply),
  lower-cased, whitespace collapsed, surrounding punctuation stripped.

`kind_for_grader` maps a task's grader to its kind (the graders' own parsers do the reading), and
`detect_kind` guesses it from the prompt and replies when nothing says (an imported matrix
without `answer_kind`). None means "no answer could be read": it never agrees with anything.

A reply (and a prompt's options) is read from its last `READ_CHARS` characters, where a reply
commits to its answer: every reader is linear in what it reads, and this bounds what one reply of
up to 16 MB (`max_reply_bytes`) costs. A reply shorter than that (every reply of the shipped data
sets) reads exactly as it would whole.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Literal

from fugu_pipeline.tasks.answers import extract_final_number, final_line

AnswerKind = Literal["choice", "number", "code", "text"]
ANSWER_KINDS: tuple[str, ...] = ("choice", "number", "code", "text")

# each run of spaces read one way: "#### " at the very end reads as its last space (no answer), as before
_HASHES = re.compile(r"####\s*(\S[^\n]*|[^\S\n](?=\n*\Z))")
_CHOICE_FINAL = re.compile(r"(?:answer|choice|option)\s*(?:(?:is|:|=)\s*)?(?:option\s*)?[\(\[]?([A-J])[\)\]]?(?![A-Za-z])",
                           re.IGNORECASE)
_CHOICE_BOXED = re.compile(r"\\boxed\{\s*[\(\[]?([A-J])(?![A-Za-z0-9])")
_CHOICE_VERDICT = re.compile(r"\boutput\s*[\(\[]([a-j])[\)\]]\s*is\s*(?:the\s*)?better\b", re.IGNORECASE)
_CHOICE_ALONE = re.compile(r"(?:^|[\s\(\[\*])([A-J])(?=[\)\]\.:\*,]|\s*$)")
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_OPTIONS = re.compile(r"(?:^|\n)[^\S\n]*[\(\[]?([A-D])[\)\].:]\s+\S", re.MULTILINE)  # read from the option's own line
_PUNCT = " \t\n.,;:!?\"'`*()[]{}"
_QA_FINAL = re.compile(r"^[ \t]*A[ \t]*:[ \t]*(\S[^\n]*)$", re.MULTILINE)
READ_CHARS = 65_536  # the tail of a reply (and of a prompt, for its options) that is read


def canonical_number(x: float) -> str:
    """One spelling per value: integers without a decimal point, others to 10 significant digits."""
    if not math.isfinite(x):
        return repr(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.10g}"


def _choice(text: str) -> str | None:
    for pattern in (_CHOICE_BOXED, _CHOICE_VERDICT, _CHOICE_FINAL):  # the strongest commitment first
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    tail = text.strip()[-200:]
    alone = _CHOICE_ALONE.findall(tail)
    return alone[-1].upper() if alone else None


def _number(text: str) -> str | None:
    hashes = _HASHES.findall(text)  # GSM8K's "#### 42" convention
    if hashes:
        x = extract_final_number(hashes[-1])
        if x is not None:
            return canonical_number(x)
    x = extract_final_number(text)
    return None if x is None else canonical_number(x)


def _code(text: str) -> str | None:
    blocks = _FENCE.findall(text)
    body = blocks[-1] if blocks else text
    lines = [line.rstrip() for line in body.strip("\n").split("\n") if line.strip()]
    return "\n".join(lines) or None


def _text(text: str) -> str | None:
    committed = final_line(text)
    if committed is text:  # nothing says "answer is": a few-shot "Q: ... A: X" reply ends on its "A:" line
        lines = _QA_FINAL.findall(text)
        committed = lines[-1] if lines else text
    s = " ".join(committed.split()).strip(_PUNCT).lower()
    return s or None


_READERS = {"choice": _choice, "number": _number, "code": _code, "text": _text}


def extract(answer: str | None, kind: str) -> str | None:
    """The comparable final answer of `answer` read as `kind`; None when nothing can be read."""
    if answer is None or not answer.strip():
        return None
    try:
        reader = _READERS[kind]
    except KeyError:
        raise ValueError(f"unknown answer kind {kind!r}; use one of {ANSWER_KINDS}") from None
    return reader(answer[-READ_CHARS:])


def kind_for_grader(grader_type: str | None) -> AnswerKind | None:
    """The answer kind a grader reads: numeric → number, python_tests → code, the string graders →
    text; None (llm_judge, unknown) when the kind has to be detected from the replies."""
    return {"numeric": "number", "python_tests": "code", "exact": "text", "contains": "text",
            "regex": "text"}.get(grader_type or "")


def detect_kind(prompt: str, answers: list[str | None]) -> AnswerKind:
    """A guess when nothing names the kind: lettered options in the prompt → choice; most replies
    with a fenced code block → code; most replies ending in a number → number; else text."""
    if len(set(_OPTIONS.findall(prompt[-READ_CHARS:]))) >= 3:
        return "choice"
    given = [a[-READ_CHARS:] for a in answers if a and a.strip()]
    if not given:
        return "text"
    votes = Counter("code" if "```" in a else "number" if _number(a) is not None else "text" for a in given)
    kind, n = votes.most_common(1)[0]
    return kind if n * 2 > len(given) else "text"
