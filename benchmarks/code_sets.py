"""Code routing sets with several models' recorded replies, read where the releases lie (a checkout
or the bare git directory `fetch` gives; `benchmarks/release_files.py`); nothing is copied into this
repository.

HumanEval, `humaneval_rows(DIR)`: github.com/jamesmurdza/humaneval-results (no licence file; read
in place, cited), the traces of "Challenges in code generation with GPT-4" (J. Murdza, 2023): the
164 HumanEval problems, each asked ten times (temperature 0.2) of codellama-34b-instruct
(September 2023), gpt-3.5-turbo and gpt-4 (July 2023), each run's code run against the problem's
unit tests. One markdown file per model and problem, `<model>/<n>.md`:
- `## Prompt`: an optional `Tokens: N` line (the prompt's token count), the problem's code in a
  python fence and the instruction line; that text (the count dropped) is the row's prompt.
- `## Unit tests`, then `## Runs`: per run `### <mark> Run <k>`, the lines `Start time: ...<br />`,
  `Duration: <seconds>s<br />`, an optional `Completion tokens: N<br />`, `Result: Pass|Fail`, and
  the run's code in a python fence.
Each worker's reply is the code of run `run` (default 1, its first sample), its quality the
recorded result (`Result: Pass`), its latency the recorded duration. `regrade(rows, tasks)` grades
the replies again with the project's sandboxed grader (`collect/code_grader.py`) against
HumanEval's tests (`/work/shared/data/tasks/humaneval/HumanEval.jsonl.gz`) and counts where it
differs from the recorded result.

CRUXEval-O, read from the same harness as the math sets, is in `zeroeval_sets.py`.

Costs: token counts where the data has them (HumanEval's OpenAI runs), else (chars / 4) tokens, at
`PRICES` (USD per million tokens: the providers' list prices of the time; an open model at a hosted
price, an assumption marked there). A file or row not in the documented format is a
`ReleaseFormatError`, one line naming the file, the row's line and the field.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from benchmarks.release_files import ReleaseFormatError, commit_of, read_file

PRICES = {  # (input, output) USD per million tokens
    "codellama-34b-instruct": (0.78, 0.78),  # assumed: a hosted 34B model's price
    "gpt-3.5-turbo": (1.5, 2.0), "gpt-4": (30.0, 60.0),
}

HUMANEVAL_REPO = "jamesmurdza/humaneval-results"
HUMANEVAL_MODELS = ("codellama-34b-instruct", "gpt-3.5-turbo", "gpt-4")
_HE_FIX = f"restore the file (git checkout in {HUMANEVAL_REPO}) or pass an untouched checkout of it"
_SECTION = re.compile(r"^## (.+)\n", re.MULTILINE)
_RUN = re.compile(r"^### \S+ Run (\d+)\n((?:[A-Za-z ]+: [^\n]*\n)*)```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_META = re.compile(r"^([A-Za-z ]+): ([^\n]*?)(?:<br />)?$", re.MULTILINE)



def humaneval_trace(text: str, rel: str, run: int = 1) -> dict:
    """The prompt, its token count, and run `run`'s code, result, duration and completion tokens of
    one markdown trace; a trace not in the format above is a ReleaseFormatError naming the field."""
    cuts = [(m.group(1).strip(), m.end(), m.start()) for m in _SECTION.finditer(text)]
    sections = {name: (end, text[end:(cuts[k + 1][2] if k + 1 < len(cuts) else len(text))]) for k, (name, end, _) in enumerate(cuts)}
    for name in ("Prompt", "Runs"):
        if name not in sections:
            raise ReleaseFormatError(f"{rel}: no '## {name}' section; {_HE_FIX}")
    prompt, tokens = sections["Prompt"][1], None
    if prompt.startswith("Tokens: "):
        first, _, prompt = prompt.partition("\n")
        if not first.removeprefix("Tokens: ").isdigit():
            raise ReleaseFormatError(f"{rel}: the prompt's 'Tokens' is {first!r}, not a count; {_HE_FIX}")
        tokens = int(first.removeprefix("Tokens: "))
    runs_at, runs_text = sections["Runs"]
    runs = {int(m.group(1)): m for m in _RUN.finditer(runs_text)}
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    if run not in runs:
        raise ReleaseFormatError(f"{rel} line {line_of(runs_at) - 1}: '## Runs' has no 'Run {run}' with its fields and a "
                                 f"python block; {_HE_FIX}")
    meta = dict(_META.findall(runs[run].group(2)))
    where = f"{rel} line {line_of(runs_at + runs[run].start())}: run {run}'s"
    if meta.get("Result") not in ("Pass", "Fail"):
        raise ReleaseFormatError(f"{where} 'Result' is {meta.get('Result')!r}, not Pass or Fail; {_HE_FIX}")
    try:
        duration = float(meta["Duration"].removesuffix("s"))
        out_tokens = int(meta["Completion tokens"]) if "Completion tokens" in meta else None
    except (KeyError, ValueError):
        raise ReleaseFormatError(f"{where} 'Duration' or 'Completion tokens' is missing or not a number; {_HE_FIX}") from None
    return {"prompt": prompt.strip(), "prompt_tokens": tokens, "code": runs[run].group(3), "passed": meta["Result"] == "Pass",
            "duration_s": duration, "completion_tokens": out_tokens}


def humaneval_rows(root: Path, run: int = 1, models: tuple[str, ...] = HUMANEVAL_MODELS, names: dict | None = None,
                   test_fraction: float = 0.5, val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per HumanEval problem, each model's run `run` (module docstring);
    `names`: {model: worker id} where a worker id is not the model's name."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    rows = []
    for n in range(164):
        traces = [humaneval_trace(read_file(root, f"{m}/{n}.md", HUMANEVAL_REPO), f"{m}/{n}.md", run) for m in models]
        cost = []
        for m, t in zip(models, traces):
            p_in, p_out = PRICES[m]
            tin = t["prompt_tokens"] if t["prompt_tokens"] is not None else len(t["prompt"]) / 4
            tout = t["completion_tokens"] if t["completion_tokens"] is not None else len(t["code"]) / 4
            cost.append((tin * p_in + tout * p_out) / 1e6)
        tid = f"HumanEval/{n}"
        rows.append(RewardRow(task_id=tid, prompt=traces[0]["prompt"], domain="humaneval",
                              worker_ids=[(names or {}).get(m, m) for m in models],
                              split=assign_split(tid, seed, test_fraction, val_fraction),
                              quality=[float(t["passed"]) for t in traces], cost_usd=cost,
                              latency_s=[t["duration_s"] for t in traces], answers=[t["code"] for t in traces],
                              answer_kind="code"))
    notes = {"source": HUMANEVAL_REPO, "commit": commit_of(root), "models": list(models), "run": run, "problems": len(rows),
             "prices_usd_per_m_tokens": {m: PRICES[m] for m in models}, "graded_by": "the recorded result of each run"}
    return rows, notes


def regrade(rows: list, tasks_path: Path) -> dict:
    """Grade every reply of `rows` (in place) with the project's sandboxed code grader against the
    tests of HumanEval's task file (`tasks_path`, JSON lines, gzip or not); returns how many
    cells it graded and where it differs from the recorded result."""
    from fugu_pipeline.collect.code_grader import grade_python_tests

    opener = gzip.open if str(tasks_path).endswith(".gz") else open
    with opener(tasks_path, "rt", encoding="utf-8") as fh:
        tasks = {t["task_id"]: t for t in map(json.loads, filter(str.strip, fh))}
    differ = []
    for r in rows:
        task = tasks[r.task_id]
        spec = {"type": "python_tests", "test": task["test"], "entry_point": task["entry_point"]}
        graded = [grade_python_tests(a, spec, task["prompt"])[0] for a in r.answers]
        differ += [(r.task_id, w) for w, old, new in zip(r.worker_ids, r.quality, graded) if old != new]
        r.quality = graded
    return {"cells": sum(len(r.answers) for r in rows), "differ_from_recorded": len(differ), "differing": differ[:20]}
