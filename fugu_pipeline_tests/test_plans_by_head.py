"""The head over plans of `benchmarks/plans_by_head.py`: out of fold, it sends each kind of prompt to
the action that is right there at the least cost, and the penalty its inner cross-validation picks
is one of the grid's."""

from __future__ import annotations

import numpy as np

from benchmarks.plans_by_head import ALPHAS, head_candidates, pick_alpha


def _two_kinds(n: int = 400, seed: int = 0):
    """Prompts of two kinds (two directions of the feature space); the cheap action (0) is right on
    kind A only, the dear one (1) everywhere."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 2, n)
    x = rng.normal(0, 0.3, (n, 8))
    x[:, 0] += np.where(kind == 0, 2.0, -2.0)
    Q = np.stack([(kind == 0).astype(float), np.ones(n)], axis=1)
    C = np.tile([0.1, 1.0], (n, 1))
    return x, Q, C, kind, np.arange(n) % 5


def test_each_kind_goes_to_its_cheapest_right_action_out_of_fold():
    x, Q, C, kind, folds = _two_kinds()
    got, alphas = head_candidates(x, Q, C, folds, ref=1.0)
    q, c = got[0.3]
    assert q.mean() > 0.97  # kind B still goes to the dear action
    assert np.isclose(c[kind == 0], 0.1).mean() > 0.95  # kind A to the cheap one
    assert np.isclose(c[kind == 1], 1.0).mean() > 0.95
    assert all(a in ALPHAS for a in alphas) and len(alphas) == 5
    q0, c0 = got[0.0]  # no price on cost: quality alone, so the dear action on every row of kind B
    assert q0.mean() > 0.97


def test_the_penalty_follows_the_noise():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 20))
    folds = np.arange(300) % 5
    clean = x @ rng.normal(size=(20, 1))
    noise = rng.normal(size=(300, 1)) * 50
    assert pick_alpha(x, clean, folds) < pick_alpha(x, noise, folds)
