"""Routing sets from the ZeroEval harness (Lin et al., 2024; github.com/WildEval/ZeroEval, Apache-2.0),
read where the release lies (a checkout or the bare git directory `fetch` gives;
`benchmarks/release_files.py`); nothing is copied into this repository.

ZeroEval asks some 50 models each benchmark zero-shot (greedy, temperature 0) with one instruction:
reason, then answer in a JSON object with `reasoning` and `answer`. `result_dirs/<task>/<model>.json`
is a JSON array of `{id, chat_history: [prompt], output: [reply], answer}`; `answer` is the
reference. `MODELS` chooses six that span the price range and that every task here has.

- `crux` (CRUXEval-O, code reasoning: predict a Python function's output; 800 problems): the
  reference is a Python literal's text. A reply is right when its answer equals it as a string with
  surrounding quotes stripped (ZeroEval's rule) or as a Python literal. `answer_kind` "text".
- `gsm` (GSM8K test, 1,319 problems; reference `# <number>`) and `math-l5` (MATH level 5, the 721
  problems ZeroEval keeps, all with a number for an answer): ZeroEval's rule. Both sides lose `$`,
  `,` and surrounding space; an `a/b` fraction becomes its value; the reply is right when its first
  number equals the reference's first number. `answer_kind` "number".

A reply's answer is the `answer` of its first JSON object that has one; else the first
`"answer": "..."` pair; else an unquoted `"answer": value` (up to the next comma, brace or line end);
else the last `\\boxed{...}` (ZeroEval reads a final `\\boxed{}` too, for the Llama 3.1 models alone).

Costs: (chars / 4) tokens in and out at `PRICES` (USD per million tokens: the providers' list
prices of the time; the open models at a hosted price, an assumption marked there). A file or row
not in the documented format is a `ReleaseFormatError`, one line naming the file, the row's line and
the field.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from fractions import Fraction
from pathlib import Path

from benchmarks.release_files import ReleaseFormatError, array_rows, call_cost, commit_of, field, read_file

REPO = "WildEval/ZeroEval"
MODELS = ("Meta-Llama-3.1-8B-Instruct", "gpt-4o-mini-2024-07-18", "claude-3-haiku-20240307",
          "Meta-Llama-3.1-70B-Instruct", "gpt-4o-2024-08-06", "claude-3-5-sonnet-20241022")
PRICES = {  # (input, output) USD per million tokens
    "Meta-Llama-3.1-8B-Instruct": (0.18, 0.18), "Meta-Llama-3.1-70B-Instruct": (0.88, 0.88),  # assumed: hosted prices
    "gpt-4o-mini-2024-07-18": (0.15, 0.6), "claude-3-haiku-20240307": (0.25, 1.25),
    "gpt-4o-2024-08-06": (2.5, 10.0), "claude-3-5-sonnet-20241022": (3.0, 15.0),
}
TASKS = {"crux": "text", "gsm": "number", "math-l5": "number"}  # task -> answer kind
_FIX = f"restore the file (git checkout in {REPO}) or pass an untouched checkout of it"
_QUOTED = re.compile(r'"answer"\s*:\s*"((?:[^"\\]|\\.)*)"', re.DOTALL)
_BARE = re.compile(r'"answer"\s*:\s*([^\s,}"][^,}\n]*)')
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FRACTION = re.compile(r"\s*(-?\d+)\s*/\s*(\d+)\s*")


def reply_answer(reply: str) -> str | None:
    """The `answer` a ZeroEval reply commits to (module docstring); None when there is none."""
    decoder, pos = json.JSONDecoder(strict=False), reply.find("{")  # replies put raw newlines in their strings
    while pos != -1:
        try:
            obj, _ = decoder.raw_decode(reply, pos)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "answer" in obj:
            return str(obj["answer"])
        pos = reply.find("{", pos + 1)
    m = _QUOTED.search(reply)
    if m is None:
        from fugu_pipeline.tasks.answers import boxed_contents

        m = _BARE.search(reply)
        boxed = boxed_contents(reply) if m is None else []
        return m.group(1).strip() if m else boxed[-1] if boxed else None
    try:
        return json.loads(f'"{m.group(1)}"', strict=False)
    except json.JSONDecodeError:
        return m.group(1)


def crux_right(said: str | None, reference: str) -> bool:
    """ZeroEval's rule (equal strings, surrounding quotes stripped, newlines escaped), or equal as Python literals."""
    if said is None:
        return False
    a, b = said.strip().strip("'\"").replace("\n", "\\n"), reference.strip().strip("'\"")
    if a == b:
        return True
    with warnings.catch_warnings():  # a reply's "1st" is not a literal: no SyntaxWarning on the console
        warnings.simplefilter("ignore", SyntaxWarning)
        try:
            return ast.literal_eval(said.strip()) == ast.literal_eval(reference.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False


def _first_number(text: str) -> float | None:
    text = text.replace("$", "").replace(",", "").strip()
    frac = _FRACTION.fullmatch(text)
    if frac and int(frac.group(2)) != 0:
        return float(Fraction(int(frac.group(1)), int(frac.group(2))))
    m = _NUMBER.search(text)
    return float(m.group()) if m else None


def number_right(said: str | None, reference: str) -> bool:
    """ZeroEval's math rule: the first number of each side, after `$`, `,` and fractions are dealt with, are equal."""
    if said is None:
        return False
    a, b = _first_number(said), _first_number(reference.replace("#", ""))
    return a is not None and a == b


def replies(root: Path, task: str, models: tuple[str, ...] = MODELS) -> dict[str, dict[str, tuple[str, str, str]]]:
    """{model: {problem id: (prompt, reply, reference)}} of `result_dirs/<task>/<model>.json`."""
    per_model = {}
    for m in models:
        rel = f"result_dirs/{task}/{m}.json"
        got = {}
        for line, row in array_rows(read_file(root, rel, REPO), rel, _FIX):
            chat, out = field(row, "chat_history", list, rel, line, _FIX), field(row, "output", list, rel, line, _FIX)
            if not chat or not isinstance(chat[0], str) or not out or not isinstance(out[0], str):
                raise ReleaseFormatError(f"{rel} line {line}: 'chat_history' or 'output' holds no text; {_FIX}")
            pid = str(field(row, "id", (str, int), rel, line, _FIX))
            got[pid] = (chat[0], out[0], field(row, "answer", str, rel, line, _FIX))
        per_model[m] = got
    return per_model


def task_rows(root: Path, task: str, models: tuple[str, ...] = MODELS, test_fraction: float = 0.5,
              val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per problem of `task` every chosen model answered, `domain` the task."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    if task not in TASKS:
        raise SystemExit(f"unknown ZeroEval task {task!r}; one of {', '.join(TASKS)}")
    right = crux_right if task == "crux" else number_right
    per_model = replies(root, task, models)
    rows = []
    for pid, (prompt, _, reference) in per_model[models[0]].items():
        if not all(pid in d for d in per_model.values()):
            continue
        said = [per_model[m][pid][1] for m in models]
        tid = f"{task}-{pid.rsplit('#', 1)[-1]}"
        rows.append(RewardRow(task_id=tid, prompt=prompt.strip(), domain=task, worker_ids=list(models),
                              split=assign_split(tid, seed, test_fraction, val_fraction),
                              quality=[float(right(reply_answer(r), reference)) for r in said],
                              cost_usd=[call_cost(len(prompt), len(r), PRICES[m]) for m, r in zip(models, said)],
                              answers=said, answer_kind=TASKS[task]))
    notes = {"source": REPO, "commit": commit_of(root), "task": task, "models": list(models), "problems": len(rows),
             "prices_usd_per_m_tokens": {m: PRICES[m] for m in models}}
    return rows, notes


def mixed_rows(root: Path, tasks: tuple[str, ...] = ("crux", "gsm", "math-l5"), **kw):
    """(rows, notes): the tasks' rows in one import, one `domain` per task, the same six workers."""
    rows, notes = [], {}
    for task in tasks:
        got, notes[task] = task_rows(root, task, **kw)
        rows += got
    return rows, notes
