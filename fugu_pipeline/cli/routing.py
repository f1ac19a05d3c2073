"""Routing commands: `route` (decide only), `ask` (decide and call, with fallback), `serve`."""

from __future__ import annotations

from fugu_pipeline.cli.common import CLIError, check_prompt, print_json


def _router(args):
    from fugu_pipeline.cli.training import encoder_settings
    from fugu_pipeline.policies.registry import load_promoted, load_router

    from fugu_pipeline.cli.checkpoints import routable

    path, promoted = routable(args.checkpoint) if args.checkpoint else (args.models_dir, True)
    if promoted:
        router = load_promoted(path, device=args.device, dtype=args.dtype, encoder=args.encoder).router
    else:
        router = load_router(path, device=args.device, dtype=args.dtype, encoder=args.encoder)
    encoder_settings(args, args.encoder, router.checkpoint.manifest.feature_contract)  # refuses contradicting flags
    return router


def _route_kwargs(args, router, config=None, budget=None) -> dict:
    """`--allowed` may name a configured worker (with `--workers`) whose alias the router routes by.
    With a worker config, a router that routes to a worker it does not define is refused, as
    `serve` refuses it: its pick could not be called."""
    if config is not None:
        problem = config.missing_routes(router.path, router.worker_ids)
        if problem:
            raise CLIError(f"{problem} ({args.workers})")
    if budget is not None and args.cost_weight is not None:
        raise CLIError("give --cost-weight or a cap (--cap), not both")
    if args.cost_weight is not None:
        problem = router.cost_weight_problem()  # a flag that cannot move the route is refused, never ignored silently
        if problem:
            hint = ": --cap share=S or --cap usd_per_1k=USD" if "cost cap" in problem else ""
            raise CLIError(f"--cost-weight: {problem}{hint} (checkpoint {router.path})")
    allowed = args.allowed
    if allowed is not None and config is not None:
        allowed = [config.routed_id(w, router.worker_ids) for w in allowed]
    return {"allowed": allowed, "cost_weight": args.cost_weight, "budget": budget,
            **({"default_point": False} if getattr(args, "no_default_budget", False) else {})}


def policy_of(router) -> dict:
    """{"policy": what train chose and printed for this checkpoint (`route/shipped.py`)}, or {}."""
    shipped = getattr(router, "shipped", None)
    return {"policy": shipped.public()} if shipped is not None else {}


def scores_of(d) -> dict:
    """What the head scored each worker on, named for what it is (`score_kind`); `probabilities` only
    where the head is a policy and they are its probabilities."""
    from fugu_pipeline.route.router import POLICY_PROBABILITY

    out = {"scores": d.scores, "score_kind": d.score_kind}
    if d.score_kind == POLICY_PROBABILITY:
        out["probabilities"] = d.scores
    return out


def cmd_route(args) -> int:
    from fugu_pipeline.cli.training import budget_of

    check_prompt(args.prompt)
    budget = budget_of(args)  # a bad cap is said before the checkpoint loads
    config = None
    if args.workers is not None:
        from fugu_pipeline.workers.config import load_workers_config

        config = load_workers_config(args.workers)
    router = _router(args)
    d = router.route(args.prompt, args.domain, **_route_kwargs(args, router, config, budget))
    print_json({"worker": d.worker_id, **scores_of(d), "ranking": d.ranking, "checkpoint": d.checkpoint,
                 **({"cascade": d.extra["cascade"]["describe"]} if "cascade" in d.extra else {}),
                 **({"group": d.extra["cascade"]["group"]} if "group" in d.extra.get("cascade", {}) else {}),
                **({"budget": d.extra["budget"]} if "budget" in d.extra else {}),
                **({"note": d.extra["domain_note"]} if "domain_note" in d.extra else {}), **policy_of(router)})
    return 0


def cmd_ask(args) -> int:
    if getattr(args, "mode", "one-step") == "multi-turn":
        from fugu_pipeline.cli.roles import cmd_ask_multi_turn

        return cmd_ask_multi_turn(args)
    import asyncio

    from dotenv import load_dotenv

    from fugu_pipeline.workers.config import load_workers_config
    from fugu_pipeline.workers.contract import WorkerCallError
    from fugu_pipeline.workers.factory import make_client

    from fugu_pipeline.cli.training import budget_of

    check_prompt(args.prompt)
    budget = budget_of(args)
    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    router = _router(args)
    d = router.route(args.prompt, args.domain, **_route_kwargs(args, router, config, budget))
    if "cascade" in d.extra:  # a cascade checkpoint: step by step, the same clients and fallback
        return _ask_cascade(args, config, router, d)
    errors = []

    async def call():
        for routed in d.ranking:  # fall back down the ranking
            try:
                spec = config.worker(routed)  # by id, or by alias (a router trained on imported data)
            except KeyError as exc:
                raise CLIError(f"{exc.args[0]} ({args.workers})") from None
            wid, client = spec.id, make_client(spec, config)
            try:
                return wid, await client.complete([{"role": "user", "content": args.prompt}])
            except WorkerCallError as exc:
                errors.append({"worker": wid, "error": str(exc)})
                if type(exc).__name__ == "FatalWorkerError":
                    raise
            finally:
                await client.aclose()
        raise CLIError(f"every worker failed: {errors}")

    wid, comp = asyncio.run(call())
    print(comp.answer)
    print_json({"fugu_lite": {"chosen": d.worker_id, "served_by": wid, **scores_of(d),
                               "latency_s": comp.latency_s, "cost_usd": comp.cost_usd, "fallback_errors": errors,
                               **({"budget": d.extra["budget"]} if "budget" in d.extra else {}),
                               **({"note": d.extra["domain_note"]} if "domain_note" in d.extra else {}),
                               **policy_of(router)}})
    return 0


def _ask_cascade(args, config, router, d) -> int:
    import asyncio

    from fugu_pipeline.policies.cascade.route import run_cascade
    from fugu_pipeline.workers.factory import make_client

    async def call(routed: str):
        try:
            spec = config.worker(routed)
        except KeyError as exc:
            raise CLIError(f"{exc.args[0]} ({args.workers})") from None
        client = make_client(spec, config)
        try:
            return await client.complete([{"role": "user", "content": args.prompt}])
        finally:
            await client.aclose()

    steps = d.router or router  # a cap the shipped description sent to the run's cascade (Router.cap_router)
    run = asyncio.run(run_cascade(steps, args.prompt, args.domain, d, call, verify=_now(steps)))
    if run.answer is None:
        raise CLIError(f"every worker failed: {run.fallback_errors}")
    print(run.answer.answer)
    print_json({"fugu_lite": {"mode": "cascade", **run.info(), "fallback_errors": run.fallback_errors,
                               **({"budget": d.extra["budget"]} if "budget" in d.extra else {}), **policy_of(router)}})
    return 0


def _now(router):
    async def verify(*a):
        return router.verify(*a)
    return verify


MAX_TORCH_THREADS = 1024  # past this torch refuses or overflows; no machine here has so many cores


def cmd_serve(args) -> int:
    from fugu_pipeline.cli.training import budget_of
    from fugu_pipeline.serve import serve
    from fugu_pipeline.serve.connections import ConnectionLimitError
    from fugu_pipeline.serve.run import PortUnavailable

    for flag, value, ok, what in (
            ("--port", args.port, 0 <= args.port <= 65535, "a TCP port is 0 to 65535 (0: any free port); e.g. --port 8080"),
            ("--torch-threads", args.torch_threads, 0 <= args.torch_threads <= MAX_TORCH_THREADS,
             f"0 (torch's default) to {MAX_TORCH_THREADS}; the default, 1, is the cheapest per request for small batches"),
            ("--batch-window-ms", args.batch_window_ms, 0 <= args.batch_window_ms <= 10_000,
             "0 (no waiting) to 10000 milliseconds"),
            ("--max-batch", args.max_batch, 1 <= args.max_batch <= 4096, "1 (no batching) to 4096 prompts"),
            ("--max-body-bytes", args.max_body_bytes, args.max_body_bytes >= 1024, "at least 1024 bytes"),
            ("--max-json-values", args.max_json_values, args.max_json_values >= 1, "at least 1"),
            ("--shutdown-grace-s", args.shutdown_grace_s, 0 <= args.shutdown_grace_s <= 3600, "0 to 3600 seconds"),
            ("--auth-cooldown-s", args.auth_cooldown_s, 0 <= args.auth_cooldown_s <= 86_400,
             "0 (never keep a worker out) to 86400 seconds")):
        if not ok:  # NaN fails every comparison above
            raise CLIError(f"{flag} {f'{value:g}' if isinstance(value, float) else value}: {what}")
    limits = serve_limits(args)
    budget = budget_of(args)  # the flags first, then the files
    from fugu_pipeline.cli.checkpoints import routable
    from fugu_pipeline.serve.run import bind
    from fugu_pipeline.workers.config import load_workers_config

    load_workers_config(args.workers)  # the worker file first, then the port: both before the router and encoder load
    try:
        bind(args.host, args.port).close()
    except PortUnavailable as exc:
        raise CLIError(str(exc)) from None
    source = routable(args.checkpoint)[0] if args.checkpoint else args.models_dir
    try:
        serve(source, args.workers, host=args.host, port=args.port, api_token=args.token,
              device=args.device, encoder=args.encoder, dtype=args.dtype, torch_threads=args.torch_threads,
              max_body_bytes=args.max_body_bytes, batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
              log_level=args.log_level, default_budget=budget, shutdown_grace_s=args.shutdown_grace_s,
              default_point=not args.no_default_budget,
              max_json_values=args.max_json_values, allowed_hosts=tuple(args.allowed_host or ()),
              auth_cooldown_s=args.auth_cooldown_s, limits=limits)
    except (PortUnavailable, ConnectionLimitError) as exc:
        raise CLIError(str(exc)) from None
    return 0


def serve_limits(args):
    """The `ConnectionLimits` of `serve`'s flags; a value out of range is said in one line naming its flag."""
    from pydantic import ValidationError

    from fugu_pipeline.serve.connections import ConnectionLimits

    values = {name: getattr(args, name) for name in ConnectionLimits.model_fields}
    try:
        return ConnectionLimits(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-")
        raise CLIError(f"{flag} {values[err['loc'][0]]}: {err['msg'].lower()}") from None
