"""Reading answers: the number, the boxed expression or the final line a reply commits to.

Used by the task schema (a numeric reference must parse), the graders and the mock workers.
"""

from __future__ import annotations

import re
from fractions import Fraction

NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")
_BRACE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_MAX_BOXED = 64  # only the last ones are ever read
# what follows "answer is", from its first character that is not a space or `$` (each space read one way)
FINAL = re.compile(r"(?:answer|result)\s*(?:is|:|=)\s*(?:\$\s*)?((?:[^\s$][^\n$]*)?)", re.IGNORECASE)


def parse_number(text: str) -> float | None:
    """One number from a short string: '42', '-3.5', '1,234', '3/4', '1e-3', '$12', '50%'.
    Returns None when the string holds no number or more than one distinct number."""
    if text is None:
        return None
    s = text.strip().strip("$").replace("\\$", "").rstrip(".%").strip()
    s = re.sub(r"^\\frac\{(-?\d+)\}\{(\d+)\}$", r"\1/\2", s)
    m = NUMBER.fullmatch(s)
    if not m:
        return None
    return _to_float(m.group(0))


def _to_float(tok: str) -> float | None:
    tok = tok.replace(",", "").replace(" ", "")
    try:
        if "/" in tok:
            num, den = tok.split("/")
            if int(den) == 0:
                return None
            return float(Fraction(int(float(num)), int(den)))
        return float(tok)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def extract_final_number(answer: str) -> float | None:
    """The answer's final number: \\boxed{...} first, then 'answer is X', then the last number."""
    for m in reversed(boxed_contents(answer)):
        x = parse_number(m)
        if x is not None:
            return x
    for m in reversed(FINAL.findall(answer)):
        nums = NUMBER.findall(m)
        if nums:
            x = _to_float(nums[0])
            if x is not None:
                return x
    nums = NUMBER.findall(answer)
    for tok in reversed(nums):
        x = _to_float(tok)
        if x is not None:
            return x
    return None


def final_line(answer: str) -> str:
    """What the answer commits to: the last \\boxed{}, else the last 'answer is X', else all of it."""
    m = boxed_contents(answer)
    if m:
        return m[-1]
    f = FINAL.findall(answer)
    if f:
        return f[-1]
    return answer


def boxed_contents(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` (or `\\fbox{...}`), in order, braces balanced at any
    depth (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); an unbalanced one is left out. At most
    the last 64 (a looping reply can hold thousands; readers want the last)."""
    spans: list[tuple[int, int]] = []
    stack: list[int] = []  # per open brace: where a boxed content starts, or -1 for a plain brace
    for m in _BRACE.finditer(text):  # one pass: a reply of 20,000 `\\boxed{` took minutes
        tok = m.group(0)
        if tok == "}":
            if stack and (start := stack.pop()) >= 0:
                spans.append((start, m.start()))
        else:
            stack.append(m.end() if len(tok) > 1 else -1)
    spans.sort()
    return [text[a:b].strip() for a, b in spans[-_MAX_BOXED:]]


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced at any depth."""
    found = boxed_contents(text)
    return found[-1] if found else None
