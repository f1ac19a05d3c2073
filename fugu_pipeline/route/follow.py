"""A one-step head under a cap: λ follows the spend.

A cap's λ is chosen on the calibration's rows (`budget.py`): the smallest λ whose mean expected cost
there, plus the cap's margin of standard errors, is within the cap. On new prompts the same λ can
spend far less than the cap: the margin holds it under on purpose, and new prompts' predicted gains
differ from the calibration's. Held out, a head chosen at a 20% cap spent 9.5% of the strongest
worker's cost (docs/results.md). So a head serving a cap does not keep one λ. Per
cap, the **follower** counts the requests routed under it (n) and what they cost (spent), and
before each request it gives an effective cap

    effective = cap · TARGET − (spent − n · cap · TARGET) / HORIZON, within [cap · LOW, cap · HIGH]

the cap's target, less what the spend so far ran over it (or plus what it ran under) spread over the
next `HORIZON` requests. The request is routed at the smallest λ of the calibration's curve whose
mean expected cost is within the effective cap, with no margin (`curve_index`; the cheapest point
where none is): the running mean is held at the cap's target by the spend itself, not by a margin.

The spend is counted in two steps. When a request is routed, its route's **expected cost**
(`route/expected_cost.py`, the cost model fitted on training rows) is recorded, so the requests
routed before its reply comes back (a batch, concurrent requests) already count it. When the reply's
**actual cost** is known (`serve` reads it off the worker's reply), the follower is **settled**: the
difference between the two is added to the spend (`RunningSpend.settle`). The follower therefore
holds what the calls really cost at the target, not what the cost model thought they would cost:
where prices change after training (a catalog update) or new prompts draw longer replies than the
training rows did, the effective cap falls until the actual running mean is back at the target.
A request no worker answered keeps its expected cost; `route`, which calls nothing, counts the
expected cost alone. One request counts at most `MAX_ONE` caps' worth (what is recorded, and again
what a reply settles): a bogus cost in a reply from a hostile OpenAI-compatible server (a finite
`usage.cost` of a million dollars) would otherwise hold the effective cap at its floor until the
router reloads; counted at 50 caps, it holds it down for about that many requests, then the
follower comes back. A real reply that costs more than 50 times the cap is counted short, and
the server's `/metrics` still shows what every reply cost.

`evaluate`, and `train`'s figures out of fold, replay recorded rows the same way: each row is
routed, then settled by the recorded cost of the worker it was routed to. A row's own cost never
moves its own route, only the routes of the rows after it in traffic order, as a reply already
served moves the routes of the requests after it.

A cap the calibration cannot keep with its margin is refused (`Router.own_budget_point`): the
follower moves λ only for a cap the calibration's rows say is within reach. The one exception is the
cap a head was shipped under by `train --cap`, which it serves when a request names no cap: such a
request is never refused, and where the calibration cannot keep that cap it starts from the curve's
cheapest point.

`evaluate`, and `train`'s figures for a head at a cap out of fold (`budget.cap_route_oof`), replay
rows through a follower in **traffic order** (`traffic_order`): sorted by a hash of the task id, not
in the file's order. An import lists its rows one source after another (every HumanEval row, then
every MBPP row), where live traffic interleaves kinds of prompt; replayed in the file's order, a dear
first kind would use up what the kinds after it are owed. The hash interleaves them at random, the
same way on every run, and a row is served at the same place however the file orders its rows. A
cascade's spend guard (`policies/cascade/spend.py`) replays the same order, and under a cap, asked
of a cascade or the one it was trained under, it follows the spend by the same effective cap, over
the cascade's saved points.
"""

from __future__ import annotations

import threading

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.hashing import sha256_text

TARGET = 0.98  # the share of the cap the running mean is aimed at
HORIZON = 50  # requests over which a difference from the target is paid back (or spent)
LOW, HIGH = 0.25, 4.0  # the effective cap stays within these multiples of the cap
MAX_FOLLOWERS = 256  # distinct caps a router keeps a follower for (the least recently used dropped)
MAX_ONE = 50.0  # the most one request counts in a follower, in caps (the module docstring)


class RunningSpend:
    """Requests counted under one cap and what they cost; safe across threads."""

    def __init__(self, cap_usd: float):
        self.cap = float(cap_usd)
        self.n, self.spent = 0, 0.0
        self.moved = 0.0  # Σ of the caps the requests were counted under, less n · cap (`set_cap`)
        self._lock = threading.Lock()

    def set_cap(self, cap_usd: float) -> None:
        """Count the next requests under `cap_usd`; those counted so far keep the cap they were
        counted under, so what the spend ran over (or under) them stays owed (or in hand)."""
        with self._lock:
            cap = float(cap_usd)
            self.moved += self.n * (self.cap - cap)
            self.cap = cap

    def counted(self) -> float:
        """The requests counted, in requests at the current cap: Σ of their caps / the cap (n while
        the cap never moved). Call under the lock."""
        return self.n + self.moved / self.cap if self.cap > 0 else float(self.n)

    def record(self, cost_usd: float) -> None:
        """Count one request at `cost_usd` (at most `MAX_ONE` caps)."""
        with self._lock:
            self.n += 1
            self.spent += min(float(cost_usd), MAX_ONE * self.cap)

    def settle(self, delta_usd: float) -> None:
        """Add what a counted request's reply cost beyond what was recorded for it (negative: less;
        at most `MAX_ONE` caps); the request count stays."""
        with self._lock:
            self.spent += min(float(delta_usd), MAX_ONE * self.cap)

    def state(self) -> dict:
        with self._lock:
            return {"requests": self.n, "running_mean_usd": self.spent / self.n if self.n else 0.0, "cap_usd": self.cap}

    def effective(self) -> float:
        """The effective cap the next request gets (`effective_cap` over these counts)."""
        with self._lock:
            return effective_cap(self.cap, self.counted(), self.spent)


def effective_cap(cap: float, n: float, spent: float, target: float = TARGET, horizon: float = HORIZON) -> float:
    """The module docstring's effective cap after `n` requests that spent `spent` (same unit as `cap`)."""
    goal = cap * target
    return min(HIGH * cap, max(LOW * cap, goal - (spent - n * goal) / horizon))


class CapFollower(RunningSpend):
    """The spend under one cap and the effective cap it gives the next request (module docstring)."""


def curve_index(costs: np.ndarray, limit: float) -> int:
    """The index of the first point (the smallest λ) of a calibration curve (`costs`: each λ's mean
    expected cost, not increasing with λ) whose cost is within `limit`; the cheapest point where none is."""
    ok = within_cap(np.asarray(costs, dtype=np.float64), limit)
    return int(np.argmax(ok)) if ok.any() else int(np.argmin(costs))


def traffic_order(task_ids) -> np.ndarray:
    """The positions of `task_ids` in the order a replay serves them (the module docstring): by the
    sha256 of each id."""
    keys = [sha256_text(f"spend-guard\x00{t}") for t in task_ids]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
