"""The held-out report of a checkpoint (DESIGN §5): scores, every metric, JSON and plots.

Shared by the Dagster assets and the command line, so both compute the same figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.baselines import baseline_rows, baseline_summary
from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report, summary_line
from fugu_pipeline.evaluate.plots import plot_report
from fugu_pipeline.files import atomic_write


def head_scores(head, features: np.ndarray, domains: list[str] | None = None) -> np.ndarray:
    """Routing scores (N, W) of any head kind; `domains` (one per row) reach the heads that use them."""
    import torch

    from fugu_pipeline.train.heads import call_head

    with torch.inference_mode():
        x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
        return call_head(head, x, domains).float().numpy()


def quality_predictions(head, features: np.ndarray, domains: list[str] | None = None) -> np.ndarray | None:
    """Predicted quality (N, W) in [0, 1] from heads that predict it, else None."""
    if not hasattr(head, "predict_quality"):
        return None
    import torch

    from fugu_pipeline.train.heads import head_quality

    with torch.inference_mode():
        q = head_quality(head, torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)), domains)
        return None if q is None else q.float().numpy()


def evaluate_checkpoint(checkpoint, data, split: str = "test", n_boot: int = 2000, seed: int = 0) -> dict:
    """The full DESIGN §5 report of one loaded checkpoint on one split of `data`."""
    held, train = data.split(split), data.split("train")
    if list(checkpoint.manifest.worker_ids) != list(data.worker_ids):
        raise ValueError(f"checkpoint workers {checkpoint.manifest.worker_ids} differ from the matrix's {data.worker_ids}")
    inp = EvalInputs(
        worker_ids=data.worker_ids, utility=held.utility, scores=head_scores(checkpoint.head, held.features, held.domains),
        train_utility=train.utility, domains=held.domains, quality=held.quality, cost_usd=held.cost_usd,
        latency_s=held.latency_s, train_quality=train.quality,
        quality_pred=quality_predictions(checkpoint.head, held.features, held.domains),
    )
    rep = evaluation_report(inp, n_boot=n_boot, seed=seed)
    rep["split"] = split
    rep["checkpoint"] = str(checkpoint.path)
    rep["method"] = checkpoint.manifest.method
    rep["head_kind"] = checkpoint.manifest.head_kind
    rep["data_version"] = data.data_version
    rep["train_router_utility"] = float(np.mean(routed_utility(train.utility, head_scores(checkpoint.head, train.features, train.domains))))
    rep.update(utility_fields(checkpoint, data))
    # the baselines (each worker, random over seeds, oracle, cross-fit oracle) on the same rows
    router = {"utility": rep["router_utility"], **({"quality": rep["router_mean_quality"]} if "router_mean_quality" in rep else {})}
    rep["baselines"] = baseline_rows(data.worker_ids, held.utility, held.quality, held.domains, router=router, seed=seed)
    rep["summary"] = summary_line(rep) + f" | {baseline_summary(rep['baselines'])} | {rep['utility_formula']}"
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
