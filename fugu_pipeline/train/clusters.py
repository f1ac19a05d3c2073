"""Groups of prompts learnt from the prompts, for an import that names no domains: what a cascade's
plans per group (`policies/cascade/groups.py`) and a one-shot head's default operating point per
group (`policies/oneshot/default_point.py`) are chosen per, when there are no domains to choose per.

`PromptClusters`: spherical k-means over the frozen encoder's prompt features of the non-test rows,
k from 2 to 8 by the best mean silhouette. A silhouette alone says little in hundreds of
dimensions, so the same search runs on one Gaussian blob with the prompts' own covariance; a split
whose silhouette is `min_gap` (`DEFAULT_CLUSTER_MIN_GAP`, `cascade.cluster_min_gap`) above the
blob's stands. With MiniLM features, real mixed imports stand 0.067 (GSM8K + MMLU, 0.188 against
0.121) and 0.131 (pairwise judgements + code, 0.390 against 0.259) above the blob, single benchmarks
0.013 to 0.035 (0.086 to 0.116 against 0.073 to 0.083): 0.05 lies between. Kinds that differ less
(GSM8K and MATH level 5: 0.026 above their blob, within the math cluster of a code + math mix) are
told apart by the workers instead: a split also stands where the workers do differently on its parts
(`outcome_z` at least `OUTCOME_Z`). The prompts alone place every line; the workers' results only
keep a split or not. Each cluster is split in two again where the workers do differently on its
halves. Prompts no split of which stands keep one choice, with one line saying so. A checkpoint that chooses per cluster saves the
centroids, and serving puts each prompt in its nearest cluster (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.train.groups import CLUSTER_PREFIX, merged_line, split_groups

DEFAULT_CLUSTER_MIN_GAP = 0.05
# a split of prompts that do not stand apart is kept where the workers do differently on its parts:
# their accuracies, each row's mean over the workers taken out, differ between the parts by at least
# `OUTCOME_Z` standard deviations of what random splits of the same rows into parts of the same sizes
# reach, above those splits' mean (`PERMUTATIONS` draws). MiniLM features, a code + math mix (CRUXEval-O,
# GSM8K, MATH level 5; seven splits of its non-test rows): the math cluster's halves (GSM8K and MATH)
# stand 53 to 86 above; halves within one set, on three of the splits, up to 3.9 (statistically real,
# but a plan per half of one set buys noise)
OUTCOME_Z = 10.0
PERMUTATIONS = 200

MAX_CLUSTERS = 8
SILHOUETTE_SAMPLE = 2000  # rows the choice of k reads (the mean silhouette of a random sample)
CLUSTER_SAMPLE = 10_000  # rows the centroids are fitted on (a random sample of more): every row is then assigned
# the clusters a cascade plans by must not hang on the rows they are judged on: refitted without each
# fold's rows, they must put at least this share of that fold's rows where the clusters of every row do
# (MiniLM features, the code + math mix without domains, seven splits: 99.3% to 100% on each of the 35
# folds, k the same every time); a plan per cluster is chosen out of fold over clusters fitted once, on
# every non-test row, and the share that moves is what that figure takes on trust
CLUSTER_MIN_AGREEMENT = 0.95


def cluster_name(i: int) -> str:
    return f"{CLUSTER_PREFIX}{i + 1}"


@dataclass
class PromptClusters:
    """Groups learnt from the prompts (`fit_clusters`): spherical k-means over the frozen
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
    refined: list[dict] = field(default_factory=list)  # the clusters split again within (`fit_clusters`)
    apart: bool = True  # the first split stands: its prompts stand apart from the blob, or the workers differ on its parts
    outcome_z: float = float("nan")  # the first split's workers' difference (`outcome_z`; NaN: not read)

    def assign(self, X: np.ndarray) -> np.ndarray:
        """The cluster name of each row of `X` (N, dim)."""
        if not len(X):
            return np.array([], dtype=object)
        Z = _unit((np.asarray(X, np.float64) - self.center) / self.scale)
        return np.asarray(self.names, dtype=object)[np.argmax(Z @ self.centroids.T, axis=1)]

    def params(self) -> dict:
        return {"names": list(self.names), "silhouette": self.silhouette, "null_silhouette": self.null_silhouette,
                "examples": dict(self.examples), "refined": [dict(r) for r in self.refined],
                **({} if np.isnan(self.outcome_z) else {"outcome_z": self.outcome_z})}


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


def outcome_z(quality: np.ndarray, labels: np.ndarray, rng: np.random.Generator, draws: int = PERMUTATIONS) -> float:
    """How far the workers' accuracies differ between the parts `labels` makes, in standard deviations
    of what random splits of the same rows into parts of the same sizes reach, above their mean.
    Each row's mean over the workers is taken out first, so a part that is easier for every worker
    alike does not count: what counts is which worker does well where. The statistic: the parts'
    mean rows' squared distance from the overall mean, weighted by size. 0.0 where there is nothing
    to compare (one part, one worker)."""
    Q = np.nan_to_num(np.asarray(quality, np.float64))
    Q = Q - Q.mean(axis=1, keepdims=True)
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k).astype(np.float64)
    if len(Q) < 2 or Q.shape[1] < 2 or (sizes > 0).sum() < 2:
        return 0.0
    total = Q.sum(axis=0)

    def stat(lab: np.ndarray) -> float:
        sums = np.eye(k)[lab].T @ Q
        return float((np.square(sums - sizes[:, None] * total / len(Q)).sum(axis=1) / np.maximum(sizes, 1)).sum())

    null = np.array([stat(rng.permutation(labels)) for _ in range(draws)])
    return float((stat(labels) - null.mean()) / max(float(null.std()), 1e-12))


def _lloyd(Z: np.ndarray, C: np.ndarray, iters: int = 50) -> np.ndarray:
    """Spherical k-means steps from the centres `C` until no row changes cluster; a centre left
    without rows stays where it was."""
    labels = None
    for _ in range(iters):
        new = np.argmax(Z @ C.T, axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        for j in range(len(C)):
            mine = Z[labels == j]
            if len(mine):
                C[j] = _unit(mine.sum(axis=0, keepdims=True))[0]
    return C


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


def _moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(column means, column scales, floored) of `X`."""
    return X.mean(axis=0, dtype=np.float64), np.maximum(X.std(axis=0, dtype=np.float64), 1e-6)


def _search(X: np.ndarray, top: int, seed: int, rng: np.random.Generator):
    """(silhouette, blob's silhouette, labels) of the best k in 2..`top` over the rows `X` (already a
    sample of at most `CLUSTER_SAMPLE`), standardised on their own rows; the blob: one Gaussian blob
    of the same rows' covariance, the same search."""
    center, scale = _moments(X)
    Z = _unit((X - center) / scale).astype(np.float32)
    sample = rng.choice(len(Z), SILHOUETTE_SAMPLE, replace=False) if len(Z) > SILHOUETTE_SAMPLE else np.arange(len(Z))
    s, _, labels = _best_k(Z, top, seed, sample)
    Y = ((X[sample] - center) / scale).astype(np.float32)
    blob = rng.normal(size=(len(Y), len(Y))).astype(np.float32) @ (Y - Y.mean(axis=0)) / np.sqrt(len(Y))
    null = _best_k(_unit(blob), top, seed, np.arange(len(blob)))[0]
    return float(s), float(null), labels


def fit_clusters(X: np.ndarray, min_rows: int, prompts: list[str] | None = None, seed: int = 0,
                 max_k: int = MAX_CLUSTERS, min_gap: float = DEFAULT_CLUSTER_MIN_GAP,
                 quality: np.ndarray | None = None, min_z: float = OUTCOME_Z) -> PromptClusters | None:
    """Prompt clusters of the rows `X` (the non-test rows' prompt features): k from 2 up to `max_k`
    (and at most one cluster per `min_rows` rows), the k with the best mean silhouette, fitted on up
    to `CLUSTER_SAMPLE` rows. Beside it, the same search on one Gaussian blob with the prompts' own
    covariance (`null_silhouette`): what the silhouette reads where there is one kind of prompt, in
    these dimensions. The split stands (`apart`) where its silhouette is `min_gap` above the blob's,
    or, given the workers' `quality` on the rows (N, workers), where the workers do differently on its
    parts (`outcome_z` at least `min_z`: which worker does well differs, not only how hard the prompts
    are). Where it stands, each cluster is split in two on its own rows (standardised on them, against
    its own blob) where the workers do differently on the halves (given `quality`; else where the
    halves stand apart), and each part again, until none does or there are `max_k` (`refined`: the
    splits, in order). The most different kinds of prompt win the first search (code against math),
    and kinds that differ less (grade-school word problems and competition algebra) only show within
    their cluster, where the prompts alone may not tell them from one kind but the workers' results
    do. Within a cluster the prompts' own gap is not enough: re-standardised on one set's rows, its
    halves can stand 0.05 above their blob (pairwise judgements: 0.063), and a choice per half of
    one set buys noise. Every row then belongs to the nearest
    cluster centre (the mean direction of its rows; Lloyd's steps from there), as at serving. None:
    fewer than twice `min_rows` rows."""
    X = np.asarray(X, np.float32)
    top = min(max_k, len(X) // max(min_rows, 1))
    if top < 2:
        return None
    rng = np.random.default_rng(seed)
    fit_at = np.sort(rng.choice(len(X), CLUSTER_SAMPLE, replace=False)) if len(X) > CLUSTER_SAMPLE else np.arange(len(X))
    Xf = X[fit_at]
    Qf = None if quality is None else np.asarray(quality, np.float64)[fit_at]
    test = np.random.default_rng([seed, 1])

    def stands(s_: float, null_: float, rows: np.ndarray, labels_: np.ndarray, within: bool = False) -> tuple[bool, float]:
        if Qf is None or (s_ - null_ >= min_gap and not within):
            return s_ - null_ >= min_gap, float("nan")
        z = outcome_z(Qf[rows], labels_, test)
        return z >= min_z, z

    s, null, labels = _search(Xf, top, seed, rng)
    apart, z_top = stands(s, null, np.arange(len(Xf)), labels)
    leaves = [np.flatnonzero(labels == j) for j in range(labels.max() + 1)]
    refined: list[dict] = []
    least = max(1, round(min_rows * len(fit_at) / len(X)))  # `min_rows` of all rows, in the fitted sample
    queue = list(range(len(leaves))) if apart else []
    while queue and len(leaves) < max_k:
        at = queue.pop(0)
        rows = leaves[at]
        if len(rows) < 2 * least:
            continue
        s_in, null_in, sub = _search(Xf[rows], 2, seed + 1 + len(refined), rng)
        ok, z_in = stands(s_in, null_in, rows, sub, within=True)
        if not ok:
            continue
        parts = [rows[sub == j] for j in range(sub.max() + 1)]
        refined.append({"rows": int(len(rows)), "into": len(parts), "silhouette": s_in, "null_silhouette": null_in,
                        **({} if np.isnan(z_in) else {"outcome_z": z_in})})
        leaves[at] = parts[0]
        queue.insert(0, at)
        for part in parts[1:]:
            leaves.append(part)
            queue.insert(0, len(leaves) - 1)
    center, scale = _moments(X)  # every row's, as serving standardises
    Z = _unit((Xf - center) / scale).astype(np.float32)
    C = _unit(np.stack([Z[rows].sum(axis=0) for rows in leaves]).astype(np.float64))
    if refined:  # settle the centres together, so each row's nearest centre is its cluster's (Lloyd's steps)
        C = _lloyd(Z, C.astype(np.float32)).astype(np.float64)
    # as the checkpoint keeps them (float32), so training puts each row where serving will
    center, scale, C = (np.asarray(v, np.float32).astype(np.float64) for v in (center, scale, C))
    near = np.argmax(Z @ C.T.astype(np.float32), axis=1)
    order = np.argsort(-np.bincount(near, minlength=len(C)), kind="stable")  # cluster 1 the largest
    C = C[order]
    names = [cluster_name(i) for i in range(len(C))]
    examples = {}
    if prompts is not None:
        nearest = fit_at[np.argmax(Z @ C.T.astype(np.float32), axis=0)]
        examples = {n: " ".join(str(prompts[int(i)]).split())[:60] for n, i in zip(names, nearest)}
    return PromptClusters(center, scale, C, names, float(s), float(null), examples, refined, apart, z_top)


def fold_agreement(clusters: PromptClusters, X: np.ndarray, rows: np.ndarray, folds: np.ndarray, min_rows: int,
                   quality: np.ndarray | None, seed: int = 0, min_gap: float = DEFAULT_CLUSTER_MIN_GAP) -> dict:
    """{fold: the share of its rows (of `rows`, `folds` one per row) that the clusters refitted on the
    other folds' rows (`fit_clusters`, the same settings) put in the cluster matched to the one
    `clusters` puts them in}. Each refitted cluster is matched to the cluster of `clusters` it shares
    the most rows of the other folds with, the largest overlap first (one each); a refit that finds
    other clusters matches fewer rows; one whose prompts do not fall apart at all reads NaN."""
    full = clusters.assign(X[rows]).astype(str)
    out = {}
    for f in np.unique(folds):
        tr, at = rows[folds != f], folds == f
        refit = fit_clusters(X[tr], min_rows, None, seed, min_gap=min_gap,
                             quality=None if quality is None else np.asarray(quality)[tr])
        if refit is None or not refit.apart:
            out[int(f)] = float("nan")
            continue
        mine = refit.assign(X[rows]).astype(str)
        overlap = {(a, b): int(((full == a) & (mine == b) & ~at).sum()) for a in clusters.names for b in refit.names}
        match: dict[str, str] = {}
        for (a, b), _ in sorted(overlap.items(), key=lambda kv: -kv[1]):
            if b not in match and a not in match.values():
                match[b] = a
        out[int(f)] = float(np.mean([match.get(b) == a for a, b in zip(full[at], mine[at])])) if at.any() else 1.0
    return out


def pick_groups(how: str, doms: np.ndarray, rows: np.ndarray, X: np.ndarray | None, prompts: list[str] | None,
                min_rows: int, min_gap: float = DEFAULT_CLUSTER_MIN_GAP, log=print, seed: int = 0, *,
                who: str = "cascade", one: str = "one plan for every prompt", pooled: str = "the pooled plan",
                what: str = "a plan", rows_setting: str = "cascade.search.min_domain_rows",
                gap_setting: str = "cascade.cluster_min_gap", quality: np.ndarray | None = None,
                folds: np.ndarray | None = None, min_agreement: float = CLUSTER_MIN_AGREEMENT):
    """(groups, merged, the group of every row, PromptClusters or None) for `how` (auto | domain |
    cluster | off): by domain where the rows name two or more with `min_rows` non-test rows, else (auto,
    cluster) by prompt clusters of `X` where they stand apart or, given the workers' `quality` (a row
    per row of `X`), where the workers do differently on them (`fit_clusters`); nothing to group by:
    ([], [], `doms`, None). Given `folds` (one per row of `rows`), the clusters must also hold across
    them (`fold_agreement` at least `min_agreement` on every fold), else nothing to group by either: a
    choice per cluster made out of fold over clusters that a fold's own rows shaped is not out of fold
    (the one-shot default point needs no such check: its check inside the folds refits the clusters).
    `who`, `one`, `pooled`, `what` and the two settings' names word the lines `log` receives."""
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
    clusters = fit_clusters(X[rows], min_rows, None if prompts is None else [prompts[i] for i in rows], seed,
                            min_gap=min_gap, quality=None if quality is None else np.asarray(quality)[rows])
    if clusters is None:
        log(f"{who}: {len(rows)} non-test rows are too few for two prompt clusters of {min_rows} rows "
            f"({rows_setting}): {one}")
        return none
    if not clusters.apart:
        read = "" if np.isnan(clusters.outcome_z) else (
            f"; nor do the workers do differently on them: {clusters.outcome_z:.1f} standard deviations of random "
            f"splits above their mean, less than {OUTCOME_Z:g}")
        log(f"{who}: the prompts do not fall apart into clusters (best mean silhouette {clusters.silhouette:.3f} at "
            f"k = {len(clusters.names)}, one Gaussian blob of their covariance {clusters.null_silhouette:.3f}: less than "
            f"{gap_setting} {min_gap:g} apart{read}): {one}")
        return none
    labels = clusters.assign(X).astype(str)
    groups, merged = split_groups(labels, rows, min_rows)
    counts = {n: int((labels[rows] == n).sum()) for n in clusters.names}
    shown = "; ".join(f"{n} ({counts[n]} rows, e.g. {clusters.examples.get(n, '')!r})" for n in clusters.names)
    split = "".join(f"; a cluster of {r['rows']} rows split in {r['into']} ({_why(r['silhouette'], r['null_silhouette'], r.get('outcome_z', float('nan')))})"
                    for r in clusters.refined)
    log(f"{who}: no domains to choose {what} by; {len(clusters.names)} prompt clusters "
        f"({_why(clusters.silhouette, clusters.null_silhouette, clusters.outcome_z, 'mean silhouette', 'one blob')}{split}): {shown}")
    if folds is not None:
        held = fold_agreement(clusters, X, rows, folds, min_rows, quality, seed, min_gap)
        worst = min(held, key=lambda f: -1.0 if np.isnan(held[f]) else held[f])
        if not held[worst] >= min_agreement:
            said = ("the prompts do not fall apart into clusters" if np.isnan(held[worst]) else
                    f"they put {held[worst]:.1%} of them where the clusters of every row do")
            log(f"{who}: the prompt clusters do not hold across the folds: refitted without fold {worst + 1}'s rows, "
                f"{said} (at least {min_agreement:.0%} of each fold's rows in the same cluster needed): {one}")
            return none
        log(f"{who}: the prompt clusters hold across the folds: refitted without each fold's rows, they put "
            f"{min(held.values()):.1%} to {max(held.values()):.1%} of that fold's rows where the clusters of every "
            "row do")
    if merged:
        log(merged_line(merged, min_rows, who, pooled, rows_setting, what))
    if not groups:
        return none
    return groups, merged, labels, clusters


def _why(s: float, null: float, z: float, first: str = "silhouette", blob: str = "its own blob") -> str:
    """Why a split stands: its prompts stand apart, else the workers' results differ on its parts."""
    said = f"{first} {s:.3f}, {blob} {null:.3f}"
    return said if np.isnan(z) else f"{said}; the workers do differently on the parts: {z:.1f} standard deviations of random splits above their mean"
