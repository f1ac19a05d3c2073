"""RouteLLM's GSM8K and MMLU evaluations as one mixed import (math word problems and multiple choice),
written as a reward-matrix JSONL from the release folder where it lies (nothing is copied here):

    python benchmarks/routellm_mix.py <RouteLLM routellm/evals folder> --out mix.jsonl [--per-set 600] [--no-domains]

- each set is read as `fugu-lite import routellm-gsm8k` / `routellm-mmlu` read it with their
  defaults (contaminated prompts removed; 30% test, 10% validation by a hash of the prompt, seed 0);
- `--per-set N` rows of each: the N whose task ids hash lowest (sha256), so the same rows every run;
- priced as `benchmarks/cascade_data.py` prices them: a call costs (its prompt and reply, 4
  characters a token) x the model's price per million tokens (`--prices`; RouteLLM's own: GPT-4-1106
  $24.7, Mixtral-8x7B $0.24);
- the replies are dropped (MMLU records none, and an import gives every row its replies or none), so
  `train` fits the one-shot heads only;
- `--no-domains`: every row's `domain` is the default, so `train` groups by prompt clusters.

It prints each worker's accuracy per set and the rows per split.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRICES = {"gpt-4-1106-preview": 24.7, "mistralai/Mixtral-8x7B-Instruct-v0.1": 0.24}
SETS = {"gsm8k": "routellm-gsm8k", "mmlu": "routellm-mmlu"}


def _key(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()


def mix_rows(evals: Path, per_set: int = 600, domains: bool = True, prices: dict[str, float] | None = None) -> list:
    """The mixed import's rows (see the module docstring)."""
    from fugu_pipeline.matrix.importers import read_source

    prices = prices or PRICES
    out = []
    for name, kind in SETS.items():
        rows, _ = read_source(kind, evals)
        rows = sorted(rows, key=lambda r: _key(r.task_id))[:per_set]
        for r in rows:
            replies = r.answers or [None] * len(r.worker_ids)
            r.cost_usd = [(len(r.prompt) + len(a or "")) / 4 * prices.get(w, 1.0) / 1e6 for w, a in zip(r.worker_ids, replies)]
            r.answers, r.answer_kind = None, None
            r.domain = name if domains else "general"
        out += rows
    return out


def main() -> int:
    from fugu_pipeline.matrix.import_format import write_reward_jsonl

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", type=Path, help="RouteLLM's routellm/evals folder (gsm8k_responses.csv.gz, mmlu_responses/)")
    ap.add_argument("--out", type=Path, required=True, help="the reward-matrix JSONL to write")
    ap.add_argument("--per-set", type=int, default=600, help="rows of each set (the lowest hashes of their task ids)")
    ap.add_argument("--no-domains", action="store_true", help="leave `domain` at its default on every row")
    ap.add_argument("--prices", default=None, help='JSON {worker: $ per million tokens} (default: RouteLLM\'s)')
    args = ap.parse_args()
    if args.per_set < 1:
        ap.error("--per-set must be at least 1")
    if not (args.evals / "gsm8k_responses.csv.gz").exists() and not (args.evals / "gsm8k_responses.csv").exists():
        ap.error(f"{args.evals}: no gsm8k_responses.csv(.gz) here; give RouteLLM's routellm/evals folder")
    rows = mix_rows(args.evals, args.per_set, not args.no_domains, json.loads(args.prices) if args.prices else None)
    write_reward_jsonl(rows, args.out)
    for k, name in enumerate(SETS):  # mix_rows keeps each set's rows together, in SETS' order
        mine = rows[k * args.per_set:(k + 1) * args.per_set]
        acc = {w: sum(r.quality[j] for r in mine) / len(mine) for j, w in enumerate(mine[0].worker_ids)}
        print(f"{name}: {len(mine)} rows; " + ", ".join(f"{w} {a:.3f}" for w, a in acc.items()))
    splits = {s: sum(r.split == s for r in rows) for s in ("train", "val", "test")}
    print(f"wrote {args.out}: {len(rows)} rows {splits}" + ("; no domains" if args.no_domains else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
