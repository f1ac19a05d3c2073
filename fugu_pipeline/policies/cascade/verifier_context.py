"""The verifier read at a point of a plan: a reply's score given the other replies already paid for.

The cell verifier (`verifier.py`) scores each (prompt, reply) alone. A cascade knows more when it
decides: the replies of every worker it has called so far. This second, small logistic model reads,
for a reply j among the paid replies P (j in P, only replies the plan has paid for at that point):

- `base_logit`: the cell verifier's log-odds of j (out of fold while a plan is chosen);
- agreement: how many other paid replies give j's final answer (`agree`), how many give another one
  (`disagree`), the number of paid replies (`paid`);
- the answer distribution over P: distinct finals (`distinct`), the modal answer's share
  (`modal_share`), whether j's answer is the modal one (`is_modal`);
- calibration: `calib`, worker j's accuracy on training rows where its own reply looked like this one
  (the same bucket of its reply statistics: a final answer read or not, one of the listed options or
  not, which option, its own arithmetic wrong or not; smoothed toward the worker's accuracy), and the
  calibrated votes `support` / `oppose`: the sum of `calib` over the paid replies that agree / disagree;
- the worker (one-hot).

Fitting (`fit_context`): rows are (task, worker j, paid set P) for every P of j and at most
`MAX_OTHERS` other workers (a bounded sample when there are many). Everything is fitted on training
folds only: per fold, the calibration tables of the training rows come from the folds outside both
(nested), and the model is scored on the held-out fold for every paid set a plan asks for
(`ContextScores.at`, cached per set). `ContextModel` is the fit on all non-test rows, saved in the
cascade checkpoint and run live (`policies/cascade/route.py`) with the replies paid so far.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

FEATURES = ("base_logit", "paid", "agree", "disagree", "distinct", "modal_share", "is_modal", "calib", "support", "oppose")
# the reply statistics a calibration bucket reads (those the inputs hold), each rounded
CALIB_KEYS = ("readable", "option_valid", "option_position", "arith_any_wrong", "answers_disagree")
CALIB_PRIOR = 4.0  # pseudo-rows of the worker's own accuracy in each bucket
MAX_OTHERS = 2  # a training paid set holds the reply and at most this many others
MAX_SETS = 12  # paid sets per cell at most (a seeded sample beyond)
L2_GRID = (1e-3, 1e-2, 1e-1)


def _bucket_columns(stat_names: tuple[str, ...], n_vec: int) -> list[int]:
    return [n_vec + stat_names.index(k) for k in CALIB_KEYS if k in stat_names]


def bucket_key(values) -> str:
    """The calibration bucket of one reply from its `CALIB_KEYS` statistics (in that order), each
    rounded to a quarter."""
    return ",".join(f"{v:g}" for v in np.round(np.asarray(values, np.float64) * 4) / 4)


def buckets(answer: np.ndarray, has: np.ndarray, stat_names: tuple[str, ...]) -> np.ndarray:
    """(N, W) bucket keys (str) of every cell's reply, from its statistics (`CALIB_KEYS` it holds)."""
    n_vec = answer.shape[2] - len(stat_names)
    cols = _bucket_columns(tuple(stat_names), n_vec)
    out = np.full(has.shape, "", dtype=object)
    vals = answer[:, :, cols] if cols else np.zeros(has.shape + (0,))
    for i, j in zip(*np.nonzero(has)):
        out[i, j] = bucket_key(vals[i, j])
    return out


@dataclass
class Calibration:
    """Per worker: its accuracy per bucket, smoothed toward its accuracy (`prior`)."""

    prior: list[float]
    table: list[dict[str, float]]

    @classmethod
    def fit(cls, keys: np.ndarray, target: np.ndarray, has: np.ndarray, rows: np.ndarray) -> "Calibration":
        prior, table = [], []
        for j in range(has.shape[1]):
            m = rows[has[rows, j]]
            y = np.clip(np.nan_to_num(target[m, j], nan=0.0), 0, 1)
            p = float(y.mean()) if len(y) else 0.5
            sums: dict[str, list[float]] = {}
            for k, v in zip(keys[m, j], y):
                s = sums.setdefault(k, [0.0, 0.0])
                s[0] += v
                s[1] += 1
            prior.append(p)
            table.append({k: (s[0] + CALIB_PRIOR * p) / (s[1] + CALIB_PRIOR) for k, s in sums.items()})
        return cls(prior, table)

    def value(self, j: int, key: str) -> float:
        return self.table[j].get(key, self.prior[j])

    def apply(self, keys: np.ndarray, has: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        for i in rows:
            for j in np.flatnonzero(has[i]):
                out[i, j] = self.value(j, keys[i, j])

    def to_json(self) -> dict:
        return {"prior": self.prior, "table": self.table}


def features(j_cols: np.ndarray, paid: list[int], codes: np.ndarray, base: np.ndarray, calib: np.ndarray) -> np.ndarray:
    """(n, len(FEATURES)) for the reply of worker column `j_cols[r]` of row r, among the paid columns
    `paid` (the same for every row; it holds every j). `codes`, `base`, `calib`: (n, W)."""
    n = len(codes)
    r = np.arange(n)
    C = codes[:, paid]
    cj = codes[r, j_cols]
    same = (C == cj[:, None]) & (cj[:, None] >= 0)
    other = np.asarray(paid)[None, :] != j_cols[:, None]
    readable = C >= 0
    agree = (same & other).sum(axis=1)
    disagree = (readable & ~same & other).sum(axis=1)
    cnt = ((C[:, :, None] == C[:, None, :]) & readable[:, :, None]).sum(axis=2)
    top = cnt.max(axis=1)
    distinct = np.array([len(set(row[row >= 0].tolist())) for row in C])
    cal = calib[:, paid]
    s0 = np.clip(np.nan_to_num(base[r, j_cols], nan=0.5), 1e-4, 1 - 1e-4)
    return np.stack([
        np.log(s0 / (1 - s0)), np.full(n, float(len(paid))), agree, disagree, distinct, top / len(paid),
        ((cj >= 0) & (same.sum(axis=1) == top)).astype(float), calib[r, j_cols],
        np.where(same & other, cal, 0).sum(axis=1), np.where(readable & ~same & other, cal, 0).sum(axis=1),
    ], axis=1).astype(np.float64)


def _design(F: np.ndarray, j_cols: np.ndarray, n_workers: int) -> np.ndarray:
    return np.concatenate([F, np.eye(n_workers)[j_cols]], axis=1).astype(np.float32)


@dataclass
class ContextModel:
    """The fitted model: logistic weights over `FEATURES` + the worker one-hot, its standardisation,
    and the calibration tables; JSON in a cascade checkpoint (`to_json` / `from_json`)."""

    weight: np.ndarray
    bias: float
    center: np.ndarray
    scale: np.ndarray
    calibration: Calibration
    stat_names: tuple[str, ...]
    l2: float = 0.0

    def predict(self, X: np.ndarray) -> np.ndarray:
        z = (((X - self.center) / self.scale) * self.weight).sum(axis=1) + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def score(self, j_cols, paid, codes, base, calib) -> np.ndarray:
        j_cols = np.asarray(j_cols)
        return self.predict(_design(features(j_cols, list(paid), codes, base, calib), j_cols, len(self.weight) - len(FEATURES)))

    def to_json(self) -> dict:
        return {"features": list(FEATURES), "weight": self.weight.tolist(), "bias": self.bias, "center": self.center.tolist(),
                "scale": self.scale.tolist(), "calibration": self.calibration.to_json(), "stat_names": list(self.stat_names),
                "calib_keys": [k for k in CALIB_KEYS if k in self.stat_names], "l2": self.l2}

    @classmethod
    def from_json(cls, d: dict) -> "ContextModel":
        if list(d.get("features", [])) != list(FEATURES):
            raise ValueError(f"the context verifier reads {d.get('features')}, this version computes {list(FEATURES)}")
        return cls(np.asarray(d["weight"], np.float32), float(d["bias"]), np.asarray(d["center"], np.float32),
                   np.asarray(d["scale"], np.float32), Calibration(list(d["calibration"]["prior"]), list(d["calibration"]["table"])),
                   tuple(d["stat_names"]), float(d.get("l2", 0.0)))

    def bucket_of(self, reply: str, final: str | None, prompt: str) -> str:
        """A live reply's calibration bucket, its statistics read as this model was trained on them
        (options set out as blocks read or not, as its statistics' names say)."""
        from fugu_pipeline.policies.cascade.answer_features import answer_stats, reads_blocks

        keys = [k for k in CALIB_KEYS if k in self.stat_names]
        return bucket_key(answer_stats(reply, final, prompt, keys, reads_blocks(self.stat_names)))

    def score_live(self, workers: list[int], finals: list[str | None], base: list[float | None], keys: list[str],
                   n_workers: int, which: list[int]) -> list[float]:
        """Scores of the replies `which` (indices into the paid replies) given every paid reply: its
        worker column, final answer, cell-verifier score and calibration bucket."""
        codes, seen = np.full((1, n_workers), -1, np.int64), {}
        b, cal = np.full((1, n_workers), np.nan), np.zeros((1, n_workers))
        for w, f, s, k in zip(workers, finals, base, keys):
            if f is not None:
                codes[0, w] = seen.setdefault(f, len(seen))
            b[0, w] = 0.5 if s is None else s
            cal[0, w] = self.calibration.value(w, k)
        return [float(self.score(np.array([workers[i]]), workers, codes, b, cal)[0]) for i in which]


def _paid_sets(j: int, others: list[int], rng) -> list[list[int]]:
    sets = [[j, *s] for k in range(MAX_OTHERS + 1) for s in itertools.combinations(others, k)]
    if len(sets) > MAX_SETS:
        keep = [0, *sorted(rng.choice(np.arange(1, len(sets)), MAX_SETS - 1, replace=False))]
        sets = [sets[k] for k in keep]
    return sets


def _training_rows(rows, codes, base, calib, has, target, seed: int = 0):
    """(X, y) over (row, worker, paid set): the sets are taken per worker pattern of replies."""
    rng = np.random.default_rng(seed)
    W = has.shape[1]
    Xs, ys = [], []
    for j in range(W):
        others = [k for k in range(W) if k != j]
        for paid in _paid_sets(j, others, rng):
            r = rows[has[rows][:, paid].all(axis=1)]
            if not len(r):
                continue
            jc = np.full(len(r), j)
            Xs.append(_design(features(jc, paid, codes[r], base[r], calib[r]), jc, W))
            ys.append(np.clip(np.nan_to_num(target[r, j], nan=0.0), 0, 1))
    if not Xs:
        return np.zeros((0, len(FEATURES) + W), np.float32), np.zeros(0)
    return np.concatenate(Xs), np.concatenate(ys)


def _fit(X, y, l2: float, W: int, calibration: Calibration, stat_names) -> ContextModel:
    from fugu_pipeline.policies.cascade.verifier import _one_thread, _Standardised

    with _one_thread():
        w, b, center, scale = _Standardised(X, y).fit(l2)
    return ContextModel(w, b, center, scale, calibration, tuple(stat_names), l2)


@dataclass
class ContextScores:
    """Out-of-fold scores of every reply at any paid set (`at(called)`: (N, W), NaN outside the fitted
    rows and for cells without a reply); each row read by the model of its own held-out fold."""

    codes: np.ndarray
    base: np.ndarray
    has: np.ndarray
    calib: np.ndarray  # (N, W) each row's calibration from its own fold's tables
    fold_rows: dict  # fold -> rows
    models: dict  # fold -> ContextModel
    final: ContextModel | None = None  # fitted on every fitted row: what a checkpoint saves
    figures: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)

    def at(self, called) -> np.ndarray:
        key = tuple(sorted(set(int(c) for c in called)))
        if key not in self._cache:
            out = np.full(self.has.shape, np.nan)
            for f, r in self.fold_rows.items():
                for j in key:
                    m = r[self.has[r, j]]
                    paid_ok = m[self.has[m][:, list(key)].all(axis=1)] if len(m) else m
                    if len(paid_ok):
                        out[paid_ok, j] = self.models[f].score(np.full(len(paid_ok), j), key, self.codes[paid_ok],
                                                               self.base[paid_ok], self.calib[paid_ok])
                    rest = np.setdiff1d(m, paid_ok)
                    for i in rest:  # a paid worker gave no reply on this row: the set of those that did
                        got = [k for k in key if self.has[i, k]]
                        out[i, j] = self.models[f].score(np.array([j]), got, self.codes[i:i + 1], self.base[i:i + 1],
                                                         self.calib[i:i + 1])[0]
            self._cache[key] = out
        return self._cache[key]


def _logloss(p, y) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def fit_context(inputs, base: np.ndarray, codes: np.ndarray, folds: np.ndarray, rows: np.ndarray | None = None,
                seed: int = 0) -> ContextScores:
    """The context verifier over `rows` (default every row) of `inputs` (`VerifierInputs`, N rows),
    with the cell verifier's out-of-fold scores `base` (N, W) and the answer codes (N, W); `folds` gives
    the fold of each of `rows`. See the module docstring."""
    N, W = inputs.has.shape
    rows = np.arange(N) if rows is None else np.asarray(rows)
    names = tuple(inputs.stat_names)
    keys = buckets(inputs.answer, inputs.has, names)
    has, target = inputs.has, inputs.target
    fold_rows = {f: rows[folds == f] for f in np.unique(folds)}
    # calibration: held-out rows from the other folds' tables; training rows of fold f from the folds
    # outside both f and their own (nested)
    calib_oof = np.zeros((N, W))
    for f, r in fold_rows.items():
        Calibration.fit(keys, target, has, rows[folds != f]).apply(keys, has, r, calib_oof)
    models, losses = {}, {l2: [0.0, 0] for l2 in L2_GRID}
    for f, r_test in fold_rows.items():
        train = rows[folds != f]
        calib_in = np.zeros((N, W))
        for g, r_g in fold_rows.items():
            if g != f:
                Calibration.fit(keys, target, has, rows[(folds != f) & (folds != g)]).apply(keys, has, r_g, calib_in)
        cal_f = Calibration.fit(keys, target, has, train)
        X, y = _training_rows(train, codes, base, calib_in, has, target, seed)
        Xt, yt = _training_rows(r_test, codes, base, calib_oof, has, target, seed)
        if not len(y):
            continue
        for l2 in L2_GRID:  # chosen by the log-loss over the held-out folds' paid sets
            models[f, l2] = m = _fit(X, y, l2, W, cal_f, names)
            if len(yt):
                losses[l2][0] += _logloss(m.predict(Xt), yt) * len(yt)
                losses[l2][1] += len(yt)
    losses = {l2: (s / n if n else math.inf) for l2, (s, n) in losses.items()}
    l2 = min(losses, key=losses.get)
    best_l2 = {f: models[f, l2] for f in fold_rows if (f, l2) in models}
    # the final model: every fitted row, calibration features out of fold, tables from every row
    X, y = _training_rows(rows, codes, base, calib_oof, has, target, seed)
    final = _fit(X, y, l2, W, Calibration.fit(keys, target, has, rows), names) if len(y) else None
    return ContextScores(codes, base, has, calib_oof, {f: r for f, r in fold_rows.items() if f in best_l2}, best_l2,
                         final, {"context_l2": l2, "context_oof_logloss": losses[l2]})


def context_of_head(context: dict | None, base: np.ndarray, codes: np.ndarray, inputs):
    """Offline scores of a saved cascade's context verifier (None: the cell scores as they are):
    a `ContextScores` whose one fold is every row, read by the saved model."""
    if not context:
        return base
    model = ContextModel.from_json(context)
    keys = buckets(inputs.answer, inputs.has, tuple(inputs.stat_names))
    calib = np.zeros(inputs.has.shape)
    model.calibration.apply(keys, inputs.has, np.arange(len(keys)), calib)
    return ContextScores(codes, base, inputs.has, calib, {0: np.arange(len(keys))}, {0: model}, model)


def with_context(enabled: bool, inputs, base: np.ndarray, codes: np.ndarray, rows: np.ndarray, folds: np.ndarray, log=print):
    """The scores a cascade search reads: the context verifier's (`fit_context`) when `enabled` and
    there are replies to read, else the cell scores `base` as they are."""
    if not enabled or inputs.n_workers < 2:
        return base
    ctx = fit_context(inputs, base, codes, folds, rows)
    if ctx.final is None:
        return base
    log(f"cascade: context verifier (agreement, answer distribution, calibration) out-of-fold log-loss "
        f"{ctx.figures['context_oof_logloss']:.4f} over the paid sets (L2 {ctx.figures['context_l2']:g})")
    return ctx


def context_json(scores) -> dict:
    """What a cascade checkpoint saves of the context verifier ({} when the search read cell scores)."""
    final = getattr(scores, "final", None)
    return final.to_json() if final is not None else {}
