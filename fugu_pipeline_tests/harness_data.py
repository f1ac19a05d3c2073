"""A routing problem whose heads route exactly as the test says, so a composite difference can be
built to a given size and checked against a hand computation.

Features are one-hot cluster ids; a `normed_linear` head with a single 1 per cluster column sends
every task of that cluster to one worker. Cluster 0: only w0 solves it; cluster 1: only w1;
cluster 2 ("contested"): only w2 solves it. One domain, so one benchmark.
"""

from __future__ import annotations

import numpy as np
import torch

from fugu_pipeline.evaluate.composite import CompositeConfig, audit_mask
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.train.checkpoints import save_checkpoint

WORKERS = ["w0", "w1", "w2"]
CONTRACT = FeatureContract(encoder_id="synthetic-onehot", dim=3)


def controlled_data(n_test: int = 1000, contested_eval: int = 0, contested_train: int = 20, seed: int = 0) -> RoutingData:
    """Train 400 / val 200 / test `n_test` rows; `contested_eval` of the test's eval rows (and none
    of its audit rows) are cluster 2, the rest of the test is clusters 0 and 1 (3:1)."""
    rng = np.random.default_rng(seed)
    ids = [f"t{i:05d}" for i in range(600 + n_test)]
    splits = np.array(["train"] * 400 + ["val"] * 200 + ["test"] * n_test)
    cluster = np.where(rng.random(len(ids)) < 0.75, 0, 1)
    cluster[:contested_train] = 2
    test_rows = np.flatnonzero(splits == "test")
    audit = audit_mask([ids[i] for i in test_rows], CompositeConfig())
    eval_rows = test_rows[~audit]
    cluster[eval_rows[:contested_eval]] = 2
    quality = np.zeros((len(ids), 3))
    quality[np.arange(len(ids)), cluster] = 1.0
    features = np.eye(3, dtype=np.float32)[cluster]
    cost = np.full((len(ids), 3), 0.001)
    return RoutingData(task_ids=ids, prompts=[f"p{i}" for i in range(len(ids))], domains=["math"] * len(ids),
                       splits=splits, worker_ids=WORKERS, features=features, utility=quality.copy(), contract=CONTRACT,
                       quality=quality, cost_usd=cost)


def routing_head(models_dir, data: RoutingData, routes: tuple[int, int, int], *, method: str = "sft", noise: float = 0.0,
                 steps: int = 5, cost: float | None = 0.5, seed: int = 0, data_version: str | None = None):
    """Save a normed_linear checkpoint sending cluster c to worker routes[c]; its receipt records
    `steps` fitness values and a training cost of `cost` (None: none recorded); `data_version`
    names other training data than `data` (default: `data`'s own)."""
    w = torch.zeros(3, 3)
    for c, r in enumerate(routes):
        w[r, c] = 1.0
    if noise:
        w = w + noise * torch.randn(3, 3, generator=torch.Generator().manual_seed(seed))
    metrics = {} if cost is None else {"data_cost_usd": cost}
    return save_checkpoint(models_dir, method, "normed_linear", {"linear.weight": w}, {
        "worker_ids": WORKERS, "feature_contract": CONTRACT, "data_version": data_version or data.data_version,
        "curves": {"val_utility": [0.5 + 0.01 * i for i in range(steps)]}, "metrics": metrics})
