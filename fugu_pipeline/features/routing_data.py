"""What every trainer reads: one row per task with its features and each worker's reward.

`RoutingData` is plain arrays (numpy, no torch): task ids, prompts, domains, splits, the feature
matrix (N, D) from the encoder and the utility matrix (N, W) with one column per worker, in
`worker_ids` order. `validate()` refuses data a trainer cannot learn from, before any training,
with a message that says what to fix. `load_routing_data` joins the reward matrix's complete rows
with their cached features: the one way the assets and the command line get training data.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.schema import SPLITS

TIE_TOLERANCE = 1e-9  # utilities closer than this count as a tie


class TrainingDataError(ValueError):
    """The training data cannot be trained on; the message says why and what to do."""


def compute_data_version(
    task_ids: list[str],
    worker_ids: list[str],
    splits: np.ndarray,
    utility: np.ndarray,
    features: np.ndarray,
    contract: FeatureContract,
) -> str:
    """Content hash of the rewards, task ids and splits, worker ids, and the features' fingerprint
    (the contract's fingerprint plus a hash of the feature bytes)."""
    h = hashlib.sha256()
    h.update(canonical_json({"task_ids": list(task_ids), "worker_ids": list(worker_ids),
                             "splits": [str(s) for s in splits]}).encode())
    u = np.ascontiguousarray(utility, dtype=np.float64)
    h.update(repr(u.shape).encode() + u.tobytes())
    f = np.ascontiguousarray(features, dtype=np.float32)
    h.update(contract.fingerprint().encode() + repr(f.shape).encode())
    h.update(hashlib.sha256(f.tobytes()).digest())
    return h.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class RoutingData:
    task_ids: list[str]
    prompts: list[str]
    domains: list[str]
    splits: np.ndarray  # str: 'train' | 'val' | 'test'
    worker_ids: list[str]
    features: np.ndarray  # float32 (N, D)
    utility: np.ndarray  # float64 (N, W)
    contract: FeatureContract
    quality: np.ndarray | None = None  # (N, W) in [0, 1]
    cost_usd: np.ndarray | None = None  # (N, W)
    latency_s: np.ndarray | None = None  # (N, W)
    utility_config: UtilityConfig | None = None
    utility_source: str = ""  # how the utility was made and where its weights came from (matrix meta)
    feature_task_ids: list[str] | None = None  # task order of `features`, checked by validate()
    tags: list[tuple[str, ...]] | None = None  # per task: labels reports group by (e.g. 'id'/'ood')
    data_version: str = ""  # computed when empty
    cost_simulated: bool = False  # every worker is a mock: `cost_usd` is simulated, nothing was paid

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("task_ids", [str(t) for t in self.task_ids])
        set_("worker_ids", [str(w) for w in self.worker_ids])
        set_("splits", np.asarray(self.splits, dtype=str))
        set_("features", np.ascontiguousarray(self.features, dtype=np.float32))
        set_("utility", np.ascontiguousarray(self.utility, dtype=np.float64))
        for name in ("quality", "cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is not None:
                set_(name, np.asarray(v, dtype=np.float64))
        if not self.data_version:
            set_("data_version", compute_data_version(self.task_ids, self.worker_ids, self.splits,
                                                      self.utility, self.features, self.contract))

    # ------------------------------------------------------------------ shape
    @property
    def n_tasks(self) -> int:
        return len(self.task_ids)

    @property
    def n_workers(self) -> int:
        return len(self.worker_ids)

    @property
    def dim(self) -> int:
        return int(self.features.shape[1]) if self.features.ndim == 2 else 0

    def split(self, name: str) -> "RoutingData":
        """The rows of one split, as a RoutingData of its own (its own data_version)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        return self.subset(np.flatnonzero(self.splits == name))

    def subset(self, rows: np.ndarray) -> "RoutingData":
        rows = np.asarray(rows, dtype=np.int64)
        pick = lambda a: None if a is None else a[rows]  # noqa: E731
        take = lambda xs: None if xs is None else [xs[i] for i in rows]  # noqa: E731
        return dataclasses.replace(
            self, task_ids=take(self.task_ids), prompts=take(self.prompts), domains=take(self.domains),
            splits=self.splits[rows], features=self.features[rows], utility=self.utility[rows],
            quality=pick(self.quality), cost_usd=pick(self.cost_usd), latency_s=pick(self.latency_s),
            feature_task_ids=take(self.feature_task_ids), tags=take(self.tags), data_version="",
        )

    def in_worker_order(self, workers: list[str], what: str = "the checkpoint") -> "RoutingData":
        """The same rows with the worker columns in the order of `workers` (a checkpoint's), which
        must be the same set; else TrainingDataError naming the workers that differ."""
        workers = [str(w) for w in workers]
        if workers == self.worker_ids:
            return self
        if sorted(workers) != sorted(self.worker_ids):
            gone, extra = sorted(set(workers) - set(self.worker_ids)), sorted(set(self.worker_ids) - set(workers))
            raise TrainingDataError(f"{what} routes among {workers}, and this data scores {self.worker_ids} (missing "
                                    f"{gone}, extra {extra}): evaluate it on data with the workers it was trained on")
        at = [self.worker_ids.index(w) for w in workers]
        cols = lambda a: None if a is None else a[:, at]  # noqa: E731
        return dataclasses.replace(self, worker_ids=workers, utility=self.utility[:, at], quality=cols(self.quality),
                                   cost_usd=cols(self.cost_usd), latency_s=cols(self.latency_s), data_version="")

    def counts(self) -> dict[str, int]:
        return {s: int((self.splits == s).sum()) for s in SPLITS}

    # ------------------------------------------------------------------ checks
    def validate(self, require: tuple[str, ...] = ("train", "val"), force: bool = False) -> "RoutingData":
        """Raise TrainingDataError on data no trainer should see. Returns self, for chaining."""
        n, w = self.n_tasks, self.n_workers
        if self.utility.ndim != 2:
            raise TrainingDataError(f"utility must be a 2-D (tasks, workers) matrix, got shape {self.utility.shape}")
        if self.utility.shape != (n, w):
            raise TrainingDataError(
                f"utility has shape {self.utility.shape} but there are {n} task ids and {w} worker ids"
            )
        if w < 2:
            raise TrainingDataError(f"routing needs at least 2 workers, got {w}: {self.worker_ids}")
        if len(set(self.worker_ids)) != w:
            raise TrainingDataError(f"worker_ids has duplicates: {self.worker_ids}")
        if len(set(self.task_ids)) != n:
            dup = sorted(t for t, c in Counter(self.task_ids).items() if c > 1)[:5]
            raise TrainingDataError(f"task_ids has duplicates, e.g. {dup}")
        for name in ("prompts", "domains"):
            if len(getattr(self, name)) != n:
                raise TrainingDataError(f"{name} has {len(getattr(self, name))} entries for {n} tasks")
        if self.splits.shape != (n,):
            raise TrainingDataError(f"splits has shape {self.splits.shape} for {n} tasks")
        bad = sorted(set(self.splits.tolist()) - set(SPLITS))
        if bad:
            raise TrainingDataError(f"unknown split value(s) {bad}; each task's split must be one of {SPLITS}")

        # features: shape, order, contract
        if self.features.ndim != 2:
            raise TrainingDataError(f"features must be a 2-D (tasks, dim) matrix, got shape {self.features.shape}")
        if self.features.shape[0] != n:
            raise TrainingDataError(
                f"features have {self.features.shape[0]} rows but the reward matrix has {n} tasks; "
                "re-embed the tasks of this reward matrix (the embedding cache is out of date)"
            )
        if self.feature_task_ids is not None:
            if len(self.feature_task_ids) != n:
                raise TrainingDataError(
                    f"feature_task_ids has {len(self.feature_task_ids)} ids but the reward matrix has {n} tasks"
                )
            wrong = [i for i, (a, b) in enumerate(zip(self.feature_task_ids, self.task_ids)) if a != b]
            if wrong:
                i = wrong[0]
                raise TrainingDataError(
                    f"feature rows are not in reward-matrix task order: {len(wrong)} rows differ, first at row {i} "
                    f"(features: {self.feature_task_ids[i]!r}, rewards: {self.task_ids[i]!r}); "
                    "align the features to the reward matrix's task_ids before training"
                )
        if self.features.shape[1] != self.contract.dim:
            raise TrainingDataError(
                f"features have dim {self.features.shape[1]} but the feature contract says dim={self.contract.dim} "
                f"(encoder {self.contract.encoder_id!r})"
            )

        # finite values
        _check_finite("features", self.features, self.task_ids, [f"dim {j}" for j in range(self.dim)])
        _check_finite("utility", self.utility, self.task_ids, self.worker_ids)
        for name in ("quality", "cost_usd", "latency_s"):
            v = getattr(self, name)
            if v is not None:
                if v.shape != (n, w):
                    raise TrainingDataError(f"{name} has shape {v.shape}, expected {(n, w)} like utility")
                _check_finite(name, v, self.task_ids, self.worker_ids)

        # splits present
        counts = self.counts()
        for s in require:
            if counts.get(s, 0) == 0:
                hint = (
                    "set \"split\": \"val\" on some tasks, or let the pipeline carve a validation split "
                    "from train (features.routing_data.carve_validation)"
                    if s == "val"
                    else f"set \"split\": \"{s}\" on some tasks"
                )
                raise TrainingDataError(f"the '{s}' split has no rows (counts: {counts}); {hint}")

        # learning signal
        train = self.splits == "train"
        if train.any() and not force:
            u = self.utility[train]
            if np.all(u.max(axis=1) - u.min(axis=1) <= TIE_TOLERANCE):
                raise TrainingDataError(
                    f"no learning signal: all {w} workers tie on every one of the {int(train.sum())} training tasks, "
                    "so every route is equally good. Choose workers that differ, or check the grader; "
                    "pass --force (force=True in code, force: true in an asset's config) to train anyway"
                )
        return self


def _check_finite(name: str, a: np.ndarray, task_ids: list[str], columns: list[str]) -> None:
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    rows, cols = np.nonzero(bad)
    tids = sorted({task_ids[r] for r in rows})
    cnames = sorted({columns[c] for c in cols}, key=columns.index)
    raise TrainingDataError(
        f"{name} holds {int(bad.sum())} NaN or infinite value(s) in {len(tids)} task(s) "
        f"{tids[:10]}{' ...' if len(tids) > 10 else ''}, column(s) {cnames[:10]}"
        f"{' ...' if len(cnames) > 10 else ''}; fix or drop these rows before training"
    )


def carve_validation(data: RoutingData, fraction: float = 0.15, seed: int = 0) -> RoutingData:
    """When there is no 'val' row, move a deterministic share of 'train' rows to 'val': a task goes
    to val when the hash of (seed, task_id) falls below `fraction`, so the choice does not depend on
    row order. At least one train row moves. Data that already has a val split is returned as is."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    if (data.splits == "val").any():
        return data
    train = np.flatnonzero(data.splits == "train")
    if len(train) < 2:
        raise TrainingDataError(f"cannot carve a validation split from {len(train)} training row(s) (splits: {data.counts()}): "
                                "give the data more rows with split 'train' (rows without a split are train), or rows with split 'val'")
    h = np.array([int(sha256_text(f"{seed}:{data.task_ids[i]}")[:15], 16) / 16**15 for i in train])
    move = train[h < fraction]
    if len(move) == 0:
        move = train[[int(np.argmin(h))]]
    if len(move) == len(train):
        move = move[:-1]
    splits = data.splits.copy()
    splits[move] = "val"
    return dataclasses.replace(data, splits=splits, data_version="")


def load_routing_data(db_path: Path, encoder, cache_root: Path, *, val_fraction: float = 0.15, seed: int = 0,
                      progress=None):
    """The reward matrix's complete rows with their cached features, as `RoutingData`, with the
    utility weights the matrix was built with. When the matrix has no 'val' rows, a deterministic
    share of 'train' becomes validation. `progress` goes to `embed_prompts` (True: a progress bar
    while prompts are encoded). Returns (data, embed_result)."""
    from fugu_pipeline.features.cache import embed_prompts
    from fugu_pipeline.matrix.read import RewardMatrixError, missing_cells_note, read_training_inputs

    arrays, utility_config, utility_source = read_training_inputs(db_path)
    if not arrays.task_ids:
        why = missing_cells_note(db_path)
        raise RewardMatrixError(f"{db_path}: no complete rows (every task needs a reward for every worker)"
                                + (f": {why}" if why else ""))
    emb = embed_prompts(arrays.prompts, arrays.domains, encoder, cache_root, progress=progress)
    data = RoutingData(
        task_ids=arrays.task_ids, prompts=arrays.prompts, domains=arrays.domains, splits=arrays.splits,
        worker_ids=arrays.worker_ids, features=emb.vectors, utility=arrays.utility, contract=emb.contract,
        quality=arrays.quality if not np.isnan(arrays.quality).any() else None,
        cost_usd=arrays.cost_usd, latency_s=arrays.latency_s,
        utility_config=utility_config, utility_source=utility_source,
        feature_task_ids=arrays.task_ids, tags=arrays.tags, cost_simulated=arrays.cost_simulated,
    )
    if "val" not in set(data.splits.tolist()):
        data = carve_validation(data, fraction=val_fraction, seed=seed)
    return data, emb


def prefill_layer_sets(db_path: Path, settings_list: list, cache_root: Path, *, progress=None) -> int:
    """Encode the reward matrix's prompts once for several layer settings (`cache.embed_layer_sets`),
    so that `load_routing_data` then finds each setting's features in the cache. Returns how many
    distinct texts were encoded."""
    from fugu_pipeline.features.cache import embed_layer_sets
    from fugu_pipeline.matrix.read import read_arrays

    arrays = read_arrays(db_path)
    return embed_layer_sets(arrays.prompts, arrays.domains, settings_list, cache_root, progress=progress)
