"""The multi-turn coordinator's assets: `router_roles` (trajectory CMA-ES) and `eval_report_roles`
(live held-out report against the one-step router, the answer-aware cascade and the best fixed
worker, then king versus challenger on models/promoted/roles.json). Thin: the work is in `policies/coordinator/project.py`."""

import dagster as dg

from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.data import reward_matrix
from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.metadata import LIVE_KIND, LIVE_WORKERS, tidy
from fugu_pipeline.defs.partitions import GPU_POOL
from fugu_pipeline.defs.reports import promoted_router
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.settings import SETTINGS_FILES
from fugu_pipeline.defs.staleness import require_fresh_inputs
from fugu_pipeline.defs.versions import file_version
from fugu_pipeline.steps.versions import code_version

ROLES_SETTINGS = SETTINGS_FILES["config_train_roles"]


class RolesAssetConfig(dg.Config):
    config_path: str = "configs/train_roles.yaml"
    """Roles trainer YAML relative to the project directory (RolesConfig)."""
    eval_seeds: int = 1
    """Sampling seeds per held-out task in the report."""
    margin: float | None = None
    """Composite the challenger must gain over the promoted coordinator (None: the policy file's, 0.02:
    TinyRouter's king + 0.02 rule)."""
    max_train_gap: float | None = None
    """Largest allowed train minus held-out reward (None: the policy file's, 0.25)."""
    replace_broken_king: bool = False
    """When the promoted coordinator cannot be loaded, let the new one replace it facing the baselines
    only; the history records that this run asked (default: the step fails and says why, and the
    broken king stays for someone to restore)."""


def _open(context, config: RolesAssetConfig, pipeline: PipelineResource, encoder: EncoderResource):
    from fugu_pipeline.policies.coordinator.project import open_run, project_tasks, roles_encoder_settings
    from fugu_pipeline.config_files import ConfigError
    from fugu_pipeline.policies.coordinator.train import load_roles_config
    from fugu_pipeline.workers.catalog import load_latest

    path = pipeline.paths.resolve(config.config_path)
    try:
        cfg = load_roles_config(path)
    except ConfigError as exc:
        raise explained_failure(str(exc)) from None

    workers = pipeline.load_workers()
    refused: list = []  # a batch file the reward matrix left out is left out here too, with a warning
    try:
        tasks = project_tasks(pipeline.paths.benchgen, pipeline.paths.reward_db, refused)
    except ValueError as exc:
        raise explained_failure(str(exc)) from None
    for exc in refused:
        context.log.warning(f"batch file left out as the matrix leaves it out: {exc.first_problem()}")
    settings = roles_encoder_settings(encoder.model, cfg.max_length, revision=encoder.revision, device=encoder.device,
                                      dtype=encoder.dtype)
    run = open_run(workers, settings, pipeline.paths.data / "trajectories", tasks, cfg,
                   catalog=load_latest(pipeline.paths.catalog))
    return cfg, tasks, run


def _stop(exc: Exception) -> dg.Failure:
    return explained_failure(f"{type(exc).__name__}: {exc}")


@dg.asset(deps=[reward_matrix, promoted_router, ROLES_SETTINGS], pool=GPU_POOL, group_name="multi_turn",
          kinds={"pytorch", "safetensors", LIVE_KIND}, tags=LIVE_WORKERS,
          code_version=code_version("fugu_pipeline.policies.coordinator.project", "fugu_pipeline.policies.coordinator.search"))
def router_roles(context: dg.AssetExecutionContext, config: RolesAssetConfig, pipeline: PipelineResource,
                 encoder: EncoderResource) -> dg.Output[str]:
    """Calls the configured workers live (every session of training; with real workers it spends money).
    The multi-turn coordinator (TinyRouter): a roles head (worker + Thinker/Worker/Verifier logits
    over the encoded transcript) trained by separable CMA-ES on live trajectory reward, with common
    random numbers, warm-started from the promoted one-step router where the encoders match.
    Trajectories are stored per (task, head, seed): a re-run or a killed run calls nothing twice.
    Output: models/roles/<content hash>/."""
    from fugu_pipeline.policies.coordinator.project import train_coordinator
    from fugu_pipeline.route.promoted import promoted_checkpoint_path
    from fugu_pipeline.route.router import RouterError
    from fugu_pipeline.session.runner import BudgetExhausted
    from fugu_pipeline.workers.contract import FatalWorkerError

    require_fresh_inputs(context)
    cfg, tasks, run = _open(context, config, pipeline, encoder)
    try:
        one_step = promoted_checkpoint_path(pipeline.paths.models)
    except RouterError:
        one_step = None
    with run as r:
        try:
            path, result = train_coordinator(r, tasks, cfg, pipeline.paths.models, one_step_checkpoint=one_step,
                                             log=context.log.info)
        except (FatalWorkerError, BudgetExhausted, ValueError) as exc:
            raise _stop(exc) from None
        calls = dict(r.caller.calls)
    m = result.metrics
    return dg.Output(str(path), data_version=dg.DataVersion(path.name), metadata=tidy({
        "checkpoint": dg.MetadataValue.path(str(path)),
        "param_count": int(result.weight.size),
        "best_generation": result.best_generation,
        "val_reward": float(m["val_reward"]), "val_accuracy": float(m["val_accuracy"]),
        "val_turns": float(m["val_turns"]), "start_val_reward": float(m["start_val_reward"]),
        "worker_calls_this_run": dg.MetadataValue.json(calls),
        "trajectories": dg.MetadataValue.path(str(r.runner.store.path)),
        "curves": dg.MetadataValue.json(result.curves),
    }))


@dg.asset(deps=[SETTINGS_FILES["config_promotion"]], pool=GPU_POOL, group_name="multi_turn", kinds={"json", LIVE_KIND},
          tags=LIVE_WORKERS, code_version=code_version("fugu_pipeline.policies.coordinator.project"))
def eval_report_roles(context: dg.AssetExecutionContext, config: RolesAssetConfig, pipeline: PipelineResource,
                      encoder: EncoderResource, router_roles: str, router_es: str, router_cascade: dict) -> dg.Output[dict]:
    """Calls the configured workers live (every held-out session; with real workers it spends money).
    Live multi-turn report on the held-out tasks: accuracy with a 95% interval, turns and cost
    per correct answer, role and worker usage per turn, against the one-step router (the promoted
    one; the latest CMA-ES checkpoint when none is promoted), the answer-aware cascade (the promoted
    router when it is a cascade, else `router_cascade`'s; none when the matrix holds no
    replies: the report says so), run over the fixed workers' replies (turns = calls), and the
    best fixed worker (chosen on train), per domain with a verdict on whether delegation is worth
    its extra calls. Then the one
    contest every kind goes through: the coordinator replaces models/promoted/roles.json only if it
    passes every gate and beats the promoted coordinator's composite (its live and efficiency terms
    from the session loop) by the margin."""
    from pathlib import Path

    from fugu_pipeline.defs.harness import policy_for
    from fugu_pipeline.evaluate.metrics import ci_text
    from fugu_pipeline.defs.harness import broken_king_ask
    from fugu_pipeline.policies.coordinator.project import evaluate_coordinator
    from fugu_pipeline.session.runner import BudgetExhausted
    from fugu_pipeline.train.checkpoints import CheckpointError
    from fugu_pipeline.workers.contract import FatalWorkerError

    require_fresh_inputs(context)
    cfg, tasks, run = _open(context, config, pipeline, encoder)
    # the project's promotion policy (configs/promotion.yaml: composite, overfit rule, gates), as for the router
    policy = policy_for(pipeline, context=context, margin=config.margin, max_train_gap=config.max_train_gap)
    with run as r:
        try:
            rep = evaluate_coordinator(r, Path(router_roles), tasks, cfg, pipeline.paths.models, seeds=config.eval_seeds,
                                       policy=policy, one_step_fallback=Path(router_es),
                                       cascade_fallback=Path(router_cascade["cascade"]) if router_cascade.get("cascade") else None,
                                       device=encoder.device, log=context.log.info,
                                       replace_broken_king=broken_king_ask(context, config.replace_broken_king))
        except (FatalWorkerError, BudgetExhausted, ValueError, CheckpointError) as exc:
            raise _stop(exc) from None
    p = rep["policies"]
    table = ["| domain | policy | accuracy [95% CI] | turns / correct | cost / correct | mean turns | coordinator − it [95% CI] |",
             "|---|---|---|---|---|---|---|"]
    for d in rep["per_domain"]:
        for name in ("coordinator", "one_step", "cascade", "best_fixed"):
            if name in d["policies"]:
                s, a = d["policies"][name], d["policies"][name]["accuracy"]
                gain = d.get(f"coordinator_vs_{name}")
                table.append(f"| {d['domain']} | {name} | {a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}] | "
                             f"{s['turns_per_correct'] or float('nan'):.2f} | {s['cost_per_correct_usd'] or float('nan'):.5f} | "
                             f"{s['mean_turns']:.2f} | {ci_text(gain, '+.3f') if gain else ''} |")
    promo = rep.get("promotion", {})
    from fugu_pipeline.defs.harness import promotion_metadata

    return dg.Output({"checkpoint": router_roles, "report": rep["report_path"], "promoted": promo.get("promoted", False)},
                     data_version=dg.DataVersion(file_version(Path(rep["report_path"]))),
                     metadata=tidy({
                         "coordinator_accuracy": p["coordinator"]["accuracy"]["mean"],
                         "best_fixed_accuracy": p["best_fixed"]["accuracy"]["mean"],
                         "best_fixed_worker": rep["best_fixed_worker"],
                         **({"one_step_accuracy": p["one_step"]["accuracy"]["mean"]} if "one_step" in p else {}),
                         **({"cascade_accuracy": p["cascade"]["accuracy"]["mean"]} if "cascade" in p else {}),
                         "cascade_baseline": rep["cascade"].get("source") or f"none: {rep['cascade'].get('missing')}",
                         "coordinator_turns_per_correct": p["coordinator"]["turns_per_correct"] or float("nan"),
                         "one_step_router": rep.get("one_step_router") or "none",
                         "per_domain": dg.MetadataValue.md("\n".join(table)),
                         "verdicts": dg.MetadataValue.md("\n".join(f"- {v}" for v in rep["verdicts"])),
                         "usage_per_turn": dg.MetadataValue.json(rep["usage_per_turn"]),
                         "promoted": bool(promo.get("promoted", False)),
                         "decision": dg.MetadataValue.md("\n".join(f"- {x}" for x in promo.get("reasons", []))),
                         "report": dg.MetadataValue.path(rep["report_path"]),
                         **promotion_metadata(promo),
                     }))
