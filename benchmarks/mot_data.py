"""Reward-matrix rows with several models' recorded replies from the answer-consistency cascade study
(Yue et al., "Large Language Model Cascades with Mixture of Thought Representations for
Cost-efficient Reasoning", ICLR 2024; github.com/MurongYue/LLM_MoT_cascade), read where it lies.

    python benchmarks/cascade_data.py --mot <checkout or git directory of LLM_MoT_cascade> --encoder <dir>

The folder is a checkout of the repository or its bare git directory (what `fetch` gives: the files
are read with `git show HEAD:<path>`); nothing is copied into this repository.

What is read (the files the study released for a task; every model's chain-of-thought replies):
- `date`: BIG-Bench date understanding, 369 questions asked free-form ("... in MM/DD/YYYY?"),
  8-shot chain-of-thought prompt `date_CoT1_prompting` of `Evaluation/prompting/date.py`:
  llama-2-13b (`llama2_13B_result/date_cot1.json`), gpt-3.5-turbo (`GPT3_result/date_cot1.json`),
  each its first sampled reply, and gpt-4's greedy reply (`GPT4_result/date_greedy_cot1.json`).
- A reply is cut at its first blank line, as a call with the few-shot prompt's stop sequence
  returns it (llama-2-13b goes on to invent the next question). Its final answer is its last
  "A: X" line; it is right when that equals the reference date exactly (the study's own rule:
  string equality), graded here from the cut reply (the study's recorded extraction of llama's
  reply sometimes read the invented question's answer instead).
- Cost: the data has none, so a call costs (few-shot prompt + question) chars / 4 input tokens and
  reply chars / 4 output tokens at `PRICES` (USD per million tokens: the study's gpt-3.5-turbo
  and gpt-4 prices; llama-2-13b at a hosted 13B model's price, an assumption).

The released format of a result file: a JSON array of objects, one a question, each with
`question` (text), `answer` (the reference: a string, or `{option: 1 or 0}` marking the right one,
as a dict or its Python literal) and `generated` (the sampled replies: a list of strings, or its
Python literal); other fields are not read. A file or row that is not in it is a `MotFormatError`:
one line naming the file, the line the row starts on, the field and what to do.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from benchmarks.release_files import ReleaseFormatError, array_rows, call_cost, commit_of
from benchmarks.release_files import read_file as release_file

PRICES = {"llama-2-13b": (0.22, 0.22), "gpt-3.5-turbo": (1.5, 2.0), "gpt-4": (30.0, 60.0)}  # (input, output) $/M tokens
TASKS = {
    "date": {"prompt_file": "Evaluation/prompting/date.py", "few_shot": "date_CoT1_prompting",
             "workers": {"llama-2-13b": "llama2_13B_result/date_cot1.json", "gpt-3.5-turbo": "GPT3_result/date_cot1.json",
                         "gpt-4": "GPT4_result/date_greedy_cot1.json"}},
}
_STOP = re.compile(r"\n[ \t]*\n")
_ANSWER_LINE = re.compile(r"^[ \t]*A[ \t]*:[ \t]*(\S[^\n]*)$", re.MULTILINE)


MotFormatError = ReleaseFormatError  # a result file or row not in the study's released format

_FIX = "restore the study's file (git checkout in LLM_MoT_cascade) or pass an untouched checkout of it"
_REPO = "MurongYue/LLM_MoT_cascade"


def read_file(root: Path, rel: str) -> str:
    """A file of the study's repository: from a checkout, or from a bare git directory's HEAD."""
    return release_file(root, rel, _REPO)


def _few_shot(root: Path, rel: str, name: str) -> str:
    for node in ast.parse(read_file(root, rel)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{rel} has no {name}")


def read_items(root: Path, rel: str) -> list[tuple[int, dict]]:
    """(line the row starts on, row) for every row of a result file, each row checked
    (`check_item`); a file or row not in the released format is a MotFormatError."""
    return [(line, check_item(item, rel, line)) for line, item in array_rows(read_file(root, rel), rel, _FIX)]


def check_item(item, rel: str, line: int) -> dict:
    """`item` with `answer` and `generated` in their read forms (a string or an option dict; a
    list of strings), else a MotFormatError naming the file, the row's line and the field."""
    def bad(field: str, why: str) -> MotFormatError:
        return MotFormatError(f"{rel} line {line}: {field} {why}; {_FIX}")

    if not isinstance(item, dict):
        raise bad("row", f"is a JSON {type(item).__name__}, not an object")
    for field in ("question", "answer", "generated"):
        if field not in item:
            raise bad(f"{field!r}", "is missing")
    if not isinstance(item["question"], str) or not item["question"].strip():
        raise bad("'question'", "is not a non-empty string")
    out = dict(item)
    for field, want in (("answer", (str, dict)), ("generated", list)):
        value = item[field]
        if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):  # a Python literal, as the study saved some
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError) as exc:
                raise bad(f"{field!r}", f"is not a readable literal ({type(exc).__name__})") from None
        if not isinstance(value, want):
            raise bad(f"{field!r}", f"is a {type(value).__name__}")
        out[field] = value
    if not all(isinstance(g, str) for g in out["generated"]):
        raise bad("'generated'", "holds a reply that is not a string")
    if isinstance(out["answer"], dict) and not any(v for v in out["answer"].values()):
        raise bad("'answer'", "marks no option as the right one (1)")
    return out


def _reference(item: dict) -> str:
    """The reference answer of a checked row: the string, or the option marked right."""
    ans = item["answer"]
    return next(str(k) for k, v in ans.items() if v) if isinstance(ans, dict) else str(ans)


def mot_rows(root: Path, task: str = "date", test_fraction: float = 0.5, val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per question every model answered, with each model's reply.
    A result file not in the released format: MotFormatError (module docstring)."""
    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    spec = TASKS[task]
    shots = _few_shot(root, spec["prompt_file"], spec["few_shot"])
    per_worker = {}
    for w, rel in spec["workers"].items():
        per_worker[w] = {it["question"]: it for _, it in read_items(root, rel)}
    questions = [q for q in per_worker[next(iter(spec["workers"]))] if all(q in d for d in per_worker.values())]
    workers = list(spec["workers"])
    rows = []
    for k, q in enumerate(questions):
        gold = _reference(per_worker["gpt-4"][q] if "gpt-4" in per_worker else per_worker[workers[0]][q])
        replies, quality, cost = [], [], []
        for w in workers:
            generated = per_worker[w][q]["generated"]
            reply = _STOP.split(generated[0].strip(), 1)[0] if generated else ""
            said = _ANSWER_LINE.findall(reply)
            replies.append(reply)
            quality.append(float(bool(said) and said[-1].strip() == gold))
            cost.append(call_cost(len(shots) + len(q), len(reply), PRICES[w]))
        tid = f"mot-{task}-{k:04d}"
        rows.append(RewardRow(task_id=tid, prompt=q, domain=task, split=assign_split(tid, seed, test_fraction, val_fraction),
                              worker_ids=workers, quality=quality, cost_usd=cost, answers=replies, answer_kind="text"))
    notes = {"source": "MurongYue/LLM_MoT_cascade", "commit": commit_of(root), "files": spec["workers"],
             "few_shot_chars": len(shots), "questions": len(questions), "prices_usd_per_m_tokens": PRICES}
    return rows, notes
