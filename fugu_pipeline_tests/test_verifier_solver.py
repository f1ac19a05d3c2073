"""The verifier's fast grid (`policies/cascade/verifier.py`: Newton, warm starts along the L2 path, shared fits
reused by the per-worker settings) against a plain reference: every grid point fitted from scratch,
in the order the grid lists them, by a textbook float64 Newton run to |gradient| < 1e-11.

Tolerance: both solve the same strictly convex problem (mean log-loss + L2 > 0), so they differ by
optimiser tolerance only: the fast Newton stops at |gradient| <= 1e-9 and keeps float32 weights,
and the scores agree to ~1e-7 (measured). 1e-5 leaves a margin and still fails an under-converged
solver: the old 100-step float32 L-BFGS missed these optima by up to ~1e-3 on real features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fugu_pipeline.policies.cascade import verifier as v
from fugu_pipeline.policies.cascade.verifier import INPUT_SETS, L2_GRID, VerifierInputs, fit_logistic, oof_scores

TOL = 1e-5


def _problem(seed: int = 0, n: int = 66, d: int = 5, a: int = 9, n_stats: int = 4, few: bool = True):
    """Three workers; the third answers on ~15% of the tasks (too few rows for a model of its own
    in any fold) when `few`; the reply's statistics and the first prompt column tell right from wrong."""
    rng = np.random.default_rng(seed)
    prompt = rng.normal(size=(n, d)).astype(np.float32)
    answer = rng.normal(size=(n, 3, a)).astype(np.float32)
    # the first statistic tells right from wrong the opposite way for the second worker: a model per worker wins
    sign = np.array([1.5, -1.5, 1.0])
    logit = np.array([0.3, 0.8, 1.2]) + 0.8 * prompt[:, :1] + sign * answer[:, :, a - n_stats] + 0.4 * answer[:, :, 0]
    right = rng.random((n, 3)) < 1 / (1 + np.exp(-logit))
    target = np.where(rng.random((n, 3)) < 0.15, rng.random((n, 3)), right.astype(float))
    has = rng.random((n, 3)) > 0.05
    if few:
        has[:, 2] &= rng.random(n) < 0.15
    folds = np.arange(n) % 3
    return VerifierInputs(prompt, answer, has, target, tuple(f"s{i}" for i in range(n_stats))), folds


def _tight(Z: np.ndarray, t: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """Textbook Newton on the full (d + 1) x (d + 1) Hessian, from zero, in numpy, to |gradient| < 1e-11."""
    A = np.hstack([Z.astype(np.float64), np.ones((len(Z), 1))])
    reg = np.append(np.full(Z.shape[1], 2 * l2), 0.0)
    theta = np.zeros(A.shape[1])

    def loss(th):
        z = A @ th
        return np.mean(np.logaddexp(0, z) - t * z) + l2 * th[:-1] @ th[:-1]

    for _ in range(200):
        p = 1 / (1 + np.exp(-(A @ theta)))
        g = A.T @ (p - t) / len(t) + reg * theta
        if np.abs(g).max() < 1e-11:
            break
        step = np.linalg.solve((A.T * (p * (1 - p) / len(t))) @ A + np.diag(reg), g)
        a = 1.0
        while loss(theta - a * step) > loss(theta) + 1e-15 and a > 1e-10:
            a /= 2
        theta -= a * step
    else:
        raise AssertionError("the reference did not converge")
    return theta[:-1], float(theta[-1])


def _reference_predict(X, y, Xt, l2, mask, n_workers, per_worker):
    """Plain: standardise the fit's rows, fit from zero; per worker when it has 20 rows and 5 of each
    class, else the shared model; score the test rows by their worker's model."""
    def fit(rows):
        Xf = X[rows]
        center, scale = Xf.mean(0), Xf.std(0)
        scale = np.where(scale > 1e-6, scale, 1.0)
        w, b = _tight(((Xf - center) / scale)[:, mask], np.clip(y[rows], 0, 1), l2)
        return lambda Q: 1 / (1 + np.exp(-(((Q - center) / scale)[:, mask] @ w + b)))

    who, who_t = np.argmax(X[:, -n_workers:], 1), np.argmax(Xt[:, -n_workers:], 1)
    shared = fit(np.ones(len(X), bool))
    out = shared(Xt)
    for j in range(n_workers):
        m = who == j
        right = (np.clip(y[m], 0, 1) >= 0.5).sum()
        if per_worker and m.sum() >= 20 and 5 <= right <= m.sum() - 5:
            out[who_t == j] = fit(m)(Xt[who_t == j])
    return out


def _reference_grid(inp: VerifierInputs, folds: np.ndarray):
    rows = np.arange(len(folds))
    losses = {}
    for per_worker in (False, True):
        for inputs in INPUT_SETS:
            for l2 in L2_GRID:
                S = np.full(inp.has.shape, np.nan)
                for f in np.unique(folds):
                    X, y, _ = inp.design(rows[folds != f])
                    Xt, _, at = inp.design(rows[folds == f])
                    S[at[:, 0], at[:, 1]] = _reference_predict(X, y, Xt, l2, inp.mask(inputs), inp.n_workers, per_worker)
                m = inp.has
                p = np.clip(S[m], 1e-6, 1 - 1e-6)
                t = np.clip(inp.target[m], 0, 1)
                losses[l2, inputs, per_worker] = (float(-np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))), S)
    return losses


@pytest.fixture(scope="module")
def problem():
    inp, folds = _problem()
    return inp, folds, _reference_grid(inp, folds)


def test_the_fast_grid_chooses_the_reference_setting_and_gives_its_scores(problem):
    inp, folds, ref = problem
    S, setting, fig = oof_scores(inp, folds)
    best = min(ref, key=lambda k: ref[k][0])
    assert setting == best
    assert np.array_equal(np.isnan(S), np.isnan(ref[best][1]))
    assert np.nanmax(np.abs(S - ref[best][1])) < TOL
    assert fig["oof_logloss"] == pytest.approx(ref[best][0], abs=TOL)
    # the choice is not a near-tie that optimiser noise could flip, and it is a per-worker one:
    # the grid's per-worker branch (with the third worker on the shared fit) is what was compared
    losses = sorted(loss for loss, _ in ref.values())
    assert losses[1] - losses[0] > 100 * TOL
    assert setting[2] is True


@pytest.mark.parametrize("inputs", INPUT_SETS)
@pytest.mark.parametrize("per_worker", [False, True])
def test_every_grid_point_gives_the_reference_scores(problem, inputs, per_worker):
    """Each input set (the masked ones too) alone, shared and per worker, along the whole L2 path."""
    inp, folds, ref = problem
    if not per_worker:  # the grid of one input set and one L2: shared or per worker, as the reference
        for l2 in L2_GRID:
            S, setting, _ = oof_scores(inp, folds, l2_grid=(l2,), input_sets=(inputs,))
            assert setting[2] == (ref[l2, inputs, True][0] < ref[l2, inputs, False][0] - 1e-9)
            assert np.nanmax(np.abs(S - ref[l2, inputs, setting[2]][1])) < TOL, (l2, inputs)
    rows = np.arange(len(folds))
    X, y, _ = inp.design(rows[folds != 0])
    Xt, _, _ = inp.design(rows[folds == 0])
    for l2 in L2_GRID:
        got = fit_logistic(X, y, l2, inp.n_workers, mask=inp.mask(inputs), per_worker=per_worker).predict(Xt)
        want = _reference_predict(X, y, Xt, l2, inp.mask(inputs), inp.n_workers, per_worker)
        assert np.abs(got - want).max() < TOL, (l2, inputs, per_worker)


def test_a_worker_with_too_few_rows_takes_the_shared_fit(problem):
    inp, folds, _ = problem
    rows = np.arange(len(folds))
    X, y, _ = inp.design(rows[folds != 0])
    assert (np.argmax(X[:, -3:], 1) == 2).sum() < 20
    shared = fit_logistic(X, y, 0.01, 3)
    own = fit_logistic(X, y, 0.01, 3, per_worker=True)
    assert np.array_equal(own.weight[2], shared.weight[2]) and own.bias[2] == shared.bias[2]
    assert not np.allclose(own.weight[0], shared.weight[0])


def test_wide_inputs_are_solved_through_the_kernel_and_the_widest_by_lbfgs(monkeypatch):
    """More columns than rows (a real encoder's features on a few hundred replies): the Newton step
    goes through the n x n kernel; past NEWTON_MAX_DIM both ways, L-BFGS (float32, looser)."""
    inp, folds = _problem(seed=1, n=60, d=60, a=70, n_stats=4, few=False)
    rows = np.arange(len(folds))
    X, y, _ = inp.design(rows[folds != 0])
    Xt, _, _ = inp.design(rows[folds == 0])
    assert X.shape[1] > len(X)
    for inputs in ("all", "stats"):
        mask = inp.mask(inputs)
        for l2 in (1e-3, 1e-1):
            want = _reference_predict(X, y, Xt, l2, mask, inp.n_workers, per_worker=False)
            got = fit_logistic(X, y, l2, inp.n_workers, mask=mask).predict(Xt)
            assert np.abs(got - want).max() < TOL, (inputs, l2)
            with monkeypatch.context() as m:
                m.setattr(v, "NEWTON_MAX_DIM", 0)
                slow = fit_logistic(X, y, l2, inp.n_workers, mask=mask).predict(Xt)
            assert np.abs(slow - want).max() < 5e-3, (inputs, l2)


def test_the_fit_runs_on_one_thread_and_gives_the_caller_its_count_back(monkeypatch):
    inp, folds = _problem(n=45)
    seen = set()
    newton = v._newton
    monkeypatch.setattr(v, "_newton", lambda *a, **k: seen.add(torch.get_num_threads()) or newton(*a, **k))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        oof_scores(inp, folds, l2_grid=(0.1,), input_sets=("stats",))
        assert seen == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
