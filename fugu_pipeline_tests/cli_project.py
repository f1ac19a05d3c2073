"""A reward matrix written as a user writes one, and `fugu-lite` run in this process, for the tests
that train through the command line and then route, serve or evaluate what it saved."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

from fugu_pipeline.cli import main

QUALITY_ONLY = "reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n"
WORKERS = ["c", "b", "a"]  # c the strongest and the dearest, first (a tie of predicted quality goes to it); a cheap
PRICE = [5e-6, 1e-6, 0.2e-6]  # USD per prompt token
HARD = ("integral", "prove")


def run(*argv) -> tuple[int, str]:
    """`fugu-lite *argv` in this process: (exit code, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def hard_math_rows(n: int = 300, answers: bool = False) -> list[dict]:
    """The cheap worker `a` is right wherever the strongest `c` is except on math prompts; `b` except
    on math prompts with a hard word: the prompt's domain and words tell which rows. `answers`: every
    reply recorded and reading the same (the replies tell nothing the prompt does not)."""
    rng = random.Random(0)
    words = "solve compute matrix python list derivative train hours value sum table graph".split()
    out = []
    for i in range(n):
        d = ("math", "code", "chat")[i % 3]
        q = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
        if d == "math" and rng.random() < 0.5:
            q += f" {rng.choice(HARD)} {rng.choice(HARD)}"
        hard = any(h in q for h in HARD)
        quality = [1.0, 0.0 if hard else 1.0, 0.0 if hard or d == "math" else 1.0]
        tokens = -(-len(q) // 4)
        row = {"task_id": f"t{i:03d}", "prompt": q, "domain": d, "worker_ids": WORKERS, "quality": quality,
               "split": ("train", "train", "train", "val", "test")[i % 5], "cost_usd": [tokens * p for p in PRICE]}
        out.append({**row, "answers": ["#### 7"] * 3, "answer_kind": "number"} if answers else row)
    return out


def write_inputs(work: Path, rows: list[dict]) -> list[str]:
    """The rows (`r.jsonl`) and quality-only weights (`w.yaml`) in `work`; returns the flags every
    command reads them with (the CPU, an embedding cache and an imports folder in `work`)."""
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "w.yaml").write_text(QUALITY_ONLY)
    return ["--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--device", "cpu",
            "--cache-dir", str(work / "emb"), "--work-dir", str(work / "imports")]


def two_kinds_rows(n: int = 500, answers: bool = True) -> list[dict]:
    """Rows as a user imports them, with no `domain`: half ask for Python code (the cheap worker gives
    the strong one's answer), half for an option (the cheap worker is right on 30%, and says it is unsure
    where it is wrong); `answers`: with the workers' replies (what a cascade reads)."""
    rng = random.Random(0)
    code_words = "def return list python for loop index array sort append string".split()
    mc_words = "which option best answer choice following statement true false correct".split()
    rows = []
    for i in range(n):
        code = bool(i % 2)
        words = code_words if code else mc_words
        prompt = ("Write a Python function: " if code else "Choose the correct option: ") + " ".join(
            rng.choice(words) for _ in range(12))
        strong_ok = rng.random() < 0.85
        cheap_ok = strong_ok if code else rng.random() < 0.3
        strong = "42" if strong_ok else str(rng.randint(100, 999))
        cheap = strong if code else ("42" if cheap_ok else str(rng.randint(100, 999)))
        rows.append({"task_id": f"t{i:03d}", "prompt": prompt, "worker_ids": ["cheap", "strong"],
                     "quality": [float(cheap_ok), float(strong_ok)], "cost_usd": [0.0001, 0.01],
                     "split": ("train", "train", "train", "val", "test")[i % 5],
                     **({"answers": [f"The answer is {cheap}" if code or cheap_ok else
                                     f"I am not sure. It might be {cheap}, but I could not check it", f"The answer is {strong}"],
                         "answer_kind": "number"}
                        if answers else {})})
    return rows
