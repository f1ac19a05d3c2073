"""Training and evaluation commands over a reward-matrix JSONL or DuckDB file: `train` (the
configured heads, chosen on validation, and the cascade), `train-sft`, `train-rl`, `train-es`,
`evaluate`. The training commands run the steps the assets run (`fugu_pipeline/steps/`), with the
same config rule and features; a second run on the same data and settings trains nothing (each
step finds its record under `<output>/.steps/`).

One meaning per setting: the utility comes from the same `reward:` block as in the
assets. A JSONL whose rows carry `quality` is turned into utility with the weights of
`--workers W.yaml` (the worker YAML `generate` and `fugu-lite pipeline --workers` read; a file
holding only `reward:` works too), through the same matrix build as the `reward_matrix` asset. A
DuckDB matrix carries the weights it was built with. Every command prints the weights it used.

`--output` is a models folder: the checkpoint lands in `<output>/<method>/<content hash>/`, its
path is printed and `<output>/latest.json` names it. `--checkpoint` takes that printed path, or the
`--output` folder of an earlier command (its latest checkpoint, `cli/checkpoints.py`), so
`train-sft --output X` then `train-rl --checkpoint X` works.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from pathlib import Path

from fugu_pipeline.cli.checkpoints import record_latest, resolve_checkpoint
from fugu_pipeline.cli.common import CLIError, encoder_name
from fugu_pipeline.route.budget import calibrate_beside


def models_output(arg: str) -> Path:
    """--output of a training command, a models folder: checked before any training (a file there
    was NotADirectoryError after the whole fit)."""
    path = Path(arg)
    if path.exists() and not path.is_dir():
        raise CLIError(f"--output {arg} is a file; --output is a models folder (the checkpoint goes to "
                       "<output>/<method>/<hash>/): pass a folder, e.g. models")
    return path


def report_output(arg: str | None, checkpoint: Path, default: str) -> Path:
    """--output of a report (`<name>.json`, its plots beside it): a .json path outside the checkpoint's
    own folder, where a report named manifest.json or budget.json would replace the checkpoint's file."""
    if arg is None:
        return checkpoint / "reports" / default
    out = Path(arg)
    if out.suffix != ".json" or out.is_dir():
        raise CLIError(f"--output {arg}: give the report's path ending in .json (its plots are written beside it), "
                       "e.g. report.json")
    if out.parent.resolve() == checkpoint.resolve():
        raise CLIError(f"--output {arg} is inside the checkpoint's own folder, whose files it could replace; "
                       f"write it elsewhere, e.g. {checkpoint / 'reports' / out.name}")
    return out


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
    for flag in ("work_dir", "cache_dir"):  # folders this command writes (a file there: FileExistsError after the reading)
        value = getattr(args, flag, None)
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise CLIError(f"--{flag.replace('_', '-')} {value} is a file; pass a folder (created when missing)")
    if not data_path.exists():
        raise CLIError(f"--data {args.data}: no such file; pass a reward-matrix JSONL or a reward_matrix.duckdb")
    if data_path.is_dir():
        raise CLIError(f"--data {args.data} is a folder; pass the reward-matrix JSONL or the reward_matrix.duckdb "
                       "file in it")
    if not data_path.is_file():  # a FIFO or a device: DuckDB (or the hash below) would wait on it for ever
        raise CLIError(f"--data {args.data} is not a regular file (a FIFO, socket or device); pass a reward-matrix JSONL "
                       "or a reward_matrix.duckdb file")
    weights, source = utility_weights(args)
    if data_path.suffix == ".duckdb":
        built = read_utility_config(data_path)
        if weights is not None and weights != built:
            raise CLIError(f"{data_path} was built with {built.describe()}, but {source} gives {weights.describe()}; "
                           "rebuild the matrix with those weights (materialize reward_matrix), or drop --workers")
        return data_path
    given = weights is None
    if given:
        rows = read_reward_jsonl(data_path)
        if any(r.quality is not None and r.rewards is None for r in rows):
            raise CLIError(f"{data_path}: rows carry quality and no rewards, so the utility is computed from weights: "
                           "pass --workers W.yaml, the worker YAML whose reward: block generate or fugu-lite pipeline "
                           "used (a YAML holding only a reward: block works too)")
        from fugu_pipeline.reward import UtilityConfig

        weights, source = UtilityConfig(), "none applied (every row gives rewards)"
        if any(r.quality is not None for r in rows) and data_path not in _SAID:
            _SAID.add(data_path)
            print(f"utility: the rewards {data_path}'s rows carry, as given (no --workers: pass --workers W.yaml to "
                  "recompute them from quality, cost and latency with its reward: weights)", file=sys.stderr)
    digest = hashlib.sha256(data_path.read_bytes()).hexdigest()[:12]
    db = Path(args.work_dir) / f"{data_path.name.split('.')[0]}-{digest}-u{weights.fingerprint()}{'-r' if given else ''}.duckdb"
    if not db.exists():
        build(from_import(data_path, weights, source, rewards_as_given=given), db)
    return db


_SAID: set[Path] = set()  # the JSONL files whose carried rewards this command has said it uses


def incomplete_split(db: Path, split: str) -> str | None:
    """Why the `split` rows of the matrix `db` are all left out, when they are there but lack a
    worker's reward (a row needs every worker's); None when the split has no rows at all."""
    import numpy as np

    from fugu_pipeline.matrix.read import missing_cells_note, read_arrays

    every = read_arrays(db, complete_only=False)
    n = int((every.splits == split).sum())
    if not n:
        return None
    return (f"the '{split}' split's {n} row(s) all lack a worker's reward, and a row needs every worker's"
            f"{': ' + missing_cells_note(db) if missing_cells_note(db) else ''}"
            if np.isnan(every.utility[every.splits == split]).any(axis=1).all() else None)


ENCODER_FLAGS = (("template", "prompt_template"), ("pooling", "pooling"), ("token_position", "token_position"),
                 ("layers", "layer"), ("max_length", "max_length"), ("lexical", "lexical"))


FLAG_OF_FIELD = {field: "--" + flag.replace("_", "-") for flag, field in ENCODER_FLAGS} | {
    "model": "--encoder", "device": "--device", "dtype": "--dtype", "folds": "--folds", "seed": "--seed",
    "objective": "--objective", "selection_rule": "--selection-rule"}


@contextlib.contextmanager
def flag_errors():
    """A pydantic ValidationError of settings built from flags as one CLIError naming the flags
    (not pydantic's multi-line dump with its input)."""
    from pydantic import ValidationError

    from fugu_pipeline.matrix.import_common import option_errors

    try:
        yield
    except ValidationError as exc:
        text = option_errors(exc, lambda f: FLAG_OF_FIELD.get(f, f))
        for field, flag in FLAG_OF_FIELD.items():  # a check across fields names them in its message
            if "_" in field:
                text = re.sub(rf"\b{field}\b(?!=)", flag, text).replace(f"{flag}: {flag} ", f"{flag} ")
        raise CLIError(text) from None


def encoder_settings(args, encoder: str | None = None, contract=None, metrics: dict | None = None):
    """The encoder settings of a command: from the flags (--template, --pooling, --token-position,
    --layers, --max-length, --dtype, --device) for a new head; from a checkpoint's feature contract
    when there is one (then a flag that contradicts the contract is refused, since the head was
    trained on other features; --encoder may relocate the same model, --dtype and --device apply)."""
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.route.router import encoder_settings_for

    given = {field: getattr(args, flag) for flag, field in ENCODER_FLAGS if getattr(args, flag, None) is not None}
    dtype = getattr(args, "dtype", None) or "auto"
    if contract is None:
        with flag_errors():
            return EncoderSettings(model=encoder or encoder_name(args), device=args.device, dtype=dtype, **given)
    settings = encoder_settings_for(contract, args.device, dtype, encoder)
    if dtype == "auto" and metrics:  # the dtype the checkpoint's features were computed in, as route/serve do
        from fugu_pipeline.route.router import serving_dtype

        settings = settings.model_copy(update={"dtype": serving_dtype(settings, metrics)})
    clash = []
    for flag, field in ENCODER_FLAGS:
        if field in given:
            with flag_errors():
                asked = getattr(EncoderSettings.model_validate({**settings.model_dump(), field: given[field]}), field)
            if asked != getattr(settings, field):
                clash.append(f"--{flag.replace('_', '-')} {getattr(args, flag)!r} (the checkpoint has {getattr(settings, field)!r})")
    if clash:
        raise CLIError("these flags contradict the checkpoint's feature contract, whose features the head was "
                       f"trained on: {'; '.join(clash)}. Drop them (the contract's settings are used), or train a "
                       "head with them")
    return settings


def routing_data(args, encoder: str | None = None, *, contract=None, settings=None):
    """A reward-matrix JSONL (or a DuckDB matrix) plus the encoder -> RoutingData, through the cache
    (a progress bar while prompts are encoded; finished chunks are kept if the run is interrupted)."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data

    db = matrix_db(args)
    settings = settings or encoder_settings(args, encoder, contract)
    lazy = LazyEncoder(settings)
    print(lazy.describe(), file=sys.stderr)
    data, emb = load_routing_data(db, lazy, Path(args.cache_dir), progress=True)
    print(f"features: {emb.n_cached} cached, {emb.n_computed} encoded ({emb.seconds:.1f}s); splits {data.counts()}", file=sys.stderr)
    print(f"utility: {data.utility_config.describe()} ({data.utility_source})", file=sys.stderr)
    lazy.close()
    return data


def rows_of(args):
    """What a training step reads, as the flags give it (`steps/inputs.Rows`): the encoder flags'
    settings, the rows through the cache with a progress bar, the matrix of --data."""
    from fugu_pipeline.steps.inputs import Rows

    noted: list[bool] = []

    def load(s):
        data = routing_data(args, settings=s)
        if not noted and data.counts()["test"] == 0:
            noted.append(True)
            from fugu_pipeline.matrix.import_common import HOLD_OUT_HINT

            print(f"note: {args.data} has no test rows, so nothing is held out for `fugu-lite evaluate`: {HOLD_OUT_HINT}",
                  file=sys.stderr)
        return data

    return Rows(settings=encoder_settings(args), load=load, matrix=matrix_db(args), cache_root=Path(args.cache_dir),
                prefill=lambda ss: prefill(args, ss), model=getattr(args, "encoder", None))


def prefill(args, settings_list) -> None:
    """--layer-sets: every setting's features in one forward pass per prompt, before the fits."""
    from fugu_pipeline.features.routing_data import prefill_layer_sets

    n = prefill_layer_sets(matrix_db(args), settings_list, Path(args.cache_dir), progress=True)
    if n:
        print(f"features: {n} prompts encoded once for {len(settings_list)} layer settings", file=sys.stderr)


def _step_errors():
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.steps.oneshot import StageError
    from fugu_pipeline.config_files import ConfigError

    return ConfigError, TrainingDataError, StageError


def train(args, method: str) -> int:
    """`fugu-lite train-sft/-rl/-es`: the stage the `router_<method>` asset runs (`steps/oneshot.py`),
    with the same config rule (--config, else configs/train_<method>.yaml, else the defaults) and the
    same features (a new head chooses its prompt rules; a warm start's are its contract's)."""
    from fugu_pipeline.steps.oneshot import train_stage
    from fugu_pipeline.policies.registry import load_checkpoint
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE, Manifest

    models_output(args.output)
    start = None
    if getattr(args, "checkpoint", None):
        start = resolve_checkpoint(args.checkpoint)
        print(f"warm start: {start}", file=sys.stderr)
        init = load_checkpoint(start)  # a flag that contradicts its feature contract: refused here, in one line
        encoder_settings(args, args.encoder, init.manifest.feature_contract, init.manifest.metrics)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        record = train_stage(method, rows_of(args), Path(args.output), root=Path.cwd(), config=args.config,
                             warm_start=start, force=args.force, prompt_rules=getattr(args, "prompt_rules", None), log=log)
    except _step_errors() as exc:
        raise CLIError(str(exc)) from None
    path = Path(record.output["checkpoint"])
    man = Manifest.model_validate_json((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    from fugu_pipeline.reward import UtilityConfig

    m, weights = man.metrics, UtilityConfig.model_validate(man.utility_config or {})
    record_latest(args.output, path, f"train-{method}")
    print(f"{method}: {man.param_count} parameters, kept epoch {m.get('best_epoch')}; "
          f"val utility {m.get('val_utility', float('nan')):.4f} ({weights.describe()})"
          + (f"; kept from {record.when()}: the same inputs, nothing trained" if record.reused else ""))
    print(path)
    return 0


OLD_CAP_FLAGS = {"usd_per_1k": "--budget-usd-per-1k", "share": "--budget-share", "margin_z": "--budget-margin-z"}


def budget_of(args):
    """The cost cap the flags ask for (`cost_cap.CostCap`), or None: `--cap usd_per_1k=2.5` or
    `--cap share=0.3`, or the older --budget-usd-per-1k / --budget-share / --budget-margin-z, still
    taken, with one line on stderr giving the same cap in the --cap form."""
    from fugu_pipeline.cost_cap import CapError, CostCap

    old = {k: getattr(args, f"budget_{k}") for k in OLD_CAP_FLAGS if getattr(args, f"budget_{k}", None) is not None}
    if getattr(args, "cap", None) is not None:
        if old:
            raise CLIError(f"give --cap or {OLD_CAP_FLAGS[next(iter(old))]}, not both")
        try:
            return CostCap.parse(args.cap)
        except CapError as exc:
            raise CLIError(str(exc)) from None
    if not old:
        return None
    if set(old) == {"margin_z"}:  # it would have no effect
        raise CLIError("--budget-margin-z is the margin of a cap: give it with --budget-share or --budget-usd-per-1k, "
                       "or as --cap share=0.3,margin_z=Z (or drop it)")
    if len(set(old) - {"margin_z"}) > 1:
        raise CLIError("give --budget-usd-per-1k or --budget-share, not both")
    try:
        cap = CostCap.model_validate(old)
    except ValueError as exc:
        from fugu_pipeline.matrix.import_common import option_errors

        raise CLIError(option_errors(exc, lambda f: OLD_CAP_FLAGS.get(f, f))) from None
    given = " ".join(f"{OLD_CAP_FLAGS[k]} {v:g}" for k, v in old.items())
    print(f"{given}: the old form of --cap {cap.spelled()}", file=sys.stderr)
    return cap


def cmd_evaluate(args) -> int:
    from fugu_pipeline.evaluate.reports import write_report
    from fugu_pipeline.policies.registry import load_checkpoint

    budget = budget_of(args)
    path = resolve_checkpoint(args.checkpoint)
    from fugu_pipeline.policies.registry import cap_checkpoint

    path, sent = cap_checkpoint(path, budget)  # a cap the shipped description sends to another checkpoint of the run
    if sent:
        print(sent, file=sys.stderr)
    out = report_output(args.output, path, f"{args.split}.json")
    probe = load_checkpoint(path)
    if probe.manifest.head_kind == "cascade" and budget is not None:  # a cap it cannot serve: refused before any work
        from fugu_pipeline.policies.cascade.evaluate import budget_reachable
        from fugu_pipeline.policies.cascade.spend import CapOutOfReach

        try:
            budget_reachable(probe, budget)
        except CapOutOfReach as exc:
            raise CLIError(f"{path}: {exc}") from None
    contract = probe.manifest.feature_contract
    settings = encoder_settings(args, args.encoder, contract, probe.manifest.metrics)
    data = routing_data(args, settings=settings)
    if probe.manifest.head_kind == "cascade":  # scored from the recorded replies (policies/cascade/evaluate.py)
        from fugu_pipeline.policies.cascade.evaluate import evaluate_cascade, report_lines

        # under a cap asked here, as serving serves requests asking it
        rep = evaluate_cascade(path, data, matrix_db(args), settings, Path(args.cache_dir), args.split, out.parent,
                               budget=budget)
        for line in report_lines(rep):
            print(line)
        print(f"report: {rep['report_path']}")
        return 0
    expected = data.contract if args.encoder is None else data.contract.model_copy(update={"encoder_id": contract.encoder_id})
    ckpt = load_checkpoint(path, expected_contract=expected)
    data = data.in_worker_order(ckpt.manifest.worker_ids, f"checkpoint {path}")
    if not data.counts()[args.split] and (why := incomplete_split(matrix_db(args), args.split)):
        raise CLIError(f"{args.data}: {why}")
    calibration = calibrate_beside(path, data, strict=budget is not None)  # with a cap: BudgetError, the reason
    from fugu_pipeline.policies.oneshot.default_report import served_report

    # as it serves: with no cap asked, at its operating point (unless --no-default-budget)
    rep = served_report(ckpt, data, args.split, calibration=calibration, budget=budget,
                        default_point=not getattr(args, "no_default_budget", False))
    shipped = rep.get("shipped_policy", {}).get("line")  # what train chose and printed (route/shipped.py)
    if args.split == "test":  # the composite is defined on the held-out split
        from fugu_pipeline.cli.reporting import composite_for_report

        from fugu_pipeline.evaluate.feature_source import FeatureSource

        features = FeatureSource(data, lambda s: routing_data(args, settings=s), settings)
        composite_for_report(rep, ckpt, data, args, features)
    report, plots = write_report(rep, out.parent, out.stem)
    print(rep["summary"])
    from fugu_pipeline.cli.reporting import print_groups, print_report_tables

    print_report_tables(rep)
    print_groups(rep)
    if rep.get("budget"):
        from fugu_pipeline.evaluate.budget_report import budget_lines

        for line in budget_lines(rep["budget"], args.split):
            print(line)
    if rep.get("default_point"):
        from fugu_pipeline.policies.oneshot.default_report import default_report_lines

        for line in default_report_lines(rep["default_point"], shipped):
            print(line)
    elif shipped is not None:
        print(f"as chosen at training: {shipped}")
    print(f"utility weights: {rep['utility_source']}")
    if rep.get("utility_note"):
        print(f"note: {rep['utility_note']}")
    print(f"report: {report} (+ {len(plots)} plots)")
    return 0


def cmd_train_heads(args) -> int:
    """`fugu-lite train`: the `router_heads` and `router_cascade` steps (`steps/heads.py`,
    `steps/cascade.py`): fit the configured heads (--config, else configs/train.yaml, else the
    built-in defaults), choose one on validation (K-fold out-of-fold over the non-test rows), save each
    kind's best, then the cascade against them; print the checkpoint that ships last."""
    from fugu_pipeline.steps.cascade import fit_cascade
    from fugu_pipeline.steps.heads import absolute, fit_heads, heads_config
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.train.feature_choice import LayerSetError

    models_output(args.output)
    try:
        cfg, path, version = heads_config(Path.cwd(), args.config)
    except _step_errors() as exc:
        raise CLIError(str(exc)) from None
    cfg = cascade_flags(args, cfg)
    overrides = {k: v for k, v in (("objective", args.objective), ("selection_rule", args.selection_rule),
                                   ("folds", args.folds), ("seed", args.seed)) if v is not None}
    if overrides:
        with flag_errors():
            cfg = TrainSetConfig.model_validate({**cfg.model_dump(), **overrides})
    print(f"heads: {path or 'built-in defaults (= configs/train.yaml as shipped)'}; "
          f"enabled {[k for k, v in cfg.heads.model_dump().items() if v is not None]}", file=sys.stderr)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if args.layers is not None and args.layer_sets:
        raise CLIError("give --layers or --layer-sets, not both")
    rows, output = rows_of(args), Path(args.output)
    try:
        heads = fit_heads(cfg, rows, output, cfg_path=path, cfg_version=version, force=args.force, lexical=args.lexical,
                          layer_sets="off" if args.layers is not None else args.layer_sets,
                          prompt_rules=args.prompt_rules, log=log)
        cascade = fit_cascade(cfg, rows, output, heads, log=log)
    except LayerSetError as exc:
        raise CLIError(f"--layer-sets {exc}") from None
    except _step_errors() as exc:
        raise CLIError(str(exc)) from None
    out, s = absolute(heads, output), heads.summary
    print(f"validation: {s['protocol']}; objective {s['objective']}; rule {s['rule']} ({s['rule_reason']})")
    by = "apgr" if s["rule"] == "apgr" else s["rule"]
    for h in out["saved"]:
        figs = ", ".join(f"{k} {v:.4f}" for k, v in h["figures"].items())
        print(f"{'*' if h['selected'] else ' '} {h['kind']:<12} {h['name']}: {figs} -> {h['path']}")
    print(f"selected ({by}): {s['selected']} — {s['reason']}")
    for line in s.get("default_lines", []):
        print(line)
    shipped = out["selected"]
    if cascade.output.get("cascade"):  # its lines end with what ships (route/shipped.py), as it is saved beside it
        for line in cascade.summary.get("lines", []):
            print(line)
        shipped = str(output / cascade.output["shipped"])
    elif s.get("policy"):  # no cascade: the selected head ships, at its default operating point
        from fugu_pipeline.route.shipped import ShippedPolicy

        for line in ShippedPolicy.model_validate(s["policy"]).lines():
            print(line)
    if heads.reused and cascade.reused:
        print(f"(kept from {heads.when()}: the same data, settings and code; nothing fitted)", file=sys.stderr)
    record_latest(args.output, Path(shipped), "train")
    print(shipped)
    return 0


def cascade_flags(args, cfg):
    """`--cap share=0.3` (or usd_per_1k=2.5), `--domain-cap math:share=0.2` (repeatable) and
    `--per-domain` onto the config's `cascade:` block; a malformed one is a CLIError naming it."""
    cap, caps, per = getattr(args, "cap", None), getattr(args, "domain_cap", None) or [], getattr(args, "per_domain", False)
    if cap is None and not caps and not per:
        return cfg

    def parse(text: str, flag: str) -> dict:
        from fugu_pipeline.cost_cap import CapError, CostCap

        try:
            return CostCap.parse(text, flag).model_dump()
        except CapError as exc:
            raise CLIError(str(exc)) from None

    block = cfg.cascade.model_dump()
    if cap is not None:
        block["cap"] = parse(cap, "--cap")
    for item in caps:
        domain, colon, rest = item.partition(":")
        if not colon or not domain:
            raise CLIError(f"--domain-cap {item!r}: give DOMAIN:share=<fraction> or DOMAIN:usd_per_1k=<dollars>")
        block["domain_caps"][domain] = parse(rest, f"--domain-cap {domain}:")
    block["per_domain"] = block["per_domain"] or per
    with flag_errors():
        return cfg.model_validate({**cfg.model_dump(), "cascade": block})
