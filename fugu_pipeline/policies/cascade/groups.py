"""Plans per kind of prompt: a plan, or one worker, per domain (or, for an import without domains,
per prompt cluster), chosen out of fold by the rule the pooled policy is chosen by, per group and
for the whole.

One plan for every row hides a saving one kind of prompt allows: on a mixed import a cheap model
may tie the strongest on code while multiple choice needs the strongest, and a pooled plan, which
must keep the strongest's accuracy on all rows at once, pays for the strongest everywhere. Each
domain with at least `search.min_domain_rows` non-test rows gets its own candidates, out of fold
(per fold, searched on the domain's rows of the other folds, run on its rows of this fold):

- the domain's ladder: the most accurate plan on the domain's rows within each share of the
  strongest worker's expected cost (`choice.LADDER`);
- the domain's own strongest worker alone (the most accurate on its rows of the other folds);
- the pooled candidates (the pooled ladder's plans and always the strongest worker), on its rows.

Per domain the cheapest candidate not significantly below always the strongest worker on the
domain's rows is kept (`train.selection.cheapest_not_below`: paired 95% interval reaching 0, mean
within `cascade.margin`), and, a domain's rows being few, its interval's low end no further below
than `cascade.group_floor` (0.05): on 89 rows an interval that reaches 0 can reach down 7 points, and
a plan that only ties the strongest there was 15 points below it on the held-out rows of a real
import. The whole (each row under its domain's choice, the smaller domains under
the pooled plan) must pass the same test against the strongest on every row; while it does not, the
domain furthest below the strongest moves to its next dearer qualifying candidate (always the
strongest qualifies on every domain, so this ends). Domains too small are merged into the pooled
plan, with one line naming them. A domain unseen in training is served the pooled plan.

Groups without domains (`cascade.groups: auto` on an import that names fewer than two domains, or
`cluster`): `PromptClusters`, k-means over the frozen encoder's prompt features of the non-test rows
(no outcome is read), k from 2 to 8 by the best mean silhouette. Prompts that do not fall apart into
clusters keep one plan, with one line saying so: their silhouette is less than
`cascade.cluster_min_gap` above the same search's on one Gaussian blob with the prompts' own
covariance (one kind of prompt, in these dimensions: a real mixed import of pairwise judgements and
code reads 0.370 against 0.245, single benchmarks 0.086 to 0.116 against 0.073 to 0.083). Each cluster is a group as a domain is; a checkpoint that plans per
cluster saves the centroids, and serving puts each prompt in its nearest cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fugu_pipeline.train.groups import CLUSTER_PREFIX, GroupChoice, Option, group_label, merged_line, split_groups
from fugu_pipeline.train.groups import choose_groups as _choose_groups
from fugu_pipeline.train.selection import STRONGEST

__all__ = ["GroupChoice", "Option", "STRONGEST", "choose_groups", "group_label", "merged_line", "split_groups",
           "PromptClusters", "fit_clusters", "pick_groups", "group_fold", "GROUP_STRONGEST", "group_rung"]

GROUP_STRONGEST = "the domain's strongest worker alone"


def group_rung(share: float) -> str:
    return f"its own cascade ≤ {share:.0%} of the strongest's cost"


def group_fold(grid, tr: np.ndarray, te: np.ndarray, doms: np.ndarray, groups: list[str], search_cfg, allowed,
               usable: list[int], shares, ref_cost: float, memo: dict | None = None) -> dict:
    """{(domain, name): (quality, expected cost) per row of te in that domain, or None}: each
    domain's ladder (`group_rung(share)`) and its own strongest worker alone (`GROUP_STRONGEST`),
    chosen on its rows of `tr`."""
    from fugu_pipeline.policies.cascade.frontier import best_within
    from fugu_pipeline.policies.cascade.plans import RowSet, points_for

    out = {}
    for d in groups:
        tr_d, te_d = tr[doms[tr] == d], te[doms[te] == d]
        if not len(te_d):
            continue
        held = RowSet(grid, te_d)
        pts = points_for(grid, tr_d, search_cfg, allowed, memo)
        for s in shares:
            i = best_within(pts, s * ref_cost)
            out[(d, group_rung(s))] = None if i is None else held.run(pts.plans[i])[:2]
        top = usable[int(np.argmax(grid.quality[tr_d][:, usable].mean(axis=0)))]
        out[(d, GROUP_STRONGEST)] = held.run((((top,), None, None),))[:2]
    return out


def choose_groups(*args, **kw) -> GroupChoice:
    """`train.groups.choose_groups` over a cascade's candidates: a domain's ladder rung, its own
    strongest worker alone, or a pooled candidate."""
    return _choose_groups(*args, spec_of=_spec, **kw)


def _spec(name: str) -> tuple:
    return ("alone", None) if name == GROUP_STRONGEST else ("rung", _share(name))


def _share(name: str) -> float:
    from fugu_pipeline.policies.cascade.choice import LADDER

    return next(s for s in LADDER if group_rung(s) == name)


# --------------------------------------------------------------------------- groups without domains

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


def pick_groups(how: str, doms: np.ndarray, rows: np.ndarray, X: np.ndarray, prompts: list[str], min_rows: int,
                min_gap: float, log=print, seed: int = 0):
    """(groups, merged, the group of every row, PromptClusters or None) for `cascade.groups`
    (`how`: auto | domain | cluster | off): see the module docstring. Nothing to group by: ([], [],
    `doms`, None)."""
    none = ([], [], doms, None)
    if how == "off":
        return none
    if how in ("auto", "domain"):
        groups, merged = split_groups(doms, rows, min_rows)
        if len(groups) + len(merged) >= 2 and groups:
            if merged:
                log(merged_line(merged, min_rows))
            return groups, merged, doms, None
        if how == "domain":
            return none
        if len(groups) + len(merged) >= 2:  # domains, none of them big enough for a plan of its own
            log(merged_line(merged, min_rows))
            return none
    clusters = fit_clusters(X[rows], min_rows, [prompts[i] for i in rows], seed)
    if clusters is None:
        log(f"cascade: {len(rows)} non-test rows are too few for two prompt clusters of {min_rows} rows "
            "(cascade.search.min_domain_rows): one plan for every prompt")
        return none
    if clusters.silhouette - clusters.null_silhouette < min_gap:
        log(f"cascade: the prompts do not fall apart into clusters (best mean silhouette {clusters.silhouette:.3f} at "
            f"k = {len(clusters.names)}, one Gaussian blob of their covariance {clusters.null_silhouette:.3f}: less than "
            f"cascade.cluster_min_gap {min_gap:g} apart): one plan for every prompt")
        return none
    labels = clusters.assign(X).astype(str)
    groups, merged = split_groups(labels, rows, min_rows)
    counts = {n: int((labels[rows] == n).sum()) for n in clusters.names}
    shown = "; ".join(f"{n} ({counts[n]} rows, e.g. {clusters.examples.get(n, '')!r})" for n in clusters.names)
    log(f"cascade: no domains to plan by; {len(clusters.names)} prompt clusters (mean silhouette "
        f"{clusters.silhouette:.3f}, one blob {clusters.null_silhouette:.3f}): {shown}")
    if merged:
        log(merged_line(merged, min_rows))
    if not groups:
        return none
    return groups, merged, labels, clusters
