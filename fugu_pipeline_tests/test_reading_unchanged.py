"""The patterns rewritten to read untrusted text in linear time read normal text as before: each is
compared with the pattern it replaced (kept here, as it was) on short texts hypothesis draws from
the characters and words they read, and on the real replies and prompts of ../shared/data (skipped
where absent). A short text cannot make the old patterns backtrack for long."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fugu_pipeline.collect import code_grader
from fugu_pipeline.features import lexical
from fugu_pipeline.policies.cascade import answer_checks, answer_features
from fugu_pipeline.session import roles
from fugu_pipeline.tasks import answers, final_answer, references
from fugu_pipeline.workers import mock_roles
from fugu_pipeline_tests.conftest import REPO

_ARITH = r"(?:\d[\d,]*(?:\.\d+)?%?|[-+*/x×÷()^ \t$\\]|\*\*)"
OLD = {
    "left": re.compile(_ARITH + r"+$"),
    "right": re.compile(r"[ \t]*(?:<<[^>\n]{0,200}>>)?" + _ARITH + r"+"),
    "percent": re.compile(r"(\d+(?:\.\d+)?)%"),
    "tail": re.compile(r"[^\d)]+$"),
    "option_line": re.compile(r"(?:^|\n)[ \t]*[\(\[]?([A-Ja-j])[\)\]\.:][ \t]+([^\n]+)"),
    "option_inline": re.compile(r"\(([A-Ja-j])\)[ \t]*([^()\n]+?)(?=[ \t]*\([A-Ja-j]\)|[ \t]*$|\n)"),
    "eq": re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d[\d,]*(?:\.\d+)?)\s*=\s*(-?\d[\d,]*(?:\.\d+)?)"),
    "lex_num": re.compile(r"\d[\d,]*\.?\d*"),
    "lex_choice": re.compile(r"(?m)^\s*\(?[A-Ha-h][).:]\s"),
    "hashes": re.compile(r"####\s*([^\n]+)"),
    "choice_final": re.compile(r"(?:answer|choice|option)\s*(?:is|:|=)?\s*(?:option\s*)?[\(\[]?([A-J])[\)\]]?(?![A-Za-z])",
                               re.IGNORECASE),
    "options": re.compile(r"(?:^|\n)\s*[\(\[]?([A-D])[\)\].:]\s+\S", re.MULTILINE),
    "final": re.compile(r"(?:answer|result)\s*(?:is|:|=)\s*\$?\s*([^\n$]*)", re.IGNORECASE),
    "verdict": re.compile(r"VERDICT\s*[:：=\-]?\s*\**\s*(ACCEPT|REVISE)\b", re.IGNORECASE),
    "mcq": re.compile(r"^\s*(?:\\text(?:bf)?\{\s*)?\(([A-J])\)\s*\}?\s*$"),
    "fence": re.compile(r"^[ \t]{0,3}```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.MULTILINE),
}
_AW = r"(?i:answer)(?:\s+(?i:is)|\s*:)"
OLD_CHOICE = (r"^\s*[(\[]?B[)\]]?\s*\.?\s*$|^\s*[(\[]?B[)\].:]\s|" + _AW + r"\s*(?:\*\*)?\s*[(\[]?B\b(?![\s\S]*" + _AW + r")"
              r"|\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?B\)?\s*\}")


def _spans(rx, text, *args):
    return [(m.span(), m.groups()) for m in rx.finditer(text, *args)]


def _stripped(found):
    return [(a, b.strip()) for a, b in found]


def compare(text: str) -> list[str]:
    """The names of the patterns that read `text` differently from the old ones."""
    new_options = [(letter, (a or "")) for letter, a in answer_checks._OPTION_INLINE.findall(text)]
    sides = list(_left_sides(text))
    checks = {
        "left": ([o for o, _ in sides], [n for _, n in sides]),
        "right": (_value_of(OLD["right"].match(text)), _value_of(answer_checks._RIGHT.match(text))),
        "percent": (OLD["percent"].sub(r"(\1/100)", text), re.sub(r"(?<!\d)(\d+(?:\.\d+)?)%", r"(\1/100)", text)),
        "tail": (OLD["tail"].sub("", text), re.sub(r"(?<![^\d)])[^\d)]+$", "", text)),
        "option_line": (_stripped(OLD["option_line"].findall(text)), _stripped(answer_checks._OPTION_LINE.findall(text))),
        "option_inline": (_stripped(OLD["option_inline"].findall(text)), _stripped(new_options)),
        "eq": (OLD["eq"].findall(text), [m.groups() for m in answer_features._equation_matches(text)]),
        "lex_num": (OLD["lex_num"].findall(text), lexical._NUM.findall(text)),
        "lex_choice": (len(OLD["lex_choice"].findall(text)), len(lexical._CHOICE.findall(text))),
        "hashes": (OLD["hashes"].findall(text), final_answer._HASHES.findall(text)),
        "choice_final": (OLD["choice_final"].findall(text), final_answer._CHOICE_FINAL.findall(text)),
        "options": (set(OLD["options"].findall(text)), set(final_answer._OPTIONS.findall(text))),
        "final": (OLD["final"].findall(text), answers.FINAL.findall(text)),
        "verdict": (_spans(OLD["verdict"], text), _spans(roles._VERDICT, text)),
        "mcq": ((m := OLD["mcq"].match(text)) and m.group(1), (m := references._MCQ_ANSWER.match(text)) and m.group(1)),
        "fence": (_spans(OLD["fence"], text), _spans(code_grader._FENCE, text)),
        "choice_pattern": ([bool(re.search(OLD_CHOICE, text, f)) for f in (0, re.MULTILINE)],
                           [bool(re.search(references.choice_pattern("B"), text, f)) for f in (0, re.MULTILINE)]),
    }
    return [name for name, (old, new) in checks.items() if old != new]


def _left_sides(text: str):
    """(old, new) left-hand side of each `=`, searched as the checks do: in the 160 characters before
    it. Where a run of arithmetic characters in that window holds more than 16 digits and commas the
    old pattern is not asked: it takes up to 2^n steps on them, the reason it was replaced (one `=`
    of a HumanEval prompt, after `[0,3,2,1,3,5,7,4,5,5,5,2,181,...]`, took it 300 s)."""
    for m in answer_checks._EQUALS.finditer(text):
        w = max(0, m.start() - 160)
        if any(len(re.findall(r"[\d,]", run)) > 16 for run in _ARITH_RUN.findall(text, w, m.start())):
            continue
        old, new = OLD["left"].search(text, w, m.start()), answer_checks._LEFT.search(text, w, m.start())
        yield old and old.span(), new and new.span()


_ARITH_RUN = re.compile(r"[\d.,%+\-*/x×÷()^ \t$\\]+")


def _value_of(m):
    """What the reply checks make of a right-hand side: its value, or nothing."""
    if m is None:
        return None
    v, decimals = answer_checks._value(re.sub(r"^[ \t]*<<[^>\n]*>>", "", m.group(0)))
    return None if v is None else (v, decimals)


PIECES = ["1", "2", "12", "0.5", ".", ",", "%", " ", "  ", "\t", "\n", "\r", "+", "-", "*", "**", "/", "x", "×", "=",
          "(", ")", "[", "]", "$", "\\", "^", "<<", ">>", "a", "A", "B", "b", "(A)", "(B) ", "A.", "B)", "C:", "#### ",
          "answer", " is ", "Answer: ", "option ", "result", "VERDICT", ": ", "**", "ACCEPT", "REVISE", "\\text{", "}",
          "```", "```py\n", "def f():"]


@settings(max_examples=1500, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join))
def test_the_rewritten_patterns_read_short_texts_as_before(text):
    assert compare(text) == []


def test_the_mock_verifier_line_reads_as_before():
    old = re.compile(r"^Latest verdict \(turn \d+[^)]*\): REVISE\b", re.MULTILINE)
    for text in ("Latest verdict (turn 3 · stub/beta): REVISE. The Verifier's objection:\nno",
                 "x\nLatest verdict (turn 12 · a): REVISE", "Latest verdict (turn 2): ACCEPT"):
        assert (m := old.search(text)) and m.span() == mock_roles.OBJECTION.search(text).span() or not old.search(text)


SHARED = Path(os.environ.get("FUGU_SHARED_DATA", REPO.parent / "shared" / "data"))


def _real_texts() -> list[str]:
    routing = SHARED / "routing" / "routellm_evals"
    if not routing.is_dir():
        pytest.skip(f"{routing} not found: this test reads ../shared/data, which a user's clone lacks "
                    "(set FUGU_SHARED_DATA to its location)")
    texts: list[str] = []
    with gzip.open(routing / "gsm8k_responses.csv.gz", "rt") as f:
        for row in csv.DictReader(f):
            texts += [row["prompt"]] + [v for k, v in row.items() if k.endswith("_response")]
    for path in sorted((routing / "mmlu_responses").glob("*.csv.gz"))[:20]:
        texts += [row["prompt"] for row in csv.DictReader(io.TextIOWrapper(gzip.open(path)))]
    for path in sorted((SHARED / "tasks").glob("*/*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            texts += [str(v) for line in f for v in json.loads(line).values() if isinstance(v, str)]
    return texts


@pytest.mark.slow
def test_the_rewritten_patterns_read_real_replies_and_prompts_as_before():
    texts = _real_texts()
    differ = [(names, text[:80]) for text in texts if (names := compare(text))]
    assert len(texts) > 10_000 and not differ, differ[:5]
