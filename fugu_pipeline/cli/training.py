"""Training and evaluation commands over a reward-matrix JSONL or DuckDB file: `train` (the
configured heads, chosen on validation), `train-sft`, `train-rl`, `train-es`, `evaluate`.

One meaning per setting (DESIGN §2): the utility comes from the same `reward:` block as in the
assets. A JSONL whose rows carry `quality` is turned into utility with the weights of
`--workers W.yaml` (the worker YAML `generate` and `fugu-lite pipeline --workers` read; a file
holding only `reward:` works too), through the same matrix build as the `reward_matrix` asset. A
DuckDB matrix carries the weights it was built with. Every command prints the weights it used.

`--output` is a models folder: the checkpoint lands in `<output>/<method>/<content hash>/` and its
path is printed. `--checkpoint` takes that printed path, or a models folder that holds exactly one
checkpoint (the `--output` of an earlier `train-*`), so `train-sft --output X` then
`train-rl --checkpoint X` works.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, encoder_name


def resolve_checkpoint(arg: str) -> Path:
    """The checkpoint directory `--checkpoint` names: a checkpoint directory (or its weights file),
    or a models folder holding exactly one `<method>/<hash>/` checkpoint."""
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE

    path = Path(arg)
    path = path.parent if path.is_file() else path
    if (path / MANIFEST_FILE).exists():
        return path
    if not path.is_dir():
        raise CLIError(f"--checkpoint {arg}: no such directory; pass the checkpoint path train-* printed "
                       "(<models>/<method>/<hash>) or the --output folder it wrote to")
    found = sorted(m.parent for m in path.glob(f"*/*/{MANIFEST_FILE}")
                   if m.parent.parent.name != "promoted" and not m.parent.name.startswith("."))
    if len(found) == 1:
        return found[0]
    if not found:
        raise CLIError(f"--checkpoint {arg}: neither a checkpoint ({MANIFEST_FILE} + weights) nor a models folder "
                       "holding one (<method>/<hash>/); pass the path train-* printed")
    listed = ", ".join(str(p) for p in found[:8]) + (" ..." if len(found) > 8 else "")
    raise CLIError(f"--checkpoint {arg}: this models folder holds {len(found)} checkpoints ({listed}); "
                   "pass the one you mean (train-* prints its path)")


def utility_weights(args):
    """(weights, where they came from in words) from --workers; (None, None) when not given."""
    from fugu_pipeline.workers.config import load_reward_block

    if getattr(args, "reward_config", None):
        return load_reward_block(args.reward_config)
    return None, None


def matrix_db(args) -> Path:
    """The DuckDB matrix for --data: the file itself, or one built from the JSONL (once per file
    content and weights) with the same build the `reward_matrix` asset runs."""
    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.import_format import read_reward_jsonl
    from fugu_pipeline.matrix.read import read_utility_config

    data_path = Path(args.data)
    if not data_path.exists():
        raise CLIError(f"--data {args.data}: no such file; pass a reward-matrix JSONL (DESIGN §4) or a reward_matrix.duckdb")
    weights, source = utility_weights(args)
    if data_path.suffix == ".duckdb":
        built = read_utility_config(data_path)
        if weights is not None and weights != built:
            raise CLIError(f"{data_path} was built with {built.describe()}, but {source} gives {weights.describe()}; "
                           "rebuild the matrix with those weights (materialize reward_matrix), or drop --workers")
        return data_path
    if weights is None:
        if any(r.quality is not None for r in read_reward_jsonl(data_path)):
            raise CLIError(f"{data_path}: its rows carry quality, so the utility is computed from weights: pass "
                           "--workers W.yaml, the worker YAML whose reward: block generate or fugu-lite pipeline used "
                           "(a YAML holding only a reward: block works too)")
        from fugu_pipeline.reward import UtilityConfig

        weights, source = UtilityConfig(), "none applied (every row gives rewards)"
    digest = hashlib.sha256(data_path.read_bytes()).hexdigest()[:12]
    db = Path(args.work_dir) / f"{data_path.name.split('.')[0]}-{digest}-u{weights.fingerprint()}.duckdb"
    if not db.exists():
        build(from_import(data_path, weights, source), db)
    return db


def routing_data(args, encoder: str | None = None):
    """A reward-matrix JSONL (or a DuckDB matrix) plus the encoder -> RoutingData, through the cache."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings

    db = matrix_db(args)
    settings = EncoderSettings(model=encoder or encoder_name(args), device=args.device)
    lazy = LazyEncoder(settings)
    print(lazy.describe(), file=sys.stderr)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir))
    print(f"features: {emb.n_cached} cached, {emb.n_computed} encoded ({emb.seconds:.1f}s); splits {data.counts()}", file=sys.stderr)
    print(f"utility: {data.utility_config.describe()} ({data.utility_source})", file=sys.stderr)
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
        start = resolve_checkpoint(args.checkpoint)
        print(f"warm start: {start}", file=sys.stderr)
        init = load_checkpoint(start)
        encoder = args.encoder or init.manifest.feature_contract.encoder_id
    data = routing_data(args, encoder)
    kwargs = {"force": args.force, "log": lambda m: print(m, file=sys.stderr)}
    if init is not None:
        load_checkpoint(init.path, expected_contract=data.contract)  # refuse other features
        kwargs["init_state"] = init.state_dict
    fn = {"sft": train_sft, "rl": train_rl, "es": train_es}[method]
    result = fn(data, cfg, **kwargs)
    path = result.save(args.output)
    m = result.metrics
    print(f"{method}: {result.param_count} parameters, kept epoch {result.best_epoch}; "
          f"val utility {m.get('val_utility', float('nan')):.4f} ({data.utility_config.describe()})")
    print(path)
    return 0


def cmd_evaluate(args) -> int:
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, write_report
    from fugu_pipeline.train.checkpoints import load_checkpoint

    path = resolve_checkpoint(args.checkpoint)
    probe = load_checkpoint(path)
    data = routing_data(args, args.encoder or probe.manifest.feature_contract.encoder_id)
    ckpt = load_checkpoint(path, expected_contract=data.contract)
    rep = evaluate_checkpoint(ckpt, data, args.split)
    if args.split == "test":  # the composite is defined on the held-out split
        from fugu_pipeline.cli.reporting import composite_for_report

        composite_for_report(rep, ckpt, data, args)
    out = Path(args.output) if args.output else path / "reports" / f"{args.split}.json"
    report, plots = write_report(rep, out.parent, out.stem)
    print(rep["summary"])
    from fugu_pipeline.cli.reporting import print_report_tables

    print_report_tables(rep)
    print(f"utility weights: {rep['utility_source']}")
    if rep.get("utility_note"):
        print(f"note: {rep['utility_note']}")
    print(f"report: {report} (+ {len(plots)} plots)")
    return 0


def cmd_train_heads(args) -> int:
    """`fugu-lite train`: fit the configured heads (configs/train.yaml), choose one on validation
    (K-fold out-of-fold over the non-test rows), save each kind's best and print the chosen
    checkpoint's directory last."""
    from fugu_pipeline.train.configs import TrainSetConfig, load_config
    from fugu_pipeline.train.fit import fit_and_save

    config = args.config
    if config is None and Path(DEFAULT_TRAIN_CONFIG).exists():
        config = DEFAULT_TRAIN_CONFIG
    cfg = load_config(config, TrainSetConfig) if config else TrainSetConfig()
    overrides = {k: v for k, v in (("objective", args.objective), ("selection_rule", args.selection_rule),
                                   ("folds", args.folds), ("seed", args.seed)) if v is not None}
    if overrides:
        cfg = TrainSetConfig.model_validate({**cfg.model_dump(), **overrides})
    print(f"heads: {config or 'built-in defaults (= configs/train.yaml as shipped)'}; "
          f"enabled {[k for k, v in cfg.heads.model_dump().items() if v is not None]}", file=sys.stderr)
    data = routing_data(args)
    report = fit_and_save(data, args.output, cfg, log=lambda m: print(m, file=sys.stderr), force=args.force)
    print(f"validation: {report.protocol}; objective {report.objective}; rule {report.rule} ({report.rule_reason})")
    by = "apgr" if report.rule == "apgr" else report.rule
    for s in report.saved:
        figs = ", ".join(f"{k} {v:.4f}" for k, v in s.figures.items())
        print(f"{'*' if s.selected else ' '} {s.kind:<12} {s.name}: {figs} -> {s.path}")
    print(f"selected ({by}): {report.selected} — {report.reason}")
    print(report.selected_path())
    return 0


DEFAULT_TRAIN_CONFIG = "configs/train.yaml"
