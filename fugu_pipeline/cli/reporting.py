"""What the report-writing commands share (`evaluate`, `validate`): the promotion policy file, the
live evaluator, and printing the baselines and the composite under a report's summary line."""

from __future__ import annotations

import sys
from pathlib import Path


def policy(args):
    from fugu_pipeline.evaluate.promotion import DEFAULT_POLICY_FILE, load_policy

    return load_policy(args.policy or DEFAULT_POLICY_FILE, required=args.policy is not None)


def live_for(args, data):
    """The live evaluator (the worker YAML's pool) and the tasks with graders, or (None, None)."""
    from fugu_pipeline.evaluate.live import OneCallEvaluator, tasks_by_id
    from fugu_pipeline.workers.config import load_workers_config

    tasks_path = args.tasks or ("data/benchgen" if Path("data/benchgen").is_dir() else None)
    if not args.reward_config or tasks_path is None:
        print("live term: not measured (needs --workers W.yaml with workers and --tasks)", file=sys.stderr)
        return None, None
    try:
        config = load_workers_config(args.reward_config)
    except Exception as exc:  # a YAML with only reward: has no workers to call
        print(f"live term: not measured ({args.reward_config} names no workers to call: {exc})", file=sys.stderr)
        return None, None
    return OneCallEvaluator(config), tasks_by_id(tasks_path)


def composite_for_report(rep: dict, ckpt, data, args) -> None:
    """`fugu-lite evaluate`: the composite against the king of --models-dir, live where it can."""
    from fugu_pipeline.evaluate.contest import add_composite

    live, tasks = live_for(args, data)
    add_composite(rep, ckpt, data, args.models_dir, policy(args).composite, live=live, tasks=tasks)


def print_report_tables(rep: dict) -> None:
    """The baselines and the composite with its terms, under the summary line."""
    from fugu_pipeline.evaluate.baselines import baseline_lines
    from fugu_pipeline.evaluate.composite import composite_lines

    for line in baseline_lines(rep["baselines"]):
        print(line)
    c = rep.get("composite")
    if c is not None:
        for line in composite_lines(c["challenger"], "composite"):
            print(line)
        if c["king"] is not None:
            for line in composite_lines(c["king"], f"king composite ({c['king_note']})"):
                print(line)
            d = c["difference"]
            print(f"composite − king {d['mean']:+.4f} [95%: {d['low']:+.4f}, {d['high']:+.4f}]")
        else:
            print(f"no king to compare ({c['king_note']})")
        print(c["live"])
