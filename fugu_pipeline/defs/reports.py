"""The held-out reports and the promotion: `eval_report_sft`, `_rl`, `_es`, `_heads` (one factory
over `steps/reports.py`), `eval_report_cascade` (`steps/cascade.py`) and `promoted_router`, the
contest every router-slot challenger goes through. Each report's data version is its report file's
hash, so a report read back unchanged leaves the promotion fresh."""


import base64
from pathlib import Path

import dagster as dg

from fugu_pipeline.defs import harness
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.metadata import LIVE_KIND, LIVE_WORKERS, tidy
from fugu_pipeline.defs.models import heads_record_of, record_metadata
from fugu_pipeline.defs.partitions import GPU_POOL, ROUTER_FRESHNESS
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.rows import cache_root, feature_source, rows_for
from fugu_pipeline.defs.settings import SETTINGS_FILES
from fugu_pipeline.defs.shared import SharedStore
from fugu_pipeline.defs.staleness import require_fresh_inputs
from fugu_pipeline.defs.versions import file_version
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.steps.cascade import cascade_report_code_version
from fugu_pipeline.steps.reports import report_code_version
from fugu_pipeline.steps.versions import code_version

POLICY = SETTINGS_FILES["config_promotion"]
LIVE_NOTE = "Its composite's live term calls the configured workers (`live_sample` tasks a benchmark, configs/promotion.yaml)."


def _live_key(pipeline: PipelineResource, live) -> str:
    """What identifies the live workers and judge (their answer fields), for a report's fingerprint."""
    return sha256_text(canonical_json(getattr(live, "context", None) or
                                      [w.answer_fields() for w in pipeline.load_workers().workers]))[:16]


def _report_metadata(rep: dict, json_path: Path, plots: list[Path], checkpoint: str) -> dict:
    from fugu_pipeline.evaluate.metrics import ci_text

    md = "\n\n".join(f"![{p.name}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})" for p in plots)
    table = "\n".join(["| domain | n | router | best fixed | oracle | top route |", "|---|---|---|---|---|---|"]
                      + [f"| {r['domain']} | {r['n']} | {r['router']:.4f} | {r['best_fixed']:.4f} | {r['oracle']:.4f} | {r['top_route']} |"
                         for r in rep.get("per_domain", [])])
    meta = {
        "router_utility": rep["router_utility"], "oracle_utility": rep["oracle_utility"],
        "best_fixed_utility": rep["best_fixed_utility"], "best_fixed_worker": rep["best_fixed_worker"],
        "random_utility": rep["random_utility"], "regret": rep["regret"],
        "oracle_route_accuracy": rep["oracle_route_accuracy"],
        "router_minus_best_fixed": ci_text(rep["router_minus_best_fixed"]),
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
    meta["checkpoint"] = dg.MetadataValue.path(checkpoint)
    meta["plot_files"] = dg.MetadataValue.md("\n".join(f"- `{p}`" for p in plots))
    return meta


def _report(context, pipeline: PipelineResource, encoder: EncoderResource, checkpoint: str, method: str) -> dg.Output[dict]:
    from fugu_pipeline.matrix.read import read_data_version
    from fugu_pipeline.steps.reports import evaluate_oneshot

    require_fresh_inputs(context)
    policy = harness.policy_for(pipeline)
    live, tasks = harness.live_for(pipeline)  # the TinyRouter composite against the current king
    try:
        done = evaluate_oneshot(checkpoint, feature_source(context, pipeline, encoder), pipeline.paths.models,
                                policy.composite, matrix_version=read_data_version(pipeline.paths.reward_db),
                                live=live, tasks=tasks, live_key=_live_key(pipeline, live), log=context.log.info)
    except ValueError as exc:
        raise explained_failure(str(exc)) from None
    context.log.info(done.rep["summary"])
    meta = {**_report_metadata(done.rep, done.path, done.plots, checkpoint), **record_metadata(done.record)}
    return dg.Output({"checkpoint": checkpoint, "report": str(done.path), "method": method,
                      "router_utility": done.rep["router_utility"]},
                     metadata=tidy(meta), data_version=dg.DataVersion(file_version(done.path)))


def _report_asset(name: str, upstream: str, what: str, pick) -> dg.AssetsDefinition:
    """`eval_report_<name>`: the held-out report of the checkpoint `pick(upstream output)` names."""

    @dg.asset(name=f"eval_report_{name}", ins={"trained": dg.AssetIn(upstream)}, deps=[POLICY], pool=GPU_POOL,
              group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS, code_version=report_code_version(),
              description=f"Held-out report of {what}: every metric, the baselines, plots, per-domain table. {LIVE_NOTE}")
    def _asset(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource,
               trained) -> dg.Output[dict]:
        checkpoint, method = pick(trained)
        return _report(context, pipeline, encoder, checkpoint, method)

    return _asset


eval_report_sft, eval_report_rl, eval_report_es = (
    _report_asset(m, f"router_{m}", f"the {label} checkpoint", lambda path, m=m: (path, m))
    for m, label in (("sft", "SFT"), ("rl", "RL"), ("es", "CMA-ES")))
eval_report_heads = _report_asset("heads", "router_heads", "the head `router_heads` selected",
                                  lambda heads: (heads["selected"], heads["selected_kind"]))


@dg.asset(pool=GPU_POOL, group_name="evaluation", kinds={"json"}, code_version=cascade_report_code_version())
def eval_report_cascade(context: dg.AssetExecutionContext, pipeline: PipelineResource, encoder: EncoderResource,
                        router_cascade: dict, router_heads: dict) -> dg.Output[dict]:
    """Held-out report of the cascade `router_cascade` fitted: quality, cost and calls per task of
    every policy against the one-shot head `router_heads` selected and each worker, per domain, with
    the out-of-fold frontier and its plot. Scored from the recorded replies (no live call)."""
    from fugu_pipeline.policies.cascade.evaluate import report_lines
    from fugu_pipeline.steps import records
    from fugu_pipeline.steps.cascade import STEP, evaluate_cascade

    require_fresh_inputs(context)
    if not router_cascade.get("cascade"):
        return dg.Output({"checkpoint": None, "skipped": router_cascade.get("skipped")}, data_version=dg.DataVersion("skipped"),
                         metadata={"skipped": router_cascade.get("skipped") or ""})
    heads = heads_record_of(router_heads, pipeline)
    cascade = records.find(pipeline.paths.models, STEP, router_cascade.get("fingerprint", ""))
    if cascade is None:
        raise explained_failure(f"the cascade's record (or its checkpoint {router_cascade['cascade']}) is gone",
                                "materialize router_cascade again (it finds or fits the cascade), then this report")
    try:
        rep = evaluate_cascade(cascade, rows_for(context, pipeline, encoder), pipeline.paths.models, heads,
                               log=context.log.info)
    except ValueError as exc:
        raise explained_failure(f"cascade report: {exc}") from None
    lines = [line for line in report_lines(rep) if line not in rep.get("frontier_lines", [])]
    context.log.info("\n".join(lines))  # one event per report, one block in the run log
    md = "\n".join(["```", *lines, "```"])
    if rep.get("frontier_png") and Path(rep["frontier_png"]).exists():  # the out-of-fold frontier's plot, 640 x 400 px
        md += f"\n\n![frontier](data:image/png;base64,{base64.b64encode(Path(rep['frontier_png']).read_bytes()).decode()})"
    return dg.Output({"checkpoint": router_cascade["cascade"], "report": rep["report_path"], "method": "cascade"},
                     data_version=dg.DataVersion(file_version(Path(rep["report_path"]))),
                     metadata={"report": dg.MetadataValue.path(rep["report_path"]), "policy": router_cascade["policy"],
                               "cascade_report": dg.MetadataValue.md(md), **record_metadata(cascade)})


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


@dg.asset(deps=[POLICY], pool=GPU_POOL, group_name="evaluation", kinds={"json", LIVE_KIND}, tags=LIVE_WORKERS,
          code_version=code_version("fugu_pipeline.evaluate.promotion", "fugu_pipeline.policies.cascade.contest"),
          freshness_policy=ROUTER_FRESHNESS)
def promoted_router(
    context: dg.AssetExecutionContext, config: PromotionConfig, pipeline: PipelineResource, encoder: EncoderResource,
    eval_report_sft: dict, eval_report_rl: dict, eval_report_es: dict, eval_report_heads: dict, eval_report_cascade: dict,
) -> dg.MaterializeResult:
    """King versus challenger. The challengers are the SFT, RL and CMA-ES heads, the head
    `router_heads` selected and the cascade `router_cascade` fitted over the workers' replies (when the
    matrix holds them); the one with the best validation utility (out-of-fold for heads fitted on the val
    rows too) replaces the promoted checkpoint, one-step head or cascade, only if it passes every
    gate; models/promoted/current.json is swapped atomically and every decision is kept in
    models/promoted/history.jsonl. The composite's live term calls the configured workers. Its data
    version is the pointer's: a decision that changes nothing leaves what reads the promoted router fresh."""
    from fugu_pipeline.policies.cascade.contest import AnswerSource
    from fugu_pipeline.policies.registry import promote_best
    from fugu_pipeline.train.pointer import POINTER, pointer_target

    require_fresh_inputs(context)
    source = feature_source(context, pipeline, encoder)
    shared = SharedStore.of(pipeline.paths)
    king_version = shared.pull_promoted() if shared else None  # the deployment's king, from the store
    policy = harness.policy_for(
        pipeline, config.policy_file, margin=config.margin, max_train_gap=config.max_train_gap,
        require_significant=config.require_significant, min_quality_std=config.min_quality_std, live_sample=config.live_sample,
        rate_limit_s=None if config.rate_limit_hours is None else config.rate_limit_hours * 3600)
    live, tasks = harness.live_for(pipeline)
    paths = [r["checkpoint"] for r in (eval_report_sft, eval_report_rl, eval_report_es, eval_report_heads)]
    paths += [eval_report_cascade["checkpoint"]] if eval_report_cascade.get("checkpoint") else []
    answers = AnswerSource.from_matrix(pipeline.paths.reward_db, encoder.settings(), cache_root(pipeline, encoder))
    outcome = promote_best(paths, source.data, pipeline.paths.models, policy, live=live, tasks=tasks, features=source,
                           replace_broken_king=harness.broken_king_ask(context, config.replace_broken_king), answers=answers)
    context.log.info("\n".join(outcome["reasons"]))
    if shared and shared.push_promoted(king_version):  # compare-and-swap: fails if another machine promoted meanwhile
        context.log.info(f"promoted pointer published to {shared.models_url}")
    challenger = outcome["challenger"] or ""
    return dg.MaterializeResult(metadata=tidy({
        "promoted": outcome["promoted"],
        "challenger": dg.MetadataValue.path(challenger) if "/" in challenger else challenger or "none",
        **({"current_checkpoint": dg.MetadataValue.path(str(pointer_target(pipeline.paths.models, outcome["pointer"])))}
           if outcome["pointer"] else {}),
        "decision": dg.MetadataValue.md("\n".join(f"- {r}" for r in outcome["reasons"])),
        "current": dg.MetadataValue.json(outcome["pointer"] or {}),
        **harness.promotion_metadata(outcome),
    }), data_version=dg.DataVersion(file_version(pipeline.paths.models / POINTER)))
