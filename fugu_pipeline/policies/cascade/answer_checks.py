"""Checks a reply's own work: general signs that an answer is wrong, read without another model call.

Cascade work (FrugalGPT's scorer, AutoMix's self-verification, answer-consistency cascades) decides
whether to trust a cheap model's answer from the answer itself. These statistics are the parts of
that signal that need no model at all; each is neutral (the same value for every reply) where it
does not apply, so they can be read for any kind of task:

- `arith_steps`, `arith_wrong`, `arith_any_wrong`: every `expression = value` the reply writes
  (`3 x 60 = 180`, `20 + 80 + 160 = 260`, `84 * (9/14) = 48`, GSM8K-style `<<a*b=c>>` notes,
  percentages) is recomputed with a safe evaluator (numbers, + - * / ^ and parentheses only; a
  value written with d decimals may be rounded to d decimals); a reply whose own arithmetic is
  wrong is likely wrong. Text that is not arithmetic (`x = 5` of algebra, units between numbers)
  is skipped, not counted.
- `final_is_result`: the final answer is the result of one of those steps (it was computed, not
  guessed or copied).
- `final_line_numbers`: how many numbers the line holding the final answer has ("90 minutes or 1
  hour and 30 minutes" hedges between answers).
- `answers_disagree`: the reply states two different final answers (`#### 12` ... `#### 14`).
- `tail_after_final`: characters after the final answer's line (a reply that goes on after
  answering, e.g. into a made-up next question).
- `prompt_numbers_used`: the share of the prompt's numbers that the reply uses (1 when the prompt
  has none): an answer that ignores a given quantity is often wrong.
- `self_corrections`: "wait", "actually", "correction", "let me recalculate" ...
- `repeated_lines`: the share of the reply's non-empty lines that repeat an earlier one (a
  generation stuck in a loop).

A second group, `OPTION_STATS`, reads the reply with its prompt's options (multiple choice): how
many the prompt lists, whether the final answer is one of them, which one, whether the reply
repeats its text, the final answer's length, and how long the picked option is beside the others
(`option_stats`). The last is a known bias of model judges and test takers alike: on LLMBar's
pairwise judgements, an evaluator that picks the longer of the two outputs is right 25% to 60% of
the time, and one that picks the shorter 69% to 96% (six evaluators, 419 prompts).
"""

from __future__ import annotations

import ast
import bisect
import math
import re

import numpy as np

from fugu_pipeline.tasks.final_answer import READ_CHARS

CHECK_STATS = ("arith_steps", "arith_wrong", "arith_any_wrong", "final_is_result", "final_line_numbers",
               "answers_disagree", "tail_after_final", "prompt_numbers_used", "self_corrections", "repeated_lines")
MAX_CHARS = 20_000  # the reply's last characters that are checked (a runaway reply costs no more)

_BINOPS = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}
# Arithmetic text is numbers (`\d[\d,]*(?:\.\d+)?%?`) and operator characters, one after another. Written
# as a repeat of that alternation, a run of digits splits into numbers 2^n ways and the engine tries
# them all before `$` gives up (24 digits: 5 s). So each character is consumed one way: a run of number
# characters is one `_RUN` (numbers written back to back, as "1.55.3" is "1.5" then "5.3"), runs are
# separated by operators.
_OP = r"[-+*/x×÷()^ \t$\\]"
_SEG = r"\d[\d,]*(?:\.\d\d+(?:,[\d,]*)?)*(?:\.\d)?"  # numbers without a %, written back to back
_RUN = rf"{_SEG}(?:%{_SEG})*%?"
_LEFT = re.compile(rf"(?=.){_OP}*(?:{_RUN}(?:{_OP}+{_RUN})*{_OP}*)?$")  # searched in the window before an `=`
_ARITH_CHAR = re.compile(r"[\d.,%+\-*/x×÷()^ \t$\\]")
_WINDOW = 160  # the longest left-hand side read
# the right-hand side: read greedily, number by number (possessive: what a number took is never split)
_RIGHT = re.compile(rf"[ \t]*+(?:<<[^>\n]{{0,200}}>>)?(?:\d[\d,]*+(?:\.\d++)?+%?+|{_OP})++")
_EQUALS = re.compile(r"(?<![<>=!])=(?!=)")
_COMPUTES = re.compile(r"\d\s*(?:[-+*/x×÷^]|\*\*)\s*[\d($]|\)\s*[-+*/x×÷]")
_NEWLINE = re.compile(r"\n")
_PLAIN = re.compile(r"-?\d+(?:\.(\d+))?")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_FINAL_MARK = re.compile(r"####|\banswer is\b|\banswer:|\\boxed\{", re.IGNORECASE)
_DOUBT = re.compile(r"\b(?:wait|actually|correction|my mistake|oops|let me re\w*|re-?calculat\w*|re-?check\w*)\b",
                    re.IGNORECASE)


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _evaluate(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(b) > 64 or abs(a) > 1e6:
                raise ValueError("power too large to check")
            return float(a ** b)
        if type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](a, b)
    raise ValueError("not arithmetic")


def _value(run: str) -> tuple[float | None, int | None]:
    """(value, decimals shown when the run is a plain number, else None) of an arithmetic run of text;
    (None, None) when it is not arithmetic."""
    e = run.replace("$", "").replace("\\", "").replace("×", "*").replace("÷", "/").replace("^", "**")
    e = re.sub(r"(?<=[\d)])\s*x\s*(?=[\d(])", "*", e)  # 3 x 60
    if "x" in e:  # a variable: algebra, not arithmetic
        return None, None
    e = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", e)  # 1,200
    e = re.sub(r"(?<!\d)(\d+(?:\.\d+)?)%", r"(\1/100)", e)  # a number starts at its first digit
    e = re.sub(r"(?<![^\d)])[^\d)]+$", "", re.sub(r"^[^\d(\-]+", "", e.strip()))  # one try per run
    if not e or len(e) > 200:
        return None, None
    plain = _PLAIN.fullmatch(e)
    try:
        v = _evaluate(ast.parse(e, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError, MemoryError):
        return None, None
    return v, (len(plain.group(1) or "") if plain else None)


def arithmetic_steps(reply: str) -> list[tuple[float, float, bool]]:
    """(left value, right value, holds) of each `expression = value` step the reply writes."""
    text = reply[-MAX_CHARS:]
    out = []
    for m in _EQUALS.finditer(text):
        window = max(0, m.start() - _WINDOW)
        # no left-hand side holds an `=`: the search starts after the last one (dense `=` cost 160 tries each)
        left = _LEFT.search(text, max(window, text.rfind("=", window, m.start()) + 1), m.start())
        right = _RIGHT.match(text, m.end())
        if not left or not right or not _COMPUTES.search(left.group(0)):
            continue  # a bare value on the left (`x = 5`, `total = 12`) is not a computation to check
        if left.start() == window > 0 and _ARITH_CHAR.match(text, window - 1):
            continue  # longer than the window: only its tail would be read
        rtext = re.sub(r"^[ \t]*<<[^>\n]*>>", "", right.group(0))
        a, _ = _value(left.group(0))
        b, decimals = _value(rtext)
        if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
            continue
        tol = 0.5 * 10.0 ** -decimals if decimals is not None else 0.01
        shown = [(b, tol)] + ([(b * 100, tol * 100)] if "%" in rtext else [])  # 0.1 * 100 = 10%
        out.append((a, b, any(abs(a - x) <= max(t, 1e-6 * abs(x)) + 1e-9 for x, t in shown)))
    return out


def _number(tok: str) -> float | None:
    try:
        return float(tok.replace(",", ""))
    except ValueError:
        return None


def check_stats(reply: str | None, final: str | None, prompt: str) -> np.ndarray:
    """The statistics `CHECK_STATS` names, in that order; all zero for no reply."""
    if reply is None:
        return np.zeros(len(CHECK_STATS), dtype=np.float32)
    text = reply[-MAX_CHARS:]
    steps = arithmetic_steps(text)
    wrong = sum(not ok for _, _, ok in steps)
    final_num = _number(final) if final else None
    results = {round(b, 6) for _, b, _ in steps} | {round(a, 6) for a, _, ok in steps if ok}
    marks = list(_FINAL_MARK.finditer(text))
    if marks:
        line = text[marks[-1].end():].split("\n", 1)[0]
        tail = len(text) - marks[-1].end() - len(line)
        stated = set()
        numbers = list(_NUMBER.finditer(text))  # read once: a mark ends on a character no number holds
        starts = [n.start() for n in numbers]
        newlines = [n.start() for n in _NEWLINE.finditer(text)]
        for mk in marks:  # the first number on the rest of each mark's line
            k = bisect.bisect_left(starts, mk.end())
            eol = bisect.bisect_left(newlines, mk.end())
            if k < len(starts) and (eol == len(newlines) or starts[k] < newlines[eol]):
                if (v := _number(numbers[k].group(0))) is not None:
                    stated.add(v)
        disagree = float(len(stated) > 1)
    else:
        lines = [x for x in text.strip().split("\n") if x.strip()]
        line, tail, disagree = (lines[-1] if lines else ""), 0, 0.0
    given = {_number(t) for t in _NUMBER.findall(prompt[-READ_CHARS:])} - {None}
    used = len(given & ({_number(t) for t in _NUMBER.findall(text)} - {None})) / len(given) if given else 1.0
    lines = [x.strip() for x in text.split("\n") if x.strip()]
    repeated = 1.0 - len(set(lines)) / len(lines) if lines else 0.0
    return np.array([
        math.log1p(len(steps)), math.log1p(wrong), float(wrong > 0),
        float(final_num is not None and round(final_num, 6) in results),
        math.log1p(len(_NUMBER.findall(line))), disagree, math.log1p(max(0, tail)), used,
        math.log1p(len(_DOUBT.findall(text))), repeated,
    ], dtype=np.float32)


# --------------------------------------------------------------------------- the answer among the options
#
# A reply read with its prompt: where the prompt lists options (`A. ...`, `(B) ...`, `C) ...`, or
# `Answer Choices: (a) ... (b) ...`), which one the final answer picked and whether it is one of them.
# Neutral (all zero but `option_valid` = 1 and `option_position` = 0) where the prompt lists none.
OPTION_STATS = ("options_listed", "option_valid", "option_position", "option_text_in_reply", "final_chars",
                "option_rel_chars")
# an option's text starts at its first character that is not a space (an option with none reads as
# empty); written so that a run of spaces is consumed one way (a long one took minutes)
_OPTION_LINE = re.compile(r"(?:^|\n)[ \t]*[\(\[]?([A-Ja-j])[\)\]\.:](?:[ \t]+([^ \t\n][^\n]*)|[ \t]{2,}(?=\n|\Z))")
_OPTION_INLINE = re.compile(r"\(([A-Ja-j])\)(?:[ \t]*+([^()\n \t](?:[^()\n]*[^()\n \t])?)|[ \t]++)"
                            r"(?=[ \t]*(?:\([A-Ja-j]\)|$|\n))")


# an option set out as a block: a line of its own that names it ("# Output (a):", "Response B",
# "**Option C:**"), its text on the lines after, up to the next such line or markdown heading; matched
# against one short line at a time
_BLOCK_HEAD = re.compile(r"[#*\[ \t]*(?:output|response|answer|option|choice|candidate|assistant)[ \t]*"
                         r"[\(\[]?([A-Ja-j])[\)\] \t*#:.]*", re.IGNORECASE)
_BLOCK_HEAD_CHARS = 40
OPTIONS_TAIL = 8000  # the prompt's last characters where its options are read


def _block_options(text: str) -> dict[str, str]:
    """{letter: text} of options set out as blocks (`_BLOCK_HEAD`), in the order they come."""
    found: dict[str, list[str]] = {}
    at = None
    for line in text.split("\n"):
        bare = line.strip()
        head = _BLOCK_HEAD.fullmatch(bare) if len(bare) <= _BLOCK_HEAD_CHARS else None
        if head is not None:
            at = head.group(1).upper()
            found.setdefault(at, [])
        elif bare.startswith("#"):
            at = None  # a heading ends the option before it
        elif at is not None:
            found[at].append(line)
    return {k: "\n".join(v).strip() for k, v in found.items()}


_LABEL = re.compile(r"[(\[]?[A-Ja-j][)\].:]?")
_TRAILING_LABEL = re.compile(r"(?:^|\s)[(\[]?[A-Ja-j][)\].:]?$")
_TRAILING_LABEL_CHARS = 6


def without_label(text: str) -> str:
    """`text` (what comes before an option's own text) less the option's label: a last line that is
    only a label (`A.`, `(b)`, `# Output (a):`), or a label at its end (`... Answer Choices: (A)`)."""
    text = text.rstrip()
    head, _, last = text.rpartition("\n")
    last = last.strip()
    if len(last) <= _BLOCK_HEAD_CHARS and (_LABEL.fullmatch(last) or _BLOCK_HEAD.fullmatch(last)):
        return head.rstrip()
    end = text[-_TRAILING_LABEL_CHARS:]
    return (text[:-len(end)] + _TRAILING_LABEL.sub("", end)).rstrip() if end else text


def prompt_options(prompt: str, blocks: bool = True) -> dict[str, str]:
    """{letter (upper case): option text} of the options a prompt lists, in order; {} when it lists
    fewer than two (a lone `A: ...` line is an answer, not a list). Options set out as blocks under
    a line naming each (`# Output (a):` then its text) are read first: their text may hold lines or
    parentheses of its own that would read as options (`blocks=False`: not read, as checkpoints
    trained before they were read it)."""
    tail = prompt[-OPTIONS_TAIL:]
    found_blocks = _block_options(tail) if blocks else {}
    if len(found_blocks) >= 2 and "".join(sorted(found_blocks)) == "ABCDEFGHIJ"[:len(found_blocks)]:
        return {k: found_blocks[k] for k in sorted(found_blocks)}
    found: dict[str, str] = {}
    for rx in (_OPTION_LINE, _OPTION_INLINE):
        for letter, text in rx.findall(tail):
            found.setdefault(letter.upper(), text.strip())
        if len(found) >= 2:
            break
        found = {}
    letters = sorted(found)
    # a list is A, B, C, ... in a row: a stray "I." in running text is not one
    if len(letters) < 2 or letters[0] != "A" or "".join(letters) != "ABCDEFGHIJ"[:len(letters)]:
        return {}
    return found


def picked_option(options: dict[str, str], final: str | None) -> str | None:
    """The letter of the option a final answer picks (its letter, or an option's whole text), or None."""
    f = (final or "").strip()
    if f.upper() in options:
        return f.upper()
    return next((k for k, v in options.items() if f and f.lower() == v.lower()), None)


def option_stats(reply: str | None, final: str | None, prompt: str, blocks: bool = True) -> np.ndarray:
    """The statistics `OPTION_STATS` names: how many options the prompt lists (log), whether the final
    answer is one of them (a letter listed, or an option's text), the picked option's place in the list
    (0 first .. 1 last; 0 when none or not an option), whether the reply repeats the picked option's text,
    the final answer's length (log of characters), and the picked option's length beside the others'
    (log of its characters less the mean log of theirs; 0 when none is picked). All zero for no reply.
    `blocks`: read options set out as blocks (`prompt_options`)."""
    if reply is None:
        return np.zeros(len(OPTION_STATS), dtype=np.float32)
    opts = prompt_options(prompt, blocks)
    f = (final or "").strip()
    if not opts:
        return np.array([0.0, 1.0, 0.0, 0.0, math.log1p(len(f)), 0.0], dtype=np.float32)
    letters = list(opts)
    pick = picked_option(opts, f)
    pos = letters.index(pick) / max(1, len(letters) - 1) if pick else 0.0
    said = float(bool(pick) and opts[pick].lower()[:60] in reply[-MAX_CHARS:].lower())
    rel = (math.log1p(len(opts[pick])) - float(np.mean([math.log1p(len(v)) for k, v in opts.items() if k != pick]))
           if pick else 0.0)
    return np.array([math.log1p(len(opts)), float(pick is not None), pos, said, math.log1p(len(f)), rel],
                    dtype=np.float32)
