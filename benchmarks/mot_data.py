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
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

PRICES = {"llama-2-13b": (0.22, 0.22), "gpt-3.5-turbo": (1.5, 2.0), "gpt-4": (30.0, 60.0)}  # (input, output) $/M tokens
TASKS = {
    "date": {"prompt_file": "Evaluation/prompting/date.py", "few_shot": "date_CoT1_prompting",
             "workers": {"llama-2-13b": "llama2_13B_result/date_cot1.json", "gpt-3.5-turbo": "GPT3_result/date_cot1.json",
                         "gpt-4": "GPT4_result/date_greedy_cot1.json"}},
}
_STOP = re.compile(r"\n[ \t]*\n")
_ANSWER_LINE = re.compile(r"^[ \t]*A[ \t]*:[ \t]*(\S[^\n]*)$", re.MULTILINE)


def read_file(root: Path, rel: str) -> str:
    """A file of the repository: from a checkout, or from a bare git directory's HEAD."""
    root = Path(root)
    if (root / rel).is_file():
        return (root / rel).read_text(encoding="utf-8")
    if (root / "HEAD").is_file() and (root / "objects").is_dir():
        out = subprocess.run(["git", "--git-dir", str(root), "show", f"HEAD:{rel}"], capture_output=True, check=False)
        if out.returncode == 0:
            return out.stdout.decode("utf-8")
        raise FileNotFoundError(f"{root}: HEAD has no readable {rel} ({out.stderr.decode(errors='replace').strip()[:200]})")
    raise FileNotFoundError(f"{root}: no {rel} (pass a checkout of LLM_MoT_cascade or its git directory)")


def commit_of(root: Path) -> str | None:
    root = Path(root)
    git = ["git", "--git-dir", str(root)] if (root / "HEAD").is_file() else ["git", "-C", str(root)]
    out = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, check=False)
    return out.stdout.decode().strip() if out.returncode == 0 else None


def _few_shot(root: Path, rel: str, name: str) -> str:
    for node in ast.parse(read_file(root, rel)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{rel} has no {name}")


def _listed(value) -> list:
    return list(ast.literal_eval(value)) if isinstance(value, str) else list(value)


def _reference(item: dict) -> str:
    ans = item["answer"]
    if isinstance(ans, str) and ans.startswith("{"):  # {option: 1 for the right one, 0 else}
        ans = ast.literal_eval(ans)
    if isinstance(ans, dict):
        return next(k for k, v in ans.items() if v)
    return str(ans)


def mot_rows(root: Path, task: str = "date", test_fraction: float = 0.5, val_fraction: float = 0.1, seed: int = 0):
    """(rows, notes): one `RewardRow` per question every model answered, with each model's reply."""
    import json

    from fugu_pipeline.matrix.import_common import assign_split
    from fugu_pipeline.matrix.import_format import RewardRow

    spec = TASKS[task]
    shots = _few_shot(root, spec["prompt_file"], spec["few_shot"])
    per_worker = {}
    for w, rel in spec["workers"].items():
        items = json.loads(read_file(root, rel))
        per_worker[w] = {it["question"]: it for it in items}
    questions = [q for q in per_worker[next(iter(spec["workers"]))] if all(q in d for d in per_worker.values())]
    workers = list(spec["workers"])
    rows = []
    for k, q in enumerate(questions):
        gold = _reference(per_worker["gpt-4"][q] if "gpt-4" in per_worker else per_worker[workers[0]][q])
        replies, quality, cost = [], [], []
        for w in workers:
            generated = _listed(per_worker[w][q]["generated"])
            reply = _STOP.split(generated[0].strip(), 1)[0] if generated else ""
            said = _ANSWER_LINE.findall(reply)
            replies.append(reply)
            quality.append(float(bool(said) and said[-1].strip() == gold))
            p_in, p_out = PRICES[w]
            cost.append(((len(shots) + len(q)) / 4 * p_in + len(reply) / 4 * p_out) / 1e6)
        tid = f"mot-{task}-{k:04d}"
        rows.append(RewardRow(task_id=tid, prompt=q, domain=task, split=assign_split(tid, seed, test_fraction, val_fraction),
                              worker_ids=workers, quality=quality, cost_usd=cost, answers=replies, answer_kind="text"))
    notes = {"source": "MurongYue/LLM_MoT_cascade", "commit": commit_of(root), "files": spec["workers"],
             "few_shot_chars": len(shots), "questions": len(questions), "prices_usd_per_m_tokens": PRICES}
    return rows, notes
