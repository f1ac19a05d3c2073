"""The TinyRouter harness on the command line: `baseline`, `train-triage`, `triage-report`, and the
contest's commands (`cli/contest.py`: `keygen`, `accept-key`, `pack`, `preflight`, `validate`).
Thin: each calls the same core as the assets (`evaluate/`, `policies/triage/train.py`), over the same data
plumbing as `train-*` and `evaluate` (`--data` JSONL or DuckDB, `--workers` for the utility weights)."""

from __future__ import annotations

import sys
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, print_json


def add_commands(add, data_opts) -> None:
    """Register the harness commands on the `fugu-lite` parser (`add(name, fn, help)`)."""
    p = add("baseline", cmd_baseline, "baselines from the reward matrix alone: always one worker, random routing "
            "over seeds, the oracle ceiling and the cross-fit oracle")
    p.add_argument("kind", choices=["always", "random", "oracle", "all"])
    p.add_argument("--data", required=True, help="reward-matrix JSONL or a reward_matrix.duckdb")
    p.add_argument("--workers", "--reward-config", dest="reward_config", default=None, metavar="YAML",
                   help="the YAML whose reward: block gives the utility weights (needed for a JSONL with quality)")
    p.add_argument("--work-dir", default="data/imports", help="where the DuckDB matrix of a JSONL is built")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--seeds", type=int, default=100, help=f"random routing: number of seeds (1 to {MAX_DRAWS:,})")
    p.add_argument("--repeats", type=int, default=20, help=f"cross-fit oracle: number of random half splits (1 to {MAX_DRAWS:,})")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")

    from fugu_pipeline.cli import contest

    contest.add_commands(add, data_opts)  # keygen, accept-key, pack, preflight, validate

    p = add("train-triage", cmd_train_triage, "train the triage head: domain and difficulty of a prompt")
    data_opts(p)
    p.add_argument("--config", default=None, help="triage trainer YAML (TriageConfig; default: built-in defaults)")
    p.add_argument("--output", default="models", help="models folder: the head goes to <output>/triage/<hash>/")

    p = add("triage-report", cmd_triage_report, "accuracy and confusion of a triage head per domain, on a split")
    p.add_argument("--checkpoint", required=True)
    data_opts(p)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--output", default=None, help="report JSON (default: <checkpoint>/reports/triage-<split>.json)")


# --------------------------------------------------------------------------- baselines


# --seeds and --repeats: at least one draw (a percentile of none is undefined); at most this many, since
# random routing holds a (seeds x rows) array of routes (10,000 seeds of 7,000 rows: 0.6 GB)
MAX_DRAWS = 10_000


def cmd_baseline(args) -> int:
    import numpy as np

    from fugu_pipeline.cli.training import matrix_db

    for flag, value in (("--seeds", args.seeds), ("--repeats", args.repeats)):
        if not 1 <= value <= MAX_DRAWS:
            raise CLIError(f"{flag} {value}: give a count from 1 to {MAX_DRAWS:,} (default {100 if flag == '--seeds' else 20})")
    from fugu_pipeline.evaluate.baselines import baseline_lines, baseline_rows
    from fugu_pipeline.matrix.read import read_arrays, read_utility_config

    db = matrix_db(args)
    arrays = read_arrays(db)
    rows = np.flatnonzero(arrays.splits == args.split)
    if not len(rows):
        from fugu_pipeline.cli.training import incomplete_split

        if why := incomplete_split(db, args.split):
            raise CLIError(f"{args.data}: {why}")
        raise CLIError(f"{args.data}: the '{args.split}' split has no complete rows (splits: "
                       f"{ {s: int((arrays.splits == s).sum()) for s in ('train', 'val', 'test')} })")
    quality = arrays.quality[rows]
    b = baseline_rows(arrays.worker_ids, arrays.utility[rows], None if np.isnan(quality).any() else quality,
                      [arrays.domains[i] for i in rows], seeds=args.seeds, repeats=args.repeats)
    keep = {"always": ("always",), "random": ("random",), "oracle": ("oracle", "cross_fit_oracle",
            "cross_fit_oracle_by_domain", "headroom"), "all": None}[args.kind]
    if keep is not None:
        for m in b["measures"]:
            b[m] = {k: v for k, v in b[m].items() if k in keep}
    b["split"] = args.split
    b["utility_formula"] = read_utility_config(db).describe()
    if args.json:
        print_json(b)
        return 0
    print(f"{args.split} split of {args.data}; utility {b['utility_formula']}")
    for line in baseline_lines(b):
        print(line)
    return 0


# --------------------------------------------------------------------------- triage


def cmd_train_triage(args) -> int:
    from fugu_pipeline.cli.training import models_output, routing_data
    from fugu_pipeline.config_files import load_config
    from fugu_pipeline.policies.triage.train import TriageConfig, train_triage

    models_output(args.output)
    cfg = load_config(args.config, TriageConfig) if args.config else TriageConfig()
    data = routing_data(args)
    result = train_triage(data, cfg, log=lambda m: print(m, file=sys.stderr))
    path = result.save(args.output)
    from fugu_pipeline.cli.checkpoints import record_latest

    record_latest(args.output, path, "train-triage")
    m = result.metrics
    print(f"triage: {result.param_count} parameters, kept epoch {result.best_epoch}; val domain accuracy "
          f"{m['val_domain_accuracy']:.4f}, val difficulty accuracy {m['val_difficulty_accuracy']:.4f}")
    print(path)
    return 0


def cmd_triage_report(args) -> int:
    from fugu_pipeline.cli.training import report_output, routing_data
    from fugu_pipeline.cli.checkpoints import resolve_checkpoint
    from fugu_pipeline.policies.triage.report import triage_lines, triage_report, write_triage_report
    from fugu_pipeline.policies.triage.train import load_triage

    checkpoint = resolve_checkpoint(args.checkpoint)
    probe = load_triage(checkpoint)
    out = report_output(args.output, Path(probe.path), f"triage-{args.split}.json")
    data = routing_data(args, args.encoder or probe.manifest.feature_contract.encoder_id)
    head = load_triage(checkpoint, expected_contract=data.contract)
    rep = triage_report(head, data, args.split)
    write_triage_report(rep, out)
    for line in triage_lines(rep):
        print(line)
    print(f"report: {out}")
    return 0
