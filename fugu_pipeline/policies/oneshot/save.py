"""Checkpoints of the heads `fit.py` chose: `models/<kind>/<content hash>/` (SFT heads under
`models/sft/`), each manifest carrying its validation figures, the selection rule and why, and
whether it is the selected head. The same checkpoint format, weight checks and content hash as
every other head (`checkpoints.py`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.train.checkpoints import save_checkpoint
from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
from fugu_pipeline.policies.oneshot.predictors import QualityPredictor
from fugu_pipeline.train.selection import routed


@dataclass
class SavedHead:
    kind: str
    name: str
    path: Path
    figures: dict[str, float]
    selected: bool
    # out-of-fold quality on the validation rows (the head is refitted on them, so its own
    # predictions there are in-sample); None: use the head's
    val_quality: np.ndarray | None = None
    # out-of-fold quality over every non-test row (in order) and each row's fold: what its budget
    # calibration's λ curve and the default operating point (default_point.py) are drawn on; None
    # where the head predicts none (a head fitted on train only: its curve is drawn on validation)
    oof_quality: np.ndarray | None = None
    oof_folds: np.ndarray | None = None


def selection_block(report) -> dict[str, Any]:
    """What the choice rested on, the same in every manifest of one `fugu-lite train` run."""
    out = {
        "protocol": report.protocol, "objective": report.objective, "rule": report.rule, "rule_reason": report.rule_reason,
        "rule_check": report.rule_check, "selected": report.selected, "selected_kind": report.selected_kind,
        "reason": report.reason, "candidates": report.table(),  # no timings: they would change the hash
    }
    if report.ensemble is not None:
        out["ensemble"] = {"name": report.ensemble["name"], "figures": report.ensemble["figures"],
                           "nested_check": report.ensemble_check, "curve": report.ensemble["curve"],
                           "calibration": {k: list(v) for k, v in report.ensemble["calibration"].items()},
                           "brier_raw_calibrated": report.ensemble["brier_raw_calibrated"]}
    return out


def _common_metrics(data: RoutingData, fd, figures: dict[str, float], train_u: float) -> dict[str, Any]:
    fixed = int(np.argmax(fd.utility.mean(axis=0)))
    pooled = figures.get("pooled")
    return {
        # validation utility of the greedy route on out-of-fold predictions (what promotion ranks by)
        "val_utility": pooled if pooled is not None else figures.get("apgr"),
        "validation": figures, "fit_splits": ["train", "val"], "train_utility": train_u,
        "n_train": int((data.splits == "train").sum()), "n_val": int((data.splits == "val").sum()),
        "best_fixed_worker": data.worker_ids[fixed], "val_best_fixed_utility": float(fd.utility[:, fixed].mean()),
        "data_cost_usd": None if data.cost_usd is None else float(np.nansum(data.cost_usd[fd.rows])),
    }


def save_fitted(data: RoutingData, fd, report, fitted: dict[str, Any], ens_head, cfg: TrainSetConfig,
                models_dir: Path, extra_metrics: dict[str, Any] | None = None) -> list:
    extra = dict(extra_metrics or {})  # recorded in every manifest: feature_dtype, prompt_rules_choice
    block = selection_block(report)
    saved = []
    is_val = data.splits[fd.rows] == "val"  # the validation rows among the non-test rows fd holds
    folds = _folds(data, fd, cfg)
    jobs = [(kind, name) for kind, name in report.best_per_kind.items()]
    if ens_head is not None:
        jobs.append(("ensemble", "ensemble"))
    for kind, name in jobs:
        t0 = time.perf_counter()
        oof = None
        if kind == "ensemble":
            head, figures, params = ens_head, report.ensemble["figures"], {"members": report.ensemble["name"]}
            oof = report.ensemble["quality"]
            curve = report.ensemble["curve"]
            grid = cfg.heads.ensemble.model_dump() if cfg.heads.ensemble else {}
        else:
            cand = next(c for c in report.candidates if c.name == name)
            head, figures, params = fitted[name], cand.figures, cand.params
            oof = cand.quality
            by = report.rule
            curve = [float(c.figures.get(by, c.figures.get("apgr", np.nan))) for c in report.candidates if c.kind == kind]
            grid = getattr(cfg.heads, kind).model_dump()
        selected = name == report.selected
        training_config = {"kind": kind, "name": report.ensemble["name"] if kind == "ensemble" else name, "params": params,
                           "grid": grid, "folds": cfg.folds, "seed": cfg.seed, "objective": cfg.objective,
                           "selection_rule": cfg.selection_rule}
        if isinstance(head, QualityPredictor):
            with torch.no_grad():
                s = head(torch.from_numpy(fd.features), fd.domains.tolist()).numpy()
            metrics = {**_common_metrics(data, fd, figures, float(routed(fd.utility, s).mean())),
                       "selected": selected, "selection": block, **extra}
            path = save_checkpoint(models_dir, kind, kind, head.state_dict(), {
                "worker_ids": data.worker_ids, "feature_contract": data.contract, "dim": data.dim,
                "utility_config": data.utility_config.model_dump() if data.utility_config else None,
                "data_version": data.data_version, "head_params": head.head_params(), "training_config": training_config,
                "metrics": metrics, "curves": {"val_utility": curve}, "wall_s": round(time.perf_counter() - t0, 3),
            })
            val_quality = None if oof is None else np.asarray(oof)[is_val]
            oof_all = None if oof is None else np.asarray(oof)
        else:  # an SFT TrainResult: its own metrics (val_utility on the val split it stopped on) plus the selection
            val_quality = oof_all = None  # fitted on train only: its own predictions on val are out of sample
            head.metrics.update({"validation": figures, "selected": selected, "selection": block, **extra})
            head.config = {**head.config, "selection": training_config}
            path = head.save(models_dir)
        saved.append(SavedHead(kind=kind, name=training_config["name"], path=path, figures=figures, selected=selected,
                               val_quality=val_quality, oof_quality=oof_all, oof_folds=folds))
    return saved


def _folds(data: RoutingData, fd, cfg: TrainSetConfig) -> np.ndarray:
    """Each non-test row's fold, as `fit.select_heads` made them (hash folds, or one per domain)."""
    if cfg.objective == "lodo":
        doms = sorted(set(fd.domains.tolist()))
        return np.array([doms.index(d) for d in fd.domains])
    from fugu_pipeline.train.selection import fold_ids

    return fold_ids([data.task_ids[i] for i in fd.rows], cfg.folds, cfg.seed)
