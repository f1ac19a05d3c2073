"""Embeddings, training, evaluation and promotion assets. Thin: the work is in the core modules."""

import base64
from pathlib import Path

import dagster as dg

from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs import harness
from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.distributed import GPU_OP_TAGS
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.metadata import LIVE_KIND, LIVE_WORKERS, tidy
from fugu_pipeline.defs.partitions import GPU_POOL, ROUTER_FRESHNESS
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.shared import SharedStore

CODE_VERSION = "fugu-models-1"


def _cache_root(pipeline: PipelineResource, encoder: EncoderResource) -> Path:
    return pipeline.paths.resolve(encoder.cache_dir)


def _routing_data(context, pipeline: PipelineResource, encoder: EncoderResource, settings=None):
    """The reward matrix's rows with features: the resource's own settings, or `settings` (a
    checkpoint's contract, a layer setting or prompt rules being chosen) through the same cache."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data

    own = settings is None or settings == encoder.settings()
    lazy = encoder.encoder() if own else LazyEncoder(settings)
    try:
        with _shared_embeddings(context, pipeline, encoder):
            data, emb = load_routing_data(pipeline.paths.reward_db, lazy, _cache_root(pipeline, encoder))
    finally:
        if not own:
            lazy.close()
    context.log.info(f"{emb.encoder_description}; {emb.n_cached} cached, {emb.n_computed} encoded; splits {data.counts()}")
    return data


def _prefill(context, pipeline: PipelineResource, encoder: EncoderResource, settings_list) -> None:
    """Several layer settings' features in one forward pass per prompt (features/cache.py)."""
    from fugu_pipeline.features.routing_data import prefill_layer_sets

    with _shared_embeddings(context, pipeline, encoder):
        n = prefill_layer_sets(pipeline.paths.reward_db, settings_list, _cache_root(pipeline, encoder))
    if n:
        context.log.info(f"{n} prompts encoded once for {len(settings_list)} layer settings")


def _feature_source(context, pipeline: PipelineResource, encoder: EncoderResource):
    """Each checkpoint's own features of the same rows (evaluate/feature_source.py), for the
    reports and promotion: heads may have chosen layers or prompt rules on validation."""
    from fugu_pipeline.evaluate.feature_source import FeatureSource

    return FeatureSource(_routing_data(context, pipeline, encoder), lambda s: _routing_data(context, pipeline, encoder, s),
                         encoder.settings())


class _shared_embeddings:
    """Pull the shared embedding shards before a step reads features, push what it encoded after."""

    def __init__(self, context, pipeline: PipelineResource, encoder: EncoderResource):
        self.context, self.shared, self.root = context, SharedStore.of(pipeline.paths), _cache_root(pipeline, encoder)

    def __enter__(self):
        if self.shared and self.shared.data_url:
            n = self.shared.pull_embeddings(self.root)
            if n:
                self.context.log.info(f"took {n} embedding file(s) from {self.shared.data_url}")
        return self

    def __exit__(self, *exc) -> None:
        if self.shared and self.shared.data_url:
            self.shared.push_embeddings(self.root)


def _push_checkpoint(context, pipeline: PipelineResource, path: Path) -> None:
    shared = SharedStore.of(pipeline.paths)
    if shared and shared.models_url:
        context.log.info(f"checkpoint published to {shared.push_checkpoint(path)}")


@dg.asset(deps=[reward_matrix], pool=GPU_POOL, group_name="features", kinds={"pytorch"}, code_version=CODE_VERSION,
          op_tags=GPU_OP_TAGS)  # on Kubernetes: a GPU node (defs/distributed.py); ignored elsewhere
def task_embeddings(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource) -> dg.MaterializeResult:
    """Every prompt of the reward matrix as a feature vector from the frozen encoder, through the
    content-addressed cache: a prompt is encoded once per encoder fingerprint, never again."""
    from fugu_pipeline.defs.embeddings import materialize_embeddings
    from fugu_pipeline.matrix.read import read_arrays

    arrays = read_arrays(pipeline.paths.reward_db, complete_only=False)
    with _shared_embeddings(context, pipeline, encoder):
        return materialize_embeddings(context, encoder, arrays.prompts, arrays.domains, cache_root=_cache_root(pipeline, encoder))


class TrainConfig(dg.Config):
    config_path: str | None = None
    """Trainer YAML relative to the project directory (default: configs/train_<method>.yaml)."""
    force: bool = False
    """Train even when every worker ties on every task (no learning signal)."""


def _train(context, pipeline, encoder, method: str, config: TrainConfig, init_path: str | None = None) -> dg.Output:
    from fugu_pipeline.defs.training import GatheredLog, train_result_metadata
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.route.budget import calibrate_beside
    from fugu_pipeline.policies.registry import load_checkpoint
    from fugu_pipeline.policies.oneshot.configs import ESConfig, RLConfig, SFTConfig
    from fugu_pipeline.config_files import ConfigError, load_config
    from fugu_pipeline.policies.oneshot.es import train_es
    from fugu_pipeline.policies.oneshot.rl import train_rl
    from fugu_pipeline.policies.oneshot.sft import train_sft

    cls = {"sft": SFTConfig, "rl": RLConfig, "es": ESConfig}[method]
    try:
        cfg = load_config(pipeline.paths.resolve(config.config_path or f"configs/train_{method}.yaml"), cls)
    except ConfigError as exc:
        raise explained_failure(str(exc)) from None
    data = _routing_data(context, pipeline, encoder)
    fn = {"sft": train_sft, "rl": train_rl, "es": train_es}[method]
    kwargs = {"force": config.force}
    if init_path is not None:
        kwargs["init_state"] = load_checkpoint(init_path, expected_contract=data.contract).state_dict
    try:
        with GatheredLog(context.log.info) as log:  # its epoch lines as one block of the run log
            result = fn(data, cfg, log=log, **kwargs)
    except TrainingDataError as exc:
        raise explained_failure(str(exc)) from None
    # the dtype the features were computed in, as `fugu-lite train-*` records it
    result.metrics["feature_dtype"] = encoder.settings().feature_dtype()
    path = result.save(pipeline.paths.models)
    calibrate_beside(path, data, context.log.info)  # budget.json, as `fugu-lite train-*` writes it
    context.log.info(f"{method}: {result.param_count} parameters; checkpoint {path}")
    _push_checkpoint(context, pipeline, path)
    return dg.Output(
        str(path),
        metadata=train_result_metadata(result, path),
        data_version=dg.DataVersion(path.name),
    )


@dg.asset(deps=[task_embeddings], pool=GPU_POOL, group_name="training", kinds={"pytorch", "safetensors"}, code_version=CODE_VERSION)
def router_sft(context: dg.AssetExecutionContext, config: TrainConfig, pipeline: PipelineResource, encoder: EncoderResource) -> dg.Output[str]:
    """SFT warm start: cross-entropy to softmax(U/τ) soft targets, early-stopped on validation
    utility. Output: the checkpoint directory models/sft/<content hash>/."""
    return _train(context, pipeline, encoder, "sft", config)


@dg.asset(pool=GPU_POOL, group_name="training", kinds={"pytorch", "safetensors"}, code_version=CODE_VERSION)
def router_rl(context: dg.AssetExecutionContext, config: TrainConfig, pipeline: PipelineResource, encoder: EncoderResource, router_sft: str) -> dg.Output[str]:
    """Offline contextual-bandit RL over the full reward matrix, warm-started from SFT."""
    return _train(context, pipeline, encoder, "rl", config, init_path=router_sft)


@dg.asset(pool=GPU_POOL, group_name="training", kinds={"safetensors"}, code_version=CODE_VERSION)
def router_es(context: dg.AssetExecutionContext, config: TrainConfig, pipeline: PipelineResource, encoder: EncoderResource, router_rl: str) -> dg.Output[str]:
    """Separable CMA-ES on the final linear layer over cached features, warm-started from RL;
    keeps the weights best on validation (never worse than the warm start)."""
    return _train(context, pipeline, encoder, "es", config, init_path=router_rl)


class HeadsConfig(dg.Config):
    config_path: str = "configs/train.yaml"
    """The heads, their grids and the selection (relative to the project; absent: the built-in defaults, the same)."""
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


@dg.asset(deps=[task_embeddings], pool=GPU_POOL, group_name="training", kinds={"pytorch", "safetensors"}, code_version=CODE_VERSION)
def router_heads(context: dg.AssetExecutionContext, config: HeadsConfig, pipeline: PipelineResource, encoder: EncoderResource) -> dg.Output[dict]:
    """The configured set of heads (configs/train.yaml: kNN, domain prior, MLP, ensemble, ...), each
    grid point scored by K-fold out-of-fold predictions over the non-test rows, the rule chosen by a
    nested check; each kind's best saved to models/<kind>/<hash>/. Output: every checkpoint and the
    selected one (the challenger this asset offers to promotion)."""
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.config_files import ConfigError, load_config
    from fugu_pipeline.policies.oneshot.default_train import calibrate_saved
    from fugu_pipeline.train.feature_choice import (
        LayerSetError,
        describe_features,
        fit_choosing_features,
        heads_features,
    )
    from fugu_pipeline.policies.oneshot.fit import fit_and_save, select_heads

    path = pipeline.paths.resolve(config.config_path)
    try:
        cfg = load_config(path, TrainSetConfig) if path.exists() else TrainSetConfig()
    except ConfigError as exc:
        raise explained_failure(str(exc)) from None
    if config.prompt_rules not in (None, "auto", "on", "off"):
        raise explained_failure(f"prompt_rules {config.prompt_rules!r}: give auto, on or off (or leave it unset: "
                         "the config file's features.prompt_rules)")
    try:  # the features as `fugu-lite train` resolves and chooses them (lexical block, layer sets, prompt rules)
        settings, sets, rules = heads_features(encoder.settings(), cfg.features, lexical=config.lexical,
                                               layer_sets=config.layer_sets, prompt_rules=config.prompt_rules)
        context.log.info(describe_features(settings, sets, rules))
        selection, data, recorded = fit_choosing_features(
            settings, lambda s: _routing_data(context, pipeline, encoder, s),
            lambda d: select_heads(d, cfg, context.log.info, config.force), score=lambda sel: sel[0].val_score,
            prompt_rules=rules, layer_sets=sets, log=context.log.info,
            prefill=lambda ss: _prefill(context, pipeline, encoder, ss))
        report = fit_and_save(data, pipeline.paths.models, cfg, log=context.log.info, force=config.force,
                              selection=selection, metrics=recorded)
    except (TrainingDataError, LayerSetError) as exc:
        raise explained_failure(f"layer_sets {exc}" if isinstance(exc, LayerSetError) else str(exc)) from None
    # budget.json beside each quality head with the default operating point, as `fugu-lite train` writes it
    point = calibrate_saved(report.saved, data, context.log.info, margin=cfg.cascade.margin, n_boot=cfg.cascade.n_boot,
                            seed=cfg.seed)
    selected = report.selected_path()
    try:
        cascade = _cascade(context, pipeline, encoder, data, cfg, selection, report, recorded)
    except (TrainingDataError, ValueError) as exc:  # a cap no plan meets, a worker without replies: one line
        raise explained_failure(f"cascade: {exc}") from None
    rows = ["| kind | configuration | validation | checkpoint |", "|---|---|---|---|"] + [
        f"| {'**' + s.kind + '**' if s.selected else s.kind} | {s.name} | "
        + ", ".join(f"{k} {v:.4f}" for k, v in s.figures.items()) + f" | {s.path.name} |" for s in report.saved]
    return dg.Output(
        {"checkpoints": [str(s.path) for s in report.saved], "selected": str(selected), "selected_kind": report.selected_kind,
         **{k: v for k, v in (cascade or {}).items() if k != "policy_md"}},
        metadata={"selected": dg.MetadataValue.path(str(selected)), "selected_kind": report.selected_kind,
                  "checkpoints": dg.MetadataValue.json([str(s.path) for s in report.saved]),
                  **({"policy": cascade["policy"], "policy_choice": dg.MetadataValue.md(cascade["policy_md"]),
                      "cascade": dg.MetadataValue.path(cascade["cascade"]),
                      "cascade_report": dg.MetadataValue.path(cascade["cascade_report"])} if cascade else {}),
                  "reason": report.reason, "rule": f"{report.rule}: {report.rule_reason}", "protocol": report.protocol,
                  **({"default_point": point.describe(), "default_point_reason": point.reason} if point else {}),
                  "heads": dg.MetadataValue.md("\n".join(rows)),
                  "seconds": dg.MetadataValue.json(report.seconds)},
        data_version=dg.DataVersion(selected.name),
    )


def _cascade(context, pipeline: PipelineResource, encoder: EncoderResource, data, cfg, selection, report, recorded) -> dict | None:
    """The cascade over the workers' replies, chosen against the one-shot heads and the best worker
    (policies/cascade/train.py), and its held-out report (policies/cascade/evaluate.py); None when the matrix
    holds no replies. `selected` stays the one-shot head (what the one-step contest scores)."""
    from fugu_pipeline.policies.cascade.evaluate import evaluate_cascade, report_lines
    from fugu_pipeline.route.router import encoder_settings_for
    from fugu_pipeline.policies.cascade.train import train_cascade

    own = encoder.settings()
    settings = encoder_settings_for(data.contract, own.device, own.dtype)
    result = train_cascade(data, pipeline.paths.reward_db, settings, _cache_root(pipeline, encoder), cfg, selection[0],
                           report.saved, pipeline.paths.models, context.log.info, recorded)
    if result is None:
        return None
    rep = evaluate_cascade(result.path, data, pipeline.paths.reward_db, settings, _cache_root(pipeline, encoder),
                           one_shot=report.selected_path())
    shown = [line for line in report_lines(rep) if line not in rep.get("frontier_lines", [])]  # printed by result.lines()
    context.log.info("\n".join(result.lines() + shown))  # one event per report, one block in the run log
    md = "\n".join(["```"] + result.lines() + shown + ["```"])
    if rep.get("frontier_png"):  # the out-of-fold frontier's plot (policies/cascade/frontier_plot.py), 640 x 400 px
        md += f"\n\n![frontier](data:image/png;base64,{base64.b64encode(Path(rep['frontier_png']).read_bytes()).decode()})"
    return {"cascade": str(result.path), "policy": result.shipped, "shipped": str(result.shipped_path),
            "cascade_report": rep["report_path"], "policy_md": md}


def _report(context, pipeline: PipelineResource, encoder: EncoderResource, checkpoint_path: str, method: str,
            extra: dict | None = None) -> dg.Output[dict]:
    from fugu_pipeline.policies.oneshot.contest import add_composite
    from fugu_pipeline.evaluate.metrics import ci_text
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, write_report
    from fugu_pipeline.policies.registry import load_checkpoint

    source = _feature_source(context, pipeline, encoder)
    ckpt = load_checkpoint(checkpoint_path)
    data, problems = source.for_checkpoint(ckpt)  # the rows with the checkpoint's own features (contract checked)
    if problems:
        raise explained_failure(f"{checkpoint_path} cannot be scored with this encoder: " + "; ".join(problems))
    rep = evaluate_checkpoint(ckpt, data, "test")
    live, tasks = harness.live_for(pipeline)  # the TinyRouter composite against the current king
    add_composite(rep, ckpt, data, pipeline.paths.models, harness.policy_for(pipeline).composite, live=live, tasks=tasks,
                  features=source)
    out_dir = Path(checkpoint_path) / "reports"
    json_path, plots = write_report(rep, out_dir, "test")
    context.log.info(rep["summary"])
    ci = rep["router_minus_best_fixed"]
    md = "\n\n".join(f"![{p.name}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})" for p in plots)
    table = "\n".join(["| domain | n | router | best fixed | oracle | top route |", "|---|---|---|---|---|---|"]
                      + [f"| {r['domain']} | {r['n']} | {r['router']:.4f} | {r['best_fixed']:.4f} | {r['oracle']:.4f} | {r['top_route']} |"
                         for r in rep.get("per_domain", [])])
    meta = {
        "router_utility": rep["router_utility"], "oracle_utility": rep["oracle_utility"],
        "best_fixed_utility": rep["best_fixed_utility"], "best_fixed_worker": rep["best_fixed_worker"],
        "random_utility": rep["random_utility"], "regret": rep["regret"],
        "oracle_route_accuracy": rep["oracle_route_accuracy"],
        "router_minus_best_fixed": ci_text(ci),
        "route_distribution": dg.MetadataValue.json(rep["route_distribution"]),
        "per_domain": dg.MetadataValue.md(table),
        "plots": dg.MetadataValue.md(md),
        "report": dg.MetadataValue.path(str(json_path)),
        "n_test_tasks": rep["n_tasks"],
        "utility_weights": dg.MetadataValue.json(rep["utility_weights"]),
        "utility": f"{rep['utility_formula']} ({rep['utility_source']})",
    }
    if "apgr" in rep:
        meta["apgr"] = rep["apgr"]["apgr"] if rep["apgr"]["apgr"] is not None else rep["apgr"]["note"]
    meta.update(harness.report_metadata(rep))  # every baseline row, the composite and its terms
    meta["checkpoint"] = dg.MetadataValue.path(checkpoint_path)
    meta["plot_files"] = dg.MetadataValue.md("\n".join(f"- `{p}`" for p in plots))
    return dg.Output({"checkpoint": checkpoint_path, "report": str(json_path), "method": method,
                      "router_utility": rep["router_utility"], **(extra or {})}, metadata=tidy(meta))


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=CODE_VERSION)
def eval_report_sft(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_sft: str) -> dg.Output[dict]:
    """Held-out report of the SFT checkpoint: every metric, the baselines, plots, per-domain table.
    Its composite's live term calls the configured workers (`live_sample` tasks a benchmark, configs/promotion.yaml)."""
    return _report(context, pipeline, encoder, router_sft, "sft")


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=CODE_VERSION)
def eval_report_rl(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_rl: str) -> dg.Output[dict]:
    """Held-out report of the RL checkpoint: every metric, the baselines, plots, per-domain table.
    Its composite's live term calls the configured workers (`live_sample` tasks a benchmark, configs/promotion.yaml)."""
    return _report(context, pipeline, encoder, router_rl, "rl")


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=CODE_VERSION)
def eval_report_es(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_es: str) -> dg.Output[dict]:
    """Held-out report of the CMA-ES checkpoint: every metric, the baselines, plots, per-domain table.
    Its composite's live term calls the configured workers (`live_sample` tasks a benchmark, configs/promotion.yaml)."""
    return _report(context, pipeline, encoder, router_es, "es")


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=CODE_VERSION)
def eval_report_heads(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_heads: dict) -> dg.Output[dict]:
    """Held-out report of the head `router_heads` selected: every metric, the baselines, plots, per-domain table.
    Its composite's live term calls the configured workers (`live_sample` tasks a benchmark, configs/promotion.yaml).
    It also passes on the cascade `router_heads` fitted (when the matrix holds replies), which enters the same contest."""
    return _report(context, pipeline, encoder, router_heads["selected"], router_heads["selected_kind"],
                   extra={"cascade": router_heads["cascade"]} if router_heads.get("cascade") else None)


class PromotionConfig(dg.Config):
    policy_file: str = "configs/promotion.yaml"
    """The promotion policy (composite weights, overfit gate, gates); absent: the built-in defaults (TinyRouter's rules)."""
    margin: float | None = None
    """Replace the king only at composite(challenger) ≥ composite(king) + margin (None: the policy file's, 0.02)."""
    max_train_gap: float | None = None
    """Largest allowed train minus held-out router utility (None: the policy file's, 0.25)."""
    require_significant: bool | None = None
    """Also require the paired bootstrap 95% low end above zero, against the best fixed worker and the king (None: the file's, true)."""
    min_quality_std: float | None = None
    """A quality head whose held-out predicted qualities have a smaller std is refused (None: the file's, 0.01)."""
    rate_limit_hours: float | None = None
    """At most one promotion attempt per this many hours (None: the file's, 24; 0: off)."""
    live_sample: int | None = None
    """Live tasks per benchmark for the composite (None: the file's, 20; 0: no live term)."""
    replace_broken_king: bool = False
    """When the promoted checkpoint cannot be loaded, let the challenger replace it facing the baselines
    only; the history records that this run asked (default: the step fails and says why, and the
    broken king stays for someone to restore)."""


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=CODE_VERSION,
          freshness_policy=ROUTER_FRESHNESS)
def promoted_router(
    context: dg.AssetExecutionContext, config: PromotionConfig, pipeline: PipelineResource, encoder: EncoderResource,
    eval_report_sft: dict, eval_report_rl: dict, eval_report_es: dict, eval_report_heads: dict,
) -> dg.MaterializeResult:
    """King versus challenger. The challengers are the SFT, RL and CMA-ES heads, the head
    `router_heads` selected and the cascade it fitted over the workers' replies (when the matrix
    holds them); the one with the best validation utility (out-of-fold for heads fitted on the val
    rows too) replaces the promoted checkpoint, one-step head or cascade, only if it passes every
    gate; models/promoted/current.json is swapped atomically and every decision is kept in
    models/promoted/history.jsonl. The composite's live term calls the configured workers."""
    from fugu_pipeline.policies.cascade.contest import AnswerSource
    from fugu_pipeline.policies.registry import promote_best

    source = _feature_source(context, pipeline, encoder)
    shared = SharedStore.of(pipeline.paths)
    king_version = shared.pull_promoted() if shared else None  # the deployment's king, from the store
    policy = harness.policy_for(
        pipeline, config.policy_file, context=context, margin=config.margin, max_train_gap=config.max_train_gap,
        require_significant=config.require_significant, min_quality_std=config.min_quality_std, live_sample=config.live_sample,
        rate_limit_s=None if config.rate_limit_hours is None else config.rate_limit_hours * 3600)
    live, tasks = harness.live_for(pipeline)
    paths = [r["checkpoint"] for r in (eval_report_sft, eval_report_rl, eval_report_es, eval_report_heads)]
    paths += [eval_report_heads["cascade"]] if eval_report_heads.get("cascade") else []
    answers = AnswerSource.from_matrix(pipeline.paths.reward_db, encoder.settings(), _cache_root(pipeline, encoder))
    outcome = promote_best(paths, source.data, pipeline.paths.models, policy, live=live, tasks=tasks, features=source,
                           replace_broken_king=harness.broken_king_ask(context, config.replace_broken_king), answers=answers)
    context.log.info("\n".join(outcome["reasons"]))
    if shared and shared.push_promoted(king_version):  # compare-and-swap: fails if another machine promoted meanwhile
        context.log.info(f"promoted pointer published to {shared.models_url}")
    from fugu_pipeline.train.pointer import pointer_target

    challenger = outcome["challenger"] or ""
    return dg.MaterializeResult(metadata=tidy({
        "promoted": outcome["promoted"],
        "challenger": dg.MetadataValue.path(challenger) if "/" in challenger else challenger or "none",
        **({"current_checkpoint": dg.MetadataValue.path(str(pointer_target(pipeline.paths.models, outcome["pointer"])))}
           if outcome["pointer"] else {}),
        "decision": dg.MetadataValue.md("\n".join(f"- {r}" for r in outcome["reasons"])),
        "current": dg.MetadataValue.json(outcome["pointer"] or {}),
        **harness.promotion_metadata(outcome),
    }))
