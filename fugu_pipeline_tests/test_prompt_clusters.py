"""Prompt clusters for an import without domains (`train/clusters.py`): a split of the prompts stands
where they stand apart from one Gaussian blob of their covariance, or where the workers do
differently on its parts; a cluster is split again within where the same holds there."""

from __future__ import annotations

import numpy as np

from fugu_pipeline.train.clusters import OUTCOME_Z, fit_clusters, fold_agreement, outcome_z, pick_groups

D = 64


def _kinds(sep: float, n: int = 300, seed: int = 0):
    """Three kinds of prompt: A far from the other two; B and C `sep` apart along one direction."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=D)
    sub = rng.normal(size=D)
    sub /= np.linalg.norm(sub)
    X = np.vstack([rng.normal(size=(n, D)) + 8 * base, rng.normal(size=(n, D)) - 8 * base + sep * sub,
                   rng.normal(size=(n, D)) - 8 * base - sep * sub])
    return X, np.repeat(np.array(["A", "B", "C"]), n)


def _quality(kind: np.ndarray, differ: bool, seed: int = 1) -> np.ndarray:
    """Three workers; where `differ`, worker 0 is right on B and worker 1 on C (each 85% of the time),
    else both are right 60% of the time on either; worker 2 (the strongest) is right 90% of the time."""
    rng = np.random.default_rng(seed)
    p = np.full((len(kind), 3), 0.6)
    p[:, 2] = 0.9
    if differ:
        p[kind == "B", 0], p[kind == "B", 1] = 0.85, 0.35
        p[kind == "C", 0], p[kind == "C", 1] = 0.35, 0.85
    return (rng.random(p.shape) < p).astype(float)


def test_the_workers_difference_reads_which_worker_does_well_not_how_hard_the_prompts_are():
    rng = np.random.default_rng(0)
    kind = np.repeat(np.array(["B", "C"]), 200)
    labels = (kind == "C").astype(int)
    assert outcome_z(_quality(kind, differ=True), labels, rng) >= OUTCOME_Z
    assert abs(outcome_z(_quality(kind, differ=False), labels, rng)) < 3
    easy = np.where((kind == "B")[:, None], 1.0, 0.0) * np.ones((1, 3))  # every worker right on B, wrong on C
    assert outcome_z(easy, labels, rng) == 0.0  # each row's mean taken out: nothing left to differ
    one_worker_ahead = _quality(kind, differ=False)
    one_worker_ahead[kind == "B", 2] = 1.0  # the strongest right on every B row: a part where it alone gains
    one_worker_ahead[kind == "C", 2] = 0.6
    assert outcome_z(one_worker_ahead, labels, rng) >= OUTCOME_Z
    assert outcome_z(_quality(kind, differ=True), np.zeros(len(kind), int), rng) == 0.0  # one part: nothing to compare


def test_a_cluster_splits_again_where_the_workers_do_differently_on_its_parts():
    """B and C lie close (their split within the cluster stands less than the gap above its blob):
    the prompts alone give two clusters, A and B+C; with workers that do differently on B and C the
    B+C cluster splits, and each kind falls in a cluster of its own; with workers that do alike it
    stays whole."""
    X, kind = _kinds(sep=2.0)
    alone = fit_clusters(X, 40)
    assert alone.apart and len(alone.names) == 2 and alone.refined == []
    same = fit_clusters(X, 40, quality=_quality(kind, differ=False))
    assert len(same.names) == 2 and same.refined == []
    got = fit_clusters(X, 40, quality=_quality(kind, differ=True))
    assert len(got.names) == 3, got.refined
    (r,) = got.refined
    assert r["rows"] == 600 and r["into"] == 2 and r["outcome_z"] >= OUTCOME_Z
    assert r["silhouette"] - r["null_silhouette"] < 0.05  # the prompts alone would not have split it
    label = got.assign(X)
    mostly = {}
    for k in "ABC":
        names, counts = np.unique(label[kind == k], return_counts=True)
        assert counts.max() >= 0.8 * (kind == k).sum(), (k, names, counts)
        mostly[k] = names[np.argmax(counts)]
    assert len(set(mostly.values())) == 3, mostly


def test_prompts_that_do_not_fall_apart_split_only_where_the_workers_do_differently():
    """Two kinds of prompt that overlap (their means 3 noise widths apart along one direction of 64):
    the prompts alone keep one choice; where the workers do differently on them the split stands,
    each kind mostly in a cluster of its own, and the line says why; where they do alike, it does not."""
    rng = np.random.default_rng(3)
    kind = np.repeat(np.array(["B", "C"]), 300)
    u = rng.normal(size=D)
    X = rng.normal(size=(600, D)) + np.where(kind == "B", 1.5, -1.5)[:, None] * u / np.linalg.norm(u)
    lines: list[str] = []
    rows = np.arange(len(X))
    doms = np.full(len(X), "general")
    assert pick_groups("auto", doms, rows, X, None, 40, log=lines.append)[0] == []
    assert "do not fall apart" in lines[-1] and "standard deviations" not in lines[-1]
    groups, _, labels, clusters = pick_groups("auto", doms, rows, X, None, 40, log=lines.append,
                                              quality=_quality(kind, differ=True))
    assert len(groups) == 2 and clusters.outcome_z >= OUTCOME_Z
    for k in "BC":
        assert np.unique(labels[kind == k], return_counts=True)[1].max() >= 0.8 * 300
    assert "the workers do differently on the parts: " in lines[-1] and "standard deviations of random splits" in lines[-1]
    lines.clear()
    assert pick_groups("auto", doms, rows, X, None, 40, log=lines.append, quality=_quality(kind, differ=False))[0] == []
    assert "nor do the workers do differently on them: " in lines[-1] and f"less than {OUTCOME_Z:g}" in lines[-1]


def test_within_a_cluster_the_prompts_gap_alone_does_not_split_it_where_the_workers_do_alike():
    """B and C stand apart within their cluster by the prompts alone (the gap, without the workers'
    results, splits it); where the workers do alike on B and C the cluster stays whole, where they do
    differently it splits."""
    X, kind = _kinds(sep=4.0)
    alone = fit_clusters(X, 40)
    assert len(alone.names) == 3 and "outcome_z" not in alone.refined[0]
    assert alone.refined[0]["silhouette"] - alone.refined[0]["null_silhouette"] >= 0.05
    same = fit_clusters(X, 40, quality=_quality(kind, differ=False))
    assert len(same.names) == 2 and same.refined == []
    assert len(fit_clusters(X, 40, quality=_quality(kind, differ=True)).names) == 3


def _weakly(kind: np.ndarray, eps: float, seed: int = 1) -> np.ndarray:
    """Worker 0 `eps` better on B, worker 1 `eps` better on C, both right 60% of the time otherwise;
    worker 2 right 90% of the time."""
    rng = np.random.default_rng(seed)
    p = np.full((len(kind), 3), 0.6)
    p[:, 2] = 0.9
    p[kind == "B", 0] += eps
    p[kind == "C", 1] += eps
    return (rng.random(p.shape) < p).astype(float)


def test_clusters_a_cascade_plans_by_must_hold_without_each_folds_rows():
    """Two overlapping kinds of prompt, split only where the workers do differently on them. Where
    they do clearly differently, the clusters refitted without each fold's rows put almost every row
    of that fold where the clusters of every row do, and the split stands, with a line saying so.
    Where the workers' difference barely clears the bar on every row, refits without a fold's rows
    do not split at all: a choice per cluster would hang on the rows it is judged on, so there is
    one choice, with a line naming the fold. Without folds the same split stands."""
    rng = np.random.default_rng(3)
    kind = np.repeat(np.array(["B", "C"]), 300)
    u = rng.normal(size=D)
    X = rng.normal(size=(600, D)) + np.where(kind == "B", 1.5, -1.5)[:, None] * u / np.linalg.norm(u)
    rows, doms = np.arange(len(X)), np.full(len(X), "general")
    folds = rows % 5
    clear = _weakly(kind, 0.25)
    held = fold_agreement(fit_clusters(X, 40, quality=clear), X, rows, folds, 40, clear)
    assert sorted(held) == [0, 1, 2, 3, 4] and min(held.values()) >= 0.95, held
    lines: list[str] = []
    groups = pick_groups("auto", doms, rows, X, None, 40, log=lines.append, quality=clear, folds=folds)[0]
    assert len(groups) == 2, lines
    said = [line for line in lines if "hold across the folds" in line]
    assert len(said) == 1 and f"{min(held.values()):.1%} to {max(held.values()):.1%}" in said[0], lines

    weak = _weakly(kind, 0.1)
    barely = fit_clusters(X, 40, quality=weak)
    assert barely.apart and OUTCOME_Z <= barely.outcome_z < 1.5 * OUTCOME_Z, barely.outcome_z
    assert len(pick_groups("auto", doms, rows, X, None, 40, log=lambda line: None, quality=weak)[0]) == 2
    held = fold_agreement(barely, X, rows, folds, 40, weak)
    unsplit = sorted(f for f, v in held.items() if np.isnan(v))  # refits whose prompts do not fall apart
    assert len(unsplit) >= 2 and all(v >= 0.95 for v in held.values() if not np.isnan(v)), held
    lines.clear()
    assert pick_groups("auto", doms, rows, X, None, 40, log=lines.append, quality=weak, folds=folds)[0] == []
    assert lines[-1] == (f"cascade: the prompt clusters do not hold across the folds: refitted without fold "
                         f"{unsplit[0] + 1}'s rows, the prompts do not fall apart into clusters (at least 95% of each "
                         "fold's rows in the same cluster needed): one plan for every prompt"), lines
    # a refit that splits elsewhere: the share of the fold's rows it puts in the matching cluster
    lines.clear()
    assert pick_groups("auto", doms, rows, X, None, 40, log=lines.append, quality=clear, folds=folds,
                       min_agreement=1.01)[0] == []
    assert "refitted without fold " in lines[-1] and "% of them where the clusters of every row do" in lines[-1]
