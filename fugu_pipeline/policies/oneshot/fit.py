"""Fit the configured set of heads (`configs/train.yaml`) and choose one, on validation only.

1. Validation predictions for every grid point of every family over the NON-TEST rows (train +
   val): K-fold out-of-fold (folds by hash of the task id; `objective: oof`), or leave one domain
   out with the domain hidden (`objective: lodo`). The test split is never read here.
2. The rule (pooled / macro / blend utility) is the one that holds up in the nested check
   (`selection.nested_rule_check`), unless the config fixes it; two workers rank by APGR.
3. Each family's best grid point by that rule; an ensemble of the quality predictors' best points
   by greedy forward selection, with temperature-calibrated quality; the ensemble is chosen over
   the best single head only when it wins the nested check (members chosen on half of the
   folds, judged on the other half).
4. Each family's best point and the ensemble are refitted on all non-test rows (SFT heads keep
   train / val for early stopping) and saved as checkpoints `models/<kind>/<hash>/` whose manifest
   records the validation figures, the rule and why, and whether this head is the one selected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
from fugu_pipeline.policies.oneshot.ensemble import EnsembleHead, calibrate, temperature_fit
from fugu_pipeline.policies.oneshot.families import Family, FitData, families_for
from fugu_pipeline.policies.oneshot.reuse import PredictionMemo
from fugu_pipeline.policies.oneshot.save import SavedHead, save_fitted
from fugu_pipeline.train.selection import (
    Objective,
    best_of,
    ensemble_scores,
    fold_ids,
    greedy_ensemble,
    lodo_folds,
    nested_ensemble_check,
    nested_rule_check,
    routed,
    oof_predictions,
)

_logger = logging.getLogger(__name__)

# Two workers: APGR ranks the candidates, but the head is served greedily. Its pick gives way to the
# best greedy candidate only when that one routes better by at least this much utility per row (and
# by 1.96 standard errors): on MMLU the APGR pick trailed by 0.002 (2 SE), not worth a worse ranking.
GREEDY_FLOOR = 0.01
Log = Callable[[str], None]


@dataclass
class Candidate:
    kind: str
    name: str
    params: dict[str, Any]
    quality: np.ndarray | None  # validation predictions over the non-test rows
    scores: np.ndarray
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class FitReport:
    """Everything the choice rested on (also written to each manifest's `metrics.selection`)."""

    protocol: str
    objective: str
    rule: str
    rule_reason: str
    rule_check: dict[str, float]
    candidates: list[Candidate]
    best_per_kind: dict[str, str]
    ensemble: dict[str, Any] | None
    ensemble_check: dict[str, float] | None
    selected: str  # the chosen candidate's name (or "ensemble")
    selected_kind: str
    reason: str
    seconds: dict[str, float]
    saved: list[SavedHead] = field(default_factory=list)

    def table(self) -> list[dict[str, Any]]:
        return [{"kind": c.kind, "name": c.name, **c.figures} for c in self.candidates]

    def selected_path(self) -> Path:
        return next(s.path for s in self.saved if s.selected)

    @property
    def selected_figures(self) -> dict[str, float]:
        return self.ensemble["figures"] if self.selected == "ensemble" else \
            next(c.figures for c in self.candidates if c.name == self.selected)

    @property
    def val_utility(self) -> float:
        """The selected head's out-of-fold validation utility (its manifest's `val_utility`)."""
        figures = self.selected_figures
        return figures.get("pooled", figures.get("apgr"))

    @property
    def val_score(self) -> float:
        """The selected head's out-of-fold figure on the measure selection ranked by (APGR with two
        workers, else the chosen rule): what a choice between feature settings should compare."""
        figures = self.selected_figures
        return figures.get(self.rule, self.val_utility)


def validation_predictions(fam: Family, fd: FitData, objective: str, folds: np.ndarray, n_workers: int):
    if objective == "oof":
        return oof_predictions(lambda tr, te: fam.predict_grid(fd, tr, te, fd.domains[te].tolist()), folds, n_workers)
    out: dict[str, list] = {}
    for _, tr, te in lodo_folds(fd.domains):  # the held-out domain is unknown at routing time
        for name, (q, s) in fam.predict_grid(fd, tr, te, None).items():
            slot = out.setdefault(name, [np.full((len(fd.rows), n_workers), np.nan), np.full((len(fd.rows), n_workers), np.nan)])
            if q is None:
                slot[0] = None
            elif slot[0] is not None:
                slot[0][te] = q
            slot[1][te] = s
    return {k: (v[0], v[1]) for k, v in out.items()}


def select_heads(data: RoutingData, cfg: TrainSetConfig | None = None, log: Log | None = None,
                 force: bool = False, memo: PredictionMemo | None = None) -> tuple[FitReport, FitData, dict[str, Family]]:
    """Steps 1-3: validation predictions, the rule, the choice. Reads only the non-test rows.
    `memo`: validation predictions kept from an earlier call on other features of the same rows;
    a family part whose inputs are the same is handed its predictions instead of refitted."""
    cfg, log = cfg or TrainSetConfig(), log or _logger.info
    data.validate(require=("train",), force=force)
    rows = np.flatnonzero(data.splits != "test")
    fd = FitData.from_data(data, rows)
    W = data.n_workers
    if cfg.objective == "lodo":
        doms = sorted(set(fd.domains.tolist()))
        if len(doms) < 3:
            raise TrainingDataError(f"objective 'lodo' needs at least 3 domains in the non-test rows, got {doms}")
        folds = np.array([doms.index(d) for d in fd.domains])
        protocol = f"leave-one-domain-out over the {len(rows)} non-test rows ({len(doms)} domains, each routed as unknown)"
    else:
        folds = fold_ids([data.task_ids[i] for i in rows], cfg.folds, cfg.seed)
        protocol = (f"{cfg.folds}-fold out-of-fold over the {len(rows)} non-test rows (train + val; folds by sha256 "
                    f"of seed {cfg.seed} and the task id)")
    perf = fd.target if fd.target_is_quality else fd.utility
    objective = Objective(fd.utility, perf, fd.domains)
    fams = families_for(cfg, cfg.seed)
    if not fams:
        raise TrainingDataError("configs/train.yaml enables no head: list at least one under heads:")
    seconds: dict[str, float] = {}
    cands: list[Candidate] = []
    memo = memo or PredictionMemo()
    for fam in fams:
        t0, n, n_kept = time.perf_counter(), 0, 0
        for part in fam.parts(fd):
            reads = part.reads(fd)
            key = None if reads is None else reads + [cfg.objective, folds, W]
            preds, kept = memo.get(key, lambda part=part: validation_predictions(part, fd, cfg.objective, folds, W))
            params = dict(part.grid(fd))
            for name, (q, s) in preds.items():
                cands.append(Candidate(fam.kind, name, params[name], q, s))
            n, n_kept = n + len(preds), n_kept + (len(preds) if kept else 0)
        seconds[fam.kind] = round(time.perf_counter() - t0, 3)
        kept_note = f" ({n_kept} kept from the same inputs under another feature setting)" if n_kept else ""
        log(f"{fam.kind}: {n} configuration(s), validation predictions in {seconds[fam.kind]:.1f}s{kept_note}")
    singles = {c.name: c.scores for c in cands}
    if objective.two_workers and cfg.selection_rule == "auto":
        rule, check = "apgr", {"rule": "apgr", "scores": {}, "reason": "two workers: candidates are ranked by APGR"}
    elif objective.two_workers:
        rule, check = cfg.selection_rule, {"rule": cfg.selection_rule, "scores": {}, "reason": (
            f"selection_rule: {cfg.selection_rule} (fixed by the config; two workers: the greedy route's utility, not APGR)")}
    elif cfg.selection_rule == "auto":
        check = nested_rule_check(singles, objective, folds)
        rule = check["rule"]
    else:
        check = {"rule": cfg.selection_rule, "scores": nested_rule_check(singles, objective, folds)["scores"],
                 "reason": f"selection_rule: {cfg.selection_rule} (fixed by the config)"}
        rule = cfg.selection_rule
    val_rows = np.flatnonzero(data.splits[rows] == "val")
    for c in cands:
        c.figures = objective.table(c.scores)
        if len(val_rows):
            c.figures["importer_val"] = objective(c.scores, val_rows, rule)
    by = rule
    best_per_kind = {}
    for fam in fams:
        mine = {c.name: c.scores for c in cands if c.kind == fam.kind}
        best_per_kind[fam.kind] = best_of(mine, objective, None, by)
    best_single = best_of(singles, objective, None, by)
    selected, selected_kind = best_single, next(c.kind for c in cands if c.name == best_single)
    reason = f"best single head by {rule if rule != 'apgr' else 'APGR'} on the validation predictions"
    ens = ens_check = None
    if cfg.heads.ensemble is not None:
        ens, ens_check = _ensemble(cfg, cands, fams, objective, folds, by, fd)
        if ens is None and ens_check is not None:
            reason += f"; no ensemble: {ens_check['note']}"
        if ens is not None:
            log(f"ensemble: {ens['name']} validation {ens['figures']}; nested check single {ens_check['single']:.4f} "
                f"vs ensemble {ens_check['ensemble']:.4f}")
            if ens_check["ensemble"] > ens_check["single"] + 1e-9:
                selected, selected_kind = "ensemble", "ensemble"
                reason = (f"ensemble: in the nested check it held up better than the best single head "
                          f"({ens_check['ensemble']:.4f} vs {ens_check['single']:.4f})")
            else:
                reason += (f"; the ensemble did not hold up in the nested check ({ens_check['ensemble']:.4f} vs "
                           f"best single {ens_check['single']:.4f})")
    if rule == "apgr":  # APGR ranks rows; the served route is the greedy one: it must not be clearly worse
        chosen = ens["scores"] if selected == "ensemble" else singles[selected]
        greedy = best_of(singles, objective, None, "pooled")
        d = routed(objective.utility, singles[greedy]) - routed(objective.utility, chosen)
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
        if d.mean() > max(1.96 * se, GREEDY_FLOOR):
            reason += (f"; but the greedy route (what is served) of {selected} trails {greedy}'s by {d.mean():.4f} "
                       f"utility per row (SE {se:.4f}) on the validation predictions, so {greedy} is chosen")
            selected, selected_kind = greedy, next(c.kind for c in cands if c.name == greedy)
            best_per_kind[selected_kind] = greedy  # the configuration saved for its kind is the one served
    if cfg.objective == "lodo" and "domain_prior" in best_per_kind and selected_kind != "domain_prior":
        chosen = ens["scores"] if selected == "ensemble" else singles[selected]
        lodo_guard = unseen_domain_gain(chosen, singles[best_per_kind["domain_prior"]], fd.utility, fd.domains)
        if lodo_guard["low"] <= 0:
            reason += (f"; but on the held-out training domains it beat the domain prior (the best fixed worker, for "
                       f"a domain it never saw) by {lodo_guard['mean']:+.4f} [{lodo_guard['low']:+.4f}, "
                       f"{lodo_guard['high']:+.4f}] (over {lodo_guard['domains']} domains): not clearly, so the prior is kept")
            selected, selected_kind = best_per_kind["domain_prior"], "domain_prior"
    report = FitReport(protocol=protocol, objective=objective.name if cfg.objective == "oof" else f"LODO {objective.name}",
                       rule=rule, rule_reason=check["reason"], rule_check=check["scores"], candidates=cands,
                       best_per_kind=best_per_kind, ensemble=ens, ensemble_check=ens_check, selected=selected,
                       selected_kind=selected_kind, reason=reason, seconds=seconds)
    log(f"selection: {reason}: {selected}; rule {rule} ({check['reason']})")
    return report, fd, {f.kind: f for f in fams}


def unseen_domain_gain(scores: np.ndarray, fallback: np.ndarray, utility: np.ndarray, domains: np.ndarray,
                       n_boot: int = 2000, seed: int = 0) -> dict:
    """Macro mean over domains of the routed utility of `scores` minus that of `fallback`, both
    leave-one-domain-out predictions, with a 95% interval from a bootstrap over DOMAINS.

    Under `objective: lodo` the choice is for traffic from domains absent from training, so the
    question is how a gain transfers to a new domain: a draw from the population of domains, not
    more rows of the domains at hand. Resampling domains carries the between-domain spread (rows
    resampled within each domain would not: on real data the inner choice's small gains were
    "clear" that way and still did not transfer; README, "Real routing data"). A head replaces the
    domain prior, which routes an unseen domain like the best fixed worker, only when this interval
    lies above zero. With fewer than 3 domains there is no interval to speak of: the prior stays."""
    rows = np.arange(len(utility))
    gain = utility[rows, np.argmax(scores, axis=1)] - utility[rows, np.argmax(fallback, axis=1)]
    doms = np.asarray(domains, dtype=str)
    per = np.array([gain[doms == d].mean() for d in sorted(set(doms.tolist()))])
    if len(per) < 3:
        return {"mean": float(per.mean()) if len(per) else 0.0, "low": float("-inf"), "high": float("inf"), "domains": len(per)}
    rng = np.random.default_rng(seed)
    boot = per[rng.integers(0, len(per), size=(n_boot, len(per)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": float(per.mean()), "low": float(lo), "high": float(hi), "domains": len(per)}


def _ensemble(cfg, cands, fams, objective, folds, by, fd):
    ok = {f.kind for f in fams if f.member_ok}
    pool: dict[str, Candidate] = {}
    for kind in [f.kind for f in fams if f.kind in ok]:
        mine = sorted((c for c in cands if c.kind == kind and c.quality is not None),
                      key=lambda c: -objective(c.scores, None, by))
        for c in mine[: cfg.heads.ensemble.per_family]:
            pool[c.name] = c
    if len(pool) < 2:
        return None, None
    members = {n: c.scores for n, c in pool.items()}
    counts, curve = greedy_ensemble(members, objective, None, by, cfg.heads.ensemble.rounds)
    if len(counts) < 2:  # forward selection kept one head: that is no ensemble
        return None, {"single": float("nan"), "ensemble": float("nan"), "note": f"greedy selection kept one member ({next(iter(counts))})"}
    check = nested_ensemble_check({c.name: c.scores for c in cands}, members, objective, folds, by,
                                  by if objective.two_workers else "blend", cfg.heads.ensemble.rounds)
    observed = fd.target
    calib = {n: temperature_fit(pool[n].quality, observed) for n in counts}
    scores = ensemble_scores(members, counts)
    q = sum(counts[n] * calibrate(pool[n].quality, calib[n]) for n in counts) / sum(counts.values())
    name = "ensemble(" + " + ".join(f"{k}x {n}" for n, k in counts.items()) + ")"
    figures = objective.table(scores)
    brier = {n: [float(np.mean((pool[n].quality - observed) ** 2)), float(np.mean((calibrate(pool[n].quality, calib[n]) - observed) ** 2))]
             for n in counts}
    return {"name": name, "counts": counts, "curve": curve, "calibration": calib, "figures": figures,
            "members": {n: (pool[n].kind, pool[n].params) for n in counts}, "scores": scores, "quality": q,
            "brier_raw_calibrated": brier}, check


def fit_and_save(data: RoutingData, models_dir: str | Path, cfg: TrainSetConfig | None = None, log: Log | None = None,
                 force: bool = False, *, selection: tuple | None = None, metrics: dict | None = None) -> FitReport:
    """Select (`select_heads`, or the `selection` it already returned for `data`), then refit each
    family's best point and the ensemble on all non-test rows and save them, each manifest's
    metrics carrying `metrics` too (the feature dtype, the prompt-rule choice).
    `report.selected_path()` is the chosen checkpoint."""
    cfg, log = cfg or TrainSetConfig(), log or _logger.info
    report, fd, fams = selection if selection is not None else select_heads(data, cfg, log, force)
    fitted: dict[str, Any] = {}
    t0 = time.perf_counter()
    for kind, name in report.best_per_kind.items():
        cand = next(c for c in report.candidates if c.name == name)
        fitted[name] = fams[kind].fit(fd, np.arange(len(fd.rows)), cand.params)
    ens_head = None
    if report.ensemble is not None:
        members = []
        for n, (kind, params) in report.ensemble["members"].items():
            if n not in fitted:
                fitted[n] = fams[kind].fit(fd, np.arange(len(fd.rows)), params)
            members.append(fitted[n])
        counts = report.ensemble["counts"]
        ens_head = EnsembleHead.from_members(members, [counts[n] for n in counts],
                                             [report.ensemble["calibration"][n] for n in counts])
    report.seconds["final_fit"] = round(time.perf_counter() - t0, 3)
    report.saved = save_fitted(data, fd, report, fitted, ens_head, cfg, Path(models_dir), metrics or {})
    return report
