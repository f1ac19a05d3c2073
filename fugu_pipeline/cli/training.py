"""Training and evaluation commands over a reward-matrix JSONL or DuckDB file: `train-sft`,
`train-rl`, `train-es`, `evaluate`."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from fugu_pipeline.cli.common import encoder_name


def routing_data(args, encoder: str | None = None, utility=None):
    """A reward-matrix JSONL (or a DuckDB matrix) plus the encoder -> RoutingData, through the cache."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.reward import UtilityConfig

    data_path = Path(args.data)
    if data_path.suffix == ".duckdb":
        db = data_path
    else:
        digest = hashlib.sha256(data_path.read_bytes()).hexdigest()[:12]
        db = Path(args.work_dir) / f"{data_path.name.split('.')[0]}-{digest}.duckdb"
        if not db.exists():
            build(from_import(data_path, utility or UtilityConfig()), db)
    settings = EncoderSettings(model=encoder or encoder_name(args), device=args.device)
    lazy = LazyEncoder(settings)
    print(lazy.describe(), file=sys.stderr)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    print(f"features: {emb.n_cached} cached, {emb.n_computed} encoded ({emb.seconds:.1f}s); splits {data.counts()}", file=sys.stderr)
    lazy.close()
    return data


def train(args, method: str) -> int:
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.train.configs import ESConfig, RLConfig, SFTConfig, load_config
    from fugu_pipeline.train.es import train_es
    from fugu_pipeline.train.rl import train_rl
    from fugu_pipeline.train.sft import train_sft

    cls = {"sft": SFTConfig, "rl": RLConfig, "es": ESConfig}[method]
    cfg = load_config(args.config, cls) if args.config else cls()
    encoder = None
    init = None
    if getattr(args, "checkpoint", None):
        init = load_checkpoint(args.checkpoint)
        encoder = args.encoder or init.manifest.feature_contract.encoder_id
    data = routing_data(args, encoder)
    kwargs = {"force": args.force, "log": lambda m: print(m, file=sys.stderr)}
    if init is not None:
        load_checkpoint(args.checkpoint, expected_contract=data.contract)  # refuse other features
        kwargs["init_state"] = init.state_dict
    fn = {"sft": train_sft, "rl": train_rl, "es": train_es}[method]
    result = fn(data, cfg, **kwargs)
    path = result.save(args.output)
    m = result.metrics
    print(f"{method}: {result.param_count} parameters, kept epoch {result.best_epoch}; "
          f"val utility {m.get('val_utility', float('nan')):.4f}")
    print(path)
    return 0


def cmd_evaluate(args) -> int:
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, write_report
    from fugu_pipeline.train.checkpoints import load_checkpoint

    probe = load_checkpoint(args.checkpoint)
    data = routing_data(args, args.encoder or probe.manifest.feature_contract.encoder_id)
    ckpt = load_checkpoint(args.checkpoint, expected_contract=data.contract)
    rep = evaluate_checkpoint(ckpt, data, args.split)
    out = Path(args.output) if args.output else Path(args.checkpoint) / "reports" / f"{args.split}.json"
    path, plots = write_report(rep, out.parent, out.stem)
    print(rep["summary"])
    print(f"report: {path} (+ {len(plots)} plots)")
    return 0
