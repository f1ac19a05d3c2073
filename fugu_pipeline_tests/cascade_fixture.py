"""Synthetic routing data with recorded answers, for the cascade tests: a cheap worker, a middling
one and a strong dear one; right answers agree, wrong ones differ by worker; the reply's features
carry a noisy sign of being right (`signal`), or none."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.policies.cascade.verifier import VerifierInputs

W = ["cheap", "mid", "strong"]
P_RIGHT = np.array([0.70, 0.72, 0.95])
COST = np.array([1e-4, 5e-4, 1e-2])
UTILITY = UtilityConfig(cost_weight=0.2, cost_scale_usd=0.01, latency_weight=0.0)


def make(seed: int = 0, n: int = 500, signal: float = 1.5, shared_wrong: bool = False, domains=("math", "chat"),
         test_cheap: float | None = None):
    """`test_cheap`: the cheap worker's accuracy on the test rows (new traffic harder than the rows
    a plan is chosen on: the same plan escalates more there)."""
    rng = np.random.default_rng(seed)
    d = 6
    quality = (rng.random((n, 3)) < P_RIGHT).astype(float)
    if test_cheap is not None:
        test = np.array([i % 5 == 4 for i in range(n)])
        quality[test, 0] = (rng.random(int(test.sum())) < test_cheap).astype(float)
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


def agreeing(seed: int = 0, n: int = 400, agree: float = 0.9, p_strong: float = 0.85, signal: float = 1.5):
    """Two workers and quality-only weights: a strong dear one, and a cheap one (1% of its cost) whose
    final answer is the strong one's on `agree` of the rows (right or wrong alike) and a wrong one of
    its own elsewhere; the reply's features carry a noisy sign of being right."""
    rng = np.random.default_rng(seed)
    q_strong = (rng.random(n) < p_strong).astype(float)
    same = rng.random(n) < agree
    quality = np.stack([np.where(same, q_strong, 0.0), q_strong], axis=1)
    final = np.empty((n, 2), dtype=object)
    for i in range(n):
        final[i, 1] = "right" if q_strong[i] else f"wrong-{rng.integers(0, 50)}"
        final[i, 0] = final[i, 1] if same[i] else f"cheap-{rng.integers(0, 50)}"
    text = np.array([[f"The answer is {f}" for f in row] for row in final], dtype=object)
    prompt = rng.normal(size=(n, 6)).astype(np.float32)
    answer = rng.normal(size=(n, 2, 4)).astype(np.float32)
    answer[:, :, 0] += signal * (2 * quality - 1)
    cost = np.tile([1e-4, 1e-2], (n, 1))
    latency = np.tile([0.5, 2.0], (n, 1))
    u = UtilityConfig(cost_weight=0.0, latency_weight=0.0)
    splits = np.array([("train", "train", "train", "val", "test")[i % 5] for i in range(n)])
    data = RoutingData(task_ids=[f"a{i:04d}" for i in range(n)], prompts=[f"question {i}" for i in range(n)],
                       domains=["mc"] * n, splits=splits, worker_ids=["cheap", "strong"], features=prompt,
                       utility=quality.copy(), contract=FeatureContract(encoder_id="x", dim=6), quality=quality,
                       cost_usd=cost, latency_s=latency, utility_config=u)
    grid = AnswerGrid(list(data.task_ids), ["cheap", "strong"], text, ["text"] * n, final, "v1")
    inputs = VerifierInputs(prompt=prompt, answer=answer, has=np.ones((n, 2), bool), target=quality)
    return data, grid, inputs


def mixed(seed: int = 0, n: int = 400, tiny: int = 0, p_cheap_mc: float = 0.3, named: bool = True, apart: float = 0.0):
    """Two workers, quality-only weights, two kinds of prompt: on `code` the cheap worker (1% of the
    strong one's cost) gives the strong one's answer on every row; on `mc` it is right on
    `p_cheap_mc` of the rows, with a wrong answer of its own elsewhere, and the strong one on 85%.
    Nothing in the prompt's or the reply's features tells the kinds apart or a right reply from a
    wrong one, so a pooled plan cannot stop early on code without stopping on multiple choice. `tiny`:
    that many more rows of a third domain, `tiny` (cheap ties the strong worker there too). `named`
    False: every row's domain is "general" (an import without domains); `apart`: how far the two
    kinds' prompt features lie apart (added to the first three columns of the code rows), so prompt
    clusters can find the kinds."""
    rng = np.random.default_rng(seed)
    doms = np.array(["code" if i % 2 else "mc" for i in range(n)] + ["tiny"] * tiny)
    m = len(doms)
    q_strong = (rng.random(m) < np.where(doms == "mc", 0.85, 0.8)).astype(float)
    same = (doms != "mc") | (rng.random(m) < 0.0)
    cheap_right = np.where(same, q_strong, (rng.random(m) < p_cheap_mc).astype(float))
    quality = np.stack([cheap_right, q_strong], axis=1)
    final = np.empty((m, 2), dtype=object)
    for i in range(m):
        final[i, 1] = "right" if q_strong[i] else f"wrong-{rng.integers(0, 50)}"
        final[i, 0] = final[i, 1] if same[i] else ("right" if cheap_right[i] else f"cheap-{rng.integers(0, 50)}")
    text = np.array([[f"The answer is {f}" for f in row] for row in final], dtype=object)
    prompt = rng.normal(size=(m, 6)).astype(np.float32)
    prompt[doms == "code", :3] += apart
    answer = rng.normal(size=(m, 2, 4)).astype(np.float32)
    cost = np.tile([1e-4, 1e-2], (m, 1))
    latency = np.tile([0.5, 2.0], (m, 1))
    u = UtilityConfig(cost_weight=0.0, latency_weight=0.0)
    splits = np.array([("train", "train", "train", "val", "test")[i % 5] for i in range(m)])
    data = RoutingData(task_ids=[f"m{i:04d}" for i in range(m)], prompts=[f"question {i}" for i in range(m)],
                       domains=list(doms) if named else ["general"] * m, splits=splits, worker_ids=["cheap", "strong"],
                       features=prompt, utility=quality.copy(), contract=FeatureContract(encoder_id="x", dim=6),
                       quality=quality, cost_usd=cost, latency_s=latency, utility_config=u)
    grid = AnswerGrid(list(data.task_ids), ["cheap", "strong"], text, ["text"] * m, final, "v1")
    inputs = VerifierInputs(prompt=prompt, answer=answer, has=np.ones((m, 2), bool), target=quality)
    return data, grid, inputs


def close(seed: int = 0, n: int = 300, p_cheap: float = 0.78, p_strong: float = 0.82, signal: float = 0.5):
    """Two workers and quality-only weights, right or wrong independently: a cheap one (1% of the
    strong one's cost) nearly as accurate as the strong one, wrong answers of their own; the reply's
    features carry a weak sign of being right. A plan escalating some rows gains a little over the
    cheap worker alone, too little to be significant on a few hundred rows."""
    rng = np.random.default_rng(seed)
    quality = (rng.random((n, 2)) < np.array([p_cheap, p_strong])).astype(float)
    final = np.array([["right" if quality[i, j] else f"{w}-{rng.integers(0, 50)}" for j, w in enumerate(("c", "s"))]
                      for i in range(n)], dtype=object)
    text = np.array([[f"The answer is {f}" for f in row] for row in final], dtype=object)
    prompt = rng.normal(size=(n, 6)).astype(np.float32)
    answer = rng.normal(size=(n, 2, 4)).astype(np.float32)
    answer[:, :, 0] += signal * (2 * quality - 1)
    cost = np.tile([1e-4, 1e-2], (n, 1))
    splits = np.array([("train", "train", "train", "val", "test")[i % 5] for i in range(n)])
    data = RoutingData(task_ids=[f"c{i:04d}" for i in range(n)], prompts=[f"question {i}" for i in range(n)],
                       domains=["mc"] * n, splits=splits, worker_ids=["cheap", "strong"], features=prompt,
                       utility=quality.copy(), contract=FeatureContract(encoder_id="x", dim=6), quality=quality,
                       cost_usd=cost, latency_s=np.tile([0.5, 2.0], (n, 1)),
                       utility_config=UtilityConfig(cost_weight=0.0, latency_weight=0.0))
    grid = AnswerGrid(list(data.task_ids), ["cheap", "strong"], text, ["text"] * n, final, "v1")
    inputs = VerifierInputs(prompt=prompt, answer=answer, has=np.ones((n, 2), bool), target=quality)
    return data, grid, inputs


def take(data: RoutingData, grid: AnswerGrid, inputs: VerifierInputs, rows):
    """The three row-aligned inputs cut (or reordered) to `rows`."""
    rows = np.asarray(rows, dtype=np.int64)
    return data.subset(rows), grid.subset(rows), VerifierInputs(
        inputs.prompt[rows], inputs.answer[rows], inputs.has[rows], inputs.target[rows], inputs.stat_names)
