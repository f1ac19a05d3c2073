"""Mathematical equivalence of an answer and a reference, by math-verify (Hugging Face's
answer checker: LaTeX and plain expressions parsed to SymPy; fractions, `\\dfrac`, roots without
braces, intervals and tuples, degrees and units, `\\text{...}`, sets, and symbolic equality).

It backs the `exact` and `numeric` graders of math tasks (`math: true`, what the math converters
write) when their plain comparison fails, so `\\dfrac{1}{2}` for `\\frac{1}{2}`, `\\sqrt2` for
`\\sqrt{2}`, `(-1, 1)` for `(-1,1)`, `90` for `90^\\circ` and `\\text{east}` for `east` are graded
right, and a different value is still wrong.

- What is compared: the reference, and from the answer the last `\\boxed{...}` (else the last
  "answer is ..." / "Final answer: ..." line, else the answer's text), each at most
  `MAX_CHARS` characters. Numbers are compared to 10 decimal places (math-verify's default of 6
  took 6.73e-5 for 6.72e-5), and what math-verify drops is checked here: a number base
  (`52_8` is not `52_9`) and the power of a unit (`cm^2` is not `cm^3`), where the answer writes
  one, must match the reference's. A number's bare trailing point (`1./3`) is dropped first: the
  LaTeX reader would stop there and read `-1./3` as -1. A bare number that math-verify read from a
  reference (or a boxed answer) holding variables is its fallback, not a reading: not equivalent.
- Where: in one helper process (math-verify bounds its own parsing and checking with SIGALRM, which
  only works in a main thread, and an answer can make SymPy run for a long time), started and
  warmed up once (`START_TIMEOUT_S`), then with a wall clock of `TIMEOUT_S` per decision
  (math-verify's own bound, `PARSE_TIMEOUT_S`, applies inside); a decision that runs over it is
  "not equivalent" and the helper is replaced.
- Decisions are cached per (reference, compared answer) in memory (`CACHE_SIZE`, least recently
  used out): a trajectory reward, a re-grade or a second worker with the same answer asks once. A
  decision the helper could not make (it crashed) is not cached. The helper keeps the last
  `REFERENCE_CACHE_SIZE` parsed references: every worker's answer to a task is compared with a
  reference parsed once.
"""

from __future__ import annotations

import functools
import multiprocessing
import re
import threading
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fugu_pipeline.tasks.answers import FINAL, boxed_contents

MAX_CHARS = 1000
TIMEOUT_S = 40.0
START_TIMEOUT_S = 180.0
PARSE_TIMEOUT_S = 15  # math-verify's own bound on one parse or comparison (in the helper: SIGALRM works there)
CACHE_SIZE = 100_000
REFERENCE_CACHE_SIZE = 4096  # parsed references kept in the helper
_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_cache: OrderedDict[tuple[str, str], tuple[bool, str]] = OrderedDict()
# what math-verify drops and must still match: a number's base, a unit's power
# a number written with a bare trailing point ("1./3"): math-verify's LaTeX reader stops at the point
# and reads "-1./3" as -1, so the point is dropped before parsing ("1./3" is 1/3)
_TRAILING_POINT = re.compile(r"(?<=\d)\.(?!\d)(?=\s*[^\s$.])")
_KEPT = (re.compile(r"(?<=[\d}])_\{?(\d+)\}?"), re.compile(r"(?:mbox|text|mathrm)\{[^{}]*\}\s*\^\{?(\d+)\}?"))


def compared_answer(answer: str) -> str:
    """The part of an answer that is compared, as LaTeX math (module docstring)."""
    boxed = boxed_contents(answer or "")
    if boxed:
        return "$" + boxed[-1][:MAX_CHARS] + "$"
    final = FINAL.findall(answer or "")
    if final and final[-1].strip():
        return "$" + final[-1].strip().rstrip(".")[:MAX_CHARS] + "$"
    return (answer or "")[-MAX_CHARS:]


def equivalent(reference: str, answer: str) -> tuple[bool, str]:
    """(equivalent?, how it was decided). Never raises on odd input."""
    return _decide((reference or "").strip()[:MAX_CHARS], compared_answer(answer))


class Stats:
    hits = 0
    misses = 0


def _decide(reference: str, candidate: str) -> tuple[bool, str]:
    key = (reference, candidate)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            Stats.hits += 1
            return _cache[key]
    Stats.misses += 1
    out, keep = _ask(reference, candidate)
    if keep:
        with _lock:
            _cache[key] = out
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return out


def cache_clear() -> None:
    with _lock:
        _cache.clear()
    Stats.hits = Stats.misses = 0


def _helper() -> ProcessPoolExecutor:
    """The helper process, started and warmed up (math-verify and SymPy imported) on first use."""
    global _pool
    with _lock:
        if _pool is not None:
            return _pool
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            pool.submit(check, "1", "$1$").result(timeout=START_TIMEOUT_S)
        except BaseException:
            _kill(pool)
            raise
        _pool = pool
        return pool


def _ask(reference: str, candidate: str) -> tuple[tuple[bool, str], bool]:
    """((equivalent?, how), whether the decision may be cached)."""
    if not reference or not candidate.strip("$ \n"):
        return (False, "nothing to compare"), True
    try:
        pool = _helper()
    except Exception as exc:  # noqa: BLE001 - no helper: not equivalent, and asked again next time
        return (False, f"math-verify could not start: {type(exc).__name__}"), False
    try:
        return pool.submit(check, reference, candidate).result(timeout=TIMEOUT_S), True
    except FutureTimeout:
        _replace(pool)
        return (False, f"math-verify ran over {TIMEOUT_S:g}s"), True
    except Exception as exc:  # noqa: BLE001 - a broken helper must not fail the grade: it is not equivalent
        _replace(pool)
        return (False, f"math-verify failed: {type(exc).__name__}"), False


def _replace(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    _kill(pool)


def _kill(pool: ProcessPoolExecutor) -> None:
    for proc in list((getattr(pool, "_processes", None) or {}).values()):  # a runaway SymPy call never returns
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


_WORDS = re.compile(r"\\(?:text|mbox|mathrm|textbf|textit|operatorname)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_ASSIGNED = re.compile(r"^[\s$]*[A-Za-z]\w*\s*=")  # "x = 5": math-verify reads the value, on purpose
_EXPONENT = re.compile(r"(?<=\d)[eE](?=[-+]?\d)")


def _has_symbols(src: str) -> bool:
    """Whether LaTeX text holds a variable (a letter outside commands, words, units and exponents)."""
    t = _ASSIGNED.sub("", _COMMAND.sub(" ", _WORDS.sub(" ", src)))
    return bool(re.search(r"[A-Za-z]", _EXPONENT.sub("", t)))


@functools.cache
def _configs() -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(), ExprExtractionConfig()]


@functools.lru_cache(maxsize=REFERENCE_CACHE_SIZE)
def _parsed_reference(reference: str) -> list:
    """In the helper: a reference parsed once, then compared with every worker's answer to it."""
    from math_verify import parse

    gold = parse("$" + reference + "$", extraction_config=_configs(), parsing_timeout=PARSE_TIMEOUT_S)
    return gold or parse(reference, extraction_config=_configs(), parsing_timeout=PARSE_TIMEOUT_S)


def check(reference: str, candidate: str) -> tuple[bool, str]:
    """In the helper process: parse both with math-verify and compare."""
    from math_verify import parse, verify

    reference, candidate = _TRAILING_POINT.sub("", reference), _TRAILING_POINT.sub("", candidate)
    gold = _parsed_reference(reference)
    pred = parse(candidate, extraction_config=_configs(), parsing_timeout=PARSE_TIMEOUT_S)
    if not gold or not pred:
        return False, "math-verify could not parse the " + ("reference" if not gold else "answer")
    # math-verify falls back to a number it can read when SymPy cannot take the expression
    # ("\\hbar \\omega(v+1/2) - ..." reads as 2): a bare number read from text with symbols is no reading
    for what, src, got in (("reference", reference, gold), ("answer", candidate, pred)):
        if getattr(got[0], "is_Number", False) and (what == "reference" or src.startswith("$")) and _has_symbols(src):
            return False, f"math-verify read the {what} as the number {str(got[0])[:30]} but it holds symbols"
    ok = bool(verify(gold, pred, float_rounding=10, timeout_seconds=int(PARSE_TIMEOUT_S)))
    how = f"math-verify: {str(pred[0])[:60]!r} {'==' if ok else '!='} {str(gold[0])[:60]!r}"
    for rx in _KEPT:  # an answer may leave out the base or the unit; where it writes one, it must be the same
        want, got = rx.findall(reference), rx.findall(candidate)
        if ok and want and got and got != want:
            return False, f"{how}, but {rx.pattern!r} differs: {want} in the reference"
    return ok, how
