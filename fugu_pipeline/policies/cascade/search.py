"""Choosing a cascade on validation: which workers, in which order, with which thresholds.

The search enumerates plans of a bounded shape over the workers (`CascadeSearch`,
`candidate_plans` lists them): a final worker F among the strongest; before it, one, two or three
cheaper workers called at once, or up to three cheap steps one after another; after each early
step agreement of the answers so far and/or a verifier threshold from a grid of the scores'
quantiles (the scores read at that point of the plan when the verifier reads the paid replies): 10
levels, and under a cap 40 where one cheap worker comes before the last step (`single_thresholds`,
`CascadeConfig.searched`; a fit with no cap searches its table at caps and its frontier that way too). With 10 levels the share of replies a step keeps moves by about a tenth
from one level to the next, and the plan that fits a cap can lie between two of them. With the
defaults (3 finals, 5 cheap workers) it is at most 5,793 plans, 6,243 under a cap (7,413 and 7,863
when the verifier reads the paid replies, which adds steps where the verifier alone decides), and 75
more where the code was run on its prompts' examples (a step that stops when its code passes them),
never more than `max_plans`. Every plan is run offline on the recorded answers (`simulate`)
with EXPECTED costs and latencies (each worker's mean over the rows the choice is made on, never
a row's own cost), and scored by
- no cap: the mean utility (quality − cost and latency terms, the matrix's weights);
- a cap (`cost_cap.CostCap`: $ per 1,000 requests, or a share of the strongest worker's expected cost): the mean
  quality among plans whose mean expected cost is within it; none within it → `CapUnmet`, which
  names the cap and the cheapest point.
A domain may get its own plan under its own cap (`search_per_domain`); domains with too few rows
take the pooled plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.cost_cap import DEFAULT_MARGIN_Z, CostCap
from fugu_pipeline.features.routing_data import TrainingDataError
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.train.groups import DEFAULT_MIN_DOMAIN_ROWS
from fugu_pipeline.policies.cascade.plans import RowSet, from_model, plan_tuples, points_for, to_model
from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadePolicy, simulate


Cap = CostCap  # the one cost cap (fugu_pipeline/cost_cap.py)


# A plan is within a cap when its mean expected cost plus CAP_Z standard errors is, on the rows it is
# chosen on (one-sided 95%): the cap then holds on new rows of the same kind, not only on those. The
# default margin of the one cost cap (a cap's own `margin_z` replaces it where the cap is given).
CAP_Z = DEFAULT_MARGIN_Z


class CapUnmet(TrainingDataError):
    """No plan meets a cap on validation; the message names the cap, the cheapest point and what to do."""


class CascadeSearch(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    finals: int = Field(3, ge=1, description="strongest workers tried as the last step")
    cheap: int = Field(5, ge=1, description="workers cheaper than the last step tried before it")
    thresholds: int = Field(10, ge=2, le=40, description="verifier thresholds per step (quantiles of its scores)")
    single_thresholds: int = Field(40, ge=2, le=200, description=(
        "where a cap is searched (a capped fit's choice; any fit's table at caps and frontier), verifier "
        "thresholds of a step of one cheap worker before the last (quantiles of its scores): the plan that fits "
        "the cap can lie between two of the coarse levels (the choice of a fit with no cap: `thresholds`)"))
    three_steps: bool = Field(True, description="also try one cheap worker, then another, then the last step")
    cheap_steps: int = Field(3, ge=1, le=3, description="the most cheap steps one after another before the last step")
    parallel: int = Field(3, ge=2, le=3, description="the most cheap workers asked at once in one step")
    max_plans: int = Field(20_000, ge=10, description="the search stops after this many plans (a bound on its time)")
    min_domain_rows: int = Field(DEFAULT_MIN_DOMAIN_ROWS, ge=5, description="a domain gets its own plan only with this many rows")


@dataclass
class Grid:
    """What a plan is run on: final-answer codes, verifier scores and qualities (N, W), the expected
    cost and latency of one call per worker (W,): the references caps and shares are read against,
    and, where the matrix records them, each call's own cost and latency (N, W; `row_cost`,
    `row_latency`), which a plan's figures add up. A plan escalates the hard rows, and those are not
    the average row: on a mix of code reasoning and math a plan priced at each worker's mean cost
    spent 49% of the strongest's out of fold and 61% on new rows, the escalated rows being the long
    ones."""

    worker_ids: list[str]
    codes: np.ndarray
    scores: np.ndarray
    quality: np.ndarray
    exp_cost: np.ndarray
    exp_latency: np.ndarray
    utility: UtilityConfig
    row_cost: np.ndarray | None = None
    row_latency: np.ndarray | None = None
    passed: np.ndarray | None = None  # (N, W) bool: the reply's code passes its prompt's examples (None: not run)

    @property
    def call_cost(self) -> np.ndarray:
        """Per call: (N, W) where recorded, else the (W,) expectation."""
        return self.exp_cost if self.row_cost is None else self.row_cost

    @property
    def call_latency(self) -> np.ndarray:
        return self.exp_latency if self.row_latency is None else self.row_latency

    def per_call(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cost, latency) of calling worker `cols[i]` on row `rows[i]`."""
        take = lambda a: a[rows, cols] if np.ndim(a) == 2 else a[cols]  # noqa: E731
        return take(self.call_cost), take(self.call_latency)

    def run(self, plan: CascadePlan, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(quality, cost, utility) per row of `rows`."""
        out = simulate(plan, self.worker_ids, self.codes, self.scores, self.quality, self.call_cost, self.call_latency,
                       rows, self.passed)
        u = self.utility
        util = (u.quality_weight * out.quality - u.cost_weight * np.minimum(np.maximum(out.cost, 0) / u.cost_scale_usd, u.cap)
                - u.latency_weight * np.minimum(np.maximum(out.latency, 0) / u.latency_scale_s, u.cap))
        return out.quality, out.cost, util


@dataclass
class Choice:
    plan: CascadePlan
    quality: float
    cost: float  # mean expected $ per request
    utility: float
    considered: int
    frontier: list[dict] = field(default_factory=list)  # cheapest-to-best plans (quality, cost): the budget points
    figures: list[float] = field(default_factory=list)  # the validation figure of every plan considered, in search order


def strongest(grid: Grid, rows: np.ndarray) -> int:
    return int(np.argmax(grid.quality[rows].mean(axis=0)))


def candidate_plans(grid: Grid, rows: np.ndarray, cfg: CascadeSearch, allowed: list[str] | None = None):
    """Every plan of the searched shapes as `CascadePlan`s (`plans.plan_tuples` lists them as tuples,
    what the search runs), thresholds from the scores on `rows` (at the point of the plan they are
    read, when the scores read the paid replies: `verifier_context.ContextScores`), at most
    `cfg.max_plans`. Per last step F (one of the `finals` strongest) and the `cheap` best workers
    cheaper than F:
    - F alone;
    - one cheap worker, stop if the verifier passes (`single_thresholds` levels);
    - where the replies' code was run on their prompts' examples (`Grid.passed`): one cheap worker,
      stop if its code passes them; and (`cheap_steps` 2 or more) one, then another, each so;
    - two at once: stop if both agree, and/or the verifier passes;
    - one, then another: stop if the verifier passes, then if the two agree (and/or the verifier);
    - (`parallel` 3) three at once: stop if two agree, if all three agree, or two agree or the
      verifier passes; two at once, then a third: stop if the two agree, then if two of the three do;
    - (`cheap_steps` 3) three one after another: the verifier on the first, then agreement of two
      and/or the verifier on the second and third.
    When the scores read the paid replies, a step after the first (and three at once) may also stop
    on the verifier alone: it reads the agreement itself and may overrule it."""
    for plan in plan_tuples(grid, rows, cfg, allowed):
        yield to_model(plan, grid.worker_ids)


def search(grid: Grid, rows: np.ndarray, cfg: CascadeSearch, cap_usd: float | None = None,
           allowed: list[str] | None = None, what: str = "", memo: dict | None = None, z: float = 0.0) -> Choice:
    """The best plan on `rows` (see the module docstring); CapUnmet when a cap no plan meets. Under a
    cap a plan is within it when its mean expected cost plus `z` standard errors is (`z` 0: the mean).
    `memo`: `plans.points_for`'s, shared by every search of one fit."""
    pts = points_for(grid, rows, cfg, allowed, memo)
    i = pts.best("utility") if cap_usd is None else pts.best("quality", pts.within(cap_usd, z))
    if i is None:
        k = int(np.argmin(pts.cost))
        bound = f" plus {z:g} standard errors" if z else ""
        raise CapUnmet(f"{what}no cascade meets the cap of ${cap_usd * 1000:.4g} per 1,000 requests on validation{bound}: "
                       f"the cheapest plan ({to_model(pts.plans[k], grid.worker_ids).describe()}) costs "
                       f"${pts.cost[k] * 1000:.4g} per 1,000 requests (accuracy {pts.quality[k]:.3f}); raise the cap, "
                       "or add a cheaper worker")
    return choice_at(pts, i, grid.worker_ids, "quality" if cap_usd is not None else "utility")


def choice_at(pts, i: int, ids: list[str], figure: str = "quality") -> Choice:
    """The `Choice` of plan `i` of `pts` (`plans.Points`), with the frontier of them all and every
    plan's `figure` ("quality" or "utility")."""
    return Choice(to_model(pts.plans[i], ids), float(pts.quality[i]), float(pts.cost[i]), float(pts.utility[i]),
                  len(pts.plans), _frontier(pts, ids), [float(v) for v in getattr(pts, figure)])


KEEP = 12  # the frontier's points a choice saves (a cap asked later chooses among them)


def frontier_index(pts, keep: int = KEEP) -> list[int]:
    """The plans of `pts` no other plan beats on both cost and quality, cheapest first (at most
    `keep`, spread evenly along it): what a choice saves as its budget points."""
    out, best_q = [], -1.0
    for i in np.lexsort((-pts.quality, pts.cost)):  # stable: equal points keep the search order
        if float(pts.quality[i]) > best_q + 1e-12:
            out.append(int(i))
            best_q = float(pts.quality[i])
    if len(out) > keep:
        idx = np.unique(np.round(np.linspace(0, len(out) - 1, keep)).astype(int))
        out = [out[i] for i in idx]
    return out


def _frontier(pts, ids: list[str], keep: int = KEEP) -> list[dict]:
    """`frontier_index`'s plans as saved: {cost_usd, quality, cost_se, plan}."""
    return [{"cost_usd": float(pts.cost[i]), "quality": float(pts.quality[i]), "cost_se": float(pts.cost_se[i]),
             "plan": to_model(pts.plans[i], ids).model_dump()} for i in frontier_index(pts, keep)]


def search_policy(grid: Grid, rows: np.ndarray, domains: np.ndarray, cfg: CascadeSearch, cap: CostCap | None = None,
                  domain_caps: dict[str, CostCap] | None = None, per_domain: bool = False,
                  allowed: list[str] | None = None, memo: dict | None = None, z: float = 0.0) -> tuple[CascadePolicy, dict]:
    """A policy: the pooled plan under `cap`, and with `per_domain` (or a cap for a domain) a plan
    for each domain with enough rows under its own cap (else the pooled cap). Returns (policy,
    {domain or "*": Choice}). `memo`: as `search`'s; a cap's bound is its mean cost plus that cap's own
    `margin_z` standard errors (`z` where no cap is given)."""
    domains = np.asarray(domains, dtype=str)
    ref = grid.exp_cost[strongest(grid, rows)]
    usd = None if cap is None else cap.usd_per_request(ref)
    choices = {"*": search(grid, rows, cfg, usd, allowed, "pooled: ", memo, z if cap is None else cap.margin_z)}
    per: dict[str, CascadePlan] = {}
    domain_caps = domain_caps or {}
    unknown = sorted(set(domain_caps) - set(domains[rows].tolist()))
    if unknown:
        raise CapUnmet(f"a cap names domain(s) {unknown[:5]} that have no validation rows (domains: "
                       f"{sorted(set(domains[rows].tolist()))[:12]}); name the domains as the matrix spells them")
    if per_domain or domain_caps:
        for d in sorted(set(domains[rows].tolist())):
            mine = rows[domains[rows] == d]
            dcap = domain_caps.get(d, cap)
            if len(mine) < cfg.min_domain_rows:
                if d in domain_caps:
                    raise CapUnmet(f"domain {d!r} has {len(mine)} validation rows, fewer than min_domain_rows "
                                   f"({cfg.min_domain_rows}), so its own cap ({dcap.amount()}) cannot be checked; "
                                   "drop its cap or lower cascade.search.min_domain_rows")
                continue
            dusd = None if dcap is None else dcap.usd_per_request(grid.exp_cost[strongest(grid, mine)])
            choices[d] = search(grid, mine, cfg, dusd, allowed, f"domain {d!r}: ", memo, z if dcap is None else dcap.margin_z)
            per[d] = choices[d].plan
    return CascadePolicy(default=choices["*"].plan, per_domain=per), choices


def run_policy(grid: Grid, policy: CascadePolicy, rows: np.ndarray, domains: np.ndarray):
    """(quality, expected cost, utility) per row of `rows` under the policy (each domain's plan)."""
    domains = np.asarray(domains, dtype=str)
    n = len(rows)
    qual, cost, util = np.zeros(n), np.zeros(n), np.zeros(n)
    for plan_domain in [None, *policy.per_domain]:
        plan = policy.default if plan_domain is None else policy.per_domain[plan_domain]
        mask = (~np.isin(domains[rows], list(policy.per_domain))) if plan_domain is None else (domains[rows] == plan_domain)
        if mask.any():
            q, c, u = RowSet(grid, rows[mask]).run(from_model(plan, grid.worker_ids))
            qual[mask], cost[mask], util[mask] = q, c, u
    return qual, cost, util
