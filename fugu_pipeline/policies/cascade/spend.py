"""Keeping a cascade's cost cap on new requests: the points a cap chooses among, and the spend guard.

A cap's points are chosen on validation with a margin (mean cost plus the cap's `margin_z` standard
errors, 1.645 by default), but live traffic can escalate more than validation did, so serving keeps
the cap on the running spend too. Per cap, a **spend guard** (`SpendGuard`) counts the requests
served under it (n) and what they cost (spent).

A cap, whether a request **asks** it of a checkpoint (`fugu_budget`, `serve --cap`, `evaluate --cap`)
or the checkpoint was **trained** under it (`train --cap`, for requests that ask none), follows the
spend as a one-step head's follower does (`route/follow.py`): each request gets the effective cap
`cap · 0.98 − (spent − n · cap · 0.98) / 50` (within [cap/4, 4·cap]) and the most accurate saved
point whose validation cost is within it, with no margin (`request_point`, `follow_pick`); what it
cost then counts in the guard. Savings on cheap prompts buy escalations on later ones, and prompts
that escalate more than validation did (harder traffic, a verifier that scores new replies lower,
dearer calls) lower the effective cap until the running mean is back at the target. A cap asked
is refused where no saved point keeps it with its margin (`request_cap`). `train` scores a cascade
under its cap, and its rows of the table at caps, by the same replay out of fold
(`follow_fold.py`), so what a cap serves is what was chosen.

A checkpoint that shipped one worker alone under its cap (always the strongest, or the best worker
within the cap, beat every cascade out of fold) keeps serving that worker while the effective cap allows its cost, and past
that the most accurate saved point cheaper than it (`own_point`): following never turns it into a
cascade it did not choose.

Recorded rows reach the guard in **traffic order** (`route/follow.traffic_order`): sorted by a hash of the task
id, not in the file's order. An import lists its rows one source after another (every HumanEval row,
then every MBPP row), where live traffic interleaves kinds of prompt; served in the file's order, a
dear first kind spends the guard's allowance and the kinds after it are cut for what came before.
The hash interleaves them at random, the same way on every run, and a row is served at the same
place however the file orders its rows, so `evaluate` and the contest give a checkpoint the same
figures on the same rows.

A checkpoint whose plans per group share one pooled cap keeps a follower per group: each group's
part of the cap is the cost of the saved point `share_parts` allocates it, scaled so that the parts,
weighted by the groups' shares of the rows the points were chosen on, add up to the cap (no part
above what its group's dearest point can spend: `groups.fill_parts`). A run of
one kind of prompt (a batch of code questions whose plan costs three times the pooled cap) is then
not cut to the pooled cap while it lasts; a group whose prompts escalate more than its points did
on validation is.

The parts add up to the cap only at that mix of kinds. Beside the groups' followers one **pooled
guard** counts every grouped request and keeps the **mix of requests**: each group's share of them,
an exponential average over about `MIX_WINDOW` requests that starts at the rows' mix (`moved_mix`).
Once a group's share is `MIX_BAND` away from its share of the rows, the cap is shared again over
the mix of requests as `share_parts` shares it (`RequestShares.parts_for`), and each group's
follower keeps its new part: traffic that turns to the dear kind for good brings that kind's part
down toward the pooled cap within a few windows, and traffic that turns to the cheap kind lets the
dear kind spend more. A follower whose part moves keeps what it owed or saved under the part it had
(`RunningSpend.set_cap`). The pooled guard is also the backstop: once the pooled spend runs
`POOL_SLACK` requests' worth of the cap over the cap, its allowance

    allowance = min(cap, cap − (spent − n · cap − POOL_SLACK · cap) / HORIZON)

falls below the cap, and every group's effective cap is cut by the allowance's share of the cap
(`request_point`), so the groups cut together and the running mean comes back under the pooled cap.
"""

from __future__ import annotations

import threading

import numpy as np

from fugu_pipeline.cost_cap import DEFAULT_MARGIN_Z, within_cap
from fugu_pipeline.route.follow import RunningSpend

HORIZON = 50  # requests over which an overspend is paid back
MAX_GUARDS = 256  # distinct caps a server keeps a guard for (the least recently used dropped)
POOL_SLACK = 1000.0  # requests' worth of the pooled cap a shared cap's pooled spend may run over before it cuts
MIX_WINDOW = 1000.0  # requests over which a shared cap's mix of requests moves (`moved_mix`)
MIX_BAND = 0.05  # a shared cap is shared again once a group's share of the requests is this far from the rows' share
MIX_STEP = 0.01  # ... to the nearest this much


def cap_points(head_params: dict, metrics: dict, domain: str | None = None) -> list[dict]:
    """The points a cap chooses among ({cost_usd, cost_se, quality, plan}, validation figures on the
    non-test rows): the domain's frontier when it has one (else the pooled frontier), plus the plan
    searched for each share of the out-of-fold frontier."""
    front = (head_params.get("domains_frontier") or {}).get(domain or "") or head_params.get("frontier") or []
    levels = [{"cost_usd": lv["fit_cost_usd"], "cost_se": lv.get("fit_cost_se", 0.0), "quality": lv["fit_quality"],
               "plan": lv["plan_spec"]} for lv in ((metrics or {}).get("frontier_oof") or {}).get("levels", [])
              if lv.get("plan_spec") and "fit_cost_usd" in lv]
    return list(front) + (levels if not (head_params.get("domains_frontier") or {}).get(domain or "") else [])


def guard_key(cap_usd: float, group: str | None = None, pooled: bool = False) -> tuple:
    """The key a server (and `evaluate`) keeps a cap's guard under: the pooled guard beside a shared
    cap's parts, a group's guard (keyed by the whole cap: its part moves with the mix of requests),
    or a whole cap's."""
    cap = round(float(cap_usd), 15)
    return ("pooled", cap) if pooled else (cap,) if group is None else ("group", str(group), cap)


def guarded_cap(shares, group: str | None) -> tuple[tuple, float]:
    """(the guard's key, its cap in $ per request) for a request of `group` under `shares` (a
    `RequestShares`): the group's part of a shared cap where it has one (its part over the mix of
    the rows the plans were chosen on; keyed by the whole cap, as the part moves with the mix of
    requests), else the whole cap."""
    part = shares.group_caps.get(str(group)) if group is not None else None
    return (guard_key(shares.cap_usd, group), part) if part is not None else (guard_key(shares.cap_usd), shares.cap_usd)


class CapOutOfReach(ValueError):
    """A cap asked of a checkpoint that no saved point meets on validation; the message says how far
    to raise it."""


def strongest_cost(expected_cost: dict, worker_quality: dict) -> float:
    """The expected cost per request of the worker most accurate on validation (a cap's share is of it)."""
    strongest = max(worker_quality, key=worker_quality.get) if worker_quality else None
    return expected_cost.get(strongest, 0.0) if strongest else max(expected_cost.values(), default=0.0)


def request_cap(points: list[dict], budget, expected_cost: dict, worker_quality: dict) -> float:
    """The cap `budget` (`cost_cap.CostCap`, asked by a request or a command) means for a cascade
    whose saved points are `points` ($ per request; a share is of the expected cost of the worker
    most accurate on validation); CapOutOfReach when no point's cost bound (mean + the cap's
    `margin_z` standard errors) is within it."""
    ref = strongest_cost(expected_cost, worker_quality)
    cap, z = budget.usd_per_request(ref), budget.margin_z
    if not any(within_cap(bound(p, z), cap) for p in points):
        usd = _rounded_up(min(bound(p, z) for p in points) * 1000)
        share = f"a share of at least {_rounded_up(usd / 1000 / ref):g} or " if ref > 0 else ""
        raise CapOutOfReach(f"{budget.describe()}: no cascade point of this checkpoint meets it on validation "
                            f"(the cheapest costs ${usd:g} per 1,000 requests, plus {z:g} standard errors); raise "
                            f"the cap to {share}${usd:g} per 1,000 requests")
    return cap


class RequestShares:
    """A cap asked of a checkpoint (by a request's `fugu_budget`, `serve --cap` or `evaluate --cap`),
    or the one it was trained under, as it is kept: `cap_usd` ($ per request) and, where the
    checkpoint holds a frontier per group, each group's part of it (`group_caps`, as a cap given to
    `train` is shared: `share_parts`, over the mix of the rows the plans were chosen on) and what
    shares it again when the mix of requests moves (`parts`, as `group_parts` reads them, and the
    cap's margin `z`: `parts_for`)."""

    def __init__(self, cap_usd: float, group_caps: dict[str, float] | None = None,
                 parts: list[tuple[str, list[dict], float]] | None = None, z: float = 0.0):
        self.cap_usd, self.group_caps = float(cap_usd), dict(group_caps or {})
        self.parts, self.z = (parts if self.group_caps else None), float(z)
        # each group's share of the rows the plans were chosen on, among the groups with a part (those
        # whose requests the pooled guard counts): where `moved_mix` starts a server's mix of requests
        grouped = [(g, w) for g, _, w in self.parts or [] if g in self.group_caps]
        total = sum(w for _, w in grouped)
        self.start_mix: dict[str, float] = {g: w / total for g, w in grouped} if total > 0 else {}
        self._shared: dict[tuple, dict[str, float]] = {}
        self._lock = threading.Lock()

    def mix_weights(self, mix: dict[str, float]) -> list[float]:
        """`parts`' weights for `mix` (each group's share of the requests counted, `moved_mix`): the
        rows of no group ("*"), and of a group with no part, keep their share of the rows the plans
        were chosen on."""
        rest = sum(w for g, _, w in self.parts if g not in self.group_caps)
        return [(1.0 - rest) * float(mix.get(g, 0.0)) if g in self.group_caps else w for g, _, w in self.parts]

    def parts_for(self, mix: dict[str, float]) -> dict[str, float]:
        """Each group's part of the cap for the mix of requests (`mix_weights`): `group_caps` while
        every group's share is within `MIX_BAND` of its share of the rows the plans were chosen on,
        else the cap shared among the saved points as `share_parts` shares it over those shares (to
        the nearest `MIX_STEP`; with the margin, else without it; else `group_caps`)."""
        if not self.parts or not mix:
            return self.group_caps
        now = self.mix_weights(mix)
        if max(abs(a - w) for a, (_, _, w) in zip(now, self.parts)) < MIX_BAND:  # near the mix the parts were shared on
            return self.group_caps
        key = tuple(round(w / MIX_STEP) for w in now)
        with self._lock:
            got = self._shared.get(key)
        if got is None:
            weighted = [(g, pts, k * MIX_STEP) for (g, pts, _), k in zip(self.parts, key)]
            shared = share_parts(weighted, self.cap_usd, self.z) or share_parts(weighted, self.cap_usd, 0.0)
            got = {**self.group_caps, **shared[0]} if shared else self.group_caps
            with self._lock:
                self._shared[key] = got
                while len(self._shared) > MAX_GUARDS:
                    self._shared.pop(next(iter(self._shared)))
        return got


def request_shares(head_params: dict, metrics: dict, budget) -> RequestShares:
    """The cap `budget` asks of a cascade, shared among its groups where it holds a frontier per
    group (`share_parts`), else kept on its one pool of points; CapOutOfReach, saying how far to
    raise it, where no choice of points meets it."""
    metrics = metrics or {}
    costs, quality = metrics.get("expected_cost_usd") or {}, metrics.get("worker_quality") or {}
    ref = strongest_cost(costs, quality)
    cap, z = budget.usd_per_request(ref), budget.margin_z
    parts = group_parts(head_params, metrics)
    if parts is None:  # one pool of points
        points = cap_points(head_params, metrics)
        if not points:
            raise CapOutOfReach(f"{budget.describe()}: this cascade records no budget points; retrain it with "
                                "`fugu-lite train`")
        request_cap(points, budget, costs, quality)
        return RequestShares(cap)
    got = share_parts(parts, cap, z)
    if got is None:  # what the cheapest point of every group costs, the groups weighted by their rows
        cheap = [min(pts, key=lambda p: float(p["cost_usd"])) for _, pts, _ in parts]
        need = sum(w * float(p["cost_usd"]) for (_, _, w), p in zip(parts, cheap)) + z * float(np.sqrt(sum(
            (w * float(p.get("cost_se") or 0.0)) ** 2 for (_, _, w), p in zip(parts, cheap))))
        usd = _rounded_up(need * 1000)
        share = f"a share of at least {_rounded_up(usd / 1000 / ref):g} or " if ref > 0 else ""
        raise CapOutOfReach(f"{budget.describe()}: no choice of this checkpoint's points per group meets it on "
                            f"validation (the cheapest costs ${usd:g} per 1,000 requests over the groups' mix, plus "
                            f"{z:g} standard errors); raise the cap to {share}${usd:g} per 1,000 requests")
    return RequestShares(cap, got[0], parts, z)


def share_parts(parts: list[tuple[str, list[dict], float]], cap_usd: float, z: float) -> tuple[dict, dict] | None:
    """({group: its part of `cap_usd`}, {group: its chosen point}) for a checkpoint with a
    frontier per group (`parts`, as `group_parts` reads them): one saved point per group (and the
    pooled frontier for the rows of no group) by `groups.allocate`, the most accurate whole whose
    cost bound, the groups weighted by their shares of the rows the plans were chosen on, is within
    the cap; each group's part is its point's cost scaled so that the weighted parts add up to the
    cap, never above its dearest point's cost (`groups.fill_parts`; as `groups.shared_policy` shares a cap
    given to `train`). None: no choice within the cap."""
    from fugu_pipeline.policies.cascade.groups import allocate, fill_parts

    arr = lambda pts, key: np.array([float(p.get(key) or 0.0) for p in pts])  # noqa: E731
    got = allocate([arr(p, "quality") for _, p, _ in parts], [arr(p, "cost_usd") for _, p, _ in parts],
                   [arr(p, "cost_se") for _, p, _ in parts], [w for _, _, w in parts], cap_usd, z)
    if got is None:
        return None
    chosen = {g: pts[i] for (g, pts, _), i in zip(parts, got)}
    filled = fill_parts({g: float(chosen[g]["cost_usd"]) for g, _, _ in parts},
                        {g: max(float(p["cost_usd"]) for p in pts) for g, pts, _ in parts}, {g: w for g, _, w in parts}, cap_usd)
    return {g: part for g, part in filled.items() if g != "*" and part > 0}, chosen


def group_parts(head_params: dict, metrics: dict) -> list[tuple[str, list[dict], float]] | None:
    """[(group, its saved points, its share of the rows the plans were chosen on)], with the pooled
    frontier for the rows of no group ("*"); None where the checkpoint holds no frontier per group."""
    per = head_params.get("domains_frontier") or {}
    rows = {g["domain"]: int(g["rows"]) for g in (((metrics or {}).get("groups") or {}).get("chosen") or [])
            if g.get("domain") in per and per[g["domain"]] and g.get("rows")}
    total = int(((metrics or {}).get("frontier_oof") or {}).get("rows") or 0) or sum(rows.values())
    if not rows or total <= 0:
        return None
    parts = [(g, per[g], n / total) for g, n in rows.items()]
    rest = 1.0 - sum(w for _, _, w in parts)
    if rest > 1e-9 and head_params.get("frontier"):
        parts.append(("*", head_params["frontier"], rest))
    return parts


def request_point(shares: RequestShares, points: list[dict], group: str | None, guard_of,
                  own: dict | None = None) -> tuple[dict, list[SpendGuard], dict]:
    """(the point a request of `group` is served under `shares`, the guards its cost counts in, their
    note for the reply): the most accurate of the group's `points` whose validation cost is within
    the effective cap of its guard (`follow_pick`: the cap's spend followed as a one-step head
    follows it, `route/follow.py`), a group's part of a shared cap cut further while the pooled
    guard beside the parts is past its slack. `guard_of(cap, group, pooled)` gives the guard of a
    cap: a group's part (`group`), the whole cap (neither), or the pooled guard beside a shared
    cap's parts (`pooled`). `own` (`own_point`): the worker a checkpoint shipped alone, served while
    the effective cap allows it, else the most accurate point cheaper than it."""
    guards, cap = shared_guards(shares, group, guard_of)
    effective = guards[0].effective()
    if len(guards) > 1 and guards[1].cap > 0:  # past the pooled guard's slack: every part cut alike
        effective *= guards[1].allowance() / guards[1].cap
    if own is None:
        best = follow_pick(points, effective)
    elif within_cap(float(own["cost_usd"]), effective):
        best = own
    else:
        cheaper = [p for p in points if float(p["cost_usd"]) < float(own["cost_usd"])]
        best = follow_pick(cheaper, effective) if cheaper else own
    if len(guards) > 1:
        guards[1].seen(str(group), shares.start_mix)  # this request moves the mix the parts are shared by
    note = {"cap_usd": cap, "effective_cap_usd": effective, **guards[0].state(),
            **({"group": str(group), "pooled_cap_usd": guards[1].cap, "pooled": guards[1].state()} if len(guards) > 1 else {})}
    return best, guards, note


def trained_shares(head, metrics: dict) -> RequestShares:
    """The cap `head` was trained under (`train --cap`), as requests that ask none keep it: the pooled
    cap and each group's part of it where its plans share it (shared again as the mix of requests
    moves, over the saved points, as a cap asked is: `RequestShares.parts_for`)."""
    groups = getattr(head, "group_caps", None)
    parts = group_parts(head.head_params(), metrics) if groups else None
    z = getattr(head, "cap_z", None)
    return RequestShares(head.cap_usd, groups, parts, DEFAULT_MARGIN_Z if z is None else z)


def own_point(head, metrics: dict) -> dict | None:
    """The point of the one worker a checkpoint shipped alone under its cap (the best worker within
    it: its expected cost and accuracy on the non-test rows), or None where it shipped a cascade."""
    metrics = metrics or {}
    policy = head.policy
    if ((metrics.get("selection") or {}).get("selected_kind") not in ("best worker", "strongest") or policy.per_domain
            or len(policy.default.workers) != 1):
        return None
    w = policy.default.workers[0]
    return {"cost_usd": float((metrics.get("expected_cost_usd") or {}).get(w, 0.0)),
            "quality": float((metrics.get("worker_quality") or {}).get(w, 0.0)), "plan": policy.default.model_dump()}


def follow_pick(points: list[dict], limit: float) -> dict:
    """The most accurate of `points` whose validation cost is within `limit` (ties: the cheaper),
    with no margin (the spend itself holds the cap: `route/follow.py`); the cheapest where none is."""
    within = [p for p in points if within_cap(float(p["cost_usd"]), limit)]
    if not within:
        return min(points, key=lambda p: (float(p["cost_usd"]), -float(p["quality"])))
    return max(within, key=lambda p: (float(p["quality"]), -float(p["cost_usd"])))


def started_policy(policy, choices: dict, frontier: dict, cap_usd: float, group_caps: dict):
    """The policy a checkpoint trained under a pooled cap serves its first request with: each group's
    plan the point `request_point` gives a follower that has seen nothing (the most accurate
    saved point within the cap's target share of its part, no margin). The searched plan was held
    to the cap's margin; serving follows the spend from here (the module docstring), and `train` scored the
    candidate that way out of fold, so the plan printed is the one that serves."""
    from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadePolicy
    from fugu_pipeline.route.follow import effective_cap

    params = {"frontier": choices["*"].frontier if "*" in choices else [],
              "domains_frontier": {d: c.frontier for d, c in choices.items() if d != "*" and d in policy.per_domain}}
    metrics = {"frontier_oof": frontier}

    def first(group, cap, plan):
        pts = cap_points(params, metrics, group)
        return CascadePlan.model_validate(follow_pick(pts, effective_cap(cap, 0, 0.0))["plan"]) if pts else plan

    return CascadePolicy(default=first(None, cap_usd, policy.default),
                         per_domain={d: first(d, group_caps.get(d, cap_usd), p) for d, p in policy.per_domain.items()})


def saved_parts(choices: dict, gd: np.ndarray, cap_usd: float, z: float) -> dict[str, float] | None:
    """Each group's part of a shared cap, shared among the points the checkpoint saves (each group's
    frontier, the pooled one for the rows of no group) as a cap asked of them is (`share_parts`),
    so that the cap a checkpoint was trained under and the same cap asked of it later serve alike,
    and as `train` scores the candidate out of fold (`follow_fold.group_points`); None where no
    choice of the saved points keeps the cap."""
    weight = {d: float((gd == d).mean()) for d in choices if d != "*"}
    rest = 1.0 - sum(weight.values())
    saved = [(d, choices[d].frontier, w) for d, w in weight.items()] + (
        [("*", choices["*"].frontier, rest)] if rest > 1e-9 and "*" in choices else [])
    got = share_parts(saved, cap_usd, z)
    return None if got is None else got[0]


def _rounded_up(x: float, digits: int = 3) -> float:
    """`x` to `digits` significant digits, never below it (a cap printed as enough is enough)."""
    import math

    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def bound(point: dict, z: float) -> float:
    return float(point["cost_usd"]) + z * float(point.get("cost_se") or 0.0)


def new_guard(cap_usd: float, pooled: bool = False) -> SpendGuard:
    """A cap's guard as serving and `evaluate` keep it: the pooled guard beside a shared cap's parts
    with its slack (`POOL_SLACK`), any other with none."""
    return SpendGuard(cap_usd, slack=POOL_SLACK if pooled else 0.0)


class SpendGuard(RunningSpend):
    """The running spend under one cap (see the module docstring); safe across threads. The pooled
    guard beside a shared cap's parts also counts the requests of each group (`mix`)."""

    def __init__(self, cap_usd: float, horizon: int = HORIZON, slack: float = 0.0):
        super().__init__(cap_usd)
        self.horizon, self.slack = horizon, float(slack)
        self.mix: dict[str, float] = {}

    def allowance(self, band: float = 0.0) -> float:
        """The module docstring's allowance: it falls below the cap once the spend runs `slack`
        requests' worth of the cap over `1 − band` of the cap (0: over the cap itself)."""
        with self._lock:
            over = self.spent - self.counted() * (1 - band) * self.cap - self.slack * self.cap
        return max(0.0, min(self.cap, self.cap - over / self.horizon))

    def seen(self, group: str, start: dict[str, float]) -> None:
        """One request of `group` moves the mix (`moved_mix`; it starts at `start`)."""
        with self._lock:
            self.mix = self.mix or dict(start)
            moved_mix(self.mix, group)

    def state(self) -> dict:
        """The running spend, and the mix of requests where this is a shared cap's pooled guard."""
        got = super().state()
        with self._lock:
            return {**got, "mix": {g: round(w, 4) for g, w in self.mix.items()}} if self.mix else got

    def mix_now(self, start: dict[str, float]) -> dict[str, float]:
        """Each group's share of the grouped requests so far (`start` before any)."""
        with self._lock:
            return dict(self.mix or start)


def moved_mix(mix: dict[str, float], group: str) -> None:
    """`mix` (each group's share of the grouped requests) after one more request of `group`, in
    place: an exponential average over the last `MIX_WINDOW` requests or so."""
    for g in mix:
        mix[g] += ((1.0 if g == group else 0.0) - mix[g]) / MIX_WINDOW


def shared_guards(shares, group: str | None, guard_of) -> tuple[list[SpendGuard], float]:
    """(the guards a request of `group` counts its cost in, its cap) under `shares` (a
    `RequestShares`): its group's part and the pooled guard beside the parts where the cap is
    shared, else the whole cap's. `guard_of` as `request_point` takes it."""
    key, cap = guarded_cap(shares, group)
    if key[0] != "group":
        return [guard_of(cap, None, False)], cap
    pooled = guard_of(float(shares.cap_usd), None, True)
    cap = shares.parts_for(pooled.mix_now(shares.start_mix)).get(key[1], cap)  # the part for the mix of requests
    own = guard_of(float(shares.cap_usd), key[1], False)  # the group's guard, under its part as it moves
    own.set_cap(cap)
    return [own, pooled], cap
