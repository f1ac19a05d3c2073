"""Embeddings, training, evaluation and promotion assets. Thin: the work is in the core modules."""

import base64
from pathlib import Path

import dagster as dg

from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.partitions import GPU_POOL
from fugu_pipeline.defs.resources import PipelineResource

CODE_VERSION = "fugu-models-1"


def _cache_root(pipeline: PipelineResource, encoder: EncoderResource) -> Path:
    return pipeline.paths.resolve(encoder.cache_dir)


def _routing_data(context, pipeline: PipelineResource, encoder: EncoderResource):
    from fugu_pipeline.features.routing_data import load_routing_data

    data, emb = load_routing_data(pipeline.paths.reward_db, encoder.encoder(), _cache_root(pipeline, encoder))
    context.log.info(f"{emb.encoder_description}; {emb.n_cached} cached, {emb.n_computed} encoded; splits {data.counts()}")
    return data


@dg.asset(deps=[reward_matrix], pool=GPU_POOL, group_name="features", kinds={"pytorch"}, code_version=CODE_VERSION)
def task_embeddings(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource) -> dg.MaterializeResult:
    """Every prompt of the reward matrix as a feature vector from the frozen encoder, through the
    content-addressed cache: a prompt is encoded once per encoder fingerprint, never again."""
    from fugu_pipeline.defs.embeddings import materialize_embeddings
    from fugu_pipeline.matrix.read import read_arrays

    arrays = read_arrays(pipeline.paths.reward_db, complete_only=False)
    return materialize_embeddings(context, encoder, arrays.prompts, arrays.domains, cache_root=_cache_root(pipeline, encoder))


class TrainConfig(dg.Config):
    config_path: str | None = None
    """Trainer YAML relative to the project directory (default: configs/train_<method>.yaml)."""
    force: bool = False
    """Train even when every worker ties on every task (no learning signal)."""


def _train(context, pipeline, encoder, method: str, config: TrainConfig, init_path: str | None = None) -> dg.Output:
    from fugu_pipeline.defs.training import train_result_metadata
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.train.configs import (
        ConfigError,
        ESConfig,
        RLConfig,
        SFTConfig,
        load_config,
    )
    from fugu_pipeline.train.es import train_es
    from fugu_pipeline.train.rl import train_rl
    from fugu_pipeline.train.sft import train_sft

    cls = {"sft": SFTConfig, "rl": RLConfig, "es": ESConfig}[method]
    try:
        cfg = load_config(pipeline.paths.resolve(config.config_path or f"configs/train_{method}.yaml"), cls)
    except ConfigError as exc:
        raise dg.Failure(description=str(exc)) from None
    data = _routing_data(context, pipeline, encoder)
    fn = {"sft": train_sft, "rl": train_rl, "es": train_es}[method]
    kwargs = {"force": config.force, "log": context.log.info}
    if init_path is not None:
        kwargs["init_state"] = load_checkpoint(init_path, expected_contract=data.contract).state_dict
    try:
        result = fn(data, cfg, **kwargs)
    except TrainingDataError as exc:
        raise dg.Failure(description=str(exc)) from None
    path = result.save(pipeline.paths.models)
    context.log.info(f"{method}: {result.param_count} parameters; checkpoint {path}")
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


def _report(context, pipeline: PipelineResource, encoder: EncoderResource, checkpoint_path: str, method: str) -> dg.Output[dict]:
    from fugu_pipeline.evaluate.reports import evaluate_checkpoint, write_report
    from fugu_pipeline.train.checkpoints import load_checkpoint

    data = _routing_data(context, pipeline, encoder)
    ckpt = load_checkpoint(checkpoint_path, expected_contract=data.contract)
    rep = evaluate_checkpoint(ckpt, data, "test")
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
        "router_minus_best_fixed": f"{ci['mean']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}]",
        "route_distribution": dg.MetadataValue.json(rep["route_distribution"]),
        "per_domain": dg.MetadataValue.md(table),
        "plots": dg.MetadataValue.md(md),
        "report": dg.MetadataValue.path(str(json_path)),
        "n_test_tasks": rep["n_tasks"],
        "utility_weights": dg.MetadataValue.json(rep["utility_weights"]),
        "utility": f"{rep['utility_formula']} ({rep['utility_source']})",
    }
    if "apgr" in rep:
        meta["apgr"] = rep["apgr"]["apgr"]
    return dg.Output({"checkpoint": checkpoint_path, "report": str(json_path), "method": method,
                      "router_utility": rep["router_utility"]}, metadata=meta)


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json"}, code_version=CODE_VERSION)
def eval_report_sft(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_sft: str) -> dg.Output[dict]:
    """Held-out report of the SFT checkpoint (DESIGN §5): every metric, plots, per-domain table."""
    return _report(context, pipeline, encoder, router_sft, "sft")


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json"}, code_version=CODE_VERSION)
def eval_report_rl(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_rl: str) -> dg.Output[dict]:
    """Held-out report of the RL checkpoint (DESIGN §5)."""
    return _report(context, pipeline, encoder, router_rl, "rl")


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json"}, code_version=CODE_VERSION)
def eval_report_es(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource, router_es: str) -> dg.Output[dict]:
    """Held-out report of the CMA-ES checkpoint (DESIGN §5)."""
    return _report(context, pipeline, encoder, router_es, "es")


class PromotionConfig(dg.Config):
    margin: float = 0.02
    """Replace the promoted checkpoint only at challenger ≥ king + margin (paired mean held-out utility; the seed's rule)."""
    max_train_gap: float = 0.25
    """Largest allowed train minus held-out router utility."""
    require_significant: bool = True
    """Also require the paired bootstrap 95% interval's low end above zero, against the best fixed worker and the king."""
    min_quality_std: float = 0.01
    """A quality head whose held-out predicted qualities have a smaller std is refused."""


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json"}, code_version=CODE_VERSION)
def promoted_router(
    context: dg.AssetExecutionContext, config: PromotionConfig, pipeline: PipelineResource, encoder: EncoderResource,
    eval_report_sft: dict, eval_report_rl: dict, eval_report_es: dict,
) -> dg.MaterializeResult:
    """King versus challenger. The challenger with the best validation utility replaces the
    promoted checkpoint only if it passes every gate; models/promoted/current.json is swapped
    atomically and every decision is kept in models/promoted/history.jsonl."""
    from fugu_pipeline.evaluate.promotion import PromotionPolicy, promote_best

    data = _routing_data(context, pipeline, encoder)
    policy = PromotionPolicy(margin=config.margin, max_train_gap=config.max_train_gap,
                             require_significant=config.require_significant, min_quality_std=config.min_quality_std)
    outcome = promote_best([r["checkpoint"] for r in (eval_report_sft, eval_report_rl, eval_report_es)], data, pipeline.paths.models, policy)
    for line in outcome["reasons"]:
        context.log.info(line)
    return dg.MaterializeResult(metadata={
        "promoted": outcome["promoted"],
        "challenger": outcome["challenger"] or "",
        "decision": dg.MetadataValue.md("\n".join(f"- {r}" for r in outcome["reasons"])),
        "current": dg.MetadataValue.json(outcome["pointer"] or {}),
    })
