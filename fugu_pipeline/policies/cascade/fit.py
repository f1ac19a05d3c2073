"""Fit a cascade on the non-test rows and decide, doing no harm, whether it ships.

1. The verifier's out-of-fold scores (`verifier.oof_scores`, the same hash folds as the heads).
2. Cross-fitting: for each fold, policies are chosen on the other folds (expected costs from those
   rows) and run on this fold; so is "always the strongest worker" (the most accurate on the other
   folds), and each one-shot head's out-of-fold route. Every row then has an out-of-fold figure per
   candidate.
3. What ships (`cascade.choose`):
   - `cheapest` (the default where the utility gives cost no weight): the candidates are cascades
     chosen under a ladder of caps (10% ... 100% of the strongest worker's cost), the one-shot
     heads and the strongest worker; the cheapest whose accuracy is not significantly below the
     strongest's ships (`choice.py`: paired 95% interval reaching 0, mean within
     `cascade.margin`); only the strongest qualifying: it ships, with the reason.
   - `utility` (the utility prices cost), or a cap: a candidate replaces "always the best worker"
     (under a cap: the best worker within it) only when its gain over it (utility; quality under a
     cap) has a paired bootstrap 95% interval above zero; among those, the best mean wins.
   Every candidate's accuracy is also compared with the strongest worker's, with its interval.
4. The policy is chosen again on all non-test rows and the verifier refitted on them: the checkpoint.
Too few rows with replies (`cascade.min_rows`), or a cap no plan meets: the strongest worker ships,
with one line naming the rows or the cap and what to do. The test split is never read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.cost_cap import CostCap, within_cap
from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.cross_encoder_use import verifier_oof
from fugu_pipeline.policies.cascade.frontier import oof_frontier
from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadePolicy, CascadeStep, answer_codes
from fugu_pipeline.policies.cascade.choice import (
    LADDER,
    TABLE_SHARES,
    cap_table,
    capped_one_shot,
    ladder_fold,
    rung_name,
)
from fugu_pipeline.policies.cascade.search import CapUnmet, Grid, run_policy, search_policy
from fugu_pipeline.train.selection import STRONGEST, cheapest_not_below, fold_ids, interval
from fugu_pipeline.policies.cascade.verifier import Verifier, VerifierInputs, fit_all
from fugu_pipeline.policies.cascade.verifier_context import context_json, with_context

BEST_WORKER = "always the best worker"
BEST_IN_CAP = "always the best worker within the cap"


def answer_inputs(data: RoutingData, grid: AnswerGrid, settings, cache_root: str | Path, progress=None,
                  encode: bool = True, stat_names: tuple[str, ...] | list[str] | None = None) -> VerifierInputs:
    """The verifier's inputs for every row of `data`: its prompt features, and each reply's encoder
    features (through the cache; none when not `encode`) with its statistics (`stat_names`, default
    every one of `policies.cascade.answer_features.STATS`; a saved cascade's own list when it is evaluated),
    both through the content-addressed cache."""
    from fugu_pipeline.policies.cascade.answer_features import STATS, answer_text, cached_answer_stats, embed_answers

    names = tuple(stat_names) if stat_names is not None else STATS

    n, w = grid.text.shape
    cells = [(i, j) for i in range(n) for j in range(w) if grid.text[i, j] is not None]
    vecs = embed_answers([answer_text(grid.text[i, j], grid.final[i, j]) for i, j in cells], settings, cache_root,
                         progress=progress) if cells and encode else np.zeros((len(cells), data.dim if encode else 0), np.float32)
    stats = cached_answer_stats([(grid.text[i, j], grid.final[i, j], data.prompts[i]) for i, j in cells], cache_root,
                                names) if cells else None
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
class CandidateFigure:
    name: str
    kind: str  # "best worker" | "one-shot" | "cascade"
    mean: float  # out-of-fold utility (no cap) or quality (cap)
    quality: float
    cost_usd: float  # mean expected $ per request
    gain: float  # over the baseline: the strongest worker (cheapest rule), else the best worker (within the cap)
    low: float
    high: float
    note: str = ""
    vs_strongest: float = 0.0  # out-of-fold accuracy − always the strongest worker's, with its paired 95% interval
    vs_low: float = 0.0
    vs_high: float = 0.0

    def row(self) -> dict:
        return {k: getattr(self, k) for k in ("name", "kind", "mean", "quality", "cost_usd", "gain", "low", "high", "note",
                                              "vs_strongest", "vs_low", "vs_high")}


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
    stat_names: tuple[str, ...] = ()  # the reply statistics the verifier reads (empty: the first ten)
    context: dict = field(default_factory=dict)  # the context verifier (policies/cascade/verifier_context.py), saved with it
    frontier: dict = field(default_factory=dict)  # out-of-fold accuracy and cost per cap (policies/cascade/frontier.py)
    cap_rows: list[dict] = field(default_factory=list)  # one-shot vs cascade vs the strongest at 20/33/50% of its cost
    baseline: str = BEST_WORKER  # what `gain` is measured against
    saved_as: str = ""  # the candidate whose out-of-fold figure is the saved cascade's (cheapest rule)
    cross_encoder: object = None  # the cross-encoder the verifier reads (cascade_cross_encoder.CrossEncoder), or None

    def table(self) -> list[dict]:
        return [c.row() for c in self.candidates]


def paired_interval(diff: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    n = len(diff)
    means = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def _expected(data: RoutingData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = data.n_workers
    cost = np.nanmean(data.cost_usd[rows], axis=0) if data.cost_usd is not None else np.zeros(w)
    lat = np.nanmean(data.latency_s[rows], axis=0) if data.latency_s is not None else np.zeros(w)
    return np.nan_to_num(cost), np.nan_to_num(lat)


def fit_cascade(data: RoutingData, grid: AnswerGrid, inputs: VerifierInputs, cfg: CascadeConfig | None = None,
                folds_k: int = 5, seed: int = 0, heads: dict[str, np.ndarray] | None = None, log=print,
                cross_encoder=None, head_routes: dict[str, np.ndarray] | None = None) -> CascadeFit:
    """See the module docstring. `grid` and `inputs` are row-aligned with `data`; `heads`: one-shot
    heads' out-of-fold routing scores (rows = the non-test rows of `data`, in order; the first one
    is the table's one-shot router); `cross_encoder`: `cascade_cross_encoder_use.cross_encoder_step`'s
    callable, whose cross-fitted column the verifier reads when it lowers its out-of-fold log-loss;
    `head_routes`: a head's out-of-fold route at the operating point it serves with no cap asked
    (its default point), which its candidate is scored at instead of its plain argmax."""
    cfg = cfg or CascadeConfig()
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
    objective = {"cap": "quality under the cap (mean expected cost within it)",
                 "utility": "utility (quality − cost and latency terms)",
                 "cheapest": f"the cheapest policy whose accuracy is not significantly below {STRONGEST}'s"}[mode]
    baseline = BEST_IN_CAP if mode == "cap" else BEST_WORKER

    def grid_for(fit_rows):
        c, lat = _expected(data, fit_rows)
        return Grid(data.worker_ids, codes, scores, data.quality, c, lat, data.utility_config)

    n = len(rows)
    shares = LADDER if mode == "cheapest" else TABLE_SHARES
    names = [STRONGEST] + ([rung_name(s) for s in shares] if mode == "cheapest" else [baseline, "cascade"]) + list(heads or {})
    oof = {k: np.zeros(n) for k in names}
    cost_of = {k: np.zeros(n) for k in names}
    qual_of = {k: np.zeros(n) for k in names}
    table_rows = {f"{k}@{s}": (np.zeros(n), np.zeros(n)) for s in TABLE_SHARES
                  for k in ("cascade", "one-shot") if k == "cascade" or heads}
    missing: set[str] = set()
    first_head = next(iter(heads or {}), None)
    memo: dict = {}  # each fold's plans, run once for the ladder and the frontier
    for f in np.unique(folds):
        tr, te = rows[folds != f], rows[folds == f]
        at, tr_at = np.flatnonzero(folds == f), np.flatnonzero(folds != f)
        g = grid_for(tr)
        top = usable[int(np.argmax(g.quality[tr][:, usable].mean(axis=0)))]
        q, c, u = g.run(_alone(data.worker_ids[top]), te)
        oof[STRONGEST][at], cost_of[STRONGEST][at], qual_of[STRONGEST][at] = (u if mode == "utility" else q), c, q
        ladder = ladder_fold(g, tr, te, cfg.search, allowed, sorted(set(shares) | set(TABLE_SHARES)), g.exp_cost[top],
                             memo)
        for s, got in ladder.items():
            if s in TABLE_SHARES:
                _put(table_rows, f"cascade@{s}", at, got, missing)
            if mode == "cheapest" and s in shares:
                if got is None:
                    missing.add(rung_name(s))
                else:
                    oof[rung_name(s)][at], cost_of[rung_name(s)][at], qual_of[rung_name(s)][at] = got[0], got[1], got[0]
        if mode != "cheapest":
            try:
                policy, _ = search_policy(g, tr, doms, cfg.search, cfg.cap, cfg.domain_caps, cfg.per_domain, allowed)
            except CapUnmet as exc:
                return _strongest_ships(data, grid, inputs, rows, usable, log, (
                    f"cap: {exc}; the strongest worker ({data.worker_ids[top]}) ships"))
            q, c, u = run_policy(g, policy, te, doms)
            oof["cascade"][at], cost_of["cascade"][at], qual_of["cascade"][at] = (q if capped else u), c, q
            best = _best_worker(g, tr, capped, cfg, doms, allowed)
            q, c, u = g.run(_alone(data.worker_ids[best]), te)
            oof[baseline][at], cost_of[baseline][at], qual_of[baseline][at] = (q if capped else u), c, q
        for name, s in (heads or {}).items():
            route = (head_routes or {}).get(name, np.argmax(s, axis=1))[at]
            q = data.quality[te, route]
            c, lat = g.exp_cost[route], g.exp_latency[route]
            u = (uc.quality_weight * q - uc.cost_weight * np.minimum(c / uc.cost_scale_usd, uc.cap)
                 - uc.latency_weight * np.minimum(lat / uc.latency_scale_s, uc.cap))
            oof[name][at], cost_of[name][at], qual_of[name][at] = (u if mode == "utility" else q), c, q
            if name == first_head:
                for share in TABLE_SHARES:
                    got = capped_one_shot(s, data.quality[rows], g.exp_cost, tr_at, at, share * g.exp_cost[top],
                                          g.exp_cost[top])
                    _put(table_rows, f"one-shot@{share}", at, got, missing)
    frontier = oof_frontier(grid_for, rows, folds, cfg.search, allowed, memo=memo)  # what each cap buys, out of fold
    g_all = grid_for(rows)
    top_all = usable[int(np.argmax(data.quality[rows][:, usable].mean(axis=0)))]
    ref = g_all.exp_cost[int(np.argmax(data.quality[rows].mean(axis=0)))]
    cap_usd = None if cfg.cap is None else cfg.cap.usd_per_request(ref)
    cands = []
    for name, v in oof.items():
        kind = ("best worker" if name in (BEST_WORKER, BEST_IN_CAP) or (name == STRONGEST and mode == "cheapest")
                else "strongest" if name == STRONGEST else "one-shot" if name in (heads or {}) else "cascade")
        vs, vs_lo, vs_hi = interval(qual_of[name] - qual_of[STRONGEST], cfg.n_boot, seed)
        ref_name = STRONGEST if mode == "cheapest" else baseline
        diff = v - oof[ref_name]
        lo, hi = paired_interval(diff, cfg.n_boot, seed) if name != ref_name else (0.0, 0.0)
        note = "unavailable: no plan within this share of the strongest's cost in some fold" if name in missing else ""
        if cap_usd is not None and not within_cap(cost_of[name].mean(), cap_usd):
            note = f"over the cap (${cost_of[name].mean() * 1000:.4g} > ${cap_usd * 1000:.4g} per 1,000)"
        cands.append(CandidateFigure(name, kind, float(v.mean()), float(qual_of[name].mean()), float(cost_of[name].mean()),
                                     float(diff.mean()), lo, hi, note, vs, vs_lo, vs_hi))
    table = cap_table({k: (None if k in missing else v) for k, v in table_rows.items()},
                      (qual_of[STRONGEST], cost_of[STRONGEST]), n_boot=cfg.n_boot, seed=seed)
    against = (f"; against {STRONGEST} ({data.worker_ids[top_all]}): accuracy {{d:+.4f}} [{{lo:+.4f}}, {{hi:+.4f}}]")
    if mode == "cheapest":
        pick = cheapest_not_below(cands, STRONGEST, data.worker_ids[top_all], cfg.margin, n)
        win = next(c for c in cands if c.name == pick.name)
        reason = pick.reason
    else:
        ok = [c for c in cands if c.kind not in ("best worker", "strongest") and c.low > 0
              and not c.note.startswith("over the cap")]
        if ok:
            win = max(ok, key=lambda c: (c.mean, -c.cost_usd))
            reason = (f"{win.name} gains {win.gain:+.4f} over {baseline} out of fold, 95% interval [{win.low:+.4f}, "
                      f"{win.high:+.4f}] above zero, and has the best out-of-fold {('quality' if capped else 'utility')} "
                      f"of those that do")
        else:
            win = next(c for c in cands if c.name == baseline)
            reason = (f"no policy's out-of-fold gain over {baseline} has a 95% interval above zero, so the best worker"
                      f"{' within the cap' if capped else ''} ships (doing no harm)")
        reason += against.format(d=win.vs_strongest, lo=win.vs_low, hi=win.vs_high)
    share_won = next((s for s in shares if win.name == rung_name(s)), None)
    alone = win.kind == "best worker"
    if mode == "cheapest" and win.kind == "one-shot":  # the cascade saved beside it: the cheapest that qualified
        share_won = next((s for name in pick.qualified for s in shares if name == rung_name(s)), None)
        alone = share_won is None
        share_won = 1.0 if share_won is None else share_won
    try:
        if share_won is not None:
            policy, choices = search_policy(g_all, rows, doms, cfg.search, CostCap(share=share_won), {}, cfg.per_domain, allowed)
        else:
            policy, choices = search_policy(g_all, rows, doms, cfg.search, cfg.cap, cfg.domain_caps, cfg.per_domain, allowed)
    except CapUnmet as exc:
        return _strongest_ships(data, grid, inputs, rows, usable, log, (
            f"cap: {exc}; the strongest worker ({data.worker_ids[top_all]}) ships"))
    if alone:  # the saved cascade is that worker alone
        best = top_all if mode == "cheapest" else _best_worker(g_all, rows, capped, cfg, doms, allowed)
        policy = CascadePolicy(default=_alone(data.worker_ids[best]))
    # the verifier is saved whenever a frontier point needs it, also when the plan that ships does not
    # (the strongest alone): a cap at serving time and `evaluate`'s table at caps run those points
    needs = policy.uses_verifier or any(CascadePlan.model_validate(p["plan"]).uses_verifier
                                        for ch in choices.values() for p in ch.frontier)
    verifier = fit_all(sub, np.arange(len(rows)), l2) if needs else None
    cross_model = cross.final() if cross is not None and verifier is not None else None  # every non-test pair
    stat_names = sub.stat_names if cross_model is not None else inputs.stat_names
    log(f"cascade: {policy.describe()}; selected {win.name}: {reason}")
    return CascadeFit(policy=policy, verifier=verifier, objective=objective, candidates=cands, selected=win.name,
                      selected_kind=win.kind, reason=reason, verifier_figures=vfig, choices=choices,
                      expected_cost={w: float(c) for w, c in zip(data.worker_ids, g_all.exp_cost)},
                      answers_version=grid.version, oof=oof, stat_names=stat_names, cross_encoder=cross_model,
                      worker_quality={w: float(q) for w, q in zip(data.worker_ids, data.quality[rows].mean(axis=0))},
                      answer_kinds=_kinds(grid, rows, doms), cap_rows=table,
                      context=context_json(scores) if verifier is not None else {}, frontier=frontier,
                      saved_as=("" if mode != "cheapest" else STRONGEST if alone else rung_name(share_won)),
                      baseline=STRONGEST if mode == "cheapest" else baseline)


def _alone(worker: str) -> CascadePlan:
    return CascadePlan(steps=[CascadeStep(workers=[worker])])


def _put(table_rows: dict, key: str, at: np.ndarray, got, missing: set) -> None:
    if got is None:
        missing.add(key)
    else:
        table_rows[key][0][at], table_rows[key][1][at] = got


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


def _best_worker(g: Grid, rows: np.ndarray, capped: bool, cfg: CascadeConfig, doms, allowed) -> int:
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
