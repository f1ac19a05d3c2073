"""The TinyRouter harness on the command line: `baseline`, `pack`, `preflight`, `validate`,
`train-triage`, `triage-report`. Thin: each calls the same core as the assets (`evaluate/`,
`train/exchange.py`, `train/triage.py`), over the same data plumbing as `train-*` and `evaluate`
(`--data` JSONL or DuckDB, `--workers` for the utility weights)."""

from __future__ import annotations

import sys
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, print_json
from fugu_pipeline.cli.reporting import live_for, policy as load_policy_arg


def add_commands(add, data_opts) -> None:
    """Register the harness commands on the `fugu-lite` parser (`add(name, fn, help)`)."""
    p = add("baseline", cmd_baseline, "baselines from the reward matrix alone: always one worker, random routing "
            "over seeds, the oracle ceiling and the cross-fit oracle")
    p.add_argument("kind", choices=["always", "random", "oracle", "all"])
    p.add_argument("--data", required=True, help="reward-matrix JSONL (DESIGN §4) or a reward_matrix.duckdb")
    p.add_argument("--workers", "--reward-config", dest="reward_config", default=None, metavar="YAML",
                   help="the YAML whose reward: block gives the utility weights (needed for a JSONL with quality)")
    p.add_argument("--work-dir", default="data/imports", help="where the DuckDB matrix of a JSONL is built")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--seeds", type=int, default=100, help=f"random routing: number of seeds (1 to {MAX_DRAWS:,})")
    p.add_argument("--repeats", type=int, default=20, help=f"cross-fit oracle: number of random half splits (1 to {MAX_DRAWS:,})")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")

    p = add("pack", cmd_pack, "write a head, its training receipt and its feature contract to one folder")
    p.add_argument("checkpoint", help="the checkpoint train-* printed (or a models folder holding exactly one)")
    p.add_argument("--out", required=True, help="the pack folder to write")
    p.add_argument("--submitter", default="", help="who submits it (the rate limit counts per submitter)")

    def judge_opts(p):
        p.add_argument("--models-dir", default="models", help="holds the king (models/promoted/current.json), the "
                       "history and the registry of judged heads")
        p.add_argument("--policy", default=None, help="promotion policy YAML (default: configs/promotion.yaml if present)")
        p.add_argument("--submitter", default=None, help="rate-limit key (default: the receipt's submitter, else 'external')")

    p = add("preflight", cmd_preflight, "run the submission gates on a pack folder, offline (nothing is scored or recorded)")
    p.add_argument("pack", help="the folder fugu-lite pack wrote")
    judge_opts(p)
    p.add_argument("--workers", dest="host_workers", default=None, metavar="YAML",
                   help="the host's worker YAML: the head must route exactly these workers (default: the king's)")
    p.add_argument("--encoder", default=None, help="the host's encoder: the head's feature contract must match it "
                   "(default: the king's contract)")
    p.add_argument("--data", default=None, help="the host's reward matrix: tells which workers are paid (for the receipt)")
    p.add_argument("--work-dir", default="data/imports")
    p.add_argument("--replace-broken-king", action="store_true", help="check as validate --replace-broken-king would: a "
                   "promoted checkpoint that cannot be loaded is to be replaced (default: the king gate fails and says why)")

    p = add("validate", cmd_validate, "score a pack folder against the king and promote it or refuse it, through every gate")
    p.add_argument("--challenger", required=True, help="the folder fugu-lite pack wrote")
    data_opts(p)
    judge_opts(p)
    p.add_argument("--tasks", default=None, help="BenchGen batch file or folder holding the held-out tasks (graders): "
                   "the live term calls the routed worker on a sample of them (default: data/benchgen when present)")
    p.add_argument("--replace-broken-king", action="store_true", help="when the promoted checkpoint cannot be loaded "
                   "(damaged pointer, edited or missing checkpoint), let the challenger replace it facing the baselines "
                   "only (default: refuse before scoring and say why)")

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


# --------------------------------------------------------------------------- exchange


def cmd_pack(args) -> int:
    from fugu_pipeline.cli.training import resolve_checkpoint
    from fugu_pipeline.train.exchange import pack, read_receipt

    out = pack(resolve_checkpoint(args.checkpoint), args.out, submitter=args.submitter)
    r = read_receipt(out)
    cost = "none recorded" if r.data_cost_usd is None else f"${r.data_cost_usd:.4f}"
    print(f"packed {r.method} {r.content_hash} ({r.head_kind}, {r.param_count:,} params, workers {r.worker_ids}, "
          f"encoder {r.encoder_id}): {r.steps} fitness steps ({r.fitness_curve}), training cost {cost}")
    print(f"{out}  ({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))})")
    return 0


def cmd_preflight(args) -> int:
    from fugu_pipeline.evaluate.preflight import host_expectation, preflight

    policy = load_policy_arg(args)
    data = None
    if args.data:  # the matrix alone (no features): its worker order and which workers are paid
        from fugu_pipeline.cli.training import matrix_db
        from fugu_pipeline.matrix.read import read_arrays

        args.reward_config = args.host_workers  # its reward: block, for a JSONL whose rows carry quality
        data = read_arrays(matrix_db(args))
    host = host_expectation(args.models_dir, workers_yaml=args.host_workers, encoder=args.encoder, data=data)
    result = preflight(args.pack, args.models_dir, policy.gates, host=host, data=data, submitter=args.submitter,
                       replace_broken_king=args.replace_broken_king)
    print(f"preflight {args.pack}: host expectation from {host.source}")
    for g in result.gates:
        print(f"  {g.line()}")
    print("PASSED: ready for fugu-lite validate" if result.ok else "REFUSED")
    return 0 if result.ok else 1


def cmd_validate(args) -> int:
    from fugu_pipeline.cli.training import encoder_settings, routing_data
    from fugu_pipeline.evaluate.feature_source import FeatureSource
    from fugu_pipeline.evaluate.preflight import host_expectation, preflight
    from fugu_pipeline.evaluate.preflight import king_manifest
    from fugu_pipeline.evaluate.promotion import append_history, promote_best

    policy = load_policy_arg(args)
    pack_dir = Path(args.challenger)
    # the host's features: --encoder, else the king's encoder, else the default; never the pack's own claim
    encoder = args.encoder
    king = king_manifest(args.models_dir)
    if encoder is None and king is not None:
        encoder = king[1].feature_contract.encoder_id
    data = routing_data(args, encoder)
    host = host_expectation(args.models_dir, data=data)
    pre = preflight(pack_dir, args.models_dir, policy.gates, host=host, data=data, submitter=args.submitter,
                    replace_broken_king=args.replace_broken_king)
    for g in pre.gates:
        print(f"  {g.line()}")
    if not pre.ok:
        rate_limited = any(g.name == "rate limit" and not g.ok for g in pre.gates)
        import time

        # a refusal only for the host's broken king is not the submitter's attempt (the rate limit skips it)
        hosts_fault = all(g.ok or g.name == "king" for g in pre.gates)
        append_history(args.models_dir, {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "promote": False, "challenger": str(pack_dir),
                                         "reasons": [g.line() for g in pre.gates], "submitter": pre.submitter,
                                         "rate_limited": rate_limited, "not_an_attempt": hosts_fault})
        print("REFUSED before scoring")
        return 1
    live, tasks = live_for(args, data)
    # the pack and the king each scored on their own features of the host's encoder model
    features = FeatureSource(data, lambda s: routing_data(args, settings=s), encoder_settings(args, encoder))
    outcome = promote_best([str(pack_dir)], data, args.models_dir, policy, live=live, tasks=tasks, submitter=pre.submitter,
                           features=features, replace_broken_king=args.replace_broken_king)
    shown = {g.line() for g in pre.gates}
    for line in outcome["reasons"]:
        if line not in shown:  # the gates promote_best ran again agree with preflight: printed once
            print(line)
    if outcome["promoted"]:
        print(f"promoted: models/promoted/current.json -> {outcome['pointer']['checkpoint']}")
    return 0 if outcome["promoted"] else 1


# --------------------------------------------------------------------------- triage


def cmd_train_triage(args) -> int:
    from fugu_pipeline.cli.training import models_output, routing_data
    from fugu_pipeline.train.configs import load_config
    from fugu_pipeline.train.triage import TriageConfig, train_triage

    models_output(args.output)
    cfg = load_config(args.config, TriageConfig) if args.config else TriageConfig()
    data = routing_data(args)
    result = train_triage(data, cfg, log=lambda m: print(m, file=sys.stderr))
    path = result.save(args.output)
    m = result.metrics
    print(f"triage: {result.param_count} parameters, kept epoch {result.best_epoch}; val domain accuracy "
          f"{m['val_domain_accuracy']:.4f}, val difficulty accuracy {m['val_difficulty_accuracy']:.4f}")
    print(path)
    return 0


def cmd_triage_report(args) -> int:
    from fugu_pipeline.cli.training import report_output, routing_data
    from fugu_pipeline.evaluate.triage_report import triage_lines, triage_report, write_triage_report
    from fugu_pipeline.train.triage import load_triage

    probe = load_triage(args.checkpoint)
    out = report_output(args.output, Path(probe.path), f"triage-{args.split}.json")
    data = routing_data(args, args.encoder or probe.manifest.feature_contract.encoder_id)
    head = load_triage(args.checkpoint, expected_contract=data.contract)
    rep = triage_report(head, data, args.split)
    write_triage_report(rep, out)
    for line in triage_lines(rep):
        print(line)
    print(f"report: {out}")
    return 0
