"""The triage head's assets: `triage_head` (train) → `eval_report_triage` (held-out report).
Thin: the work is in `policies/triage/train.py` and `policies/triage/report.py`."""

import dagster as dg

from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.metadata import tidy
from fugu_pipeline.defs.models import task_embeddings
from fugu_pipeline.defs.partitions import GPU_POOL
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.rows import routing_data as _routing_data
from fugu_pipeline.defs.settings import SETTINGS_FILES
from fugu_pipeline.defs.staleness import require_fresh_inputs
from fugu_pipeline.defs.versions import file_version
from fugu_pipeline.steps.versions import code_version


class TriageAssetConfig(dg.Config):
    config_path: str | None = None
    """Triage trainer YAML relative to the project directory (TriageConfig; default: built-in defaults)."""


class TriagePromotionConfig(dg.Config):
    replace_broken_king: bool = False
    """When the promoted triage head cannot be loaded, let the new one replace it facing the baselines
    only; the history records that this run asked (default: the step fails and says why)."""


@dg.asset(deps=[reward_matrix, task_embeddings], pool=GPU_POOL, group_name="training", kinds={"pytorch", "safetensors"},
          code_version=code_version("fugu_pipeline.policies.triage.train"))
def triage_head(context: dg.AssetExecutionContext, config: TriageAssetConfig, pipeline: PipelineResource,
                encoder: EncoderResource) -> dg.Output[str]:
    """TinyRouter's first milestone: predicts a prompt's domain and difficulty (the share of workers
    that solve it, bucketed) with two bias-free linear maps over the frozen features. Output: the
    checkpoint directory models/triage/<content hash>/."""
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.config_files import ConfigError, load_config
    from fugu_pipeline.policies.triage.train import TriageConfig, train_triage

    require_fresh_inputs(context)
    try:
        cfg = load_config(pipeline.paths.resolve(config.config_path), TriageConfig) if config.config_path else TriageConfig()
        result = train_triage(_routing_data(context, pipeline, encoder), cfg, log=context.log.info)
    except (ConfigError, TrainingDataError) as exc:
        raise explained_failure(str(exc)) from None
    path = result.save(pipeline.paths.models)
    m = result.metrics
    return dg.Output(str(path), data_version=dg.DataVersion(path.name), metadata=tidy({
        "param_count": result.param_count, "best_epoch": result.best_epoch,
        "val_domain_accuracy": float(m["val_domain_accuracy"]), "val_difficulty_accuracy": float(m["val_difficulty_accuracy"]),
        "domains": dg.MetadataValue.json(result.domains),
        "difficulty": f"{result.difficulty_names} at solve share {result.difficulty_edges}",
        "checkpoint": dg.MetadataValue.path(str(path)),
    }))


@dg.asset(deps=[SETTINGS_FILES["config_promotion"]], pool=GPU_POOL, group_name="evaluation", kinds={"json"},
          code_version=code_version("fugu_pipeline.policies.triage.report", "fugu_pipeline.policies.triage.contest"))
def eval_report_triage(context: dg.AssetExecutionContext, config: TriagePromotionConfig, pipeline: PipelineResource,
                       encoder: EncoderResource, triage_head: str) -> dg.MaterializeResult:
    """Held-out report of the triage head: domain and difficulty accuracy per domain, confusion
    matrices, the majority baselines, and routing by the predicted domain. Then the one contest
    every kind goes through (TinyRouter's milestone-1 rules: under 1M parameters, 0.7 domain + 0.3
    difficulty, king + 0.02, one attempt a day): the head replaces models/promoted/triage.json only
    if it passes every gate."""
    from pathlib import Path

    from fugu_pipeline.policies.triage.report import triage_lines, triage_markdown, triage_report, write_triage_report
    from fugu_pipeline.policies.triage.train import load_triage

    require_fresh_inputs(context)
    data = _routing_data(context, pipeline, encoder)
    rep = triage_report(load_triage(triage_head, expected_contract=data.contract), data, "test")
    path = write_triage_report(rep, Path(triage_head) / "reports" / "triage-test.json")
    context.log.info("\n".join(triage_lines(rep)))  # one event per report: the run log keeps it as one block
    meta = {"domain_accuracy": rep["domain"]["accuracy"], "domain_majority_baseline": rep["domain"]["majority_baseline"],
            "difficulty_accuracy": rep["difficulty"]["accuracy"],
            "difficulty_majority_baseline": rep["difficulty"]["majority_baseline"],
            "per_domain": dg.MetadataValue.md(triage_markdown(rep)), "report": dg.MetadataValue.path(str(path)),
            "n_test_tasks": rep["n_tasks"]}
    if "routing" in rep:
        meta["routing_by_predicted_domain"] = rep["routing"]["by_predicted_domain"]
    from fugu_pipeline.defs.harness import broken_king_ask, policy_for, promotion_metadata
    from fugu_pipeline.evaluate.contest import run_contest
    from fugu_pipeline.policies.triage.contest import TriageKind
    from fugu_pipeline.train.checkpoints import CheckpointError

    try:
        outcome = run_contest(TriageKind(data), [triage_head], pipeline.paths.models, policy_for(pipeline, context=context),
                              replace_broken_king=broken_king_ask(context, config.replace_broken_king))
    except CheckpointError as exc:  # the promoted triage head is broken and nobody asked to replace it
        raise dg.Failure(description=str(exc)) from None
    context.log.info("\n".join(outcome["reasons"]))
    meta.update({"promoted": outcome["promoted"],
                 "decision": dg.MetadataValue.md("\n".join(f"- {r}" for r in outcome["reasons"])),
                 **promotion_metadata(outcome)})
    from fugu_pipeline.train.pointer import TRIAGE_POINTER

    version = f"{file_version(path)}-{file_version(pipeline.paths.models / TRIAGE_POINTER)}"
    return dg.MaterializeResult(metadata=tidy(meta), data_version=dg.DataVersion(version))
