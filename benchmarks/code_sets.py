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
recorded result (`Result: Pass`), its latency the recorded duration. `regrade` (below) grades
the replies again against HumanEval's tests (`/work/shared/data/tasks/humaneval/HumanEval.jsonl.gz`).

MBPP, `mbpp_rows(DIR)`: github.com/zaiyichen0411/MapCoder-Reproduction (MIT), a reproduction of
MapCoder (Islam et al., 2024) run in 2025 with two Qwen coders on the 397 typed MBPP problems of
MultiPL-E: `QwenCoderTurbo` (its client's default model id `qwen-coder-turbo`) and `QwenCoder480b`
(Qwen3-Coder-480B-A35B-Instruct by its name; the client reads the id from its environment, and the
two differ in code on 375 of the 397 problems and in verdict on 33), one file per model and strategy,
`results/MBPP/<model>-<strategy>-MBPP-Python3-0.0-1-merged.jsonl`, temperature 0, one sample. Each
row: `name`, `prompt` (the function's signature and docstring: what the models were asked, after
the strategy's own instructions), `test` (three asserts), `sample_io` (the first of them),
`responses` (the reply), `prompt_tokens` and `completion_tokens` (per call; summed), `is_solved`
(the three asserts passed). A row's prompt is the release's prompt, then MBPP's own form of its
example, "Your code should pass this test:" and the `sample_io` line: MBPP's problems show their
tests, and the cascades' example runs read them there. The models were asked without that line, so
their replies gain nothing from it; a router reads it before paying for a second model.

LDB, `ldb_rows(DIR)`: github.com/FloridSleeves/LLMDebugger (Apache-2.0), the starting programs of LDB
(Zhong et al., 2024), which its debugger starts from: one program per problem and model, asked once
of `gpt-3.5-turbo-0613`, CodeLlama-34b-Instruct (`codellama`) and StarCoder (`starcoder`) on three
sets, 1,224 problems: HumanEval (164), MBPP (500) and TransCoder (560 C++ functions to translate into
Python, each prompt two worked translations and then the function). One file per set and model,
`input_data/<set>/seed/<model>/seed.jsonl`, a row per problem (`task_id`, `prompt`, `entry_point`,
`test`, `given_tests`, `solution`: the program, `is_solved`: `test` passed), in an order of its
own per file (rows are paired by `task_id`). A row's prompt: HumanEval's as the release gives it
(its docstring shows its examples); MBPP's and TransCoder's, then "Your code should pass this test:"
and the first of `given_tests` (MBPP's single visible test; TransCoder's release lists all ten of
its grader's asserts as given, and a row shows one, as MBPP's does). No token counts: (chars / 4)
of the row's prompt and of the program.

CRUXEval-O, read from the same harness as the math sets, is in `zeroeval_sets.py`.

Costs: token counts where the data has them (HumanEval's OpenAI runs), else (chars / 4) tokens, at
`PRICES` (USD per million tokens: the providers' list prices of the time; an open model at a hosted
price, an assumption marked there). A file or row not in the documented format is a
`ReleaseFormatError`, one line naming the file, the row's line and the field.

`regrade(rows, tasks)` grades the replies again with the project's sandboxed grader
(`collect/code_grader.py`) and counts where it differs from the recorded result: HumanEval's against
its task file (`humaneval_tasks`), MBPP's against the asserts its release holds (`mbpp_tasks`).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from benchmarks.release_files import ReleaseFormatError, commit_of, read_file

CNY_PER_USD = 7.1  # the yuan list prices below, in dollars at about the rate of 2025
PRICES = {  # (input, output) USD per million tokens
    "codellama-34b-instruct": (0.78, 0.78),  # assumed: a hosted 34B model's price
    "starcoder": (0.3, 0.3),  # assumed: a hosted 15B model's price (the tier below the 34B's)
    "gpt-3.5-turbo": (1.5, 2.0), "gpt-3.5-turbo-0613": (1.5, 2.0), "gpt-4": (30.0, 60.0),
    # Alibaba Cloud Model Studio (help.aliyun.com/zh/model-studio/qwen-coder), yuan per million tokens:
    # qwen-coder-turbo 2 in, 6 out; Qwen3-Coder-480B at qwen3-coder-plus's tier for prompts under 32K, 4 in, 16 out
    "QwenCoderTurbo": (2 / CNY_PER_USD, 6 / CNY_PER_USD), "QwenCoder480b": (4 / CNY_PER_USD, 16 / CNY_PER_USD),
}

EXAMPLE_LINE = "Your code should pass this test:"  # MBPP's own words before the test it shows

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


MBPP_REPO = "zaiyichen0411/MapCoder-Reproduction"
MBPP_MODELS = ("QwenCoderTurbo", "QwenCoder480b")
MBPP_STRATEGIES = ("Direct", "CoT", "SelfPlanning", "Analogical", "MapCoder")
_MBPP_FIX = f"restore the file (git checkout in {MBPP_REPO}) or pass an untouched checkout of it"
_MBPP_FIELDS = {"name": str, "prompt": str, "test": str, "entry_point": str, "sample_io": list, "responses": list,
                "prompt_tokens": list, "completion_tokens": list, "is_solved": bool}


def _jsonl_rows(root: Path, rel: str, repo: str, fix: str, fields: dict, more=None):
    """(line number, row) of a release's JSON-lines file, each row an object holding `fields` ({name:
    type}); `more(row)`: what else is wrong with it, or None. A row that fails is a ReleaseFormatError
    naming the file, the line and the field. Lines are split at "\n" only: a program's text may hold
    other line separators."""
    for k, line in enumerate(read_file(root, rel, repo).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ReleaseFormatError(f"{rel} line {k}: not a JSON object; {fix}") from None
        bad = next((f"the field {f!r} is missing or not a {kind.__name__}" for f, kind in fields.items()
                    if not isinstance(row.get(f) if isinstance(row, dict) else None, kind)), None)
        if bad is None and more is not None:
            bad = more(row)
        if bad is not None:
            raise ReleaseFormatError(f"{rel} line {k}: {bad}; {fix}")
        yield k, row


def _mbpp_more(row: dict) -> str | None:
    if not row["responses"]:
        return "'responses' is empty"
    if not all(isinstance(t, int) for t in row["prompt_tokens"] + row["completion_tokens"]):
        return "'prompt_tokens' or 'completion_tokens' holds something other than token counts"
    return None


def mbpp_file(root: Path, model: str, strategy: str) -> dict[str, dict]:
    """{problem name: row} of one model and strategy's results file; a row not in the format of the
    module docstring is a ReleaseFormatError naming the file, the line and the field."""
    rel = f"results/MBPP/{model}-{strategy}-MBPP-Python3-0.0-1-merged.jsonl"
    out: dict[str, dict] = {}
    for _, row in _jsonl_rows(root, rel, MBPP_REPO, _MBPP_FIX, _MBPP_FIELDS, _mbpp_more):
        out.setdefault(row["name"], row)  # a problem written twice by a resumed run: its first row
    return out


def mbpp_rows(root: Path, strategy: str = "CoT", models: tuple[str, ...] = MBPP_MODELS, test_fraction: float = 0.5,
              val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per MBPP problem every model's `strategy` file holds (module
    docstring), in the first model's file order."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    if strategy not in MBPP_STRATEGIES:
        raise SystemExit(f"unknown MBPP strategy {strategy!r}; one of {', '.join(MBPP_STRATEGIES)}")
    files = [mbpp_file(root, m, strategy) for m in models]
    names = [n for n in files[0] if all(n in f for f in files[1:])]
    rows = []
    for name in names:
        cells = [f[name] for f in files]
        first = cells[0]
        example = "".join(f"\n{line}" for line in first["sample_io"])
        prompt = first["prompt"].rstrip() + (f"\n\n{EXAMPLE_LINE}" + example if example else "")
        cost = [(sum(c["prompt_tokens"]) * PRICES[m][0] + sum(c["completion_tokens"]) * PRICES[m][1]) / 1e6
                for m, c in zip(models, cells)]
        rows.append(RewardRow(task_id=name, prompt=prompt, domain="mbpp", worker_ids=list(models),
                              split=assign_split(name, seed, test_fraction, val_fraction),
                              quality=[float(c["is_solved"]) for c in cells], cost_usd=cost,
                              answers=[c["responses"][-1] for c in cells], answer_kind="code"))
    notes = {"source": MBPP_REPO, "commit": commit_of(root), "models": list(models), "strategy": strategy,
             "problems": len(rows), "left_out": sum(len(f) for f in files) - len(models) * len(rows),
             "prices_usd_per_m_tokens": {m: PRICES[m] for m in models}, "graded_by": "the recorded is_solved"}
    return rows, notes


LDB_REPO = "FloridSleeves/LLMDebugger"
LDB_MODELS = {"gpt-3.5-turbo-0613": "gpt-3.5-turbo-0613", "codellama": "codellama-34b-instruct", "starcoder": "starcoder"}
LDB_SETS = ("humaneval", "mbpp", "transcoder")
_LDB_FIX = f"restore the file (git checkout in {LDB_REPO}) or pass an untouched checkout of it"
_LDB_FIELDS = {"task_id": str, "prompt": str, "entry_point": str, "test": str, "given_tests": list, "solution": str,
               "is_solved": bool}


def _ldb_more(row: dict) -> str | None:
    if not all(isinstance(t, str) for t in row["given_tests"]):
        return "'given_tests' holds something other than asserts"
    return None


def ldb_file(root: Path, task_set: str, model: str) -> dict[str, dict]:
    """{task id: row} of one set and model's seed file; a row not in the format of the module
    docstring, or a task id written twice, is a ReleaseFormatError naming the file, the line and the field."""
    rel = f"input_data/{task_set}/seed/{model}/seed.jsonl"
    out: dict[str, dict] = {}
    for k, row in _jsonl_rows(root, rel, LDB_REPO, _LDB_FIX, _LDB_FIELDS, _ldb_more):
        if row["task_id"] in out:
            raise ReleaseFormatError(f"{rel} line {k}: the field 'task_id' ({row['task_id']!r}) is written twice; {_LDB_FIX}")
        out[row["task_id"]] = row
    return out


def ldb_prompt(task_set: str, row: dict) -> str:
    """The prompt a row shows the router (module docstring)."""
    if task_set == "humaneval" or not row["given_tests"]:
        return row["prompt"]
    return f"{row['prompt'].rstrip()}\n\n{EXAMPLE_LINE}\n{row['given_tests'][0]}"


def ldb_rows(root: Path, sets: tuple[str, ...] = LDB_SETS, models: tuple[str, ...] = tuple(LDB_MODELS),
             test_fraction: float = 0.5, val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per problem every model's seed file holds, `domain` its set
    (module docstring), in the first model's file order, set by set."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    rows, left_out = [], 0
    workers = [LDB_MODELS[m] for m in models]
    for task_set in sets:
        files = [ldb_file(root, task_set, m) for m in models]
        names = [n for n in files[0] if all(n in f for f in files[1:])]
        left_out += sum(len(f) for f in files) - len(models) * len(names)
        for name in names:
            cells = [f[name] for f in files]
            prompt = ldb_prompt(task_set, cells[0])
            cost = [(len(prompt) / 4 * PRICES[w][0] + len(c["solution"]) / 4 * PRICES[w][1]) / 1e6
                    for w, c in zip(workers, cells)]
            rows.append(RewardRow(task_id=name, prompt=prompt, domain=task_set, worker_ids=workers,
                                  split=assign_split(name, seed, test_fraction, val_fraction),
                                  quality=[float(c["is_solved"]) for c in cells], cost_usd=cost,
                                  answers=[c["solution"] for c in cells], answer_kind="code"))
    notes = {"source": LDB_REPO, "commit": commit_of(root), "models": dict(zip(models, workers)), "sets": list(sets),
             "problems": len(rows), "left_out": left_out, "prices_usd_per_m_tokens": {w: PRICES[w] for w in workers},
             "tokens": "chars / 4", "graded_by": "the recorded is_solved"}
    return rows, notes


def ldb_tasks(root: Path) -> dict[str, dict]:
    """{task id: task} from the release's own rows (the first model's file of each set): the prompt
    the model continued, the problem's asserts (`test`) and the function they call."""
    return {name: {"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]}
            for task_set in LDB_SETS for name, row in ldb_file(root, task_set, next(iter(LDB_MODELS))).items()}


def humaneval_tasks(tasks_path: Path) -> dict[str, dict]:
    """{task id: task} of HumanEval's task file (JSON lines, gzip or not): `prompt`, `test`, `entry_point`."""
    opener = gzip.open if str(tasks_path).endswith(".gz") else open
    with opener(tasks_path, "rt", encoding="utf-8") as fh:
        return {t["task_id"]: t for t in map(json.loads, filter(str.strip, fh))}


def mbpp_tasks(root: Path, strategy: str = "CoT") -> dict[str, dict]:
    """{problem name: task} from the release's own rows (the first model's file): the prompt the models
    were asked, the problem's three asserts (`test`) and the function they call (`entry_point`)."""
    return {name: {"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]}
            for name, row in mbpp_file(root, MBPP_MODELS[0], strategy).items()}


def regrade(rows: list, tasks: dict[str, dict]) -> dict:
    """Grade every reply of `rows` (in place) with the project's sandboxed code grader against the
    tests of `tasks` ({task id: `prompt`, `test`, `entry_point`}: `humaneval_tasks`, `mbpp_tasks`,
    `ldb_tasks`); returns how many cells it graded and where it differs from the recorded result. A
    task whose test the grader refuses (12 of TransCoder's do not compile: 11 write integers with
    leading zeros, one holds NUL characters; every model is recorded failing them) keeps its recorded
    verdicts, and is named under `not_regraded`."""
    from pydantic import ValidationError

    from fugu_pipeline.collect.code_grader import grade_python_tests
    from fugu_pipeline.tasks.schema import PythonTestsGrader

    differ, kept = [], []
    for r in rows:
        task = tasks[r.task_id]
        try:
            spec = PythonTestsGrader.model_validate({"type": "python_tests", "test": task["test"],
                                                     "entry_point": task["entry_point"]})
        except ValidationError as exc:
            kept.append((r.task_id, exc.errors()[0]["msg"][:160]))
            continue
        graded = [grade_python_tests(a, spec, task["prompt"])[0] for a in r.answers]
        differ += [(r.task_id, w) for w, old, new in zip(r.worker_ids, r.quality, graded) if old != new]
        r.quality = graded
    return {"cells": sum(len(r.answers) for r in rows if r.task_id not in dict(kept)), "differ_from_recorded": len(differ),
            "differing": differ[:20], "not_regraded": kept}
