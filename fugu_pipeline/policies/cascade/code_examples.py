"""Whether a code reply passes the examples its own prompt gives: `examples_passed`, `examples_failed`.

Many code prompts show how the function behaves: HumanEval's docstrings (`>>> below_zero([1, 2, -4, 5])`
then `True`), MBPP's "Your code should pass these tests: assert f(...) == ...", and "f(x) ➞ y" or
"f(x) == y" lines. Running the reply's code on them is the verifier's strongest check of code
(CodeT's idea, with the prompt's own tests): on HumanEval's 164 prompts (137 give examples), a reply
that passes every example is right 85% to 94% of the time (three workers), one that fails any 13%
to 68%, and the share passed alone separates right replies from wrong ones at an AUC of 0.71 to 0.84
per worker.

The code runs where the graders run it, in the sandbox (`collect/sandbox.py`: its own process,
namespaces where the kernel allows them, rlimits, a wall clock of `TIMEOUT_S`, no network), never in
this process. The reply's programs are the grader's (`collect/code_grader.candidate_programs`: the
prompt's code with the reply, the reply alone, ...), at most `MAX_PROGRAMS`, in order, until one
passes every example; the best share counts. A run that times out or crashes ends the tries.

The two statistics are the share of the examples passed and failed (both 0 where the prompt gives
none, so a prompt without examples reads as before). Training keeps them content-addressed under
`<cache>/code-examples-v2/`; serving runs them for each code reply it verifies (tens of milliseconds
a run), remembers its last runs (a cascade's later step reads the earlier replies again), and runs at
most `SANDBOX_SLOTS` sandboxes at once, however many requests come. The prompt is read line by line, in linear time; at most `MAX_EXAMPLES` examples.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import re
import secrets
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

EXECUTED_STATS = ("examples_passed", "examples_failed")
CACHE = "code-examples-v2"  # v1: read the last function defined before the last assert's
MAX_EXAMPLES = 10
MAX_PROGRAMS = 4
TIMEOUT_S = 3.0
MEMORY_MB = 512
SANDBOX_SLOTS = max(2, os.cpu_count() or 1)  # sandboxes at once in this process: training's pool and every request
RECENT_RUNS = 4096  # the last runs this process remembers (by the sha256 of prompt and reply)
PROMPT_CHARS = 16_000  # the prompt's last characters where examples are read
LINE_CHARS = 500  # a longer line is no example
_SLOTS = threading.BoundedSemaphore(SANDBOX_SLOTS)
_RECENT: OrderedDict[str, tuple[float, float]] = OrderedDict()
_RECENT_LOCK = threading.Lock()
_DEF = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)[ \t]*\(")
_CALL = re.compile(r"\b([A-Za-z_]\w*)[ \t]*\(")  # \b: each word is read once
_NOT_ENTRY = frozenset(dir(builtins)) | {"isclose", "math", "assert"}
_CODE_STARTS = ("def ", "async def ", "class ", "import ", "from ", "@")
TRIM_TRIES = 40
MAX_REPLY_CHARS = 100_000
_ARROWS = ("➞", "==", "=>", "->", "→", " should return ", " returns ")


def _entry(lines: list[str]) -> str | None:
    """The function the examples call: the one the prompt's last assert calls, else the last one the
    prompt defines. A few-shot prompt asks for its last task, and the functions it defines are its
    worked examples' (MBPP's shots, TransCoder's translations): the last assert names the function
    asked for, which the prompt does not define."""
    for line in reversed(lines):
        if line.lstrip().startswith("assert "):
            called = [name for name in _CALL.findall(line) if name not in _NOT_ENTRY]
            if called:
                return called[0]
    defined = [m.group(1) for line in lines if (m := _DEF.match(line))]
    return defined[-1] if defined else None


def _code_in_text(reply: str) -> str | None:
    """Code written among words with no fence ("Here it is:", `[BEGIN]`, then `def f(x): ...`, then
    more words): from the first line that starts code to the last indented or code-starting line,
    less lines at its end until it compiles (at most `TRIM_TRIES` cuts)."""
    lines = reply.split("\n")
    start = next((k for k, line in enumerate(lines) if line.startswith(_CODE_STARTS)), None)
    if start is None:
        return None
    last = max(k for k in range(start, len(lines)) if lines[k][:1].isspace() or lines[k].startswith(_CODE_STARTS))
    for end in range(last + 1, max(start, last + 1 - TRIM_TRIES), -1):
        code = "\n".join(lines[start:end]).rstrip()
        if code and _compiles(code):
            return code
    return None


def _compiles(source: str) -> bool:
    from fugu_pipeline.collect.code_grader import _compiles as compiles  # the grader's own test: parsed, never run

    return compiles(source)


def _expression(text: str) -> bool:
    try:
        compile(text, "<example>", "eval", dont_inherit=True)  # parsed, not run
    except Exception:  # noqa: BLE001 - as the grader's `_compiles`
        return False
    return True


def prompt_examples(prompt: str) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(the function the examples call, its examples): each `("assert", statement)` or `(call, expected)`."""
    return _examples_in(prompt[-PROMPT_CHARS:])


@functools.lru_cache(maxsize=1024)  # keyed by the tail: a huge prompt is not kept whole
def _examples_in(tail: str) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    lines = [ln for ln in tail.split("\n") if len(ln) <= LINE_CHARS]
    entry = _entry(lines)
    out: list[tuple[str, str]] = []
    for k, line in enumerate(lines):
        bare = line.strip()
        if bare.startswith(">>> "):
            nxt = lines[k + 1].strip() if k + 1 < len(lines) else ""
            if nxt and not nxt.startswith(">>>") and _expression(bare[4:]):
                out.append((bare[4:].strip(), nxt))
        elif not entry or _DEF.match(line):
            continue
        elif bare.startswith("assert ") and f"{entry}(" in bare:
            if _compiles(bare):  # not a question's `assert f(x) == ??`
                out.append(("assert", bare))
        elif (at := bare.find(f"{entry}(")) >= 0:
            call = bare[at:]
            for arrow in _ARROWS:
                cut = call.find(arrow)
                if cut > len(entry):
                    want = call[cut + len(arrow):].strip().rstrip(".,;")
                    if want and _expression(call[:cut]):
                        out.append((call[:cut].strip(), want))
                    break
        if len(out) >= MAX_EXAMPLES:
            break
    return entry, tuple(out)


# runs inside the sandbox after the reply's code, in its namespace; `{examples}` and `{marker}` are literals
_HARNESS = '''
def _fugu_examples(_examples, _marker):
    import json as _json
    _ok = 0
    for _call, _want in _examples:
        try:
            if _call == "assert":
                exec(_want, globals())
                _ok += 1
                continue
            _got = eval(_call, globals())
            try:
                _same = bool(_got == eval(_want, globals()))
            except BaseException:
                _same = False
            if not _same:
                _same = repr(_got) == _want or str(_got) == _want
            _ok += bool(_same)
        except BaseException:
            pass
    print(_marker, _json.dumps([_ok, len(_examples)]))
_fugu_examples({examples}, {marker})
'''


def _run(reply: str, prompt: str) -> tuple[float, float] | None:
    from fugu_pipeline.collect.code_grader import candidate_programs
    from fugu_pipeline.collect.sandbox import Limits, run_untrusted

    entry, examples = prompt_examples(prompt)
    if not examples:
        return 0.0, 0.0
    if len(reply or "") > MAX_REPLY_CHARS:  # no answer to a coding task is that long: failed, not run
        return 0.0, 1.0
    marker = f"fugu-examples-{secrets.token_hex(8)}"
    harness = _HARNESS.format(examples=repr(examples), marker=repr(marker))
    best = 0.0
    programs = [p for _, p in candidate_programs(reply or "", prompt, entry)]
    if (code := _code_in_text(reply or "")) is not None and code not in programs:
        programs.append(code)  # the grader's programs first; then the code among the reply's words
    for program in programs[:MAX_PROGRAMS]:
        with _SLOTS:
            result = run_untrusted(program, harness, Limits(timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB))
        if result.reason == "error":  # the sandbox could not run: unknown, not a failure (and not kept)
            return None
        found = [ln for ln in result.stdout_tail.splitlines() if ln.startswith(marker + " ")]
        if found:
            ok, n = json.loads(found[-1][len(marker) + 1:])
            best = max(best, ok / max(1, n))
        if best >= 1.0 or result.reason in ("timeout", "memory", "crashed", "killed"):
            break
    return best, 1.0 - best


def passes_all(stats: np.ndarray) -> np.ndarray:
    """Which of `examples_stats`' rows (examples_passed, examples_failed) passed every example: a
    prompt that shows none (both 0) passes nothing. What a plan's examples rule stops on, in
    training, evaluation and serving alike."""
    stats = np.asarray(stats, np.float64).reshape(-1, 2)
    return (stats[:, 0] >= 1.0 - 1e-6) & (stats[:, 1] <= 1e-6)


def _remembered(key: str) -> tuple[float, float] | None:
    with _RECENT_LOCK:
        if key in _RECENT:
            _RECENT.move_to_end(key)
            return _RECENT[key]
    return None


def _remember(key: str, value: tuple[float, float]) -> None:
    with _RECENT_LOCK:
        _RECENT[key] = value
        while len(_RECENT) > RECENT_RUNS:
            _RECENT.popitem(last=False)


def examples_stats(cells: list[tuple[str | None, str | None, str]], cache_root: str | Path | None = None,
                   threads: int | None = None) -> np.ndarray:
    """(examples_passed, examples_failed) of (reply, final answer, prompt) cells, (n, 2) float32: zeros
    for no reply or a prompt without examples; read from this process's last `RECENT_RUNS` runs (a
    cascade's later step reads its earlier replies again) or the content-addressed cache under
    `<cache_root>/code-examples-v2/` (none: not kept on disk), else run; each result is kept in both. Sandbox runs go `threads` at a
    time (default: the machine's cores), and at most `SANDBOX_SLOTS` at once in the process."""
    from fugu_pipeline.hashing import sha256_text

    out = np.zeros((len(cells), 2), np.float32)
    todo = [k for k, (reply, _, prompt) in enumerate(cells) if reply is not None and prompt_examples(prompt)[1]]
    if not todo:
        return out
    keys = [sha256_text(f"{cells[k][2]}\x00{cells[k][0]}") for k in todo]
    known: dict[int, tuple[float, float]] = {}
    for i, key in enumerate(keys):
        if (value := _remembered(key)) is not None:
            known[i] = value
    cache, on_disk = None, set()
    if cache_root is not None:
        from fugu_pipeline.features.cache import EmbeddingCache

        cache = EmbeddingCache(cache_root, CACHE)
        found, vectors = cache.get_many(keys)
        for i in np.flatnonzero(found):
            on_disk.add(int(i))
            known.setdefault(int(i), (float(vectors[i][0]), float(vectors[i][1])))
    missing = [i for i in range(len(todo)) if i not in known]
    if missing:
        with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
            got = list(pool.map(lambda i: _run(cells[todo[i]][0], cells[todo[i]][2]), missing))
        known.update({i: value for i, value in zip(missing, got) if value is not None})  # an error: as no examples
    for i, value in known.items():
        out[todo[i]] = value
        _remember(keys[i], value)
    keep = [i for i in known if i not in on_disk]
    if cache is not None and keep:
        cache.put_many([keys[i] for i in keep], out[[todo[i] for i in keep]])
    return out
