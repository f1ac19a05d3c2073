"""A one-step head's λ follows the spend under a cap (`route/follow.py`): the spend comes to its
target where one λ would spend less or more, the effective cap stays within its bounds, λ is the
curve's first point within it, and a router keeps one follower per cap across requests."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fugu_pipeline.route.follow import HIGH, LOW, TARGET, CapFollower, curve_index, effective_cap


def replay(order, cap_usd: float, route_at) -> None:
    """Rows in `order` through one follower of `cap_usd`: row k gets `route_at(k, effective cap)`,
    which routes it and returns the spend to record."""
    follower = CapFollower(cap_usd)
    for k in order:
        follower.record(route_at(int(k), follower.effective()))


def _rows(n: int = 5000, dear_share: float = 0.3, seed: int = 0):
    """Each row a cheap worker ($1) and a dear one ($10); a row at effective cap e goes to the dear
    one when its own draw is under (e − 1) / 9 · `dear_share` / 0.3 (more money, more dear rows)."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    return np.arange(n), lambda k, eff: 10.0 if u[k] < (eff - 1) / 9 * dear_share / 0.3 else 1.0


def test_the_spend_comes_to_its_target_whichever_way_the_rows_lean():
    for lean in (0.1, 0.3, 0.9):  # rows that escalate less than, as, or more than the calibration said
        order, route_at = _rows(dear_share=lean)
        spent = []
        replay(order, 4.0, lambda k, eff: spent.append(route_at(k, eff)) or spent[-1])
        # the effective cap moves with the running total, so the mean keeps an offset of about
        # horizon · (the effective cap it needs − the target) / rows: under 0.06 here
        assert abs(np.mean(spent) - TARGET * 4.0) < 0.08, (lean, np.mean(spent))
        static = np.mean([route_at(int(k), 4.0) for k in order])  # the same cap, never moved
        assert (static < 3.5) == (lean < 0.3) and (static > 4.0) == (lean > 0.3), (lean, static)


def test_the_effective_cap_stays_within_its_bounds_and_starts_at_the_target():
    seen = []
    replay(np.arange(200), 4.0, lambda k, eff: seen.append(eff) or 100.0)  # every row far over the cap
    assert seen[0] == pytest.approx(TARGET * 4.0) and min(seen) == LOW * 4.0 and seen[-1] == LOW * 4.0
    seen.clear()
    replay(np.arange(200), 4.0, lambda k, eff: seen.append(eff) or 0.0)  # nothing spent
    assert max(seen) == HIGH * 4.0
    assert effective_cap(1.0, 10, 10 * TARGET) == pytest.approx(TARGET)  # on target: the target


def test_lambda_is_the_first_point_of_the_curve_within_the_effective_cap():
    costs = np.array([5.0, 4.0, 4.0, 2.0, 1.0])  # λ grows, cost does not
    assert [curve_index(costs, c) for c in (9.0, 5.0, 4.5, 4.0, 3.0, 1.0, 0.5)] == [0, 0, 1, 1, 3, 4, 4]


def test_a_followers_counts_add_up_across_threads():
    f = CapFollower(1.0)

    def spend():
        for _ in range(1000):
            f.record(0.5)
    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert f.state() == {"requests": 8000, "running_mean_usd": 0.5, "cap_usd": 1.0}


def test_follow_routes_records_the_allowed_route_and_moves_lambda_with_the_spend():
    """Two workers, the dear one better on every row: at the cap's target the rows alternate so
    that the expected spend comes to the target; a mask that allows the cheap one only records its
    cost, so the effective cap climbs and λ falls to the curve's first point."""
    from fugu_pipeline.route.budget import follow_routes

    n = 4000  # the mean keeps an offset of horizon · (3 − the target) / n from the target
    q = np.tile([0.5, 0.9], (n, 1))
    c = np.tile([1.0, 3.0], (n, 1))
    lams = np.array([0.0, 0.1, 0.2, 1.0])
    costs = np.array([3.0, 3.0, 3.0, 1.0])  # λ = 1 sends every row to the cheap worker
    f = CapFollower(2.0)
    scores, lam, eff = follow_routes(q, c, 3.0, lambda k: (lams, costs), f)
    routes = scores.argmax(axis=1)
    assert abs(c[np.arange(n), routes].mean() - TARGET * 2.0) < 0.02 and set(lam) == {0.0, 1.0}
    g = CapFollower(2.0)
    _, lam2, eff2 = follow_routes(q, c, 3.0, lambda k: (lams, costs), g, mask=np.array([True, False]))
    assert g.state()["running_mean_usd"] == 1.0 and lam2[-1] == 0.0 and eff2[-1] == HIGH * 2.0


def test_follow_routes_refuses_an_order_that_does_not_list_every_row_once():
    from fugu_pipeline.route.budget import follow_routes

    q, c = np.tile([0.5, 0.9], (3, 1)), np.tile([1.0, 3.0], (3, 1))
    curve = (np.array([0.0, 1.0]), np.array([3.0, 1.0]))
    for order in ([0, 0, 1], [0, 1], [0, 1, 3]):
        with pytest.raises(ValueError, match="each of the 3 rows once"):
            follow_routes(q, c, 3.0, lambda k: curve, CapFollower(2.0), order)
    follow_routes(q, c, 3.0, lambda k: curve, CapFollower(2.0), [2, 0, 1])


def test_settled_actual_costs_hold_the_cap_where_the_cost_model_is_off():
    """Replies that cost 1.6 times what the cost model expected (prices raised after training): the
    expected spend alone sits on its target while the calls overspend the cap by half; settled to
    what the calls cost, the actual spend comes to the target. A settle moves the spend, never the
    count."""
    from fugu_pipeline.route.budget import follow_routes

    n = 4000
    q = np.tile([0.5, 0.9], (n, 1))
    c = np.tile([1.0, 3.0], (n, 1))
    lams, costs = np.array([0.0, 0.1, 0.2, 1.0]), np.array([3.0, 3.0, 3.0, 1.0])
    actual = 1.6 * c
    spent = {}
    for name, given in (("expected", None), ("settled", actual)):
        scores, _, _ = follow_routes(q, c, 3.0, lambda k: (lams, costs), CapFollower(2.0), actual=given)
        spent[name] = actual[np.arange(n), scores.argmax(axis=1)].mean()
    assert spent["expected"] > 1.5 * TARGET * 2.0
    assert abs(spent["settled"] - TARGET * 2.0) < 0.03
    f = CapFollower(1.0)
    f.record(0.5)
    f.settle(0.25)
    assert f.state() == {"requests": 1, "running_mean_usd": 0.75, "cap_usd": 1.0}
    nan = np.full_like(c, np.nan)  # no recorded cost: the expected cost counts
    a, _, _ = follow_routes(q, c, 3.0, lambda k: (lams, costs), CapFollower(2.0), actual=nan)
    b, _, _ = follow_routes(q, c, 3.0, lambda k: (lams, costs), CapFollower(2.0))
    assert (a == b).all()
