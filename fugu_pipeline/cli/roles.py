"""Multi-turn commands: `ask --mode multi-turn` (the promoted coordinator, or --checkpoint, runs a
session against the configured workers and prints the committed answer and every turn)."""

from __future__ import annotations

import sys

from fugu_pipeline.cli.common import CLIError, asked_by, check_prompt, print_json


def turn_summary(t) -> dict:
    return {"turn": t.index, "role": t.role, "chosen": t.chosen_worker, "served_by": t.served_by, "status": t.status,
            "verdict": t.verdict, "extractable_answer": t.extractable, "cost_usd": t.cost_usd,
            "latency_s": round(t.latency_s, 4), "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens, "fallback_errors": t.fallback_errors}


def cmd_ask_multi_turn(args) -> int:
    import asyncio

    from dotenv import load_dotenv

    from fugu_pipeline.policies.coordinator.route import PromotedRoles, RolesCoordinator
    from fugu_pipeline.session.callers import ClientCaller, SessionBudget, SpendCaps
    from fugu_pipeline.workers.config import load_workers_config

    check_prompt(args.prompt)
    one_step = [f for f, v in (("--cost-weight", args.cost_weight), ("--cap", args.cap), ("--budget-usd-per-1k", args.budget_usd_per_1k),
                               ("--budget-share", args.budget_share), ("--budget-margin-z", args.budget_margin_z))
                if v is not None]
    if one_step:  # they would be ignored: the session's spend is capped by the worker config instead
        raise CLIError(f"{', '.join(one_step)}: only for one-step routing; a multi-turn session's spend is "
                       f"capped by max_usd_per_session (and max_usd_per_run) in {args.workers}")
    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    from fugu_pipeline.cli.checkpoints import routable

    path, promoted = routable(args.checkpoint) if args.checkpoint else (args.models_dir, True)
    coord = (PromotedRoles(path, device=args.device, encoder=args.encoder).refresh() if promoted
             else RolesCoordinator.load(path, device=args.device, encoder=args.encoder))
    missing = [w for w in coord.worker_ids if w not in config.worker_ids]
    if missing:
        raise CLIError(f"the coordinator delegates to {missing}, which {args.workers} does not define")

    async def run():
        caller = ClientCaller.from_config(config, coord.worker_ids)
        try:
            caps = SpendCaps(SessionBudget(config.max_usd_per_session), SessionBudget(config.max_usd_per_run))
            return await coord.session(args.prompt, args.domain, caller, seed=args.seed, allowed=args.allowed,
                                       budget=caps)
        finally:
            await caller.aclose()

    tr = asyncio.run(run())
    print(tr.answer if tr.answer is not None else "(no committed answer)")
    print_json({"fugu_lite": {"mode": "multi_turn", "coordinator": coord.tag, "stop_reason": tr.stop_reason,
                              "committed_turn": tr.committed_turn, "turns": [turn_summary(t) for t in tr.turns],
                              "cost_usd": tr.cost_usd, "latency_s": tr.latency_s, "error": tr.error}})
    if tr.answer is None:
        why = {"max_turns": f"the coordinator used all {len(tr.turns)} turns without committing an answer"}.get(
            tr.stop_reason, tr.error or tr.stop_reason)
        raise CLIError(f"the session ended without a committed answer ({tr.stop_reason}): {why}; "
                       f"{len(tr.turns)} turn(s) cost ${tr.cost_usd:.6f}")
    return 0


def pack_manifest(pack_dir):
    """A pack's manifest, read alone (capped), or CLIError naming the file."""
    from pathlib import Path

    from fugu_pipeline.train.checkpoints import MANIFEST_FILE, MAX_MANIFEST_BYTES, Manifest, read_capped

    path = Path(pack_dir) / MANIFEST_FILE
    try:
        return Manifest.model_validate_json(read_capped(path, MAX_MANIFEST_BYTES, "a manifest"))
    except (OSError, ValueError) as exc:
        raise CLIError(f"{path}: not a checkpoint manifest ({' '.join(str(exc).split())[:300]}); pack the checkpoint "
                       "again") from None


def cmd_evaluate_roles(args) -> int:
    """The held-out multi-turn report of a coordinator (default: the promoted one) on a project's
    graded tasks, against the one-step router, the answer-aware cascade (--cascade, default: the
    promoted router when it is a cascade) and the best fixed worker; the same core as
    `eval_report_roles`, promotion only with --promote."""
    from pathlib import Path

    from fugu_pipeline.policies.coordinator.project import (
        CascadeBaselineError,
        evaluate_coordinator,
        open_run,
        project_tasks,
        roles_encoder_settings,
    )
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.route.router import RouterError
    from fugu_pipeline.train.pointer import ROLES_POINTER, pointer_target, read_pointer
    from fugu_pipeline.policies.coordinator.train import load_roles_config
    from fugu_pipeline.workers.config import load_workers_config

    from fugu_pipeline.cli.reporting import policy as load_policy_arg

    paths = ProjectPaths(Path(args.project_dir).resolve())
    config = load_workers_config(paths.resolve(args.workers))
    cfg = load_roles_config(paths.resolve(args.config))
    policy = load_policy_arg(args)  # what validate and the pipeline read: a broken file is said before any call
    from fugu_pipeline.cli.checkpoints import resolve_checkpoint

    checkpoint = resolve_checkpoint(args.checkpoint) if args.checkpoint else None
    if checkpoint is None:
        ptr = read_pointer(paths.models, ROLES_POINTER)
        if ptr is None:
            raise RouterError(f"no promoted coordinator in {paths.models}; pass --checkpoint models/roles/<hash>")
        checkpoint = pointer_target(paths.models, ptr)
    from fugu_pipeline.evaluate.contest_entry import is_pack
    from fugu_pipeline.policies.registry import load_checkpoint

    # a pack: its manifest only (the contest checks its signature before any of its weights is read)
    contract = (pack_manifest(checkpoint) if is_pack(checkpoint, paths.models) else load_checkpoint(checkpoint).manifest
                ).feature_contract
    settings = roles_encoder_settings(args.encoder or contract.encoder_id, contract.max_length, revision=contract.revision,
                                      device=args.device)
    refused: list = []  # a batch file the reward matrix left out is left out here too, said in one line
    tasks = project_tasks(paths.benchgen, paths.reward_db, refused)
    for exc in refused:
        print(f"{exc.path} left out as the matrix leaves it out: {exc.first_problem()}", file=sys.stderr)
    with open_run(config, settings, paths.data / "trajectories", tasks, cfg) as run:
        try:
            rep = evaluate_coordinator(run, checkpoint, tasks, cfg, paths.models, seeds=args.seeds, promote=args.promote,
                                       policy=policy,
                                       one_step_fallback=Path(args.one_step) if args.one_step else None,
                                       cascade=Path(args.cascade) if args.cascade else None, device=args.device,
                                       replace_broken_king=asked_by(args, "evaluate-roles --promote"))
        except CascadeBaselineError as exc:
            raise CLIError(str(exc)) from None
        print(f"worker calls this run: {dict(run.caller.calls)}; sessions read from the store: "
              f"{run.runner.stats.sessions_stored}, run: {run.runner.stats.sessions_run}")
    print(f"report: {rep['report_path']}")
    return 0
