"""Cascades on real routing data with recorded answers, against the one-shot router and the strongest
model alone: import → matrix (with the replies) → prompt and reply features through the cache →
`fugu-lite train`'s heads and the cascade, chosen on the non-test rows → the test split, read once.

    python benchmarks/cascade_data.py --routing PATH/TO/routing --encoder <MiniLM dir> [--out r.json]
    python benchmarks/cascade_data.py --jsonl mine=path/to/rows.jsonl --encoder <dir>   # any matrix with answers
    python benchmarks/cascade_data.py --mot <LLM_MoT_cascade checkout or git dir> --encoder <dir> --share 0.33
    python benchmarks/cascade_data.py --release llmbar=<LLMBar dir> --encoder <dir>   # benchmarks/reply_sets.py's sets
    ... --stats v1    # the verifier reads only the first ten reply statistics (the figures before the checks)

Data (nothing is copied into the repo):
- RouteLLM GSM8K (lm-sys/RouteLLM `routellm/evals/gsm8k_responses.csv`, Apache-2.0): Mixtral-8x7B
  and GPT-4-1106 correctness and both replies, contaminated prompts removed; 50% test, 10% val
  (hash of the prompt, seed 0), as benchmarks/real_data.py splits it.
- `--jsonl name=path`: any reward-matrix JSONL whose rows carry `answers` (and `cost_usd`).
- `--mot DIR` (`mot-date`): BIG-Bench date understanding with llama-2-13b, gpt-3.5-turbo and gpt-4
  chain-of-thought replies, released by the answer-consistency cascade study (benchmarks/mot_data.py
  says what is read, how it is graded and priced).
- `--release NAME=DIR[,DIR]`: a multiple-choice, code or mixed set of `benchmarks/reply_sets.py`
  (csqa, csqa+direct, llmbar, humaneval, crux, llmbar+humaneval), read from its release where it lies.
Prices: the data has no costs, so a call costs (its prompt and reply, chars / 4 tokens) x the
model's price per million tokens (`--prices`, default RouteLLM's own figures: GPT-4 $24.7,
Mixtral $0.24 per million tokens). Utility is the quality (cost and latency weights 0).

Figures (95% intervals: paired bootstrap over test rows, 2,000 resamples):
- APGR (RouteLLM): the share x of rows sent to the strong model, by the router's score margin, or
  escalated by the cascade (the rows whose weak reply the verifier scores lowest); the cascade's
  APGR minus the router's, paired over the same resampled rows.
- accuracy at 50% of the strong model's cost: (a) the cascade chosen on validation under the cap
  `share: 0.5` (its test cost shown); (b) both curves read at exactly 50% of the test cost.
- verifier: out-of-fold AUC (non-test rows) of its score for "this worker's reply is right", per worker.
- more than two workers (no APGR): each worker alone, the one-shot router, and the cascade chosen on
  validation under the cap, on test: accuracy and cost with intervals, and the cascade's paired
  differences from the strongest worker and from the one-shot router.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402

PRICES = {"gpt-4-1106-preview": 24.7, "mistralai/Mixtral-8x7B-Instruct-v0.1": 0.24}


def rows_of(name: str, args) -> list:
    from fugu_pipeline.matrix.import_format import read_reward_jsonl
    from fugu_pipeline.matrix.importers import read_source

    if name == "gsm8k":
        rows, _ = read_source("routellm-gsm8k", args.routing / "routellm_evals", test_fraction=0.5, val_fraction=0.1, seed=0)
    elif name.startswith("mot-"):
        from benchmarks.mot_data import mot_rows

        rows, notes = mot_rows(args.mot, name.removeprefix("mot-"))
        print(f"[{name}] read {notes}", flush=True)
    elif name in releases(args):
        from benchmarks.reply_sets import set_rows

        rows, notes = set_rows(name, releases(args)[name])
        print(f"[{name}] read {notes}", flush=True)
    else:
        rows = read_reward_jsonl(Path(dict(x.split("=", 1) for x in args.jsonl)[name]))
    if rows[0].cost_usd is None:
        prices = json.loads(args.prices) if args.prices else PRICES
        for r in rows:
            r.cost_usd = [(len(r.prompt) + len(a or "")) / 4 * prices.get(w, 1.0) / 1e6 for w, a in zip(r.worker_ids, r.answers)]
    return rows


def releases(args) -> dict[str, list[Path]]:
    """{set name: its release folders} of the `--release NAME=DIR[,DIR]` arguments."""
    return {n: [Path(d) for d in dirs.split(",")] for n, _, dirs in (x.partition("=") for x in args.release)}


def build_matrix(rows, work: Path, encoder: str, cache_dir: str | Path):
    """The reward matrix of `rows` (quality-only weights) in `work/matrix.duckdb`, built afresh, and its
    routing data (prompts encoded with `encoder`, lexical statistics on) and recorded replies:
    (data, grid, settings, embeddings)."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.answers import read_answers
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.import_format import write_reward_jsonl
    from fugu_pipeline.reward import UtilityConfig

    work.mkdir(parents=True, exist_ok=True)
    write_reward_jsonl(rows, work / "rewards.jsonl")
    db = work / "matrix.duckdb"
    db.unlink(missing_ok=True)
    build(from_import(work / "rewards.jsonl", UtilityConfig(cost_weight=0.0, latency_weight=0.0), "quality only"), db)
    settings = EncoderSettings(model=encoder, device="cpu", dtype="float32", prompt_template="{prompt}", lexical=True)
    lazy = LazyEncoder(settings)
    data, emb = load_routing_data(db, lazy, Path(cache_dir))
    lazy.close()
    return data, read_answers(db, data.task_ids, data.worker_ids), settings, emb


def load(name: str, args):
    from fugu_pipeline.policies.cascade.answer_features import STATS, STATS_V1
    from fugu_pipeline.policies.cascade.fit import answer_inputs

    data, grid, settings, emb = build_matrix(rows_of(name, args), Path(args.work_dir) / name, args.encoder, args.cache_dir)
    t0 = time.perf_counter()
    inputs = answer_inputs(data, grid, settings, Path(args.cache_dir), progress=True,
                           stat_names=STATS_V1 if args.stats == "v1" else STATS)
    print(f"[{name}] {len(data.task_ids)} rows {data.counts()}; prompts: {emb.n_computed} encoded; replies encoded "
          f"in {time.perf_counter() - t0:.0f}s; {emb.encoder_description}", flush=True)
    return data, grid, inputs


def curve_at(score: np.ndarray, q_strong, q_weak, cost_strong, cost_weak, share: float, cascade: bool):
    """Accuracy, per row, when the rows with the highest `score` go to the strong model until the mean
    cost reaches `share` of the strong model's (a cascade pays the weak call on every row)."""
    order = np.argsort(-score, kind="stable")
    n = len(score)
    base = cost_weak.sum() if cascade else 0.0
    target = share * cost_strong.sum()
    best_k = 0
    for k in range(n + 1):
        sent = order[:k]
        spent = base + cost_strong[sent].sum() + (0.0 if cascade else cost_weak[order[k:]].sum())
        if spent <= target:
            best_k = k
        else:
            break
    acc = q_weak.copy()
    acc[order[:best_k]] = q_strong[order[:best_k]]
    return acc, best_k / n


def run(name: str, args) -> dict:
    from fugu_pipeline.evaluate.metrics import apgr, paired_bootstrap
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.search import Cap
    from fugu_pipeline.policies.registry import load_checkpoint
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.policies.oneshot.fit import fit_and_save, select_heads

    t0 = time.perf_counter()
    data, grid, inputs = load(name, args)
    cfg = TrainSetConfig()
    sel = select_heads(data, cfg, log=lambda m: None)
    rep = sel[0]
    oof = rep.ensemble["scores"] if rep.selected == "ensemble" else next(c.scores for c in rep.candidates if c.name == rep.selected)
    saved = fit_and_save(data, Path(args.work_dir) / name / "models", cfg, log=lambda m: None, selection=sel)
    head = load_checkpoint(saved.selected_path()).head
    test = np.flatnonzero(data.splits == "test")
    strong = int(np.argmax(data.quality[data.splits != "test"].mean(axis=0)))
    if data.n_workers > 2:
        return run_multi(name, args, data, grid, inputs, rep, head, oof, test, strong, t0)
    weak = 1 - strong
    hs = head_scores(head, data.features[test], [data.domains[i] for i in test])
    margin = hs[:, strong] - hs[:, weak]
    ccfg = CascadeConfig(cap=Cap(share=args.share))
    fit = fit_cascade(data, grid, inputs, ccfg, heads={f"one-shot {rep.selected}": oof}, log=lambda m: print(f"[{name}] {m}", flush=True))
    X, _, at = inputs.design(test)
    s = fit.verifier.predict(X) if fit.verifier is not None else np.zeros(len(X))
    vs = np.full((len(data.task_ids), data.n_workers), np.nan)
    vs[at[:, 0], at[:, 1]] = s
    esc = 1 - np.nan_to_num(vs[test, weak], nan=0.0)  # escalate the least trusted weak replies first
    Q, C = data.quality[test], data.cost_usd[test]
    q_s, q_w = Q[:, strong], Q[:, weak]
    ap_r = apgr(margin, q_s, q_w)["apgr"]
    ap_c = apgr(esc, q_s, q_w)["apgr"]
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(2000):
        i = rng.integers(0, len(test), len(test))
        boots.append((apgr(esc[i], q_s[i], q_w[i])["apgr"], apgr(margin[i], q_s[i], q_w[i])["apgr"]))
    b = np.array(boots)
    ci = lambda v: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]  # noqa: E731
    # (a) the policy chosen on validation under the cap, on test
    from fugu_pipeline.policies.cascade.policy import answer_codes, simulate

    codes = answer_codes(grid.final)
    res = simulate(fit.policy.default, data.worker_ids, codes, vs, data.quality, data.cost_usd, data.latency_s, test,
                   inputs.passed_examples())
    # (b) both curves at exactly the same cost on test
    acc_r, x_r = curve_at(margin, q_s, q_w, C[:, strong], C[:, weak], args.share, cascade=False)
    acc_c, x_c = curve_at(esc, q_s, q_w, C[:, strong], C[:, weak], args.share, cascade=True)
    out = {
        "dataset": name, "n_test": int(len(test)), "strong": data.worker_ids[strong], "weak": data.worker_ids[weak],
        "workers": list(data.worker_ids),
        "strong_accuracy": paired_bootstrap(q_s, np.zeros(len(test))), "weak_accuracy": paired_bootstrap(q_w, np.zeros(len(test))),
        "one_shot": {"name": rep.selected, "apgr": ap_r, "apgr_ci": ci(b[:, 1]),
                     "accuracy_at_share": paired_bootstrap(acc_r, np.zeros(len(test))), "strong_share": x_r},
        "cascade": {"policy": fit.policy.describe(), "apgr": ap_c, "apgr_ci": ci(b[:, 0]),
                    "accuracy_at_share": paired_bootstrap(acc_c, np.zeros(len(test))), "strong_share": x_c,
                    "chosen_on_validation": {"accuracy": paired_bootstrap(res.quality, np.zeros(len(test))),
                                             "cost_share_of_strong": float(res.cost.sum() / C[:, strong].sum()),
                                             "escalated": float((res.stop_step > 0).mean())},
                    "verifier": fit.verifier_figures, "stats": args.stats},
        "apgr_difference": {"mean": ap_c - ap_r, "ci": ci(b[:, 0] - b[:, 1])},
        "accuracy_difference_at_share": paired_bootstrap(acc_c, acc_r),
        "selection": {"selected": fit.selected, "reason": fit.reason, "candidates": fit.table()},
        "share": args.share, "seconds": time.perf_counter() - t0,
    }
    print(table(out), flush=True)
    return out


def run_multi(name, args, data, grid, inputs, rep, head, oof, test, strong, t0) -> dict:
    """More than two workers: each alone, the one-shot router, the cascade chosen under the cap."""
    from fugu_pipeline.evaluate.metrics import paired_bootstrap
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.policy import answer_codes, simulate
    from fugu_pipeline.policies.cascade.search import Cap

    fit = fit_cascade(data, grid, inputs, CascadeConfig(cap=Cap(share=args.share)), heads={f"one-shot {rep.selected}": oof},
                      log=lambda m: print(f"[{name}] {m}", flush=True))
    X, _, at = inputs.design(test)
    vs = np.full((len(data.task_ids), data.n_workers), np.nan)
    if fit.verifier is not None:
        vs[at[:, 0], at[:, 1]] = fit.verifier.predict(X)
    res = simulate(fit.policy.default, data.worker_ids, answer_codes(grid.final), vs, data.quality, data.cost_usd,
                   data.latency_s, test, inputs.passed_examples())
    Q, C = data.quality[test], data.cost_usd[test]
    pick = np.argmax(head_scores(head, data.features[test], [data.domains[i] for i in test]), axis=1)
    one_q, one_c = Q[np.arange(len(test)), pick], C[np.arange(len(test)), pick]
    zero = np.zeros(len(test))
    share = lambda c: float(c.sum() / C[:, strong].sum())  # noqa: E731
    out = {"dataset": name, "n_test": int(len(test)), "workers": list(data.worker_ids), "strong": data.worker_ids[strong],
           "alone": {w: {"accuracy": paired_bootstrap(Q[:, j], zero), "cost_share": share(C[:, j]),
                         "usd_per_1k": float(C[:, j].mean() * 1000)} for j, w in enumerate(data.worker_ids)},
           "one_shot": {"name": rep.selected, "accuracy": paired_bootstrap(one_q, zero), "cost_share": share(one_c)},
           "cascade": {"policy": fit.policy.describe(), "accuracy": paired_bootstrap(res.quality, zero),
                       "cost_share": share(res.cost), "usd_per_1k": float(res.cost.mean() * 1000),
                       "escalated": float((res.stop_step > 0).mean()), "verifier": fit.verifier_figures, "stats": args.stats},
           "cascade_minus_strong": paired_bootstrap(res.quality, Q[:, strong]),
           "cascade_minus_one_shot": paired_bootstrap(res.quality, one_q),
           "selection": {"selected": fit.selected, "reason": fit.reason, "candidates": fit.table()},
           "share": args.share, "seconds": time.perf_counter() - t0}
    print(table_multi(out), flush=True)
    return out


def table_multi(r: dict) -> str:
    c, o = r["cascade"], r["one_shot"]
    lines = [f"\n### {r['dataset']}: {r['n_test']} test rows; workers {', '.join(r['workers'])}; strongest {r['strong']}",
             "| policy | accuracy [95% CI] | cost, share of the strongest's | $ per 1,000 |", "|---|---|---|---|"]
    for w, a in r["alone"].items():
        lines.append(f"| {w} alone | {_ci(a['accuracy'])} | {a['cost_share']:.1%} | {a['usd_per_1k']:.4g} |")
    lines.append(f"| one-shot router ({o['name']}) | {_ci(o['accuracy'])} | {o['cost_share']:.1%} | |")
    lines.append(f"| cascade chosen on validation under the cap (share {r['share']:.0%}) | {_ci(c['accuracy'])} | "
                 f"{c['cost_share']:.1%} | {c['usd_per_1k']:.4g} |")
    d1, d2 = r["cascade_minus_strong"], r["cascade_minus_one_shot"]
    by = c["verifier"].get("oof_auc_by_worker") or []
    lines += [f"\ncascade: {c['policy']}; escalated past step 1 on {c['escalated']:.1%} of the test rows",
              f"cascade − {r['strong']}: accuracy {d1['mean']:+.4f} [{d1['low']:+.4f}, {d1['high']:+.4f}]; cascade − one-shot "
              f"{d2['mean']:+.4f} [{d2['low']:+.4f}, {d2['high']:+.4f}] (paired over test rows)",
              (f"verifier (out of fold, non-test rows; reply statistics: {c['stats']}): AUC {c['verifier']['oof_auc']:.3f}, "
               f"inputs {c['verifier'].get('inputs')}, per worker " + ", ".join(f"{w} {a}" for w, a in zip(r["workers"], by))
               if "oof_auc" in c["verifier"] else "verifier: not fitted (the strongest worker ships; reason below)"),
              f"selection (out of fold, under the cap): {r['selection']['selected']} — {r['selection']['reason']}",
              *_selection_table(r)]
    return "\n".join(lines)


def _selection_table(r: dict) -> list[str]:
    """Every candidate's out-of-fold figure and interval, then the runtime."""
    return ["| candidate | out-of-fold figure | quality | expected $ per request | gain over the best worker [95% CI] | note |",
            "|---|---|---|---|---|---|",
            *(f"| {x['name']} | {x['mean']:.4f} | {x['quality']:.4f} | {x['cost_usd']:.3g} | {x['gain']:+.4f} "
              f"[{x['low']:+.4f}, {x['high']:+.4f}] | {x['note']} |" for x in r["selection"]["candidates"]),
            f"runtime {r['seconds']:.0f}s"]


def _auc_of(fig: dict, workers: list, w: str) -> str:
    by = fig.get("oof_auc_by_worker")
    return "n/a" if not by or by[workers.index(w)] is None else f"{by[workers.index(w)]:.3f}"


def _ci(d: dict) -> str:
    return f"{d['mean']:.4f} [{d['low']:.4f}, {d['high']:.4f}]"


def table(r: dict) -> str:
    sh = f"{r['share']:.0%}"
    o, c = r["one_shot"], r["cascade"]
    v = c["chosen_on_validation"]
    lines = [f"\n### {r['dataset']}: {r['n_test']} test rows; strong {r['strong']}, weak {r['weak']}",
             f"| policy | APGR [95% CI] | accuracy at {sh} of {r['strong']}'s cost [95% CI] | share of rows on the strong model |",
             "|---|---|---|---|",
             f"| {r['strong']} alone | 1 (by definition) | {_ci(r['strong_accuracy'])} (at 100% of its cost) | 100% |",
             f"| {r['weak']} alone | 0 | {_ci(r['weak_accuracy'])} | 0% |",
             f"| one-shot router ({o['name']}) | {o['apgr']:.4f} [{o['apgr_ci'][0]:.4f}, {o['apgr_ci'][1]:.4f}] | "
             f"{_ci(o['accuracy_at_share'])} | {o['strong_share']:.1%} |",
             f"| cascade ({r['weak']} → verifier → {r['strong']}) | {c['apgr']:.4f} [{c['apgr_ci'][0]:.4f}, {c['apgr_ci'][1]:.4f}] | "
             f"{_ci(c['accuracy_at_share'])} | {c['strong_share']:.1%} |",
             f"\ncascade − one-shot: APGR {r['apgr_difference']['mean']:+.4f} [{r['apgr_difference']['ci'][0]:+.4f}, "
             f"{r['apgr_difference']['ci'][1]:+.4f}]; accuracy at {sh} cost "
             f"{r['accuracy_difference_at_share']['mean']:+.4f} [{r['accuracy_difference_at_share']['low']:+.4f}, "
             f"{r['accuracy_difference_at_share']['high']:+.4f}] (paired over test rows)",
             f"chosen on validation under the cap (share {sh}): {c['policy']}; on test: accuracy "
             f"{_ci(v['accuracy'])}, cost {v['cost_share_of_strong']:.1%} of {r['strong']}'s, escalated {v['escalated']:.1%}",
             f"verifier (out of fold on the non-test rows; reply statistics: {c.get('stats', 'all')}): AUC "
             f"{c['verifier']['oof_auc']:.3f}, log-loss {c['verifier']['oof_logloss']:.4f}, L2 {c['verifier']['l2']:g}, "
             f"inputs {c['verifier'].get('inputs')}, per worker {c['verifier'].get('per_worker')}; AUC for "
             f"'{r['weak']}'s reply is right' {_auc_of(c['verifier'], r['workers'], r['weak'])}, for "
             f"'{r['strong']}'s' {_auc_of(c['verifier'], r['workers'], r['strong'])}",
             f"selection (out of fold, objective under the cap): {r['selection']['selected']} — {r['selection']['reason']}",
             *_selection_table(r)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routing", type=Path, default=None, help="a folder holding routellm_evals/ (RouteLLM's routellm/evals) and llmrouter_ulab/ (LLMRouter's dcrouter files)")
    ap.add_argument("--jsonl", action="append", default=[], metavar="NAME=PATH", help="a reward-matrix JSONL with answers")
    ap.add_argument("--encoder", required=True, help="a local model directory (all-MiniLM-L6-v2), a hub id, or 'tiny'")
    ap.add_argument("--share", type=float, default=0.5, help="the cap: a share of the strong model's cost")
    ap.add_argument("--mot", type=Path, default=None, help="a checkout or git directory of MurongYue/LLM_MoT_cascade")
    ap.add_argument("--release", action="append", default=[], metavar="NAME=DIR[,DIR]",
                    help="a set of benchmarks/reply_sets.py (csqa, csqa+direct, llmbar, humaneval, crux, llmbar+humaneval) read from "
                         "its release's checkout or git directory")
    ap.add_argument("--stats", choices=("all", "v1"), default="all",
                    help="the reply statistics the verifier reads: all, or the first ten (v1: before the checks)")
    ap.add_argument("--prices", default=None, help='JSON {"model": USD per million tokens} when the data has no costs')
    ap.add_argument("--work-dir", default="data/cascade_data")
    ap.add_argument("--cache-dir", default="data/embeddings")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    names = ((["gsm8k"] if args.routing else []) + [x.split("=", 1)[0] for x in args.jsonl] + (["mot-date"] if args.mot else [])
             + list(releases(args)))
    if args.routing and not (args.routing / "routellm_evals").is_dir():
        print(f"{args.routing}/routellm_evals not found: pass the routing data folder", file=sys.stderr)
        return 2
    results = [run(n, args) for n in names]
    print(f"\nmachine: {machine()}")
    if args.out:
        args.out.write_text(json.dumps({"results": results, "machine": machine()}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
