"""What the cross-encoder verifier (a small encoder fine-tuned on (prompt, reply) pairs read together)
adds to the cascade's verifier, out of fold, on data with recorded replies (not a test).

    .venv/bin/python benchmarks/verifier_cross.py --encoder <all-MiniLM-L6-v2 dir> \\
        [--routing PATH/TO/routing] [--mot PATH/TO/LLM_MoT_cascade] [--synthetic mc2,mc4] [--jsonl NAME=rows.jsonl] \\
        [--rows 400] [--cross-encoder on|off] [--train-layers auto] [--epochs auto] [--max-length 256] [--folds 5] \\
        [--threads 1] [--out r.json]

Sets (nothing is copied into the repository):
- `gsm8k` (`--routing`): RouteLLM's GSM8K replies of Mixtral-8x7B and GPT-4-1106, priced as
  `benchmarks/cascade_data.py` prices them;
- `date5` (`--mot`): BIG-Bench date understanding from the MoT cascade study (`benchmarks/verifier_gain.py`:
  llama-2-13b and gpt-3.5-turbo with two prompts each, and gpt-4);
- `mc2`, `mc4` (`--synthetic`): synthetic multiple choice built here ("Which of these is a fruit?" with
  2 or 4 options; three workers whose accuracy depends on the category; a reply names its option's
  letter and text, so whether it is right shows only when the question and the reply are read
  together);
- `--jsonl NAME=PATH`: any reward-matrix JSONL with `answers` (e.g. `fugu-lite sample-data`'s import).
`--rows N` keeps N rows of each set (the first by task-id hash); every row is scored out of fold
(5 folds by task hash, as `fugu-lite train`).

Per set: the out-of-fold AUC of the verifier as it is (`old`), of the cross-encoder alone (its
cross-fitted, calibrated score) and of the verifier reading it (`combined`), overall and per worker;
which one `fugu-lite train` keeps (the lower out-of-fold log-loss); the cross-encoder's fit time;
then the out-of-fold frontier (the verifier with the paid replies, the default search) at 20%, 33%
and 50% of the strongest worker's cost, before (old) and after (what is kept), with the paired
bootstrap 95% interval of the accuracy difference. `--cross-encoder off`: the verifier as it is
alone, its AUC and frontier (seconds, not minutes: what a change to its other inputs is measured by).
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
CATEGORIES = {
    "fruit": "apple banana cherry mango peach pear plum grape lemon orange melon kiwi",
    "animal": "tiger horse rabbit eagle shark wolf camel zebra otter frog goat deer",
    "tool": "hammer wrench saw drill chisel shovel pliers screwdriver axe rake spanner file",
    "vehicle": "car bus truck bicycle tractor scooter train tram van motorcycle ambulance taxi",
    "musical instrument": "violin piano guitar drum flute trumpet cello harp clarinet banjo oboe tuba",
    "colour": "red blue green yellow purple orange brown pink grey black white violet",
    "country": "France Japan Brazil Kenya Canada Norway Egypt Peru India Chile Spain Mexico",
    "body part": "elbow knee shoulder ankle wrist finger thumb ear nose chin forehead knuckle",
    "profession": "doctor teacher lawyer plumber baker pilot nurse farmer carpenter chef dentist judge",
    "sport": "tennis football cricket hockey golf rugby boxing rowing skiing cycling fencing judo",
}
WORKERS = {"small": ((0.35, 0.85), 2e-5), "medium": ((0.55, 0.9), 2e-4), "large": ((0.85, 0.97), 2e-3)}


def synthetic_mc(n: int, options: int, seed: int = 0) -> list:
    """`n` multiple-choice questions of `options` options with three workers' replies (module docstring)."""
    from fugu_pipeline.matrix.import_format import RewardRow

    rng = np.random.default_rng(seed)
    cats = sorted(CATEGORIES)
    acc = {w: dict(zip(cats, rng.uniform(*r, len(cats)))) for w, (r, _) in WORKERS.items()}
    rows = []
    for i in range(n):
        cat = cats[rng.integers(len(cats))]
        right = str(rng.choice(CATEGORIES[cat].split()))
        pool = sorted({x for c in cats if c != cat for x in CATEGORIES[c].split()} - set(CATEGORIES[cat].split()))
        opts = [right, *rng.choice(pool, options - 1, replace=False).tolist()]
        opts = [opts[k] for k in rng.permutation(options)]
        letters = "ABCD"[:options]
        prompt = (f"Which of these is a {cat}?\n" + "\n".join(f"({L}) {o}" for L, o in zip(letters, opts))
                  + "\nAnswer with the letter.")
        answers, quality, cost = [], [], []
        for w, (_, price) in WORKERS.items():
            ok = rng.random() < acc[w][cat]
            pick = opts.index(right) if ok else int(rng.choice([k for k in range(options) if opts[k] != right]))
            answers.append(f"Looking at the options, {opts[pick]} fits best. The answer is ({letters[pick]}) {opts[pick]}.")
            quality.append(float(ok))
            cost.append(price * (0.9 + 0.2 * rng.random()))
        rows.append(RewardRow(task_id=f"mc{options}-{i:05d}", prompt=prompt, domain=f"mc{options}", worker_ids=list(WORKERS),
                              quality=quality, cost_usd=cost, answers=answers, answer_kind="choice"))
    return rows


def rows_of(name: str, args) -> list:
    if name in ("gsm8k", "date5"):
        from benchmarks.verifier_gain import rows_of as gain_rows

        return gain_rows(name, args)
    if name in ("mc2", "mc4"):
        rows = synthetic_mc(args.rows, int(name[2:]), seed=0)
    else:
        from fugu_pipeline.matrix.import_format import read_reward_jsonl

        rows = read_reward_jsonl(Path(dict(x.split("=", 1) for x in args.jsonl)[name]))
        rows = sorted(rows, key=lambda r: hashlib.sha256(r.task_id.encode()).hexdigest())[: args.rows]
    for r in rows:
        r.split = "train"  # every row is scored out of fold
    return rows


def _by_worker(scores: np.ndarray, inputs, workers) -> dict:
    from fugu_pipeline.policies.cascade.verifier import auc

    out = {}
    for j, w in enumerate(workers):
        m = inputs.has[:, j] & ~np.isnan(scores[:, j])
        out[w] = round(auc(scores[m, j], inputs.target[m, j] >= 0.5), 4)
    return out


def run(name: str, args) -> dict:
    from benchmarks.cascade_data import build_matrix
    from fugu_pipeline.evaluate.metrics import paired_bootstrap
    from fugu_pipeline.policies.cascade.answer_features import STATS
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.cross_encoder import CrossEncoderConfig
    from fugu_pipeline.policies.cascade.cross_encoder_use import cross_encoder_step, verifier_oof, with_column
    from fugu_pipeline.policies.cascade.fit import answer_inputs, grid_on
    from fugu_pipeline.policies.cascade.frontier import oof_frontier
    from fugu_pipeline.policies.cascade.policy import answer_codes
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline.train.selection import fold_ids
    from fugu_pipeline.policies.cascade.verifier import oof_scores
    from fugu_pipeline.policies.cascade.verifier_context import with_context

    t0 = time.perf_counter()
    data, grid, settings, _ = build_matrix(rows_of(name, args), Path(args.work_dir) / name, args.encoder, args.cache_dir)
    inputs = answer_inputs(data, grid, settings, Path(args.cache_dir), stat_names=STATS)
    rows, folds, codes = np.arange(len(data.task_ids)), fold_ids(data.task_ids, 5, 0), answer_codes(grid.final)
    say = lambda m: print(f"[{name}] {m}", flush=True)  # noqa: E731
    say(f"{len(rows)} rows x {data.n_workers} workers; accuracy "
        f"{dict(zip(data.worker_ids, np.round(data.quality.mean(axis=0), 4)))}; loaded in {time.perf_counter() - t0:.0f}s")
    cfg = CrossEncoderConfig(model=args.cross_model, max_length=args.max_length, train_layers=args.train_layers,
                             epochs=args.epochs, folds=args.folds, threads=args.threads, device=args.device,
                             lr=args.lr, head_lr=args.head_lr, batch_size=args.batch_size)
    old, _, old_fig = oof_scores(inputs, folds)

    def frontier(base, inp):
        scores = with_context(True, inp, base, codes, rows, folds, log=lambda m: None)

        def grid_for(fit_rows):
            return grid_on(data, codes, scores, fit_rows)

        return oof_frontier(grid_for, rows, folds, CascadeSearch(), shares=SHARES, per_row=True)

    if args.cross_encoder == "off":  # the verifier as it is: its AUC and frontier alone
        alone = frontier(old, inputs)
        out = {"dataset": name, "rows": int(len(rows)), "workers": data.worker_ids, "cross_encoder": None,
               "auc": {"old": old_fig["oof_auc"]}, "auc_by_worker": {"old": _by_worker(old, inputs, data.worker_ids)},
               "frontier": [{"share": s, "before": None if (b := alone["per_row"].get(s)) is None else
                             [float(b[0].mean()), float(b[1].mean() * 1000)]} for s in SHARES],
               "strongest": [alone["strongest"], alone["strongest_quality"], alone["strongest_cost_usd"] * 1000],
               "seconds": time.perf_counter() - t0}
        print(table(out), flush=True)
        return out
    t = time.perf_counter()
    column = cross_encoder_step(CascadeConfig(cross_encoder="on", cross_encoder_fit=cfg), data, grid, 0, say)(rows, folds)
    fit_s = time.perf_counter() - t
    new, _, new_fig, used_inputs, kept = verifier_oof(inputs, folds, column, say)
    # the verifier reading the column, also where the out-of-fold log-loss leaves it out
    combined = new if kept is not None else oof_scores(with_column(inputs, column.values), folds)[0]
    ce = np.where(inputs.has, column.values, np.nan)
    cx = new_fig["cross_encoder"]
    out = {"dataset": name, "rows": int(len(rows)), "workers": data.worker_ids, "cross_encoder": cfg.model_dump(),
           "auc": {"old": old_fig["oof_auc"], "cross_encoder_alone": cx["oof_auc_alone"], "combined": cx["with"]["oof_auc"]},
           "auc_by_worker": {"old": _by_worker(old, inputs, data.worker_ids),
                             "cross_encoder_alone": _by_worker(ce, inputs, data.worker_ids),
                             "combined": _by_worker(combined, inputs, data.worker_ids)},
           "kept": kept is not None, "fit_seconds": fit_s, "frozen_seconds": cx["frozen_seconds"], "pairs": cx["pairs"],
           "mean_tokens": cx["mean_tokens"], "logloss_gain": [cx["logloss_gain"], cx["logloss_gain_low"]]}
    before, after = frontier(old, inputs), frontier(new, used_inputs)
    out["frontier"] = []
    for s in SHARES:
        b, a = before["per_row"].get(s), after["per_row"].get(s)
        d = paired_bootstrap(a[0], b[0]) if a is not None and b is not None else None
        out["frontier"].append({"share": s, "before": None if b is None else [float(b[0].mean()), float(b[1].mean() * 1000)],
                                "after": None if a is None else [float(a[0].mean()), float(a[1].mean() * 1000)],
                                "after_minus_before": d})
    out["strongest"] = [after["strongest"], after["strongest_quality"], after["strongest_cost_usd"] * 1000]
    out["seconds"] = time.perf_counter() - t0
    print(table(out), flush=True)
    return out


def table(r: dict) -> str:
    a, bw = r["auc"], r["auc_by_worker"]
    cell = lambda v: "cap not met" if v is None else f"{v[0]:.4f}, {v[1]:.4g}"  # noqa: E731
    if r["cross_encoder"] is None:  # --cross-encoder off
        return "\n".join([f"\n### {r['dataset']}: {r['rows']} rows; strongest {r['strongest'][0]}: "
                          f"{r['strongest'][1]:.4f} at ${r['strongest'][2]:.4g} per 1,000",
                          f"verifier (prompt and reply apart, no cross-encoder): out-of-fold AUC {a['old']:.3f}; per worker "
                          + ", ".join(f"{w} {v:.3f}" for w, v in bw["old"].items()),
                          "frontier at " + ", ".join(f"{f['share']:.0%}: {cell(f['before'])}" for f in r["frontier"])
                          + " (accuracy, $ per 1,000)", f"runtime {r['seconds']:.0f}s"])
    lines = [f"\n### {r['dataset']}: {r['rows']} rows, {r['pairs']} (prompt, reply) pairs (mean {r['mean_tokens']:.0f} tokens); "
             f"strongest {r['strongest'][0]}: {r['strongest'][1]:.4f} at ${r['strongest'][2]:.4g} per 1,000",
             "| verifier | out-of-fold AUC | per worker |", "|---|---|---|"]
    for k, label in (("old", "old (prompt and reply apart)"), ("cross_encoder_alone", "cross-encoder alone"),
                     ("combined", "combined (old + cross-encoder column)")):
        lines.append(f"| {label} | {a[k]:.3f} | " + ", ".join(f"{w} {v:.3f}" for w, v in bw[k].items()) + " |")
    lines.append(f"cross-encoder fit: {r['fit_seconds']:.0f}s (of which tokenising and the frozen layers "
                 f"{r['frozen_seconds']:.0f}s); kept by the out-of-fold log-loss: {'yes' if r['kept'] else 'no'} "
                 f"(gain {r['logloss_gain'][0]:+.4f}, 95% lower bound {r['logloss_gain'][1]:+.4f})")
    lines += ["| cap (share of the strongest's cost) | before: accuracy, $/1k | after: accuracy, $/1k | after − before [95% CI] |",
              "|---|---|---|---|"]
    for f in r["frontier"]:
        d = f["after_minus_before"]
        lines.append(f"| {f['share']:.0%} | {cell(f['before'])} | {cell(f['after'])} | "
                     + (f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" if d else "n/a") + " |")
    lines.append(f"runtime {r['seconds']:.0f}s")
    return "\n".join(lines)


def main(argv=None) -> int:
    from fugu_pipeline.policies.cascade.cross_encoder import MINILM, CrossEncoderConfig

    d = CrossEncoderConfig()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", required=True, help="the prompt encoder of the old verifier (e.g. the MiniLM folder)")
    ap.add_argument("--routing", type=Path, help="the routing data folder holding routellm_evals/ (gsm8k)")
    ap.add_argument("--mot", type=Path, help="a checkout or git directory of LLM_MoT_cascade (date5)")
    ap.add_argument("--synthetic", default="", help="synthetic multiple-choice sets: mc2, mc4 (comma-separated)")
    ap.add_argument("--jsonl", action="append", default=[], metavar="NAME=PATH", help="a reward-matrix JSONL with answers")
    ap.add_argument("--rows", type=int, default=400, help="rows kept per set (the first by task-id hash)")
    ap.add_argument("--cross-encoder", choices=("on", "off"), default="on",
                    help="off: the verifier as it is, no cross-encoder fit (its AUC and frontier in seconds)")
    ap.add_argument("--cross-model", default=MINILM)
    ap.add_argument("--max-length", type=int, default=d.max_length)
    ap.add_argument("--train-layers", type=lambda v: v if v == "auto" else int(v), default=d.train_layers,
                    help="top layers fine-tuned, or auto (2 on a CPU, every layer on a GPU)")
    ap.add_argument("--epochs", type=lambda v: v if v == "auto" else int(v), default=d.epochs,
                    help="or auto (2 on a CPU, 6 on a GPU)")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--head-lr", type=float, default=d.head_lr)
    ap.add_argument("--batch-size", type=int, default=d.batch_size)
    ap.add_argument("--folds", type=int, default=d.folds)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--prices", default=None, help="JSON {worker: $ per million tokens} for sets without costs")
    ap.add_argument("--work-dir", default="/tmp/fugu-verifier-cross")
    ap.add_argument("--cache-dir", default="/tmp/fugu-verifier-cross/cache")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    args = ap.parse_args(argv)
    names = (["gsm8k"] if args.routing else []) + (["date5"] if args.mot else []) \
        + [s for s in args.synthetic.split(",") if s] + [x.split("=", 1)[0] for x in args.jsonl]
    if not names:
        raise SystemExit("no data: pass --routing, --mot, --synthetic mc2,mc4 or --jsonl NAME=PATH")
    print(f"machine: {machine()}", flush=True)
    results = [run(n, args) for n in names]
    print(f"\nmachine: {machine()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "results": results}, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
