"""Embeddings and the trained artefacts: `task_embeddings`, the one-step stages (`router_sft`,
`router_rl`, `router_es`, one factory), the head set (`router_heads`) and the answer-aware cascade
(`router_cascade`). Thin: each calls its step in `fugu_pipeline/steps/`, the same function
`fugu-lite train*` calls, and reports a content-derived data version (the checkpoint's content hash),
so what reads it is stale only when it really changed.

Each training asset reads the reward matrix directly (its utility) besides the embeddings, and the
settings asset of its config file, so a changed reward weight or trainer YAML makes exactly what
reads it stale. Each refuses a stale input in one line before any work (`staleness.py`).
"""


from pathlib import Path

import dagster as dg

from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.distributed import GPU_OP_TAGS
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.metadata import tidy
from fugu_pipeline.defs.partitions import GPU_POOL
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.rows import SharedEmbeddings, cache_root, push_checkpoint, rows_for
from fugu_pipeline.defs.settings import ENCODER_KEY, SETTINGS_FILES
from fugu_pipeline.defs.staleness import require_fresh_inputs
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.steps.cascade import cascade_code_version
from fugu_pipeline.steps.heads import heads_code_version
from fugu_pipeline.steps.oneshot import STAGES, stage_code_version, warm_start_of
from fugu_pipeline.steps.versions import code_version


@dg.asset(deps=[reward_matrix, ENCODER_KEY], pool=GPU_POOL, group_name="features", kinds={"pytorch"},
          code_version=code_version("fugu_pipeline.features.cache", "fugu_pipeline.features.routing_data"),
          op_tags=GPU_OP_TAGS)  # on Kubernetes: a GPU node (defs/distributed.py); ignored elsewhere
def task_embeddings(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource) -> dg.MaterializeResult:
    """Every prompt of the reward matrix as a feature vector from the frozen encoder, through the
    content-addressed cache: a prompt is encoded once per encoder fingerprint, never again."""
    from fugu_pipeline.defs.embeddings import materialize_embeddings
    from fugu_pipeline.matrix.read import read_arrays

    require_fresh_inputs(context)
    arrays = read_arrays(pipeline.paths.reward_db, complete_only=False)
    with SharedEmbeddings(context, pipeline, encoder):
        return materialize_embeddings(context, encoder, arrays.prompts, arrays.domains, cache_root=cache_root(pipeline, encoder))


class TrainConfig(dg.Config):
    config_path: str | None = None
    """Trainer YAML relative to the project directory (default: configs/train_<method>.yaml, else the built-in defaults)."""
    force: bool = False
    """Train even when every worker ties on every task (no learning signal)."""


def _step_errors():
    """The errors a step raises in one line (a config, the data, a checkpoint), for `except`."""
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.steps.oneshot import StageError
    from fugu_pipeline.train.checkpoints import CheckpointError
    from fugu_pipeline.config_files import ConfigError

    return ConfigError, TrainingDataError, CheckpointError, StageError


def _train(context, config: TrainConfig, pipeline: PipelineResource, encoder: EncoderResource, method: str,
           warm_start: str | None) -> dg.Output[str]:
    from fugu_pipeline.defs.training import GatheredLog, train_result_metadata
    from fugu_pipeline.steps.oneshot import train_stage

    require_fresh_inputs(context)
    root = pipeline.paths.root
    try:
        record = train_stage(method, rows_for(context, pipeline, encoder), pipeline.paths.models, root=root,
                             config=config.config_path, warm_start=warm_start, force=config.force, log=context.log.info,
                             gathered=GatheredLog)
    except _step_errors() as exc:
        raise explained_failure(str(exc)) from None
    ckpt = record.output["checkpoint"]
    if not record.reused:
        push_checkpoint(context, pipeline, Path(ckpt))
    return dg.Output(ckpt, data_version=dg.DataVersion(Path(ckpt).name),
                     metadata={**train_result_metadata(ckpt), **record_metadata(record, config)})


def record_metadata(record, config: dg.Config | None = None) -> dict:
    """Whether the step ran or kept its earlier output for the same inputs (and since when), and the
    run config it was given (the fields that differ from their defaults; Dagster's staleness does not
    see run config, the main job compares it: `plan.py`)."""
    return {"step": f"kept: inputs unchanged since {record.when()}" if record.reused else "computed",
            "step_fingerprint": record.fingerprint,
            **({RUN_CONFIG: dg.MetadataValue.json(given_config(config))} if config is not None else {})}


RUN_CONFIG = "run_config"


def given_config(config: dg.Config) -> dict:
    """The fields of an asset's run config that differ from their defaults."""
    return {k: getattr(config, k) for k, f in sorted(type(config).model_fields.items()) if getattr(config, k) != f.default}


def _stage_asset(method: str) -> dg.AssetsDefinition:
    """`router_<method>`: one stage of SFT -> RL -> ES (`steps/oneshot.py` holds the order)."""
    warm = warm_start_of(method)
    kinds = {"pytorch", "safetensors"} if method != "es" else {"safetensors"}
    common = dict(name=f"router_{method}", pool=GPU_POOL, group_name="training", kinds=kinds,
                  code_version=stage_code_version(method),
                  deps=[reward_matrix, "task_embeddings", SETTINGS_FILES[f"config_train_{method}"]])
    doc = {"sft": "SFT warm start: cross-entropy to softmax(U/τ) soft targets, early-stopped on validation utility. "
                  "Chooses the prompt rules on validation (auto), as `fugu-lite train-sft` does.",
           "rl": "Offline contextual-bandit RL over the full reward matrix, warm-started from SFT on its features.",
           "es": "Separable CMA-ES on the final linear layer over cached features, warm-started from RL; keeps the "
                 "weights best on validation (never worse than the warm start)."}[method]
    description = f"{doc} Output: the checkpoint directory models/{method}/<content hash>/ (`{STAGES[method][0]}`)."
    if warm is None:
        @dg.asset(**common, description=description)
        def _first(context: dg.AssetExecutionContext, config: TrainConfig, pipeline: PipelineResource,
                   encoder: EncoderResource) -> dg.Output[str]:
            return _train(context, config, pipeline, encoder, method, None)

        return _first

    @dg.asset(**common, ins={"warm_start": dg.AssetIn(f"router_{warm}")}, description=description)
    def _next(context: dg.AssetExecutionContext, config: TrainConfig, pipeline: PipelineResource,
              encoder: EncoderResource, warm_start: str) -> dg.Output[str]:
        return _train(context, config, pipeline, encoder, method, warm_start)

    return _next


router_sft, router_rl, router_es = (_stage_asset(m) for m in STAGES)


class HeadsConfig(dg.Config):
    config_path: str | None = None
    """The heads, their grids and the selection (relative to the project; default configs/train.yaml, absent: the built-in defaults, the same)."""
    force: bool = False
    """Train even when every worker ties on every task (no learning signal)."""
    prompt_rules: str | None = None
    """Strip the text a domain's training prompts share: auto fits both and keeps the better on
    validation (None: the config file's `features.prompt_rules`, auto), as `fugu-lite train --prompt-rules`."""
    layer_sets: list[str] | None = None
    """Encoder layer settings to choose from on validation, e.g. ["-1", "-1 3"], or ["auto"] / ["off"]
    (None: the config file's `features.layer_sets`, auto = [-1] and [-1, middle]), as `fugu-lite train --layer-sets`."""
    lexical: bool | None = None
    """Append the 16 lexical statistics to the heads' features (None: the config file's `features.lexical`, on)."""


def _check_heads_config(config: HeadsConfig) -> None:
    """The run config's own mistakes, in one line naming the field, before anything else is looked at."""
    from fugu_pipeline.train.feature_choice import LayerSetError, parse_layer_set

    if config.prompt_rules not in (None, "auto", "on", "off"):
        raise explained_failure(f"prompt_rules {config.prompt_rules!r}: give auto, on or off (or leave it unset: "
                                "the config file's features.prompt_rules)")
    sets = config.layer_sets or []
    if not (len(sets) == 1 and sets[0].strip() in ("auto", "off")):
        try:
            [parse_layer_set(t) for t in sets]
        except LayerSetError as exc:
            raise explained_failure(f"layer_sets {exc}") from None


def _heads_record(context, config: HeadsConfig, pipeline: PipelineResource, encoder: EncoderResource):
    from fugu_pipeline.steps.heads import fit_heads, heads_config
    from fugu_pipeline.train.feature_choice import LayerSetError

    try:
        cfg, path, version = heads_config(pipeline.paths.root, config.config_path)
        return fit_heads(cfg, rows_for(context, pipeline, encoder), pipeline.paths.models, cfg_path=path,
                         cfg_version=version, force=config.force, lexical=config.lexical, layer_sets=config.layer_sets,
                         prompt_rules=config.prompt_rules, log=context.log.info)
    except LayerSetError as exc:
        raise explained_failure(f"layer_sets {exc}") from None
    except _step_errors() as exc:
        raise explained_failure(str(exc)) from None


@dg.asset(deps=[reward_matrix, "task_embeddings", SETTINGS_FILES["config_train"]], pool=GPU_POOL, group_name="training",
          kinds={"pytorch", "safetensors"}, code_version=heads_code_version())
def router_heads(context: dg.AssetExecutionContext, config: HeadsConfig, pipeline: PipelineResource,
                 encoder: EncoderResource) -> dg.Output[dict]:
    """The configured set of heads (configs/train.yaml: kNN, domain prior, MLP, ensemble, ...), each
    grid point scored by K-fold out-of-fold predictions over the non-test rows, the rule chosen by a
    nested check; each kind's best saved to models/<kind>/<hash>/ with budget.json (and its default
    operating point). Output: every checkpoint, the selected one (the challenger this asset offers to
    promotion) and the set's record, whose out-of-fold scores `router_cascade` competes with."""
    from fugu_pipeline.steps.heads import absolute

    _check_heads_config(config)
    require_fresh_inputs(context)
    record = _heads_record(context, config, pipeline, encoder)
    out = absolute(record, pipeline.paths.models)
    s = record.summary
    rows = ["| kind | configuration | validation | checkpoint |", "|---|---|---|---|"] + [
        f"| {'**' + h['kind'] + '**' if h['selected'] else h['kind']} | {h['name']} | "
        + ", ".join(f"{k} {v:.4f}" for k, v in h["figures"].items()) + f" | {Path(h['path']).name} |" for h in out["saved"]]
    version = sha256_text(canonical_json({"set": sorted(Path(p).name for p in out["checkpoints"]),
                                          "selected": Path(out["selected"]).name}))[:16]
    return dg.Output(
        {**out, "record": str(record.folder), "fingerprint": record.fingerprint},
        metadata={"selected": dg.MetadataValue.path(out["selected"]), "selected_kind": out["selected_kind"],
                  "checkpoints": dg.MetadataValue.json(out["checkpoints"]),
                  "reason": s["reason"], "rule": f"{s['rule']}: {s['rule_reason']}", "protocol": s["protocol"],
                  **({"default_point": s["default_point"], "default_point_reason": s["default_point_reason"]}
                     if s.get("default_point") else {}),
                  **({"policy_line": _policy_line(s["policy"])} if s.get("policy") else {}),
                  "heads": dg.MetadataValue.md("\n".join(rows)), "seconds": dg.MetadataValue.json(s["seconds"]),
                  **record_metadata(record, config)},
        data_version=dg.DataVersion(version),
    )


def _policy_line(policy: dict) -> str:
    """The line `fugu-lite train` prints for what ships (route/shipped.py), from the record's description."""
    from fugu_pipeline.route.shipped import ShippedPolicy

    return ShippedPolicy.model_validate(policy).describe()


def heads_record_of(router_heads_output: dict, pipeline: PipelineResource):
    """The head set's step record `router_heads` handed on (StepRecord), or one line saying to fit it again."""
    from fugu_pipeline.steps import records

    found = records.find(pipeline.paths.models, "heads", router_heads_output.get("fingerprint", ""))
    if found is None:
        raise explained_failure(f"the head set's record {router_heads_output.get('record')} (or one of its checkpoints) "
                                "is gone", "materialize router_heads again (it finds or fits the set), then this step")
    return found


@dg.asset(deps=[reward_matrix, "task_embeddings", SETTINGS_FILES["config_train"]], pool=GPU_POOL, group_name="training",
          kinds={"pytorch", "safetensors"}, code_version=cascade_code_version())
def router_cascade(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource,
                   router_heads: dict) -> dg.Output[dict]:
    """The answer-aware cascade over the workers' recorded replies: its plans (which workers, in which
    order, with which accept rule), its verifier and its cost–quality frontier, chosen out of fold
    against the one-shot heads of `router_heads` and "always the best worker" (configs/train.yaml
    `cascade:`). Output: the cascade checkpoint models/cascade/<hash>/ and which policy ships; skipped,
    with the reason, when the matrix holds no replies or the block turns it off."""
    from fugu_pipeline.steps.cascade import fit_cascade
    from fugu_pipeline.steps.heads import heads_config

    require_fresh_inputs(context)
    heads = heads_record_of(router_heads, pipeline)
    try:
        cfg, _path, _version = heads_config(pipeline.paths.root)
        record = fit_cascade(cfg, rows_for(context, pipeline, encoder), pipeline.paths.models, heads, log=context.log.info)
    except (*_step_errors(), ValueError) as exc:  # a cap no plan meets, a worker without replies: one line
        raise explained_failure(f"cascade: {exc}") from None
    out, models = record.output, pipeline.paths.models
    if not out.get("cascade"):
        return dg.Output({"cascade": None, "skipped": out["skipped"], "selected": router_heads["selected"]},
                         data_version=dg.DataVersion("skipped-" + sha256_text(out["skipped"])[:8]),
                         metadata={"skipped": out["skipped"], **record_metadata(record)})
    cascade, shipped = str(models / out["cascade"]), str(models / out["shipped"])
    if not record.reused:
        push_checkpoint(context, pipeline, Path(cascade))
        if Path(shipped) != Path(cascade):  # what ships has its policy.json beside it now
            push_checkpoint(context, pipeline, Path(shipped))
    context.log.info("\n".join(record.summary.get("lines", [])))  # one event: one block in the run log
    return dg.Output(
        {"cascade": cascade, "shipped": shipped, "policy": out["policy"], "selected": router_heads["selected"],
         "fingerprint": record.fingerprint},
        data_version=dg.DataVersion(Path(cascade).name),
        metadata=tidy({"cascade": dg.MetadataValue.path(cascade), "policy": out["policy"],
                       "shipped": dg.MetadataValue.path(shipped),
                       **({"policy_line": _policy_line(record.summary["policy"])} if record.summary.get("policy") else {}),
                       "policy_choice": dg.MetadataValue.md("\n".join(["```", *record.summary.get("lines", []), "```"])),
                       **record_metadata(record)}),
    )
