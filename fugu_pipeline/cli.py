"""`fugu-lite`: the command line. Thin: every command calls the same core functions as the
Dagster assets (DESIGN §2). Heavy imports happen inside the command that needs them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_pipeline(args: argparse.Namespace) -> int:
    from fugu_pipeline.defs.runner import run_pipeline

    results = run_pipeline(Path(args.project_dir).resolve(), args.workers, encoder=args.encoder, stop_after=args.stop_after)
    rm = results.get("reward_matrix", {})
    if rm:
        print(f"reward matrix: {rm.get('tasks')} tasks x {rm.get('workers')} workers, "
              f"{rm.get('cells_filled')}/{rm.get('cells_expected')} cells -> {rm.get('path')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fugu-lite", description="A learned LLM router (Dagster pipeline).")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pipeline", help="materialize the whole asset graph offline-capable (the main job)")
    p.add_argument("--project-dir", default=".", help="project root (holds data/, models/, dagster.yaml)")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="worker YAML (default: the offline mock pool)")
    p.add_argument("--encoder", default=None, help="'tiny' (built-in, offline), a local model directory, or a hub id "
                   "(default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B)")
    p.add_argument("--stop-after", default=None, help="stop after this asset (e.g. reward_matrix)")
    p.set_defaults(func=cmd_pipeline)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
