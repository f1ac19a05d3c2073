"""Saving a fitted cascade (`fit.CascadeFit`) as a checkpoint `models/cascade/<hash>/`
(`head.py` holds the format)."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.policies.cascade.head import KIND, cascade_state


def save_cascade(models_dir, data, fit, answer_dim: int, extra_metrics: dict | None = None, training_config: dict | None = None):
    """Save a `fit.CascadeFit` as `models/cascade/<hash>/`; returns the folder."""
    from fugu_pipeline.policies.cascade.answer_features import ANSWER_TEXT_FORMAT
    from fugu_pipeline.policies.cascade.cross_encoder_use import cross_encoder_files
    from fugu_pipeline.train.checkpoints import save_checkpoint

    in_dim = data.dim + answer_dim + data.n_workers
    frontier = fit.choices["*"].frontier if "*" in fit.choices else []
    per = {d: c.frontier for d, c in fit.choices.items() if d != "*" and d in fit.policy.per_domain}
    groups = getattr(fit, "groups", None)  # a group served one worker or the pooled plan: its own searched points
    per.update({d: f for d, f in (getattr(groups, "frontiers", None) or {}).items()
                if d in fit.policy.per_domain and d not in per and f})
    metrics = {
        "selected": fit.selected_kind == "cascade", "selection": {
            "objective": fit.objective, "selected": fit.selected, "selected_kind": fit.selected_kind, "reason": fit.reason,
            "candidates": fit.table()},
        "policy": fit.policy.describe(), "verifier": fit.verifier_figures, "expected_cost_usd": fit.expected_cost,
        "answers_version": fit.answers_version, "fit_splits": ["train", "val"],
        "worker_quality": fit.worker_quality, "answer_kinds": fit.answer_kinds,
        "validation": {c: {"quality": ch.quality, "cost_usd": ch.cost, "utility": ch.utility, "plans_considered": ch.considered}
                       for c, ch in fit.choices.items()},
        "frontier_oof": getattr(fit, "frontier", None) or {},  # policies/cascade/frontier.py
        # the plan per domain (policies/cascade/groups.py): each domain's choice, out of fold
        **({"groups": {"chosen": fit.groups.table(), "merged": [list(m) for m in fit.groups.merged]}}
           if getattr(fit, "groups", None) is not None else {}),
        "val_utility": next((c.mean for c in fit.candidates if c.name == fit.saved_as), None) if fit.saved_as
        else next((c.mean for c in fit.candidates if c.kind == "cascade"), None),
        # what the calls behind the rows it was fitted on cost (the receipt's training cost)
        "data_cost_usd": None if data.cost_usd is None else float(np.nansum(data.cost_usd[np.asarray(data.splits) != "test"])),
        **(extra_metrics or {}),
    }
    cross, write_cross = cross_encoder_files(getattr(fit, "cross_encoder", None))  # its contract; its weights file
    clusters = getattr(fit, "clusters", None)  # the prompt clusters its plans are chosen by (groups.py), if any
    path = save_checkpoint(models_dir, KIND, KIND, cascade_state(fit.verifier, in_dim, data.n_workers, clusters), {
        "worker_ids": data.worker_ids, "feature_contract": data.contract, "dim": data.dim,
        "utility_config": data.utility_config.model_dump() if data.utility_config else None,
        "data_version": data.data_version,
        "head_params": {"policy": fit.policy.model_dump(), "answer_dim": answer_dim, "frontier": frontier,
                        "answer_format": ANSWER_TEXT_FORMAT, "domains_frontier": per,
                        # the reply statistics by name (inputs built without names: the first ten, unrecorded)
                        **({"answer_stats": list(fit.stat_names)} if fit.stat_names else {}),
                        # the context verifier (policies/cascade/verifier_context.py): a reply read with the paid ones
                        **({"context": fit.context} if getattr(fit, "context", None) else {}),
                        # the pooled cap the policy was chosen under: serving keeps its running spend within it
                        **({"cap_usd": fit.cap_usd, "cap_z": fit.cap_z} if getattr(fit, "cap_usd", None) is not None
                           else {}), **cross,
                        # each group's part of that cap, where the groups' plans share it (policies/cascade/spend.py)
                        **({"group_caps": fit.group_caps} if getattr(fit, "group_caps", None) else {}),
                        **({"clusters": clusters.params()} if clusters is not None else {})},
        "training_config": training_config or {}, "metrics": metrics,
        # the search's record (what a receipt cites, as a grid head's figure per grid point): the
        # validation figure of every plan the pooled search considered, in search order
        "curves": {"val_utility": [float(v) for v in fit.choices["*"].figures]}
        if "*" in fit.choices and fit.choices["*"].figures else {},
    })
    write_cross(path)  # beside the manifest that pins its sha256
    return path
