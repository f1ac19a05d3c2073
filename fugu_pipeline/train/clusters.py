"""Groups of prompts learnt from the prompts alone, for an import that names no domains: what a
cascade's plans per group (`policies/cascade/groups.py`) and a one-shot head's default operating point
per group (`policies/oneshot/default_point.py`) are chosen per, when there are no domains to choose per.

`PromptClusters`: spherical k-means over the frozen encoder's prompt features of the non-test rows (no
outcome is read), k from 2 to 8 by the best mean silhouette. A silhouette alone says little in
hundreds of dimensions, so the same search runs on one Gaussian blob with the prompts' own covariance;
prompts whose silhouette is less than `min_gap` (`DEFAULT_CLUSTER_MIN_GAP`, `cascade.cluster_min_gap`)
above the blob's do not fall apart into clusters and keep one choice, with one line saying so. With
MiniLM features, real mixed imports stand 0.067 (GSM8K + MMLU, 0.188 against 0.121) and 0.131 (pairwise
judgements + code, 0.390 against 0.259) above the blob, single benchmarks 0.013 to 0.035 (0.086 to
0.116 against 0.073 to 0.083): 0.05 lies between. A checkpoint that chooses per cluster saves the centroids, and serving
puts each prompt in its nearest cluster (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.train.groups import CLUSTER_PREFIX, merged_line, split_groups

DEFAULT_CLUSTER_MIN_GAP = 0.05

MAX_CLUSTERS = 8
SILHOUETTE_SAMPLE = 2000  # rows the choice of k reads (the mean silhouette of a random sample)
CLUSTER_SAMPLE = 10_000  # rows the centroids are fitted on (a random sample of more): every row is then assigned


def cluster_name(i: int) -> str:
    return f"{CLUSTER_PREFIX}{i + 1}"


@dataclass
class PromptClusters:
    """Groups learnt from the prompts alone (no outcome is read): spherical k-means over the frozen
    encoder's prompt features, standardised per column on the non-test rows (so the lexical
    statistics weigh as much as any semantic column), each row scaled to unit length. A prompt
    belongs to the cluster whose centroid it is most similar to, at training and at serving alike."""

    center: np.ndarray  # (dim,) the non-test rows' column means
    scale: np.ndarray  # (dim,) their standard deviations (floored)
    centroids: np.ndarray  # (k, dim), unit rows
    names: list[str]
    silhouette: float = float("nan")  # the chosen k's mean silhouette (cosine), on a sample of the rows
    null_silhouette: float = float("nan")  # the same search's on one Gaussian blob of the prompts' own covariance
    examples: dict[str, str] = field(default_factory=dict)  # name -> the start of the prompt nearest its centroid

    def assign(self, X: np.ndarray) -> np.ndarray:
        """The cluster name of each row of `X` (N, dim)."""
        if not len(X):
            return np.array([], dtype=object)
        Z = _unit((np.asarray(X, np.float64) - self.center) / self.scale)
        return np.asarray(self.names, dtype=object)[np.argmax(Z @ self.centroids.T, axis=1)]

    def params(self) -> dict:
        return {"names": list(self.names), "silhouette": self.silhouette, "null_silhouette": self.null_silhouette,
                "examples": dict(self.examples)}


def _unit(Z: np.ndarray) -> np.ndarray:
    return Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)


def _kmeans(Z: np.ndarray, k: int, rng: np.random.Generator, iters: int = 50) -> tuple[np.ndarray, np.ndarray, float]:
    """Spherical k-means on unit rows `Z`, k-means++ seeding: (centroids, labels, summed similarity)."""
    n = len(Z)
    at = [int(rng.integers(n))]
    far = 1.0 - Z @ Z[at[0]]
    for _ in range(1, k):
        p = np.maximum(far, 0.0)
        at.append(int(rng.choice(n, p=p / p.sum())) if p.sum() > 0 else int(rng.integers(n)))
        far = np.minimum(far, 1.0 - Z @ Z[at[-1]])
    C = Z[at].copy()
    labels = np.full(n, -1)
    for _ in range(iters):
        sim = Z @ C.T
        new = np.argmax(sim, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            mine = Z[labels == j]
            C[j] = _unit(mine.sum(axis=0, keepdims=True))[0] if len(mine) else Z[int(np.argmin(sim.max(axis=1)))]
    return C, labels, float((Z @ C.T)[np.arange(n), labels].sum())


def _silhouette(Z: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette with cosine distance (one distance matrix of the sample)."""
    D = np.clip(1.0 - Z @ Z.T, 0.0, 2.0)
    ks = np.unique(labels)
    if len(ks) < 2:
        return -1.0
    mean_to = np.stack([D[:, labels == j].mean(axis=1) for j in ks], axis=1)  # (n, k)
    own = np.searchsorted(ks, labels)
    size = np.array([(labels == j).sum() for j in ks])[own]
    a = mean_to[np.arange(len(Z)), own] * size / np.maximum(size - 1, 1)  # without the row itself
    b = np.where(np.arange(len(ks))[None, :] == own[:, None], np.inf, mean_to).min(axis=1)
    s = np.where(size > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0.0)
    return float(s.mean())


def _best_k(Z: np.ndarray, top: int, seed: int, sample: np.ndarray):
    """(silhouette, centroids, labels) of the k in 2..top with the best mean silhouette on `sample`;
    four seeded k-means++ restarts per k, the most compact kept."""
    best = None
    for k in range(2, top + 1):
        fits = [_kmeans(Z, k, np.random.default_rng([seed, k, r])) for r in range(4)]
        C, labels, _ = max(fits, key=lambda f: f[2])
        s = _silhouette(Z[sample], labels[sample])
        if best is None or s > best[0] + 1e-12:
            best = (s, C, labels)
    return best


def fit_clusters(X: np.ndarray, min_rows: int, prompts: list[str] | None = None, seed: int = 0,
                 max_k: int = MAX_CLUSTERS) -> PromptClusters | None:
    """Prompt clusters of the rows `X` (the non-test rows' prompt features): k from 2 up to `max_k`
    (and at most one cluster per `min_rows` rows), the k with the best mean silhouette, fitted on up
    to `CLUSTER_SAMPLE` rows. Beside it, the same search on one Gaussian blob with the prompts' own
    covariance (`null_silhouette`): what the silhouette reads where there is one kind of prompt, in
    these dimensions. None: fewer than twice `min_rows` rows."""
    X = np.asarray(X, np.float32)
    top = min(max_k, len(X) // max(min_rows, 1))
    if top < 2:
        return None
    center = X.mean(axis=0, dtype=np.float64)
    scale = np.maximum(X.std(axis=0, dtype=np.float64), 1e-6)
    rng = np.random.default_rng(seed)
    fit_at = np.sort(rng.choice(len(X), CLUSTER_SAMPLE, replace=False)) if len(X) > CLUSTER_SAMPLE else np.arange(len(X))
    Z = _unit((X[fit_at] - center) / scale).astype(np.float32)
    sample = rng.choice(len(Z), SILHOUETTE_SAMPLE, replace=False) if len(Z) > SILHOUETTE_SAMPLE else np.arange(len(Z))
    s, C, labels = _best_k(Z, top, seed, sample)
    Y = ((X[fit_at][sample] - center) / scale).astype(np.float32)
    blob = rng.normal(size=(len(Y), len(Y))).astype(np.float32) @ (Y - Y.mean(axis=0)) / np.sqrt(len(Y))
    null = _best_k(_unit(blob), top, seed, np.arange(len(blob)))[0]
    # as the checkpoint keeps them (float32), so training puts each row where serving will
    center, scale, C = (np.asarray(v, np.float32).astype(np.float64) for v in (center, scale, C))
    order = np.argsort(-np.bincount(labels, minlength=len(C)), kind="stable")  # cluster 1 the largest
    C = C[order]
    names = [cluster_name(i) for i in range(len(C))]
    examples = {}
    if prompts is not None:
        near = fit_at[np.argmax(Z @ C.T.astype(np.float32), axis=0)]
        examples = {n: " ".join(str(prompts[int(i)]).split())[:60] for n, i in zip(names, near)}
    return PromptClusters(center, scale, C, names, float(s), float(null), examples)


def pick_groups(how: str, doms: np.ndarray, rows: np.ndarray, X: np.ndarray | None, prompts: list[str] | None,
                min_rows: int, min_gap: float = DEFAULT_CLUSTER_MIN_GAP, log=print, seed: int = 0, *,
                who: str = "cascade", one: str = "one plan for every prompt", pooled: str = "the pooled plan",
                what: str = "a plan", rows_setting: str = "cascade.search.min_domain_rows",
                gap_setting: str = "cascade.cluster_min_gap"):
    """(groups, merged, the group of every row, PromptClusters or None) for `how` (auto | domain |
    cluster | off): by domain where the rows name two or more with `min_rows` non-test rows, else (auto,
    cluster) by prompt clusters of `X` where they stand apart; nothing to group by: ([], [], `doms`,
    None). `who`, `one`, `pooled`, `what` and the two settings' names word the lines `log` receives."""
    none = ([], [], doms, None)
    if how == "off":
        return none
    if how in ("auto", "domain"):
        groups, merged = split_groups(doms, rows, min_rows)
        if len(groups) + len(merged) >= 2 and groups:
            if merged:
                log(merged_line(merged, min_rows, who, pooled, rows_setting, what))
            return groups, merged, doms, None
        if how == "domain":
            return none
        if len(groups) + len(merged) >= 2:  # domains, none of them big enough for a choice of its own
            log(merged_line(merged, min_rows, who, pooled, rows_setting, what))
            return none
    if X is None:
        return none
    clusters = fit_clusters(X[rows], min_rows, None if prompts is None else [prompts[i] for i in rows], seed)
    if clusters is None:
        log(f"{who}: {len(rows)} non-test rows are too few for two prompt clusters of {min_rows} rows "
            f"({rows_setting}): {one}")
        return none
    if clusters.silhouette - clusters.null_silhouette < min_gap:
        log(f"{who}: the prompts do not fall apart into clusters (best mean silhouette {clusters.silhouette:.3f} at "
            f"k = {len(clusters.names)}, one Gaussian blob of their covariance {clusters.null_silhouette:.3f}: less than "
            f"{gap_setting} {min_gap:g} apart): {one}")
        return none
    labels = clusters.assign(X).astype(str)
    groups, merged = split_groups(labels, rows, min_rows)
    counts = {n: int((labels[rows] == n).sum()) for n in clusters.names}
    shown = "; ".join(f"{n} ({counts[n]} rows, e.g. {clusters.examples.get(n, '')!r})" for n in clusters.names)
    log(f"{who}: no domains to choose {what} by; {len(clusters.names)} prompt clusters (mean silhouette "
        f"{clusters.silhouette:.3f}, one blob {clusters.null_silhouette:.3f}): {shown}")
    if merged:
        log(merged_line(merged, min_rows, who, pooled, rows_setting, what))
    if not groups:
        return none
    return groups, merged, labels, clusters
