"""Multi-turn commands: `ask --mode multi-turn` (the promoted coordinator, or --checkpoint, runs a
session against the configured workers and prints the committed answer and every turn)."""

from __future__ import annotations

from fugu_pipeline.cli.common import CLIError, print_json


def turn_summary(t) -> dict:
    return {"turn": t.index, "role": t.role, "chosen": t.chosen_worker, "served_by": t.served_by, "status": t.status,
            "verdict": t.verdict, "extractable_answer": t.extractable, "cost_usd": t.cost_usd,
            "latency_s": round(t.latency_s, 4), "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens, "fallback_errors": t.fallback_errors}


def cmd_ask_multi_turn(args) -> int:
    import asyncio

    from dotenv import load_dotenv

    from fugu_pipeline.route.roles import PromotedRoles, RolesCoordinator
    from fugu_pipeline.session.callers import ClientCaller, SessionBudget
    from fugu_pipeline.workers.config import load_workers_config

    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    coord = (RolesCoordinator.load(args.checkpoint, device=args.device, encoder=args.encoder) if args.checkpoint
             else PromotedRoles(args.models_dir, device=args.device, encoder=args.encoder).refresh())
    missing = [w for w in coord.worker_ids if w not in config.worker_ids]
    if missing:
        raise CLIError(f"the coordinator delegates to {missing}, which {args.workers} does not define")

    async def run():
        caller = ClientCaller.from_config(config, coord.worker_ids)
        try:
            return await coord.session(args.prompt, args.domain, caller, seed=args.seed, allowed=args.allowed,
                                       budget=SessionBudget(config.max_usd_per_run))
        finally:
            await caller.aclose()

    tr = asyncio.run(run())
    print(tr.answer if tr.answer is not None else "(no turn produced an answer)")
    print_json({"fugu_lite": {"mode": "multi_turn", "coordinator": coord.tag, "stop_reason": tr.stop_reason,
                              "committed_turn": tr.committed_turn, "turns": [turn_summary(t) for t in tr.turns],
                              "cost_usd": tr.cost_usd, "latency_s": tr.latency_s, "error": tr.error}})
    if tr.answer is None and tr.stop_reason in ("all_workers_failed", "fatal", "budget"):
        raise CLIError(f"the session ended without an answer ({tr.stop_reason}): {tr.error}")
    return 0
