"""The trial of `benchmarks/cap_tracking.py`: a λ that follows the spend so far spends up to its
target where the calibration's λ would spend less, and pulls back where it would spend more."""

from __future__ import annotations

import numpy as np

from benchmarks.cap_tracking import follow


def _rows(n: int = 5000, dear_share: float = 0.3, seed: int = 0):
    """Each row a cheap worker ($1) and a dear one ($10); a row at effective cap e goes to the dear
    one when its own draw is under (e − 1) / 9 · `dear_share` / 0.3 (more money, more dear rows)."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)

    def route_at(k: int, eff: float) -> tuple[float, float]:
        dear = u[k] < (eff - 1) / 9 * dear_share / 0.3
        return float(dear), 10.0 if dear else 1.0

    return np.arange(n), route_at


def test_the_spend_comes_to_its_target_whichever_way_the_rows_lean():
    for lean in (0.1, 0.3, 0.9):  # rows that escalate less than, as, or more than the calibration said
        order, route_at = _rows(dear_share=lean)
        q, c = follow(order, cap_usd=4.0, horizon=50, target=0.98, route_at=route_at)
        # the effective cap moves with the running total, so the mean keeps an offset of about
        # horizon · (the effective cap it needs − the target) / rows: under 0.06 here
        assert abs(c.mean() - 0.98 * 4.0) < 0.08, (lean, c.mean())
        static = np.array([route_at(int(k), 4.0)[1] for k in order]).mean()  # the same cap, never moved
        assert (static < 3.5) == (lean < 0.3) and (static > 4.0) == (lean > 0.3), (lean, static)


def test_the_effective_cap_stays_within_a_quarter_and_four_times_the_cap():
    seen = []

    def route_at(k: int, eff: float) -> tuple[float, float]:
        seen.append(eff)
        return 0.0, 100.0  # every row far over the cap: the effective cap falls to its floor and stays
    follow(np.arange(50), cap_usd=4.0, horizon=10, target=1.0, route_at=route_at)
    assert seen[0] == 4.0 and min(seen) == 1.0 and seen[-1] == 1.0
    seen.clear()
    follow(np.arange(50), cap_usd=4.0, horizon=10, target=1.0, route_at=lambda k, e: (seen.append(e), (0.0, 0.0))[1])
    assert max(seen) == 16.0  # nothing spent: up to four times the cap
