"""Synthetic routing data with recorded answers, for the cascade tests: a cheap worker, a middling
one and a strong dear one; right answers agree, wrong ones differ by worker; the reply's features
carry a noisy sign of being right (`signal`), or none."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.train.verifier import VerifierInputs

W = ["cheap", "mid", "strong"]
P_RIGHT = np.array([0.70, 0.72, 0.95])
COST = np.array([1e-4, 5e-4, 1e-2])
UTILITY = UtilityConfig(cost_weight=0.2, cost_scale_usd=0.01, latency_weight=0.0)


def make(seed: int = 0, n: int = 500, signal: float = 1.5, shared_wrong: bool = False, domains=("math", "chat")):
    rng = np.random.default_rng(seed)
    d = 6
    quality = (rng.random((n, 3)) < P_RIGHT).astype(float)
    final = np.empty((n, 3), dtype=object)
    text = np.empty((n, 3), dtype=object)
    for i in range(n):
        for j, w in enumerate(W):
            wrong = "wrong" if shared_wrong else f"{w}-{rng.integers(0, 50)}"
            final[i, j] = "right" if quality[i, j] else wrong
            text[i, j] = f"The answer is {final[i, j]}"
    prompt = rng.normal(size=(n, d)).astype(np.float32)
    answer = rng.normal(size=(n, 3, 4)).astype(np.float32)
    answer[:, :, 0] += signal * (2 * quality - 1)
    cost = np.tile(COST, (n, 1)) * (0.9 + 0.2 * rng.random((n, 3)))
    latency = np.tile([0.5, 1.0, 2.0], (n, 1))
    splits = np.array([("train", "train", "train", "val", "test")[i % 5] for i in range(n)])
    doms = [domains[i % len(domains)] for i in range(n)]
    utility = np.vectorize(UTILITY.utility)(quality, cost, latency)
    data = RoutingData(task_ids=[f"t{i:04d}" for i in range(n)], prompts=[f"question {i}" for i in range(n)], domains=doms,
                       splits=splits, worker_ids=W, features=prompt, utility=utility,
                       contract=FeatureContract(encoder_id="x", dim=d), quality=quality, cost_usd=cost, latency_s=latency,
                       utility_config=UTILITY)
    grid = AnswerGrid(list(data.task_ids), W, text, ["text"] * n, final, "v1")
    inputs = VerifierInputs(prompt=prompt, answer=answer, has=np.ones((n, 3), bool), target=quality)
    return data, grid, inputs
