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
