"""The learned verifier of a cascade: P(the answer is right | prompt, answer), one logistic model.

One row per (task, worker) cell that has a reply: the prompt's features, the reply's features
(`policies/cascade/answer_features.py`: the frozen encoder reading the reply, and its statistics) and the
worker (one-hot), standardised; the target is the cell's quality (graded correctness, in [0, 1]).
L2-regularised logistic regression; the strength and the inputs it reads (everything; the reply and
the worker; the reply's statistics and the worker), one model for all workers or one per worker, are
chosen from a small grid by the out-of-fold log-loss: with few rows, hundreds of encoder columns can
cost more than they tell. `oof_scores` gives every cell a score from a verifier fitted without its
fold: what the cascade's thresholds are chosen on.

The fit is convex, so how it is solved changes only the time: an exact Newton solve in float64 (the
kernel form when there are more columns than rows), warm-started along each input set's L2 path, each
design standardised once, the shared fits reused by the per-worker settings; L-BFGS (torch) for a
design too large both ways. torch runs on one thread while it fits (`_one_thread`)."""

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
    # the first ten (`policies.cascade.answer_features.STATS_V1`), as inputs were built before they were named
    stat_names: tuple[str, ...] = ()

    @property
    def n_stats(self) -> int:
        return len(self.stat_names) or 10

    @property
    def n_workers(self) -> int:
        return self.has.shape[1]

    def passed_examples(self) -> np.ndarray | None:
        """(N, W) bool: the reply's code passes every example its prompt shows (`examples_passed` 1,
        `examples_failed` 0: a prompt that shows none has both 0); None where the statistics hold no
        example runs (`cascade.run_examples: false`)."""
        names = list(self.stat_names)
        if "examples_passed" not in names or "examples_failed" not in names:
            return None
        from fugu_pipeline.policies.cascade.code_examples import passes_all

        base = self.answer.shape[2] - len(names)
        cols = [base + names.index("examples_passed"), base + names.index("examples_failed")]
        return self.has & passes_all(self.answer[:, :, cols]).reshape(self.has.shape)

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


# A fit is an exact Newton solve (float64) while min(rows, columns) is at most NEWTON_MAX_DIM: a step
# costs O(n d^2 + d^3) on the d x d Hessian, or, wider than tall (a real encoder's 1024+ columns on a
# few hundred rows), O(n^3) through the n x n kernel (Woodbury; the kernel once per design and input
# set); warm-started, a few steps reach the optimum. Beyond it, L-BFGS (steps of O(n d)).
NEWTON_MAX_DIM = 1024
NEWTON_TOL = 1e-9  # largest |gradient| of the mean log-loss + L2 objective at which Newton stops


class _Standardised:
    """The standardised design of one fit's rows (its columns' mean and spread), made once and shared
    by every input set and L2 strength fitted on those rows; each input set's columns (and kernel)
    are cut once too."""

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.center = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale = np.where(scale > 1e-6, scale, 1.0).astype(np.float32)
        self.Z = (X - self.center) / self.scale
        self.t = np.clip(y, 0.0, 1.0).astype(np.float64)
        prior = float(np.clip(np.mean(y), 1e-3, 1 - 1e-3))
        self.bias0 = float(np.log(prior / (1 - prior)))
        self._cut: dict = {}

    def _columns(self, mask: np.ndarray | None):
        key = None if mask is None else mask.tobytes()
        if key not in self._cut:
            import torch

            cols = np.arange(self.Z.shape[1]) if mask is None else np.flatnonzero(mask)
            self._cut[key] = [cols, torch.from_numpy(np.ascontiguousarray(self.Z[:, cols], dtype=np.float64)), None]
        return self._cut[key]

    def fit(self, l2: float, mask: np.ndarray | None = None, start=None, iters: int = 100):
        """(weight over every column (0 outside `mask`), bias, center, scale) of the L2 logistic
        regression on the columns in `mask`, from `start` (a (weight, bias) of this design, e.g. the
        fit at a stronger L2) or from zero weights and the prior's log-odds."""
        cut = self._columns(mask)
        cols, Z = cut[0], cut[1]
        w0 = np.zeros(len(cols)) if start is None else np.asarray(start[0], np.float64)[cols]
        b0 = self.bias0 if start is None else float(start[1])
        if min(Z.shape) <= NEWTON_MAX_DIM and l2 > 0:
            if Z.shape[1] > Z.shape[0] and cut[2] is None:
                cut[2] = Z @ Z.T  # the kernel, once for every L2 of this input set
            w, b = _newton(Z, self.t, l2, w0, b0, cut[2])
        else:
            w, b = _lbfgs(Z, self.t, l2, w0, b0, iters)
        weight = np.zeros(self.Z.shape[1], np.float32)
        weight[cols] = w
        center, scale = self.center.astype(np.float32), self.scale.copy()
        if mask is not None:  # the columns it does not read keep the full input size, neutral
            center[~mask], scale[~mask] = 0.0, 1.0
        return weight, float(b), center, scale


def _newton(Z, t: np.ndarray, l2: float, w0: np.ndarray, b0: float, kernel=None, max_steps: int = 50):
    """Minimise mean BCE(Z w + b, t) + l2 |w|^2 (Z a float64 tensor; l2 > 0) by Newton steps with a
    backtracking line search. The Hessian's weight block M = Z'SZ + 2 l2 I is solved directly, or
    with `kernel` = Z Z' by Woodbury; the unpenalised bias by its Schur complement."""
    import torch

    n, d = Z.shape
    t = torch.from_numpy(t)
    w, b = torch.from_numpy(np.array(w0, np.float64)), float(b0)
    zero = torch.zeros(n, dtype=torch.float64)

    def objective(w, b):
        z = Z @ w + b
        return float((torch.logaddexp(zero, z) - t * z).mean() + l2 * (w @ w)), z

    def spd_solve(M, V):  # M is symmetric positive definite (>= 2 l2 I) but for rounding
        L, info = torch.linalg.cholesky_ex(M)
        return torch.cholesky_solve(V, L) if int(info) == 0 else torch.linalg.lstsq(M, V).solution

    def solve_m(s, V):  # M^-1 V
        if kernel is None:
            M = (Z.T * s) @ Z
            M.diagonal().add_(2 * l2)
            return spd_solve(M, V)
        r = s.sqrt()
        B = r[:, None] * kernel * r[None, :]
        B.diagonal().add_(2 * l2)
        return (V - Z.T @ (r[:, None] * spd_solve(B, r[:, None] * (Z @ V)))) / (2 * l2)

    f, z = objective(w, b)
    for _ in range(max_steps):
        p = torch.sigmoid(z)
        gw, gb = Z.T @ ((p - t) / n) + 2 * l2 * w, float((p - t).mean())
        if max(float(gw.abs().max()), abs(gb)) <= NEWTON_TOL:
            break
        s = p * (1 - p) / n
        c = Z.T @ s
        x = solve_m(s, torch.stack([gw, c], dim=1))
        schur = float(s.sum() - c @ x[:, 1])
        db = (gb - float(c @ x[:, 0])) / schur if schur > 1e-300 else 0.0
        dw = x[:, 0] - x[:, 1] * db
        dec, a = float(gw @ dw) + gb * db, 1.0
        while True:  # backtracking (Armijo)
            f_new, z_new = objective(w - a * dw, b - a * db)
            if f_new <= f - 1e-4 * a * dec or a < 1e-6:
                break
            a *= 0.5
        w, b, f, z = w - a * dw, b - a * db, f_new, z_new
        if dec < 1e-18:
            break
    return w.numpy(), b


def _lbfgs(Z, t: np.ndarray, l2: float, w0: np.ndarray, b0: float, iters: int = 100):
    """The same objective by torch's L-BFGS (strong Wolfe line search, float32), for a design too
    large both ways for Newton."""
    import torch

    Zt = Z.to(torch.float32)
    tt = torch.from_numpy(t.astype(np.float32))
    w = torch.tensor(w0, dtype=torch.float32, requires_grad=True)
    b = torch.tensor([b0], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iters, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(Zt @ w + b, tt) + l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy().astype(np.float64), float(b.detach()[0])


def _one_thread():
    """torch on one intra-op thread while the verifier fits: its matrices are small, and on a busy CPU
    a second thread's barrier waits on a descheduled core (10-50x slower), as for the linear heads
    (`train/threads.py`); the caller's count is given back."""
    from fugu_pipeline.train.threads import torch_threads

    return torch_threads(1)


def _own_rows(X: np.ndarray, y: np.ndarray, n_workers: int) -> list[np.ndarray | None]:
    """Per worker, its rows of X when it has enough of each class for a model of its own (20 rows,
    5 right and 5 wrong), else None: it takes the shared fit."""
    who = np.argmax(X[:, -n_workers:], axis=1)
    out = []
    for j in range(n_workers):
        m = who == j
        right = int((np.clip(y[m], 0, 1) >= 0.5).sum())
        out.append(m if m.sum() >= 20 and 5 <= right <= m.sum() - 5 else None)
    return out


def _verifier(rows: list, l2: float, per_worker: bool) -> Verifier:
    return Verifier(np.stack([r[0] for r in rows]), np.array([r[1] for r in rows], np.float32),
                    np.stack([r[2] for r in rows]), np.stack([r[3] for r in rows]), l2, per_worker)


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, n_workers: int, iters: int = 100,
                 mask: np.ndarray | None = None, per_worker: bool = False) -> Verifier:
    """One model for every worker, or (`per_worker`) one per worker: a weak model's wrong replies
    look different from a strong one's. A worker with too few rows of each class takes the shared fit."""
    with _one_thread():
        shared = _Standardised(X, y).fit(l2, mask, iters=iters)
        rows = [shared] * n_workers
        if per_worker:
            for j, m in enumerate(_own_rows(X, y, n_workers)):
                if m is not None:
                    rows[j] = _Standardised(X[m], y[m]).fit(l2, mask, iters=iters)
    return _verifier(rows, l2, per_worker)


def _logloss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _path(design: _Standardised, masks: dict, l2_grid) -> dict:
    """{(input set, L2): fit} on one design: each input set's L2 path from the strongest penalty to
    the weakest, each fit starting from the previous one's optimum."""
    out = {}
    for inputs, mask in masks.items():
        start = None
        for l2 in sorted(set(l2_grid), reverse=True):
            out[inputs, l2] = fit = design.fit(l2, mask, start)
            start = fit[:2]
    return out


def oof_scores(inp: VerifierInputs, folds: np.ndarray, l2_grid=L2_GRID, n_stats: int | None = None,
               input_sets=INPUT_SETS) -> tuple[np.ndarray, tuple[float, str], dict]:
    """(scores (N, W) out of fold, NaN where no reply; the (L2 strength, input set, per worker)
    chosen; figures: log-loss and AUC of the chosen setting's out-of-fold scores, overall and per
    worker: how well it tells a worker's right replies from its wrong ones, what a cascade's stop rule
    needs). Every fit is made once: per fold, the shared design and each worker's are standardised
    once, each input set's L2 path is fitted warm-started, and the per-worker settings reuse the
    shared fits (a worker with too few rows takes it), so the grid costs what `fit_logistic` over it
    would, without the repeats."""
    rows_all = np.arange(len(folds))
    masks = {inputs: inp.mask(inputs, n_stats) for inputs in input_sets}
    fits = {}  # fold -> (test design, test cells, shared path, per worker: its path or None)
    with _one_thread():
        for f in np.unique(folds):
            (X, y, _), (Xt, _, at) = inp.design(rows_all[folds != f]), inp.design(rows_all[folds == f])
            if len(Xt) == 0 or len(X) == 0:
                continue
            own = [None if m is None else _path(_Standardised(X[m], y[m]), masks, l2_grid)
                   for m in _own_rows(X, y, inp.n_workers)]
            fits[f] = (Xt, at, _path(_Standardised(X, y), masks, l2_grid), own)
    best: tuple | None = None
    for per_worker in (False, True):
        for inputs in input_sets:
            for l2 in l2_grid:
                S = np.full(inp.has.shape, np.nan)
                for Xt, at, shared, own in fits.values():
                    rows = [shared[inputs, l2] if o is None or not per_worker else o[inputs, l2] for o in own]
                    S[at[:, 0], at[:, 1]] = _verifier(rows, l2, per_worker).predict(Xt)
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
