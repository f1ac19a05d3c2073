"""The held-out report of a checkpoint: scores, every metric, JSON and plots.

Shared by the Dagster assets and the command line, so both compute the same figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.baselines import baseline_rows, baseline_summary
from fugu_pipeline.evaluate.metrics import EvalInputs, cost_quality_curve, evaluation_report, pick, summary_line
from fugu_pipeline.evaluate.plots import plot_report
from fugu_pipeline.files import atomic_write


def head_scores(head, features: np.ndarray, domains: list[str] | None = None) -> np.ndarray:
    """Routing scores (N, W) of any head kind; `domains` (one per row) reach the heads that use them."""
    import torch

    from fugu_pipeline.train.head_base import call_head

    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
        return call_head(head, x, domains).float().numpy()


def quality_predictions(head, features: np.ndarray, domains: list[str] | None = None) -> np.ndarray | None:
    """The head's predicted quality (N, W), or None for a head without `predict_quality`."""
    if not hasattr(head, "predict_quality"):
        return None
    from fugu_pipeline.route.budget import quality_of

    return quality_of(head, features, domains).astype(np.float32)


def expected_costs(data, held, calibration=None) -> tuple[np.ndarray | None, float | None]:
    """Expected cost (N, W) of the held-out rows and c_ref, from a model fitted on TRAINING rows
    (the calibration's when given): never the held-out rows' own costs."""
    if data.cost_usd is None:
        return None, None
    from fugu_pipeline.route.expected_cost import fit_expected_cost

    if calibration is not None:
        return calibration.cost_model.predict(held.prompts, held.domains), calibration.reference_cost_usd
    train = data.split("train")
    model = fit_expected_cost(train.prompts, train.domains, train.cost_usd, data.worker_ids)
    perf = train.quality if train.quality is not None else train.utility
    ref = int(np.argmax(np.nanmean(perf, axis=0)))
    return model.predict(held.prompts, held.domains), float(model.predict(train.prompts, train.domains)[:, ref].mean())


def evaluate_checkpoint(checkpoint, data, split: str = "test", n_boot: int = 2000, seed: int = 0, *,
                        calibration=None, budget=None, route_of=None) -> dict:
    """The full held-out report (every metric, the baselines) of one loaded checkpoint on one split of `data`. With a budget
    `calibration` (`route/budget.py`, chosen on validation) the report gains a `budget` section:
    each worker's cost and quality, the router's λ curve and Pareto points, and, for `budget`, the
    operating point chosen on validation, scored on this split. `route_of(rows)`: the route served on
    a split's rows (worker indices), where it is not the head's argmax (a one-shot head at its
    operating point: `policies/oneshot/default_report.served_report`)."""
    held, train = data.split(split), data.split("train")
    if not len(held.task_ids):
        from fugu_pipeline.features.routing_data import TrainingDataError
        from fugu_pipeline.matrix.import_common import HOLD_OUT_HINT

        raise TrainingDataError(f"the {split!r} split has no rows (splits: {data.counts()}): nothing to evaluate on; {HOLD_OUT_HINT}")
    if not len(train.task_ids):
        from fugu_pipeline.features.routing_data import TrainingDataError

        raise TrainingDataError(f"the 'train' split has no rows (splits: {data.counts()}): the report's best fixed worker "
                                "and expected costs are chosen on training rows; evaluate on data that holds the head's "
                                "training rows beside the held-out ones (the file it was trained on)")
    if list(checkpoint.manifest.worker_ids) != list(data.worker_ids):
        raise ValueError(f"checkpoint workers {checkpoint.manifest.worker_ids} differ from the matrix's {data.worker_ids}")
    expected, c_ref = expected_costs(data, held, calibration)
    inp = EvalInputs(
        worker_ids=data.worker_ids, utility=held.utility, scores=head_scores(checkpoint.head, held.features, held.domains),
        train_utility=train.utility, domains=held.domains, quality=held.quality, cost_usd=held.cost_usd,
        latency_s=held.latency_s, train_quality=train.quality,
        quality_pred=quality_predictions(checkpoint.head, held.features, held.domains),
        expected_cost=expected, cost_ref=c_ref, tags=held.tags, train_domains=train.domains,
        routes=None if route_of is None else route_of(held),
    )
    rep = evaluate_report_fields(evaluation_report(inp, n_boot=n_boot, seed=seed), checkpoint, data, split)
    add_policy_cost_curve(rep, inp)
    if calibration is not None:
        from fugu_pipeline.evaluate.budget_report import budget_section

        rep["budget"] = budget_section(checkpoint, data, split, calibration, budget, n_boot=n_boot, seed=seed)
    rep["train_router_utility"] = float(np.mean(
        routed_utility(train.utility, head_scores(checkpoint.head, train.features, train.domains)) if route_of is None else
        pick(train.utility, route_of(train))))
    rep.update(utility_fields(checkpoint, data))
    # the baselines (each worker, random over seeds, oracle, cross-fit oracle) on the same rows
    router = {"utility": rep["router_utility"], **({"quality": rep["router_mean_quality"]} if "router_mean_quality" in rep else {})}
    rep["baselines"] = baseline_rows(data.worker_ids, held.utility, held.quality, held.domains, router=router, seed=seed)
    rep["summary"] = summary_line(rep) + f" | {baseline_summary(rep['baselines'])} | {rep['utility_formula']}"
    return rep


def add_policy_cost_curve(rep: dict, inp: EvalInputs) -> None:
    """The cost–quality sweep for every head: a quality head's comes with the report; a head that
    predicts no quality (SFT, RL, CMA-ES) is swept the same way over its routing probabilities
    (softmax of its scores) against the same expected costs, so its report has the curve too."""
    if "cost_quality_curve" in rep:
        rep["cost_quality_curve_of"] = "quality head"
    elif "cost_quality_points" in rep and inp.expected_cost is not None:
        z = inp.scores - inp.scores.max(axis=1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        rep["cost_quality_curve"] = cost_quality_curve(probs, inp.expected_cost, inp.cost_ref or 0.0, inp.quality, inp.cost_usd)
        rep["cost_quality_curve_of"] = "router probabilities"


def evaluate_report_fields(rep: dict, checkpoint, data, split: str) -> dict:
    rep["split"] = split
    rep["checkpoint"] = str(checkpoint.path)
    rep["method"] = checkpoint.manifest.method
    rep["head_kind"] = checkpoint.manifest.head_kind
    rep["data_version"] = data.data_version
    rep["feature_contract"] = checkpoint.manifest.feature_contract.model_dump(mode="json", exclude={"prompt_rules"})
    rules = checkpoint.manifest.feature_contract.prompt_rules
    rep["prompt_rules"] = None if rules is None else {"fingerprint": rules.fingerprint(), "per_domain": rules.summary()}
    return rep


def utility_fields(checkpoint, data) -> dict:
    """The utility weights every figure of the report was computed with, where they came from,
    and whether the checkpoint was trained with the same ones."""
    u = data.utility_config
    out = {"utility_weights": u.model_dump() if u is not None else None,
           "utility_formula": u.describe() if u is not None else "utility weights unknown",
           "utility_source": data.utility_source}
    trained = checkpoint.manifest.utility_config
    if u is not None and trained is not None and trained != u.model_dump():
        out["utility_note"] = (f"the checkpoint was trained with other weights ({trained}); the figures here "
                               "use the matrix's weights")
    return out


def routed_utility(utility: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each row's utility at its highest-scoring worker."""
    return utility[np.arange(len(scores)), scores.argmax(axis=1)]


def write_report(rep: dict, out_dir: Path, prefix: str = "report") -> tuple[Path, list[Path]]:
    """JSON report (every figure, per-domain rows and curve points included) and PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot_report(rep, out_dir, prefix)
    rep = {**rep, "plots": [p.name for p in plots]}
    path = atomic_write(out_dir / f"{prefix}.json", json.dumps(rep, indent=2, sort_keys=True, default=float))
    return path, plots
