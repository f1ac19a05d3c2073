"""Mathematical equivalence of an answer and a reference, by math-verify (Hugging Face's
answer checker: LaTeX and plain expressions parsed to SymPy; fractions, `\\dfrac`, roots without
braces, intervals and tuples, degrees and units, `\\text{...}`, sets, and symbolic equality).

It backs the `exact` and `numeric` graders of math tasks (`math: true`, what the math converters
write) when their plain comparison fails, so `\\dfrac{1}{2}` for `\\frac{1}{2}`, `\\sqrt2` for
`\\sqrt{2}`, `(-1, 1)` for `(-1,1)`, `90` for `90^\\circ` and `\\text{east}` for `east` are graded
right, and a different value is still wrong.

- What is compared: the reference, and from the answer the last `\\boxed{...}` (else the last
  "answer is ..." / "Final answer: ..." line, else the answer's text), each at most
  `MAX_CHARS` characters.
- Where: in one helper process (math-verify bounds its own parsing and checking with SIGALRM, which
  only works in a main thread, and an answer can make SymPy run for a long time), with a wall
  clock of `TIMEOUT_S` per decision; a decision that runs over it is "not equivalent" and the
  helper is replaced.
- Decisions are cached per (reference, compared answer) in memory (`CACHE_SIZE`, least recently
  used out): a trajectory reward, a re-grade or a second worker with the same answer asks once.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fugu_pipeline.tasks.answers import FINAL, boxed_contents

MAX_CHARS = 1000
TIMEOUT_S = 10.0
CACHE_SIZE = 100_000
_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


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


@functools.lru_cache(maxsize=CACHE_SIZE)
def _decide(reference: str, candidate: str) -> tuple[bool, str]:
    global _pool
    if not reference or not candidate.strip("$ \n"):
        return False, "nothing to compare"
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        pool = _pool
    try:
        return pool.submit(check, reference, candidate).result(timeout=TIMEOUT_S)
    except FutureTimeout:
        _replace(pool)
        return False, f"math-verify ran over {TIMEOUT_S:g}s"
    except Exception as exc:  # noqa: BLE001 - a broken helper must not fail the grade: it is not equivalent
        _replace(pool)
        return False, f"math-verify failed: {type(exc).__name__}"


def _replace(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    for proc in list(getattr(pool, "_processes", {}).values()):  # a runaway SymPy call never returns
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def check(reference: str, candidate: str) -> tuple[bool, str]:
    """In the helper process: parse both with math-verify and compare."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse("$" + reference + "$", extraction_config=configs)
    if not gold:
        gold = parse(reference, extraction_config=configs)
    pred = parse(candidate, extraction_config=configs)
    if not gold or not pred:
        return False, "math-verify could not parse the " + ("reference" if not gold else "answer")
    ok = bool(verify(gold, pred))
    return ok, f"math-verify: {str(pred[0])[:60]!r} {'==' if ok else '!='} {str(gold[0])[:60]!r}"
