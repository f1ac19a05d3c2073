"""The one-step heads' training stages: SFT, then RL warm-started from it, then CMA-ES from RL.

`train_stage` is what `router_sft`, `router_rl`, `router_es` and `fugu-lite train-sft/-rl/-es` run:

- the config: the file named, else `configs/train_<method>.yaml`, else the built-in defaults;
- a new head (SFT) reads the command's features and chooses the prompt rules on validation
  (`auto`: fitted with and without, the better kept); a warm-started one (RL, ES) reads the warm
  start's own features (its contract, prompt rules included) with the worker columns in its order;
- the checkpoint is saved to `<models>/<method>/<content hash>/` with `budget.json` beside it.

Content-addressed: the fingerprint of (code version, method, resolved config, the matrix's data
version, the features asked for, the warm start's content hash, `force`) names a record; when it
exists, its checkpoint is returned and nothing is trained.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from fugu_pipeline.steps import records
from fugu_pipeline.steps.inputs import Rows, config_file, load_step_config, unchanged_since_read
from fugu_pipeline.steps.versions import code_version

# method -> (its module, its function, its config class's module and name, what it warm-starts from):
# the one place the sequence SFT -> RL -> ES is written
STAGES = {
    "sft": ("fugu_pipeline.policies.oneshot.sft", "train_sft", "SFTConfig", None),
    "rl": ("fugu_pipeline.policies.oneshot.rl", "train_rl", "RLConfig", "sft"),
    "es": ("fugu_pipeline.policies.oneshot.es", "train_es", "ESConfig", "rl"),
}
CONFIGS_MODULE = "fugu_pipeline.policies.oneshot.configs"


class StageError(ValueError):
    """A step's input changed under it (its config file while it trained, the matrix under a head
    set's kept scores): one line, nothing recorded."""


def warm_start_of(method: str) -> str | None:
    """The stage `method` warm-starts from (None for SFT)."""
    return STAGES[method][3]


def stage_code_version(method: str) -> str:
    """The code version of a stage: this module and the stage's own module, with what they import."""
    return code_version(__name__, STAGES[method][0], CONFIGS_MODULE)


def stage_config(method: str, root: Path, given: str | Path | None = None):
    """(config, the file it came from or None, its settings version) for `method`."""
    cls = getattr(importlib.import_module(CONFIGS_MODULE), STAGES[method][2])
    path = config_file(root, given, f"train_{method}.yaml")
    cfg, version = load_step_config(path, cls)
    return cfg, path, version


def train_stage(method: str, rows: Rows, models_dir: Path, *, root: Path, config: str | Path | None = None,
                warm_start: str | Path | None = None, force: bool = False, prompt_rules: str | None = None,
                log: Callable[[str], None] = print, gathered: Callable | None = None) -> records.StepRecord:
    """Train (or find already trained) the `method` stage; returns its record, whose
    `output["checkpoint"]` is the checkpoint folder. `warm_start`: the checkpoint to start from
    (RL, ES); `prompt_rules`: auto, on or off for a new head (None: auto). `gathered`: a context
    manager factory wrapping the training loop's log (the assets gather its lines into blocks).
    Raises ConfigError, TrainingDataError, CheckpointError or StageError in one line."""
    from fugu_pipeline.policies.registry import load_checkpoint

    cfg, cfg_path, cfg_version = stage_config(method, root, config)
    init = load_checkpoint(warm_start) if warm_start is not None else None
    if init is not None and init.manifest.method not in (warm_start_of(method), method):
        log(f"warm start {warm_start} is a {init.manifest.method} checkpoint ({method} usually starts from "
            f"{warm_start_of(method) or 'nothing'})")
    settings = _settings_for(rows, init)
    fp = records.fingerprint(step=method, code=stage_code_version(method), config=cfg.model_dump(mode="json"),
                             matrix=rows.matrix_version(), features=rows.encoder_version(settings),
                             prompt_rules=None if init is not None else (prompt_rules or "auto"),
                             warm_start=init.manifest.content_hash if init is not None else None, force=force)
    found = records.find(models_dir, method, fp)
    if found is not None:
        log(f"{method}: inputs unchanged since {found.when()}: checkpoint {found.output['checkpoint']} kept, nothing trained")
        return _absolute(found, models_dir)
    result, data = _fit(method, cfg, rows, settings, init, force, prompt_rules, log, gathered)
    changed = unchanged_since_read(cfg_path, cfg_version)
    if changed:
        raise StageError(changed)
    from fugu_pipeline.route.budget import calibrate_beside

    path = result.save(models_dir)
    calibrate_beside(path, data, log)  # budget.json: what route, serve and evaluate --budget-* read
    log(f"{method}: {result.param_count} parameters, kept epoch {result.best_epoch}; checkpoint {path}")
    rel = records.relative(path, models_dir)
    return _absolute(records.keep(models_dir, method, fp, {"checkpoint": rel}, needs=[path],
                                  summary={"config": str(cfg_path) if cfg_path else "built-in defaults"}), models_dir)


def _settings_for(rows: Rows, init):
    """The features a stage reads: the command's for a new head; the warm start's contract otherwise,
    in the dtype its features were computed in when the command leaves it to `auto`."""
    if init is None:
        return rows.settings
    from fugu_pipeline.route.router import encoder_settings_for, serving_dtype

    s = encoder_settings_for(init.manifest.feature_contract, rows.settings.device, rows.settings.dtype, rows.model)
    if rows.settings.dtype == "auto":
        s = s.model_copy(update={"dtype": serving_dtype(s, init.manifest.metrics)})
    return s


def _fit(method, cfg, rows: Rows, settings, init, force, prompt_rules, log, gathered):
    """(the TrainResult, the data it was fitted on), with the feature choice recorded in its metrics."""
    import contextlib

    from fugu_pipeline.policies.registry import load_checkpoint
    from fugu_pipeline.train.feature_choice import feature_metrics, fit_choosing_features, val_utility

    module, name = STAGES[method][0], STAGES[method][1]
    fn = getattr(importlib.import_module(module), name)
    wrap = gathered or (lambda f: contextlib.nullcontext(f))
    with wrap(log) as train_log:
        kwargs = {"force": force, "log": train_log}
        if init is None:
            result, data, recorded = fit_choosing_features(settings, rows.read, lambda d: fn(d, cfg, **kwargs), val_utility,
                                                           prompt_rules=prompt_rules or "auto", log=log,
                                                           prefill=rows.prefill)
        else:
            # the head's columns are the warm start's workers, in its order (else a size mismatch from
            # torch, or, with as many workers under other names, columns that mean others)
            data = rows.read(settings).in_worker_order(init.manifest.worker_ids, f"the warm start {init.path}")
            load_checkpoint(init.path, expected_contract=init.manifest.feature_contract)
            result, recorded = fn(data, cfg, init_state=init.state_dict, **kwargs), feature_metrics(settings)
    result.metrics.update(recorded)
    return result, data


def _absolute(record: records.StepRecord, models_dir: Path) -> records.StepRecord:
    record.output = {**record.output, "checkpoint": str(Path(models_dir) / record.output["checkpoint"])}
    return record
