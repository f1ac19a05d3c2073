"""Fit a cascade on the non-test rows and decide, doing no harm, what ships.

1. The verifier's out-of-fold scores (`verifier.oof_scores`, the same hash folds as the heads).
2. Cross-fitting (`crossfit.py`): for each fold, policies are chosen on the other folds (expected
   costs from those rows) and run on this fold; so is "always the strongest worker" (the most
   accurate on the other folds), and each one-shot head's out-of-fold route. Every row then has an
   out-of-fold figure per candidate.
3. What ships (`ship.py`; `cascade.choose`, or a cap):
   - `cheapest` (the default where the utility gives cost no weight): the candidates are cascades
     chosen under a ladder of caps (10% ... 100% of the strongest worker's cost), the one-shot
     heads, the strongest worker, and a plan per domain, or per prompt cluster where the import
     names no domains (`groups.py`: the same rule per group and for the whole); the cheapest whose
     accuracy is not significantly below the strongest's ships (paired 95% interval reaching 0, mean
     within `cascade.margin`).
   - a cap: the candidate with the best out-of-fold accuracy within it (the search in each fold
     keeps a plan's mean expected cost plus the cap's `margin_z` standard errors within the cap);
     with domains or prompt clusters and a pooled cap, one more candidate: a plan per group, the
     plans chosen together to share the cap (`groups.share_cap`), each group's part of it saved
     for the spend guard; and the selected one-shot head at the λ that keeps the cap ("... at the cap").
   - `utility` (the utility prices cost): a candidate replaces "always the best worker" only when
     its utility gain over it has a paired bootstrap 95% interval above zero.
   Every candidate's accuracy is also compared with the strongest worker's, with its interval.
4. The policy is chosen again on all non-test rows and the verifier refitted on them: the checkpoint,
   with every frontier point's plan (and the verifier whenever one of them reads it).
Too few rows with replies (`cascade.min_rows`), or a cap no plan meets: the strongest worker ships,
with one line naming the rows or the cap and what to do. The test split is never read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.cost_cap import within_cap
from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.cross_encoder_use import verifier_oof
from fugu_pipeline.policies.cascade.frontier import oof_frontier
from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadePolicy, CascadeStep, answer_codes
from fugu_pipeline.policies.cascade.choice import LADDER, cap_table, rung_name
from fugu_pipeline.policies.cascade.crossfit import cross_fit
from fugu_pipeline.policies.cascade.groups import (GroupChoice, choose_groups, fold_tops_note, group_label, shared_figures,
                                                   shared_policy)
from fugu_pipeline.train.clusters import PromptClusters, pick_groups
from fugu_pipeline.policies.cascade.search import CAP_Z, CapUnmet, Grid, search, search_policy, strongest
from fugu_pipeline.policies.cascade.spend import saved_parts, started_policy
from fugu_pipeline.policies.cascade.ship import (  # noqa: F401  (CandidateFigure: the fit's table rows)
    BEST_IN_CAP,
    BEST_WORKER,
    PER_CLUSTER,
    PER_DOMAIN,
    SHARED_CLUSTER,
    SHARED_DOMAIN,
    CandidateFigure,
    candidates,
    paired_interval,
    pick_capped,
    pick_cheapest,
    pick_utility,
)
from fugu_pipeline.train.selection import STRONGEST, fold_ids
from fugu_pipeline.policies.cascade.verifier import Verifier, VerifierInputs, fit_all
from fugu_pipeline.policies.cascade.verifier_context import context_json, with_context



def answer_inputs(data: RoutingData, grid: AnswerGrid, settings, cache_root: str | Path, progress=None,
                  encode: bool = True, stat_names: tuple[str, ...] | list[str] | None = None) -> VerifierInputs:
    """The verifier's inputs for every row of `data`: its prompt features, and each reply's encoder
    features (through the cache; none when not `encode`) with its statistics (`stat_names`, default
    every one of `policies.cascade.answer_features.STATS`; a saved cascade's own list when it is evaluated),
    both through the content-addressed cache."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.policies.cascade.answer_features import (STATS, answer_settings, answer_text, embed_answers,
                                                                reply_statistics)

    names = tuple(stat_names) if stat_names is not None else STATS

    n, w = grid.text.shape
    cells = [(i, j) for i in range(n) for j in range(w) if grid.text[i, j] is not None]
    # one encoder for the replies and for `option_fit`'s questions and options: loaded once, if at all
    lazy = LazyEncoder(answer_settings(settings)) if settings is not None else None
    try:
        vecs = (embed_answers([answer_text(grid.text[i, j], grid.final[i, j]) for i, j in cells], settings, cache_root,
                              progress=progress, lazy=lazy)
                if cells and encode else np.zeros((len(cells), data.dim if encode else 0), np.float32))
        stats = reply_statistics([(grid.text[i, j], grid.final[i, j], data.prompts[i]) for i, j in cells], names,
                                 (lambda texts: embed_answers(texts, settings, cache_root, lazy=lazy))
                                 if lazy is not None else None, cache_root) if cells else None
    finally:
        if lazy is not None:
            lazy.close()
    a_dim = vecs.shape[1] + len(names)
    answer = np.zeros((n, w, a_dim), np.float32)
    has = np.zeros((n, w), bool)
    for k, (i, j) in enumerate(cells):
        answer[i, j] = np.concatenate([vecs[k], stats[k]])
        has[i, j] = True
    target = data.quality if data.quality is not None else np.full((n, w), np.nan)
    return VerifierInputs(prompt=data.features, answer=answer, has=has, target=target, stat_names=names)


def with_stats(inputs: VerifierInputs, names: tuple[str, ...] | list[str]) -> VerifierInputs:
    """`inputs` whose reply statistics are `names` (a saved cascade's own list), taken from the
    statistics it holds (unnamed: the first ten); a name it lacks is an error naming it."""
    from fugu_pipeline.policies.cascade.answer_features import STATS_V1

    have = inputs.stat_names or STATS_V1
    names = tuple(names)
    if names == have:
        return inputs
    missing = [n for n in names if n not in have]
    if missing:
        raise TrainingDataError(f"the verifier reads reply statistics {missing}, which these inputs lack ({list(have)})")
    n_vec = inputs.answer.shape[2] - len(have)
    cols = list(range(n_vec)) + [n_vec + have.index(n) for n in names]
    return VerifierInputs(inputs.prompt, inputs.answer[:, :, cols], inputs.has, inputs.target, names)


@dataclass
class CascadeFit:
    policy: CascadePolicy
    verifier: Verifier | None
    objective: str
    candidates: list[CandidateFigure]
    selected: str  # a candidate's name
    selected_kind: str
    reason: str
    verifier_figures: dict
    choices: dict  # domain or "*" -> Choice on all non-test rows
    expected_cost: dict[str, float]
    answers_version: str
    worker_quality: dict[str, float] = field(default_factory=dict)  # mean quality on the non-test rows
    answer_kinds: dict[str, str] = field(default_factory=dict)  # domain (and "*") -> the answer kind read live
    oof: dict[str, np.ndarray] = field(default_factory=dict)  # per candidate, per non-test row
    oof_cost: dict[str, np.ndarray] = field(default_factory=dict)  # per candidate, per non-test row: expected $
    stat_names: tuple[str, ...] = ()  # the reply statistics the verifier reads (empty: the first ten)
    context: dict = field(default_factory=dict)  # the context verifier (policies/cascade/verifier_context.py), saved with it
    frontier: dict = field(default_factory=dict)  # out-of-fold accuracy and cost per cap (policies/cascade/frontier.py)
    cap_rows: list[dict] = field(default_factory=list)  # one-shot vs cascade vs the strongest at 20/33/50% of its cost
    baseline: str = BEST_WORKER  # what `gain` is measured against
    saved_as: str = ""  # the candidate whose out-of-fold figure is the saved cascade's (cheapest rule)
    groups: GroupChoice | None = None  # the per-group choice (cheapest rule, two or more domains or prompt clusters)
    clusters: PromptClusters | None = None  # the prompt clusters the shipped policy plans by (None: by domain)
    cap_usd: float | None = None  # the pooled cap, $ per request (the serving spend guard keeps to it)
    cap_z: float | None = None  # that cap's margin in standard errors (the guard's bound on a saved point)
    cross_encoder: object = None  # the cross-encoder the verifier reads (cascade_cross_encoder.CrossEncoder), or None
    group_caps: dict[str, float] = field(default_factory=dict)  # each group's part of a shared pooled cap ($ per request)

    def table(self) -> list[dict]:
        return [c.row() for c in self.candidates]


def _expected(data: RoutingData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = data.n_workers
    cost = np.nanmean(data.cost_usd[rows], axis=0) if data.cost_usd is not None else np.zeros(w)
    lat = np.nanmean(data.latency_s[rows], axis=0) if data.latency_s is not None else np.zeros(w)
    return np.nan_to_num(cost), np.nan_to_num(lat)


def grid_on(data: RoutingData, codes: np.ndarray, scores, fit_rows: np.ndarray, passed: np.ndarray | None = None) -> Grid:
    """What plans run on, with `fit_rows`' mean cost and latency per worker (the references caps and
    shares are read against), each call's recorded cost and latency (a missing one at that mean), and
    `passed`: which replies pass their prompt's examples (`VerifierInputs.passed_examples`)."""
    c, lat = _expected(data, fit_rows)
    return Grid(data.worker_ids, codes, scores, data.quality, c, lat, data.utility_config,
                row_cost=_recorded(data.cost_usd, c), row_latency=_recorded(data.latency_s, lat), passed=passed)


def _recorded(per_call: np.ndarray | None, expected: np.ndarray) -> np.ndarray | None:
    if per_call is None:
        return None
    a = np.asarray(per_call, np.float64)
    return np.where(np.isnan(a), expected[None, :], a)


def fit_cascade(data: RoutingData, grid: AnswerGrid, inputs: VerifierInputs, cfg: CascadeConfig | None = None,
                folds_k: int = 5, seed: int = 0, heads: dict[str, np.ndarray] | None = None, log=print,
                cross_encoder=None, head_routes: dict[str, np.ndarray] | None = None,
                cap_routes: dict[str, np.ndarray] | None = None, share_routes: dict | None = None) -> CascadeFit:
    """See the module docstring. `grid` and `inputs` are row-aligned with `data`; `heads`: one-shot
    heads' out-of-fold routing scores (rows = the non-test rows of `data`, in order; the first one
    is the table's one-shot router); `cross_encoder`: `cascade_cross_encoder_use.cross_encoder_step`'s
    callable, whose cross-fitted column the verifier reads when it lowers its out-of-fold log-loss;
    `head_routes`: a head's out-of-fold route at the operating point it serves with no cap asked
    (its default point), which its candidate is scored at instead of its plain argmax; `cap_routes`:
    under a pooled cap, its out-of-fold route at the λ its budget calibration's rule chooses for
    that cap (`route.budget.cap_route_oof`), its candidate "at the cap"; `share_routes`: the first
    head's at each share of the table at caps ({share: route}, the table's one-shot row)."""
    cfg = cfg or CascadeConfig()
    at_caps = cfg.search  # what a cap's plan is chosen by, with a cap asked or not: the table at caps, the frontier
    cfg = cfg.model_copy(update={"search": cfg.searched()})  # what the choice reads: with no cap, the coarse grid
    if data.quality is None:
        raise TrainingDataError("a cascade needs each cell's quality (the import's `quality`, or graded responses); "
                                "this matrix gives rewards only")
    rows = np.flatnonzero(data.splits != "test")
    allowed = cfg.workers
    if allowed is not None:
        unknown = sorted(set(allowed) - set(data.worker_ids))
        if unknown:
            raise TrainingDataError(f"cascade.workers names {unknown}, not workers of this matrix ({data.worker_ids})")
    cov = grid.subset(rows).coverage()
    short = [w for w in (allowed or data.worker_ids) if cov[w] < cfg.min_answer_share]
    if short:
        if allowed is not None:
            raise TrainingDataError(
                "worker(s) " + ", ".join(f"{w} (replies on {cov[w]:.0%} of the rows)" for w in short[:5])
                + f": a cascade reads every worker's reply, and these have too few (cascade.min_answer_share "
                  f"{cfg.min_answer_share:.0%}); import their replies (`answers`) or leave them out (cascade.workers)")
        if len(short) < data.n_workers:
            allowed = [w for w in data.worker_ids if w not in short]
            log(f"cascade: leaving out {short}: replies on fewer than {cfg.min_answer_share:.0%} of the rows")
    usable = [j for j, w in enumerate(data.worker_ids) if allowed is None or w in allowed]
    replied = np.array([[grid.text[i, j] is not None for j in usable] for i in rows]).reshape(len(rows), len(usable))
    n_with = int((replied.sum(axis=1) >= 2).sum()) if len(rows) else 0
    if n_with < cfg.min_rows or len(usable) < 2 or (short and len(short) == data.n_workers):
        top = data.worker_ids[usable[int(np.argmax(data.quality[rows][:, usable].mean(axis=0)))]] if len(rows) else "?"
        return _strongest_ships(data, grid, inputs, rows, usable, log, (
            f"cascade: {n_with} of the {len(rows)} non-test rows have replies from two or more workers, fewer than the "
            f"{cfg.min_rows} (cascade.min_rows) needed to choose a plan out of fold, so the strongest worker ({top}) ships; "
            "import the workers' replies (`answers`) for more rows, or lower cascade.min_rows"))
    folds = fold_ids([data.task_ids[i] for i in rows], folds_k, seed)
    codes = answer_codes(grid.final)
    sub = VerifierInputs(inputs.prompt[rows], inputs.answer[rows], inputs.has[rows], inputs.target[rows], inputs.stat_names)
    column = cross_encoder(rows, folds) if cross_encoder is not None else None  # cascade_cross_encoder_use.py
    scores_sub, l2, vfig, sub, cross = verifier_oof(sub, folds, column, log)  # cross: the cross-fit, when kept
    scores = np.full(grid.final.shape, np.nan)
    scores[rows] = scores_sub
    log(f"cascade: verifier out-of-fold AUC {vfig['oof_auc']:.3f}, log-loss {vfig['oof_logloss']:.4f} "
        f"(L2 {vfig['l2']:g}, inputs {vfig['inputs']})")
    scores = with_context(cfg.verifier_context, inputs, scores, codes, rows, folds, log)  # a reply read with the paid ones
    doms = np.asarray(data.domains, dtype=str)
    capped = cfg.cap is not None or bool(cfg.domain_caps)
    uc = data.utility_config
    priced = data.cost_usd is not None and bool(np.nanmax(np.nan_to_num(data.cost_usd[rows])) > 0)
    mode = "cap" if capped else "cheapest" if cfg.choose == "cheapest" or (
        cfg.choose == "auto" and (uc is None or uc.cost_weight == 0) and priced) else "utility"
    if not capped and cfg.choose == "auto" and not priced:
        log("cascade: the matrix records no cost, so no policy is cheaper than another: a policy replaces the best "
            "worker only with a gain whose 95% interval is above zero (import `cost_usd` for the cost-aware choice)")
    objective = {"cap": "the best out-of-fold accuracy within the cap",
                 "utility": "utility (quality − cost and latency terms)",
                 "cheapest": f"the cheapest policy whose accuracy is not significantly below {STRONGEST}'s"}[mode]
    baseline = BEST_IN_CAP if mode == "cap" else BEST_WORKER

    passed = inputs.passed_examples()  # the examples rule's own test, where the code was run

    def grid_for(fit_rows):
        return grid_on(data, codes, scores, fit_rows, passed)

    # the groups that get plans of their own (groups.py): domains, or prompt clusters where there are none,
    # each held to the rule (cheapest rule) or sharing one pooled cap (a cap on the whole, no domain's own)
    pooled_cap = mode == "cap" and cfg.cap is not None and not cfg.domain_caps
    groups, merged, gdoms, clusters = pick_groups(cfg.groups if mode == "cheapest" or pooled_cap else "off", doms, rows,
                                                  inputs.prompt, data.prompts, cfg.search.min_domain_rows,
                                                  cfg.cluster_min_gap, log, seed, quality=data.quality, folds=folds)
    n = len(rows)
    shares = LADDER if mode == "cheapest" else ()
    memo: dict = {}  # every search of this fit, each row set's plans run once
    shared = None
    if pooled_cap and groups:
        shared = (SHARED_CLUSTER if clusters is not None else SHARED_DOMAIN, gdoms, groups)
    cf = cross_fit(data, grid_for, rows, folds, gdoms if groups and mode == "cheapest" else doms, usable, allowed, cfg,
                   mode, baseline, shares, heads, groups if mode == "cheapest" else [], memo,
                   lambda g, r: _best_worker(g, r, capped, cfg, allowed), head_routes, shared, cap_routes,
                   share_routes, at_caps)
    if cf.unmet:
        return _strongest_ships(data, grid, inputs, rows, usable, log, cf.unmet)
    frontier = oof_frontier(grid_for, rows, folds, at_caps, allowed, memo=memo, n_boot=cfg.n_boot, seed=seed)
    g_all = grid_for(rows)
    top_all = usable[int(np.argmax(data.quality[rows][:, usable].mean(axis=0)))]
    ref = g_all.exp_cost[int(np.argmax(data.quality[rows].mean(axis=0)))]
    cap_usd = None if cfg.cap is None else cfg.cap.usd_per_request(ref)
    over_cap = _over_caps(cfg, cap_usd, g_all, rows, doms)
    cands = candidates(cf, mode, baseline, heads, cfg.n_boot, seed, over_cap)
    strongest_worker = data.worker_ids[top_all]
    split = None
    if shared:  # under a pooled cap: how the plans that share it did on each group's rows
        split = shared_figures(cf, shared[0], groups, merged, gdoms[rows], clusters, cfg.n_boot, seed)
    elif groups:  # the per-domain policy: one more candidate, held to the rule per domain and for the whole
        pooled = [c for c in cands if c.kind != "one-shot" and c.name not in cf.missing]
        default = pick_cheapest(pooled, strongest_worker, cfg.margin, n, cfg.floor)[0].name
        split = choose_groups(groups, merged, gdoms[rows], {c.name: (cf.quality[c.name], cf.cost[c.name]) for c in pooled},
                              {k: v for k, v in cf.per_group.items()}, default, cfg.margin, cfg.n_boot, seed,
                              floor=cfg.group_floor)
        if clusters is not None:
            split.about, split.by = {n: f", e.g. {clusters.examples.get(n, '')!r}" for n in groups}, "prompt cluster"
        per = PER_CLUSTER if clusters is not None else PER_DOMAIN
        cf.names.append(per)
        cf.figure[per], cf.quality[per], cf.cost[per] = split.quality, split.quality, split.cost
        cands = candidates(cf, mode, baseline, heads, cfg.n_boot, seed, over_cap)
    pick = None
    if mode == "cheapest":
        win, reason, pick = pick_cheapest(cands, strongest_worker, cfg.margin, n, cfg.floor)
        if win.name != STRONGEST:
            win, reason, pick = _checked_inside_folds(win, reason, pick, cands, cf, folds, cfg, seed, strongest_worker,
                                                      split, groups, merged, gdoms[rows] if groups else None, log)
    elif mode == "cap":
        text = cfg.cap.amount() if cfg.cap is not None else "each domain's own cap"
        win, reason = pick_capped(cands, cf, text, baseline, strongest_worker, cfg.n_boot, seed)
        if cap_usd is not None and not cfg.domain_caps:
            reason += "; " + _capped_inside_folds(cands, cf, folds, cap_usd, cfg.n_boot, seed, log)
    else:
        win, reason = pick_utility(cands, baseline, strongest_worker)
    try:
        group_caps: dict[str, float] = {}
        if shared and win.name == shared[0]:
            policy, choices, group_caps = shared_policy(g_all, rows, gdoms, groups, cfg, cap_usd, allowed, memo, split)
            group_caps = saved_parts(choices, gdoms[rows], cap_usd, cfg.cap.margin_z) or group_caps
            saved_as = ""
        else:
            policy, choices, saved_as = _final_policy(win, pick, cands, split, cfg, g_all, rows, doms, allowed, memo,
                                                      mode, top_all, usable, capped, gdoms, cf.fold_tops)
    except CapUnmet as exc:
        return _strongest_ships(data, grid, inputs, rows, usable, log, f"cap: {exc}; the strongest worker "
                                f"({strongest_worker}) ships")
    if cap_usd is not None and not cfg.domain_caps and win.kind in ("cascade", "one-shot"):  # a cascade follows its cap
        policy = started_policy(policy, choices, frontier, cap_usd, group_caps)
    table = cap_table({k: (None if k in cf.missing else v) for k, v in cf.table_rows.items()},
                      (cf.quality[STRONGEST], cf.cost[STRONGEST]), n_boot=cfg.n_boot, seed=seed)
    reads = policy.uses_verifier or any(lv["uses_verifier"] for lv in frontier["levels"]) or any(
        CascadePlan.model_validate(p["plan"]).uses_verifier for ch in choices.values() for p in ch.frontier)
    verifier = fit_all(sub, np.arange(len(rows)), l2) if reads else None  # every saved point's verifier
    cross_model = cross.final() if cross is not None and verifier is not None else None  # every non-test pair
    stat_names = sub.stat_names if cross_model is not None else inputs.stat_names
    if note := fold_tops_note(cf.fold_tops.get(STRONGEST, []), top_all, data.worker_ids):
        log(f"cascade: {STRONGEST}, {note}")
    log(f"cascade: {policy.describe()}; selected {win.name}: {reason}")
    return CascadeFit(policy=policy, verifier=verifier, objective=objective, candidates=cands, selected=win.name,
                      selected_kind=win.kind, reason=reason, verifier_figures=vfig, choices=choices,
                      expected_cost={w: float(c) for w, c in zip(data.worker_ids, g_all.exp_cost)},
                      answers_version=grid.version, oof=cf.figure, oof_cost=cf.cost, stat_names=stat_names, cross_encoder=cross_model,
                      worker_quality={w: float(q) for w, q in zip(data.worker_ids, data.quality[rows].mean(axis=0))},
                      answer_kinds=_kinds(grid, rows, doms), cap_rows=table,
                      context=context_json(scores) if verifier is not None else {}, frontier=frontier,
                      saved_as=saved_as, baseline=STRONGEST if mode == "cheapest" else baseline, groups=split,
                      cap_usd=None if cfg.domain_caps else cap_usd, cap_z=None if cfg.cap is None else cfg.cap.margin_z,
                      clusters=clusters if policy.per_domain and set(policy.per_domain) <= set(groups) else None,
                      group_caps=group_caps)


def _capped_inside_folds(cands, cf, folds, cap_usd: float, n_boot: int, seed: int, log) -> str:
    """The capped pick made inside the folds (`nested.nested_capped`), as the reason line reads it."""
    from fugu_pipeline.policies.cascade.nested import nested_capped

    m, lo, hi, cost = nested_capped(cands, cf, folds, cap_usd, n_boot, seed)
    base = float(cf.cost[STRONGEST].mean())
    figure = (f"the pick made inside the folds (each fold served the most accurate candidate within the cap on the "
              f"others): difference {m:+.4f} [{lo:+.4f}, {hi:+.4f}] at {cost / base if base > 0 else 1.0:.0%} of the "
              "strongest's cost")
    log(f"cascade: {figure}")
    return figure


def _checked_inside_folds(win, reason, pick, cands, cf, folds, cfg, seed, strongest_worker, split, groups, merged,
                          gdoms, log):
    """(winner, reason, pick): the cheapest rule's pick, or always the strongest worker when the pick,
    made inside the folds (`nested.py`), is significantly below it there, reaches below the floor, or
    saves less than the minimum there (the saving out of fold was those rows' luck, not the rule's)."""
    from fugu_pipeline.policies.cascade.nested import nested_figure
    from fugu_pipeline.train.selection import MIN_SAVING, cheaper, holds_inside_folds

    per = (PER_CLUSTER if split.by == "prompt cluster" else PER_DOMAIN) if split is not None else None
    args = None if split is None else {"groups": groups, "merged": merged, "doms": gdoms, "per_group": cf.per_group,
                                        "group_floor": cfg.group_floor}
    m, lo, hi, cost = nested_figure(cands, cf, folds, cfg.margin, cfg.floor, cfg.n_boot, seed, per, args)
    strong = next(c for c in cands if c.name == STRONGEST)
    share = cost / strong.cost_usd if strong.cost_usd > 0 else 1.0
    figure = (f"the pick made inside the folds (each fold routed by the candidate the rule picks on the others): "
              f"difference {m:+.4f} [{lo:+.4f}, {hi:+.4f}] at {share:.0%} of the strongest's cost")
    log(f"cascade: {figure}")
    saves = cheaper(cost, strong.cost_usd)
    if holds_inside_folds(m, lo, hi, cfg.floor) and saves:
        return win, f"{reason}; {figure}", pick
    why = ("is significantly below it" if hi < 0 else f"reaches below -{cfg.floor:g}" if cfg.floor is not None and lo < -cfg.floor
           else f"saves less than {MIN_SAVING:.0%} of its cost")
    return strong, (f"{win.name} passes out of fold (difference {win.vs_strongest:+.4f} [{win.vs_low:+.4f}, "
                    f"{win.vs_high:+.4f}]), but it is the cheapest of {len(cands)} candidates picked on those very rows, "
                    f"and {figure} {why}, so the strongest worker ({strongest_worker}) ships; more rows would let a "
                    "cheaper policy qualify"), pick


def _over_caps(cfg: CascadeConfig, cap_usd: float | None, g, rows: np.ndarray, doms: np.ndarray):
    """A candidate's note when its out-of-fold mean cost is over the pooled cap or a domain's own."""
    limits = [(None, cap_usd)] if cap_usd is not None else []
    for d, c in cfg.domain_caps.items():
        mine = rows[doms[rows] == d]
        limits.append((doms[rows] == d, c.usd_per_request(g.exp_cost[strongest(g, mine)]) if len(mine) else None))

    def note(cost: np.ndarray) -> str:
        for mask, usd in limits:
            got = float(cost.mean() if mask is None else cost[mask].mean()) if usd is not None else 0.0
            if usd is not None and not within_cap(got, usd):
                return f"over the cap (${got * 1000:.4g} > ${usd * 1000:.4g} per 1,000)"
        return ""
    return note


def _final_policy(win, pick, cands, split, cfg, g_all, rows, doms, allowed, memo, mode, top_all, usable, capped, gdoms,
                  fold_tops: dict):
    """(policy, {domain or "*": Choice}, the candidate whose out-of-fold figure the saved cascade's
    is): what ships, searched again on every non-test row."""
    ids = g_all.worker_ids
    if mode != "cheapest":
        policy, choices = search_policy(g_all, rows, doms, cfg.search, cfg.cap, cfg.domain_caps, cfg.per_domain, allowed,
                                        memo, CAP_Z if capped else 0.0)
        if win.kind in ("best worker", "strongest"):  # one worker alone won: that worker ships
            top = top_all if win.kind == "strongest" else _best_worker(g_all, rows, capped, cfg, allowed)
            policy = CascadePolicy(default=_alone(ids[top]))
        return policy, choices, ""
    ref = g_all.exp_cost[strongest(g_all, rows)]
    qualified = list(pick.qualified)  # cheapest first

    def pooled_plan(name):
        share = next((s for s in LADDER if name == rung_name(s)), None)
        if share is None:
            return _alone(ids[top_all]), None
        ch = search(g_all, rows, cfg.search, share * ref, allowed, "pooled: ", memo)
        return ch.plan, ch

    if win.name in (PER_DOMAIN, PER_CLUSTER):
        default = next(c.name for c in cands if c.name in qualified and c.kind != "one-shot"
                       and c.name not in (PER_DOMAIN, PER_CLUSTER))
        plan, ch = pooled_plan(default)
        choices = {"*": ch or search(g_all, rows, cfg.search, None, allowed, "pooled: ", memo)}
        per = {}
        for d, o in split.groups.items():
            mine = rows[gdoms[rows] == d]
            if o.spec[0] in ("pooled", "alone"):  # its own points, for a cap asked later (spend.request_shares)
                split.frontiers[d] = search(g_all, mine, cfg.search, None, allowed, f"{group_label(d)}: ", memo).frontier
            if o.spec[0] == "pooled":
                per[d] = pooled_plan(o.name)[0]
            elif o.spec[0] == "alone":
                served = usable[int(np.argmax(g_all.quality[mine][:, usable].mean(axis=0)))]
                per[d] = _alone(ids[served])
                if note := fold_tops_note(fold_tops.get(d, []), served, ids):
                    split.notes[d] = note
            else:
                choices[d] = search(g_all, mine, cfg.search, o.spec[1] * ref, allowed, f"{group_label(d)}: ", memo)
                per[d] = choices[d].plan
        split.plans = {d: p.describe() for d, p in per.items()}
        return CascadePolicy(default=plan, per_domain=per), choices, win.name
    name = win.name
    if win.kind == "one-shot":  # the cascade saved beside it: the cheapest pooled cascade that qualified
        name = next((q for q in qualified if q not in (PER_DOMAIN, PER_CLUSTER)
                     and next(c for c in cands if c.name == q).kind == "cascade"), STRONGEST)
    plan, ch = pooled_plan(name)
    choices = {"*": ch or search(g_all, rows, cfg.search, None, allowed, "pooled: ", memo)}
    return CascadePolicy(default=plan), choices, name


def _alone(worker: str) -> CascadePlan:
    return CascadePlan(steps=[CascadeStep(workers=[worker])])


def _strongest_ships(data: RoutingData, grid: AnswerGrid, inputs: VerifierInputs, rows: np.ndarray, usable: list[int],
                     log, reason: str) -> CascadeFit:
    """The strongest worker alone (best mean quality on the non-test rows), with the one line saying why."""
    q = data.quality[rows].mean(axis=0) if len(rows) else np.zeros(data.n_workers)
    top = usable[int(np.argmax(q[usable]))] if usable else int(np.argmax(q))
    cost, _ = _expected(data, rows) if len(rows) else (np.zeros(data.n_workers), None)
    fig = CandidateFigure(STRONGEST, "best worker", float(q[top]), float(q[top]), float(cost[top]), 0.0, 0.0, 0.0)
    log(reason)
    doms = np.asarray(data.domains, dtype=str)
    return CascadeFit(policy=CascadePolicy(default=_alone(data.worker_ids[top])), verifier=None, objective="none",
                      candidates=[fig], selected=STRONGEST, selected_kind="best worker", reason=reason,
                      oof={STRONGEST: data.quality[rows, top]}, oof_cost={STRONGEST: np.full(len(rows), float(cost[top]))},
                      verifier_figures={}, choices={}, expected_cost={w: float(c) for w, c in zip(data.worker_ids, cost)},
                      answers_version=grid.version, stat_names=inputs.stat_names,
                      worker_quality={w: float(x) for w, x in zip(data.worker_ids, q)},
                      answer_kinds=_kinds(grid, rows, doms) if len(rows) else {"*": "text"})


def _kinds(grid: AnswerGrid, rows: np.ndarray, doms: np.ndarray) -> dict[str, str]:
    from collections import Counter

    out = {"*": Counter(grid.kinds[i] for i in rows).most_common(1)[0][0]}
    for d in sorted(set(doms[rows].tolist())):
        out[d] = Counter(grid.kinds[i] for i in rows if doms[i] == d).most_common(1)[0][0]
    return out


def _best_worker(g: Grid, rows: np.ndarray, capped: bool, cfg: CascadeConfig, allowed) -> int:
    """The best single worker on `rows`: the best mean utility; under a pooled cap, the best quality
    among those within it (none within it: the cheapest)."""
    usable = [j for j, w in enumerate(g.worker_ids) if allowed is None or w in allowed]
    q = g.quality[rows].mean(axis=0)
    if not capped or cfg.cap is None:
        u = [float(g.run(CascadePlan(steps=[CascadeStep(workers=[g.worker_ids[j]])]), rows)[2].mean()) for j in usable]
        return usable[int(np.argmax(u))] if not capped else usable[int(np.argmax(q[usable]))]
    limit = cfg.cap.usd_per_request(g.exp_cost[int(np.argmax(q))])
    within = [j for j in usable if within_cap(g.exp_cost[j], limit)]
    return max(within, key=lambda j: q[j]) if within else min(usable, key=lambda j: g.exp_cost[j])
