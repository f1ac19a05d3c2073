"""The TinyRouter harness in the Dagster layer: the policy file and live evaluator the evaluation
and promotion assets share, and the metadata that shows the baselines and the composite in the UI.
Thin: the work is in `evaluate/`."""

from __future__ import annotations

import dagster as dg

from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.partitions import MAIN_JOB_TAGS
from fugu_pipeline.defs.resources import PipelineResource


# How Dagster tags the runs it launches for the project itself: a sensor's, a schedule's, a
# backfill's, one launched from the UI (its launchpad and materialize buttons), and `fugu-lite
# pipeline`'s main job (MAIN_JOB_TAGS). Dagster sets them as it launches a run; `fugu-lite validate`
# and `evaluate-roles` run no Dagster job, so nothing a submitter sends can carry them.
PROJECT_RUN_TAGS = {"dagster/sensor_name": "sensor", "dagster/schedule_name": "schedule",
                    "dagster/backfill": "backfill", "dagster/from_ui": "the UI"}


def project_run(context) -> str | None:
    """How this run was launched when it is one of the project's own runs (e.g. "backfill
    abc123"), None otherwise (a run started from a script or a test: the outside rule)."""
    tags = context.run.tags if context is not None else {}
    if all(tags.get(k) == v for k, v in MAIN_JOB_TAGS.items()):
        return "fugu-lite pipeline"
    return next((f"{what} {tags[tag]}" for tag, what in PROJECT_RUN_TAGS.items() if tags.get(tag)), None)


def policy_for(pipeline: PipelineResource, policy_file: str | None = None, *, context=None, **overrides):
    """The promotion policy (`evaluate/promotion.py project_policy`): `configs/promotion.yaml` of
    the project (defaults where absent); with the run's `context`, the rule of the project's own
    runs when Dagster launched it for the project (`project_run`), said in the run's log."""
    from fugu_pipeline.evaluate.promotion import PolicyError, project_policy

    launched = project_run(context)
    try:
        policy = project_policy(pipeline.paths.root, policy_file, project_run=launched is not None, **overrides)
    except PolicyError as exc:
        raise explained_failure(str(exc)) from None
    if context is not None:
        rule = (f"the project's own run ({launched}): project_runs.rate_limit_s" if launched else
                "not launched by the project's sensors, schedule, backfills, UI or `fugu-lite pipeline`: gates.rate_limit_s")
        context.log.info(f"promotion policy: {rule} = {policy.gates.rate_limit_s:g} s")
    return policy


def live_for(pipeline: PipelineResource):
    """The live evaluator over the configured worker pool and the BenchGen tasks (their graders):
    its outcomes kept per (head, task, seed) in data/live/ (a re-judgement calls nothing), every
    call it makes in the project's cost ledger."""
    from fugu_pipeline.evaluate.live import live_evaluator, tasks_by_id
    from fugu_pipeline.tasks.loading import list_batch_files

    refused: list = []  # a batch file the reward matrix left out is left out here too, with a warning
    tasks = tasks_by_id(pipeline.paths.benchgen, refused) if list_batch_files(pipeline.paths.benchgen) else None
    for exc in refused:
        dg.get_dagster_logger().warning(f"live term: batch file left out as the matrix leaves it out: {exc.first_problem()}")
    return live_evaluator(pipeline.load_workers(), pipeline.paths.root), tasks


def report_metadata(rep: dict) -> dict:
    """Baselines (every row) and the composite with its terms, for an eval_report_* asset."""
    from fugu_pipeline.evaluate.baselines import baseline_markdown
    from fugu_pipeline.evaluate.composite import composite_markdown

    u = rep["baselines"]["utility"]
    meta = {
        "baselines": dg.MetadataValue.md(baseline_markdown(rep["baselines"])),
        "random_utility_95": f"{u['random']['mean']:.4f} [{u['random']['low']:.4f}, {u['random']['high']:.4f}] "
                             f"({u['random']['seeds']} seeds)",
    }
    if u["headroom"] is None:  # one held-out row: no half to choose a worker on
        meta["cross_fit_oracle_note"] = u["cross_fit_oracle"]["note"]
    else:
        meta["cross_fit_oracle_utility"], meta["headroom"] = u["cross_fit_oracle"]["mean"], u["headroom"]
    c = rep.get("composite")
    if c is not None:
        meta["composite"] = c["challenger"]["composite"]
        meta["composite_terms"] = dg.MetadataValue.md(composite_markdown(c["challenger"], c["king"]) + f"\n\n{c['live']}")
        if c["king"] is not None:
            meta["king_composite"] = c["king"]["composite"]
            d = c["difference"]
            meta["composite_minus_king"] = f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
    return meta


def promotion_metadata(outcome: dict) -> dict:
    """The composites of challenger and king, for the promoted_router asset."""
    from fugu_pipeline.evaluate.composite import composite_markdown

    c = outcome.get("contest")
    if not c:
        return {}
    meta = {"composite": c["challenger"]["composite"],
            "composite_terms": dg.MetadataValue.md(composite_markdown(c["challenger"], c["king"]) + f"\n\n{c['live']}")}
    if c["king"] is not None:
        meta["king_composite"] = c["king"]["composite"]
        meta["king_composite_terms"] = dg.MetadataValue.md(composite_markdown(c["king"]))
    return meta


def broken_king_ask(context, asked: bool) -> str | None:
    """Who asked for a promoted head that cannot be loaded to be replaced (the history records it):
    this run, through its asset config; None when the config does not ask."""
    if not asked:
        return None
    try:
        run = f"run {context.run.run_id} ({context.asset_key.to_user_string()})"
    except dg.DagsterError:  # an asset invoked directly: no run and no definition behind the context
        run = "a direct invocation"
    return f"asset config replace_broken_king of {run}"
