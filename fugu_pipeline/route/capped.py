"""A one-step router under a cost cap: which checkpoint of the run serves a cap, the cap's operating
point on the budget calibration, and the routes whose λ follows the cap's spend (`follow.py`).
`Router` (`router.py`) inherits it; `budget.py` holds the calibration it reads."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from fugu_pipeline.route.errors import BudgetUnavailable
from fugu_pipeline.route.follow import MAX_FOLLOWERS, CapFollower


class CapRouting:
    """The cap's part of `Router`: it reads the router's `checkpoint`, `calibration`, `shipped`,
    `cap_routers`, `_lock`, `encode` and `tag`."""

    def init_caps(self) -> None:
        # per cap, the spend its λ follows (follow.py), the least recently used dropped past MAX_FOLLOWERS
        self._followers: OrderedDict[float, CapFollower] = OrderedDict()
        self._curve = self.calibration.curve_arrays() if self.calibration is not None else None

    def spend_states(self) -> list[dict]:
        """The running spend under each cap this router, and each checkpoint of the run it sends caps
        to, keeps: one row per cap ({checkpoint, group, requests, running_mean_usd, cap_usd}; `group`
        "" for a whole cap), what `/metrics` shows."""
        with self._lock:
            followers = list(self._followers.values())
        rows = [{"checkpoint": self.tag, "group": "", **f.state()} for f in followers]
        for other in list(self.cap_routers.values()):
            rows += other.spend_states()
        return rows

    def cap_router(self, budget) -> tuple["CapRouting", dict] | None:
        """(the router of the run that serves `budget`, a note saying why) where this checkpoint cannot
        keep the cap (no λ, or no saved point, within it) and its shipped description names one of
        the run's checkpoints that can: the rows at the nearest share of `train`'s table at caps
        (`ShippedPolicy.for_cap`), the most accurate out of fold first. None: this router serves it
        (and refuses what it cannot keep, where no row can). A checkpoint that could not be loaded
        (`cap_problems`) is passed over."""
        choice = self.shipped.for_cap(budget) if self.shipped is not None and budget is not None else None
        if choice is None:
            return None
        try:
            self.own_budget_point(budget)
            return None
        except BudgetUnavailable as exc:
            why_not = exc.public or str(exc)
        for row in choice.rows:
            other = self.cap_routers.get(row.checkpoint)
            if other is None:
                continue
            try:
                other.own_budget_point(budget)
            except BudgetUnavailable:
                continue
            return other, {"checkpoint": other.tag, "policy": row.policy, "table_share": choice.share,
                           "why": f"{self.tag} cannot keep this cap ({why_not}); {choice.why()}"}
        return None

    def budget_point(self, budget):
        """The operating point for a cap (`own_budget_point`), of the router that serves it (`cap_router`)."""
        sent = self.cap_router(budget)
        return (sent[0] if sent else self).own_budget_point(budget)

    def own_budget_point(self, budget):
        """The operating point (λ chosen on validation) for a cap; RouterError when this checkpoint
        cannot route under a budget."""
        from fugu_pipeline.route.budget import BudgetError, require_quality_head

        try:
            require_quality_head(self.checkpoint.head, self.checkpoint.manifest.head_kind)
        except BudgetError as exc:
            raise BudgetUnavailable(f"checkpoint {self.tag}: {exc}") from None
        if self.calibration is None:
            public = (f"the budget calibration of checkpoint {self.tag} cannot be used: a fault on the server's side "
                      "(its log says why); send the request without 'fugu_budget', or ask the operator to draw it again"
                      if self.calibration_damaged else
                      f"checkpoint {self.tag} has no budget calibration, so this server cannot route under a cost cap; "
                      "send the request without 'fugu_budget'")
            raise BudgetUnavailable(self.calibration_problem, server_fault=self.calibration_damaged, public=public)
        try:
            return self.calibration.choose(budget)
        except BudgetError as exc:
            raise BudgetUnavailable(str(exc)) from None

    def follower(self, budget) -> CapFollower:
        """The follower of a cap's spend (`route/follow.py`): one per cap in dollars, kept while the
        router serves (past `MAX_FOLLOWERS` distinct caps, the least recently used is dropped, so
        requests naming ever new caps hold a bounded memory)."""
        cap = round(self.calibration.cap_usd(budget), 15)
        with self._lock:
            got = self._followers.pop(cap, None) or CapFollower(cap)
            self._followers[cap] = got  # the most recently used last
            while len(self._followers) > MAX_FOLLOWERS:
                self._followers.popitem(last=False)
            return got

    def record_spend(self, decision, cost_usd: float | None) -> None:
        """Settle the follower a decision was routed under (`follow.py`) with what its reply actually
        cost: the difference from the expected cost recorded when it was routed. Nothing for a
        decision routed under no cap, an unknown cost, or a follower dropped since."""
        held = (decision.extra.get("budget") or {})
        follow = held.get("follow")
        if not follow or cost_usd is None or not np.isfinite(cost_usd) or held.get("expected_cost_usd") is None:
            return
        with self._lock:
            got = self._followers.get(round(float(follow["cap_usd"]), 15))
        if got is not None:
            got.settle(float(cost_usd) - float(held["expected_cost_usd"]))

    def budget_scores(self, prompts: list[str], domains: list[str] | None, budget, cost_texts: list[str] | None = None,
                      mask: np.ndarray | None = None, strict: bool = True):
        """(scores, the cap's operating point on the calibration, expected cost (N, W), each prompt's λ,
        each prompt's effective cap, the follower): predicted quality − λ·expected cost / c_ref, the
        prompts routed one at a time at a λ that follows the cap's spend (`route/follow.py`, among the
        workers `mask` allows). A cap the calibration cannot keep with its margin is refused; not
        `strict` (the cap a head was shipped under, served with no cap asked), it is followed all the same."""
        from fugu_pipeline.route.budget import follow_routes

        point = self.own_budget_point(budget) if strict else self.calibration.choose(budget, strict=False)
        q, c_hat, _ = self._quality_cost(prompts, domains, cost_texts)
        follower = self.follower(budget)
        scores, lam, eff = follow_routes(q, c_hat, self.calibration.reference_cost_usd, lambda k: self._curve,
                                         follower, mask=mask)
        return scores, point, c_hat, lam, eff, follower

    def _quality_cost(self, prompts, domains, cost_texts=None, feats=None):
        """(predicted quality (N, W), the calibration's expected cost (N, W), the texts it is of)."""
        from fugu_pipeline.route.budget import quality_of

        if feats is None:
            feats = self.encode(prompts, domains)
        with self._lock:  # the head sees the domains as given (None = unknown: the pooled prior)
            q = quality_of(self.checkpoint.head, feats, domains, kind=self.checkpoint.manifest.head_kind)
        texts = cost_texts if cost_texts is not None else prompts
        return q, self.calibration.cost_model.predict(texts, domains), texts

    def lambda_scores(self, prompts: list[str], domains: list[str] | None, lam: float, cost_texts=None, feats=None):
        """(predicted quality − λ·expected cost / c_ref, expected cost (N, W)) with the calibration's cost model
        (`feats`: the prompts' features when already encoded)."""
        q, c_hat, texts = self._quality_cost(prompts, domains, cost_texts, feats)
        return self.calibration.scores(q, texts, domains, lam), c_hat
