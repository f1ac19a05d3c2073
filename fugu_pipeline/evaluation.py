"""From the reward matrix and the encoder to trainable data, reports and promotion candidates.

Shared by the Dagster assets and the command line, so both compute the same figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fugu_pipeline import reward_matrix as rm
from fugu_pipeline.files import atomic_write
from fugu_pipeline.metrics import EvalInputs, evaluation_report, plot_report, summary_line
from fugu_pipeline.schemas import UtilityConfig


def load_routing_data(db_path: Path, encoder, cache_root: Path, *, val_fraction: float = 0.15, seed: int = 0):
    """The reward matrix's complete rows with their cached features, as `RoutingData`.
    When the matrix has no 'val' rows, a deterministic share of 'train' becomes validation.
    Returns (data, embed_result)."""
    import duckdb

    from fugu_pipeline.embedding_cache import embed_prompts
    from fugu_pipeline.training_data import RoutingData, carve_validation

    arrays = rm.read_arrays(db_path)
    if not arrays.task_ids:
        raise rm.RewardMatrixError(f"{db_path}: no complete rows (every task needs a reward for every worker)")
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        util_json = con.execute("SELECT value FROM meta WHERE key='utility'").fetchone()[0]
    finally:
        con.close()
    emb = embed_prompts(arrays.prompts, arrays.domains, encoder, cache_root)
    data = RoutingData(
        task_ids=arrays.task_ids, prompts=arrays.prompts, domains=arrays.domains, splits=arrays.splits,
        worker_ids=arrays.worker_ids, features=emb.vectors, utility=arrays.utility, contract=emb.contract,
        quality=arrays.quality if not np.isnan(arrays.quality).any() else None,
        cost_usd=arrays.cost_usd, latency_s=arrays.latency_s,
        utility_config=UtilityConfig.model_validate_json(util_json), feature_task_ids=arrays.task_ids,
    )
    if "val" not in set(data.splits.tolist()):
        data = carve_validation(data, fraction=val_fraction, seed=seed)
    return data, emb


def head_scores(head, features: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return head(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))).float().numpy()


def quality_predictions(head, features: np.ndarray) -> np.ndarray | None:
    if not hasattr(head, "predict_quality"):
        return None
    import torch

    with torch.inference_mode():
        return head.predict_quality(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))).float().numpy()


def evaluate_checkpoint(checkpoint, data, split: str = "test", n_boot: int = 2000, seed: int = 0) -> dict:
    """The full DESIGN §5 report of one loaded checkpoint on one split of `data`."""
    held, train = data.split(split), data.split("train")
    if list(checkpoint.manifest.worker_ids) != list(data.worker_ids):
        raise ValueError(f"checkpoint workers {checkpoint.manifest.worker_ids} differ from the matrix's {data.worker_ids}")
    inp = EvalInputs(
        worker_ids=data.worker_ids, utility=held.utility, scores=head_scores(checkpoint.head, held.features),
        train_utility=train.utility, domains=held.domains, quality=held.quality, cost_usd=held.cost_usd,
        latency_s=held.latency_s, train_quality=train.quality,
        quality_pred=quality_predictions(checkpoint.head, held.features),
    )
    rep = evaluation_report(inp, n_boot=n_boot, seed=seed)
    rep["split"] = split
    rep["checkpoint"] = str(checkpoint.path)
    rep["method"] = checkpoint.manifest.method
    rep["head_kind"] = checkpoint.manifest.head_kind
    rep["data_version"] = data.data_version
    rep["train_router_utility"] = float(np.mean(_picked(train.utility, head_scores(checkpoint.head, train.features))))
    rep["summary"] = summary_line(rep)
    return rep


def _picked(utility: np.ndarray, scores: np.ndarray) -> np.ndarray:
    return utility[np.arange(len(scores)), scores.argmax(axis=1)]


def write_report(rep: dict, out_dir: Path, prefix: str = "report") -> tuple[Path, list[Path]]:
    """JSON report (every figure, per-domain rows and curve points included) and PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot_report(rep, out_dir, prefix)
    rep = {**rep, "plots": [p.name for p in plots]}
    path = atomic_write(out_dir / f"{prefix}.json", json.dumps(rep, indent=2, sort_keys=True, default=float))
    return path, plots


def candidate(checkpoint, data, expected_contract=None):
    """Score a checkpoint on the frozen held-out rows for promotion."""
    from fugu_pipeline.checkpoints import weight_sanity
    from fugu_pipeline.promotion import Candidate

    test, train = data.split("test"), data.split("train")
    fixed = int(np.argmax(train.utility.mean(axis=0)))
    contract_problems = checkpoint.manifest.feature_contract.differences(expected_contract) if expected_contract else []
    workers_ok = list(checkpoint.manifest.worker_ids) == list(data.worker_ids)
    if not workers_ok:
        contract_problems.append(f"workers {checkpoint.manifest.worker_ids} differ from the matrix's {data.worker_ids}")
    if contract_problems or not workers_ok:
        test_u = np.full(len(test.task_ids), np.nan)
        train_u = float("nan")
        val_u = None
    else:
        test_u = _picked(test.utility, head_scores(checkpoint.head, test.features))
        train_u = float(np.mean(_picked(train.utility, head_scores(checkpoint.head, train.features))))
        val = data.split("val")
        val_u = float(np.mean(_picked(val.utility, head_scores(checkpoint.head, val.features)))) if len(val.task_ids) else None
    return Candidate(
        path=str(checkpoint.path), method=checkpoint.manifest.method, content_hash=checkpoint.manifest.content_hash,
        test_utility=test_u, best_fixed_utility=test.utility[:, fixed], train_router_utility=train_u,
        weight_problems=weight_sanity(checkpoint.state_dict, checkpoint.manifest),
        contract_problems=contract_problems, val_router_utility=val_u,
    )
