"""The learned verifier of a cascade: P(the answer is right | prompt, answer), one logistic model.

One row per (task, worker) cell that has a reply: the prompt's features, the reply's features
(`features/answer_features.py`: the frozen encoder reading the reply, and its statistics) and the
worker (one-hot), standardised; the target is the cell's quality (graded correctness, in [0, 1]).
L2-regularised logistic regression, fitted by L-BFGS (torch); the strength and the inputs it reads
(everything; the reply and the worker; the reply's statistics and the worker), one model for all
workers or one per worker, are chosen from a small grid by the out-of-fold log-loss: with few rows, hundreds of encoder columns can cost more
than they tell. `oof_scores` gives every cell a score from a verifier fitted
without its fold: what the cascade's thresholds are chosen on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

L2_GRID = (1e-3, 1e-2, 1e-1, 1.0)
# Which inputs the verifier reads, chosen with the L2 strength by the out-of-fold log-loss: everything;
# the reply (its encoder features and statistics) and the worker; the reply's statistics and the worker.
INPUT_SETS = ("all", "reply", "stats")


@dataclass
class VerifierInputs:
    """Per task: prompt features (N, D); per cell: reply features (N, W, A) and a has-reply mask."""

    prompt: np.ndarray
    answer: np.ndarray
    has: np.ndarray  # bool (N, W)
    target: np.ndarray  # (N, W) quality in [0, 1], NaN where unknown
    # the names of the reply's statistics, its last columns (the "stats" input set reads them); empty:
    # the first ten (`features.answer_features.STATS_V1`), as inputs were built before they were named
    stat_names: tuple[str, ...] = ()

    @property
    def n_stats(self) -> int:
        return len(self.stat_names) or 10

    @property
    def n_workers(self) -> int:
        return self.has.shape[1]

    def design(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(X, y, (row, worker) index) of the cells with a reply among `rows`."""
        r, w = np.nonzero(self.has[rows])
        r = np.asarray(rows)[r]
        onehot = np.eye(self.n_workers, dtype=np.float32)[w]
        X = np.concatenate([self.prompt[r], self.answer[r, w], onehot], axis=1).astype(np.float32)
        return X, self.target[r, w], np.stack([r, w], axis=1)

    @property
    def in_dim(self) -> int:
        return self.prompt.shape[1] + self.answer.shape[2] + self.n_workers

    def mask(self, inputs: str, n_stats: int | None = None) -> np.ndarray:
        """The columns of `design` an input set reads (`INPUT_SETS`)."""
        d, a, w = self.prompt.shape[1], self.answer.shape[2], self.n_workers
        n_stats = min(self.n_stats if n_stats is None else n_stats, a)
        m = np.ones(d + a + w, bool)
        if inputs in ("reply", "stats"):
            m[:d] = False
        if inputs == "stats":
            m[d:d + a - n_stats] = False
        return m


@dataclass
class Verifier:
    """One logistic model per worker (rows of `weight`; a shared fit repeats its row): a reply is
    scored by its worker's row, the worker read from the design's one-hot columns (the last W)."""

    weight: np.ndarray  # (W, in_dim)
    bias: np.ndarray  # (W,)
    center: np.ndarray  # (W, in_dim)
    scale: np.ndarray  # (W, in_dim)
    l2: float
    per_worker: bool = False

    def predict(self, X: np.ndarray) -> np.ndarray:
        return score(X, self.weight, self.bias, self.center, self.scale)


def score(X: np.ndarray, weight, bias, center, scale) -> np.ndarray:
    """P(right) of design rows X under per-worker logistic models (the head and `Verifier` share it)."""
    w = np.argmax(X[:, -weight.shape[0]:], axis=1)
    z = (((X - center[w]) / scale[w]) * weight[w]).sum(axis=1) + bias[w]
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))


def _single(X: np.ndarray, y: np.ndarray, l2: float, iters: int = 100, mask: np.ndarray | None = None):
    """(weight, bias, center, scale) of one L2 logistic regression on the standardised columns of X
    (only those in `mask`: the others get weight 0, so every model keeps the full input size)."""
    if mask is not None and not mask.all():
        w0, b0, c0, s0 = _single(X[:, mask], y, l2, iters)
        w, c, s = np.zeros(X.shape[1], np.float32), np.zeros(X.shape[1], np.float32), np.ones(X.shape[1], np.float32)
        w[mask], c[mask], s[mask] = w0, c0, s0
        return w, b0, c, s
    import torch

    center = X.mean(axis=0)
    scale = X.std(axis=0)
    scale = np.where(scale > 1e-6, scale, 1.0).astype(np.float32)
    Z = torch.from_numpy(((X - center) / scale).astype(np.float32))
    t = torch.from_numpy(np.clip(y, 0.0, 1.0).astype(np.float32))
    prior = float(np.clip(np.mean(y), 1e-3, 1 - 1e-3))
    w = torch.zeros(X.shape[1], requires_grad=True)
    b = torch.tensor([np.log(prior / (1 - prior))], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iters, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(Z @ w + b, t) + l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy().astype(np.float32), float(b.detach()[0]), center.astype(np.float32), scale


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, n_workers: int, iters: int = 100,
                 mask: np.ndarray | None = None, per_worker: bool = False) -> Verifier:
    """One model for every worker, or (`per_worker`) one per worker: a weak model's wrong replies
    look different from a strong one's. A worker with too few rows of each class takes the shared fit."""
    shared = _single(X, y, l2, iters, mask)
    rows = [shared] * n_workers
    if per_worker:
        who = np.argmax(X[:, -n_workers:], axis=1)
        for j in range(n_workers):
            m = who == j
            yy = np.clip(y[m], 0, 1) >= 0.5
            if m.sum() >= 20 and 5 <= yy.sum() <= m.sum() - 5:
                rows[j] = _single(X[m], y[m], l2, iters, mask)
    return Verifier(np.stack([r[0] for r in rows]), np.array([r[1] for r in rows], np.float32),
                    np.stack([r[2] for r in rows]), np.stack([r[3] for r in rows]), l2, per_worker)


def _logloss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def oof_scores(inp: VerifierInputs, folds: np.ndarray, l2_grid=L2_GRID, n_stats: int | None = None,
               input_sets=INPUT_SETS) -> tuple[np.ndarray, tuple[float, str], dict]:
    """(scores (N, W) out of fold, NaN where no reply; the (L2 strength, input set) chosen; figures:
    log-loss and AUC of the chosen setting's out-of-fold scores, overall and per worker: how well it
    tells a worker's right replies from its wrong ones, what a cascade's stop rule needs). The design
    rows are built once."""
    rows_all = np.arange(len(folds))
    parts = {f: (inp.design(rows_all[folds != f]), inp.design(rows_all[folds == f])) for f in np.unique(folds)}
    best: tuple | None = None
    for per_worker in (False, True):
        for inputs in input_sets:
            mask = inp.mask(inputs, n_stats)
            for l2 in l2_grid:
                S = np.full(inp.has.shape, np.nan)
                for f, ((X, y, _), (Xt, _, at)) in parts.items():
                    if len(Xt) == 0 or len(X) == 0:
                        continue
                    v = fit_logistic(X, y, l2, inp.n_workers, mask=mask, per_worker=per_worker)
                    S[at[:, 0], at[:, 1]] = v.predict(Xt)
                m = inp.has & ~np.isnan(S)
                loss = _logloss(S[m], np.clip(inp.target[m], 0, 1))
                if best is None or loss < best[0] - 1e-9:
                    best = (loss, (l2, inputs, per_worker), S)
    loss, setting, S = best
    m = inp.has & ~np.isnan(S)
    by_worker = [auc(S[m[:, j], j], inp.target[m[:, j], j] >= 0.5) for j in range(inp.n_workers)]
    return S, setting, {"oof_logloss": loss, "oof_auc": auc(S[m], inp.target[m] >= 0.5), "l2": setting[0],
                        "inputs": setting[1], "per_worker": setting[2],
                        "oof_auc_by_worker": [None if a != a else round(a, 4) for a in by_worker]}


def fit_all(inp: VerifierInputs, rows: np.ndarray, setting, n_stats: int | None = None) -> Verifier:
    """The verifier on `rows` with a setting `oof_scores` chose: (L2, input set, per worker), or an L2 alone."""
    l2, inputs, per_worker = setting if isinstance(setting, tuple) else (setting, "all", False)
    X, y, _ = inp.design(rows)
    return fit_logistic(X, y, l2, inp.n_workers, mask=inp.mask(inputs, n_stats), per_worker=per_worker)


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (ties count half); NaN when one class is absent."""
    pos, neg = score[positive], score[~positive]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="stable")
    ranks = np.empty(len(order))
    allv = np.concatenate([pos, neg])[order]
    # average ranks for ties
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))
