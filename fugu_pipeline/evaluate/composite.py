"""The composite score (TinyRouter's judging rule): one number per head, king and
challenger scored alike on the same held-out rows.

Per benchmark b (a domain of the matrix, or an explicit grouping of domains: `benchmarks`; domains
with fewer than `min_benchmark_rows` (10) held-out rows are pooled into one, "(small domains)"):

    score_b = (0.70·cached_b + 0.15·live_b + 0.10·efficiency_b + 0.05·novelty_b) × overfit_b
    composite = mean over benchmarks of score_b            (one head across all benchmarks)

The terms, exactly:
- held-out rows: the `test` split, cut by a salted hash of the task id into **eval** rows
  (`1 − audit_fraction`) and **audit** rows. Every term below is computed on eval rows; the audit
  rows are used for nothing but the overfit gap, so no decision ever selects on them.
- `cached_b`: mean quality (in [0, 1]) of the head's greedy route on b's eval rows, read from the
  stored matrix (no call is made). A matrix without quality falls back to utility, and says so.
- `live_b`: mean graded quality when the head's route is really called (`live.py`,
  `LiveEvaluator`) on a bounded, fixed sample of b's eval rows (`live_sample`, 20 by default).
- `efficiency_b` = Σ quality / Σ turns on the live sample: correct answers per turn, in [0, 1].
  A one-step head spends one turn per answer, so for it efficiency equals `live_b`; a coordinator
  whose sessions take 3 turns for a correct answer scores 1/3 for it; a cascade counts every
  worker call it makes (two cheap workers at once, then a strong one: 3). Without a live run it
  is computed from the cached rows with the calls each head made there (a one-step head: one per
  task, so it equals `cached_b`).
- `novelty_b`: share of b's eval rows where the head decides otherwise than the king (a one-step
  head: another worker; a coordinator: another sequence of roles and workers; a triage head:
  another label). The king's own novelty is 0 (it is the reference).
- `overfit_b`: gap = eval accuracy − audit accuracy of the head on b, compared as decimals
  rounded to 9 places (so a gap of exactly 0.08 is 0.08 whatever the two accuracies are, never
  0.0800000000000001). `overfit_rule: literal` (the default, TinyRouter's rule as published):
  gap > 0.15: reject (the head cannot be promoted, and the benchmark scores 0); gap > 0.08:
  × 0.85; else × 1; a benchmark with no audit row is not judged. `overfit_rule: guarded` adds two
  guards against judging chance: a benchmark whose audit slice has fewer than `min_audit_rows`
  (30) rows takes the gap pooled over all benchmarks instead (and is not judged when the pooled
  slice is that small too), and with `overfit_significant` (on) a gap counts only when it is also
  significantly above zero (one-sided 95%: gap − 1.645·se > 0, se from the pooled per-task
  variance). Where they differ, by simulation of an honest head of true accuracy 0.7 (its eval and
  audit rows drawn alike): on a benchmark of 25 test rows (19 eval, 6 audit) the literal rule
  rejects it 24% of the time and penalises it 8%, by chance alone; the guarded rule does not judge
  so few rows (0%). At TinyRouter's 150 questions (105 eval, 45 audit) both reject 3.3%; the literal
  rule penalises 12.7%, the guarded 1.5%.
- A term that cannot be measured (no live run: no task file or `live_sample: 0`; no king for
  novelty) is left out and the remaining weights are rescaled to sum as before, for both heads
  alike; the report names what was left out.

The king is replaced only when composite(challenger) ≥ composite(king) + margin (0.02); the
paired bootstrap of the difference (eval rows and live sample resampled together within each
benchmark, the overfit factors held fixed) gives its 95% interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fugu_pipeline.config_files import Seed
from fugu_pipeline.hashing import sha256_text

TERMS = ("cached", "live", "efficiency", "novelty")


class CompositeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cached_weight: float = Field(0.70, ge=0, description="weight of cached accuracy (held-out greedy-route quality)")
    live_weight: float = Field(0.15, ge=0, description="weight of live accuracy (route, call, grade on a sample)")
    efficiency_weight: float = Field(0.10, ge=0, description="weight of efficiency (correct answers per worker call)")
    novelty_weight: float = Field(0.05, ge=0, description="weight of novelty (share of routes that differ from the king's)")
    overfit_reject_gap: float = Field(0.15, gt=0, description="eval − audit accuracy above this: reject")
    overfit_penalty_gap: float = Field(0.08, gt=0, description="eval − audit accuracy above this: multiply by overfit_penalty")
    overfit_penalty: float = Field(0.85, ge=0, le=1)
    overfit_rule: Literal["literal", "guarded"] = Field(
        "literal", description="literal: TinyRouter's rule as published (gap > reject gap: reject, > penalty gap: penalty); "
                               "guarded: also pool small audit slices (min_audit_rows) and count only significant gaps")
    overfit_significant: bool = Field(True, description="guarded rule: count a gap only when it is also significantly above zero (one-sided 95%)")
    min_audit_rows: int = Field(30, ge=1, description="guarded rule: fewer audit rows in a benchmark: judge the gap pooled over benchmarks")
    audit_fraction: float = Field(0.3, gt=0, lt=1, description="share of the test split kept as the audit slice")
    audit_seed: int = Field(0, description="salt of the audit hash: change it so outsiders cannot know the audit rows")
    live_sample: int = Field(20, ge=0, description="live tasks per benchmark (0: no live term)")
    benchmarks: dict[str, list[str]] | None = Field(
        None, description="benchmark name -> its domains; None: one benchmark per domain; unlisted domains stand alone")
    min_benchmark_rows: int = Field(
        10, ge=1, description="a domain (not listed in `benchmarks`) with fewer held-out rows joins the pooled "
                              "benchmark '" + "(small domains)" + "' instead of weighing as much as a full one alone")
    n_boot: int = Field(2000, ge=100)
    seed: Seed = 0

    @model_validator(mode="after")
    def _check(self) -> "CompositeConfig":
        if self.overfit_penalty_gap > self.overfit_reject_gap:
            raise ValueError("overfit_penalty_gap must not exceed overfit_reject_gap")
        if sum(self.weights().values()) <= 0:
            raise ValueError("at least one composite weight must be positive")
        return self

    def weights(self) -> dict[str, float]:
        return {"cached": self.cached_weight, "live": self.live_weight,
                "efficiency": self.efficiency_weight, "novelty": self.novelty_weight}


def _unit(text: str) -> float:
    return int(sha256_text(text)[:15], 16) / 16**15


def audit_mask(task_ids: list[str], cfg: CompositeConfig) -> np.ndarray:
    """True for the audit rows: a salted hash of the task id, so the slice does not depend on row
    order and stays fixed as rows are added."""
    return np.array([_unit(f"audit:{cfg.audit_seed}:{t}") < cfg.audit_fraction for t in task_ids], dtype=bool)


SMALL_DOMAINS = "(small domains)"


def benchmark_names(domains: list[str], cfg: CompositeConfig) -> np.ndarray:
    """Each row's benchmark: its group in `benchmarks`, else its domain; a domain of fewer than
    `min_benchmark_rows` rows here (one never seen in training, a typo'd label) is pooled into
    `SMALL_DOMAINS` (when there are two or more such, and larger ones besides), so a handful of rows
from several odd domains cannot move the mean over benchmarks by several whole shares."""
    owner = {d: name for name, ds in (cfg.benchmarks or {}).items() for d in ds}
    names = [owner.get(d, d) for d in domains]
    counts: dict[str, int] = {}
    for d in domains:
        counts[d] = counts.get(d, 0) + 1
    small = {d for d, n in counts.items() if n < cfg.min_benchmark_rows and d not in owner}
    if len(small) < 2 or len(small) == len(counts):  # pooling one changes nothing; pooling all, everything
        small = set()
    return np.array([SMALL_DOMAINS if d in small else name for d, name in zip(domains, names)], dtype=object)


@dataclass
class HeldOut:
    """The test rows the composite is computed on, cut into eval and audit, grouped by benchmark.
    `measure` (N, W) and `worker_ids`: a one-step head's per-worker quality, from which its routes
    give its outcomes (`score_head`); other kinds bring their outcomes per row (`score_outcomes`)."""

    task_ids: list[str]
    benchmarks: np.ndarray
    audit: np.ndarray
    measure: np.ndarray | None = None  # (N, W) quality, or utility where the matrix has no quality
    measure_name: str = "quality"
    worker_ids: list[str] | None = None

    def names(self) -> list[str]:
        return sorted(set(self.benchmarks.tolist()))

    def eval_rows(self, b: str) -> np.ndarray:
        return np.flatnonzero((self.benchmarks == b) & ~self.audit)

    def audit_rows(self, b: str) -> np.ndarray:
        return np.flatnonzero((self.benchmarks == b) & self.audit)

    def live_sample(self, b: str, n: int, seed: int, available: set[str] | None = None) -> list[str]:
        """A fixed sample of b's eval rows (salted-hash order), limited to tasks that can be called."""
        ids = [self.task_ids[i] for i in self.eval_rows(b) if available is None or self.task_ids[i] in available]
        return sorted(ids, key=lambda t: _unit(f"live:{seed}:{t}"))[:n]


def held_rows(task_ids: list[str], domains: list[str], cfg: CompositeConfig, *, one_benchmark: str | None = None,
              measure_name: str = "quality") -> HeldOut:
    """The held-out rows of any kind from its test tasks' ids and domains (`one_benchmark`: every
    row in one benchmark of that name, as the triage head is judged)."""
    if not task_ids:
        raise ValueError("the test split has no rows: the composite needs held-out rows")
    names = np.array([one_benchmark] * len(task_ids), dtype=object) if one_benchmark else benchmark_names(list(domains), cfg)
    return HeldOut(task_ids=list(task_ids), benchmarks=names, audit=audit_mask(list(task_ids), cfg), measure_name=measure_name)


def held_out(data, cfg: CompositeConfig) -> HeldOut:
    """The held-out rows of a RoutingData for the composite (one-step heads)."""
    test = data.split("test")
    if test.n_tasks == 0:
        raise ValueError("the test split has no rows: the composite needs held-out rows")
    has_q = test.quality is not None and not np.isnan(test.quality).any()
    return HeldOut(task_ids=list(test.task_ids), benchmarks=benchmark_names(test.domains, cfg),
                   audit=audit_mask(test.task_ids, cfg), measure=test.quality if has_q else test.utility,
                   measure_name="quality" if has_q else "utility (the matrix has no quality)",
                   worker_ids=list(test.worker_ids))


@dataclass
class LiveRows:
    """One head's live outcomes on one benchmark's sample, as arrays in sample order. `turns`:
    turns per task (None: one per worker call, as a one-step head spends them)."""

    quality: np.ndarray
    calls: np.ndarray
    cost_usd: float
    errors: int
    turns: np.ndarray | None = None

    def turns_or_calls(self) -> np.ndarray:
        return self.calls if self.turns is None else self.turns


def _exceeds(gap: float, bound: float) -> bool:
    """gap > bound as decimals rounded to 9 places: a gap of exactly 0.08 (0.58 − 0.50, 0.90 − 0.82)
    is treated alike whatever binary float the subtraction left."""
    return Decimal(f"{gap:.9f}") > Decimal(f"{bound:.9f}")


def _overfit(got: np.ndarray, e: np.ndarray, a: np.ndarray, cfg: CompositeConfig, pooled: tuple | None = None) -> dict:
    """The overfit verdict on eval rows `e` and audit rows `a`; under the guarded rule, with too few
    audit rows, the verdict on the `pooled` (eval, audit) rows of every benchmark, labelled so."""
    guarded = cfg.overfit_rule == "guarded"
    least = cfg.min_audit_rows if guarded else 1
    if guarded and len(a) < least and pooled is not None:
        out = _overfit(got, pooled[0], pooled[1], cfg)
        out["verdict"] = (f"pooled {out['verdict']}" if out["gap"] is not None else
                          f"not judged ({len(a)} audit rows here, {len(pooled[1])} over all benchmarks; < {least})")
        out["local"] = {"n_audit": int(len(a)), "gap": float(got[e].mean() - got[a].mean()) if len(a) and len(e) else None}
        return out
    if len(a) < least or len(e) == 0:
        return {"eval_accuracy": float(got[e].mean()) if len(e) else None, "audit_accuracy": None,
                "gap": None, "gap_se": None, "factor": 1.0,
                "verdict": f"not judged ({len(a)} audit rows < {least})"}
    ev, au = float(got[e].mean()), float(got[a].mean())
    both = got[np.concatenate([e, a])]
    var = float(both.var(ddof=1)) if len(both) > 1 else 0.0
    se = math.sqrt(var * (1 / len(e) + 1 / len(a)))
    gap = round(ev - au, 9)
    significant = not (guarded and cfg.overfit_significant) or gap - 1.645 * se > 0
    if _exceeds(gap, cfg.overfit_reject_gap) and significant:
        verdict, factor = "reject", 0.0
    elif _exceeds(gap, cfg.overfit_penalty_gap) and significant:
        verdict, factor = "penalty", cfg.overfit_penalty
    elif _exceeds(gap, cfg.overfit_penalty_gap):
        verdict, factor = "within noise", 1.0
    else:
        verdict, factor = "ok", 1.0
    return {"eval_accuracy": ev, "audit_accuracy": au, "gap": gap, "gap_se": se, "verdict": verdict, "factor": factor}


def _weights(cfg: CompositeConfig, present: set[str]) -> dict[str, float]:
    """The configured weights of the terms present, rescaled to the configured total."""
    w = cfg.weights()
    total, kept = sum(w.values()), sum(v for k, v in w.items() if k in present)
    return {k: (v * total / kept if k in present else 0.0) for k, v in w.items()} if kept > 0 else dict.fromkeys(w, 0.0)


def score_head(routes: np.ndarray, held: HeldOut, cfg: CompositeConfig, *, king_routes: np.ndarray | None = None,
               live: dict[str, LiveRows] | None = None, is_king: bool = False) -> dict:
    """The composite of one one-step head from its greedy routes on the held-out rows (indices into
    `held.worker_ids`): its outcome on a row is the stored quality of the worker it picks."""
    got = held.measure[np.arange(len(routes)), routes]
    return score_outcomes(got, routes, held, cfg, king_decisions=king_routes, live=live, is_king=is_king)


def score_outcomes(got: np.ndarray, decisions, held: HeldOut, cfg: CompositeConfig, *, king_decisions=None,
                   live: dict[str, LiveRows] | None = None, is_king: bool = False, turns: np.ndarray | None = None) -> dict:
    """The composite of one head of any kind from its outcome per held-out row (`got`, quality in
    [0, 1]) and its decision per row (`decisions`, any comparable labels). `king_decisions` gives
    novelty (None: no king, novelty left out); `is_king` scores the king itself (novelty 0).
    `live`: per benchmark, its live outcomes (None: no live term). `turns`: the calls it made per
    row, for the efficiency term when there is no live run (None: one per row)."""
    got = np.asarray(got, float)
    turns = np.ones(len(got)) if turns is None else np.asarray(turns, float)
    decisions = np.asarray(decisions, dtype=object)
    king_decisions = None if king_decisions is None else np.asarray(king_decisions, dtype=object)
    pooled = (np.flatnonzero(~held.audit), np.flatnonzero(held.audit))
    rows = []
    for b in held.names():
        e, a = held.eval_rows(b), held.audit_rows(b)
        lr = (live or {}).get(b)
        cached = float(got[e].mean()) if len(e) else None
        terms = {"cached": cached, "live": None, "efficiency": None, "novelty": None}
        eff_source = "cached (one turn per task)" if not len(e) or np.all(turns[e] == 1) else "cached (its calls per task)"
        if lr is not None and len(lr.quality):
            terms["live"] = float(lr.quality.mean())
            terms["efficiency"] = float(lr.quality.sum() / max(lr.turns_or_calls().sum(), 1))
            eff_source = "live"
        elif cached is not None:
            terms["efficiency"] = float(got[e].sum() / max(turns[e].sum(), 1))
        if is_king:
            terms["novelty"] = 0.0
        elif king_decisions is not None and len(e):
            terms["novelty"] = float(np.mean(decisions[e] != king_decisions[e]))
        present = {k for k, v in terms.items() if v is not None}
        w = _weights(cfg, present)
        of = _overfit(got, e, a, cfg, pooled)
        raw = sum(w[k] * terms[k] for k in TERMS if k in present)  # a fixed order: the same sum in every process
        rows.append({"benchmark": b, "n_eval": int(len(e)), "n_audit": int(len(a)),
                     "n_live": 0 if lr is None else int(len(lr.quality)),
                     "live_cost_usd": 0.0 if lr is None else lr.cost_usd, "live_errors": 0 if lr is None else lr.errors,
                     "live_turns": None if lr is None else float(lr.turns_or_calls().sum()),
                     **{f"{k}": terms[k] for k in TERMS}, "efficiency_source": eff_source,
                     "weights": w, "left_out": sorted(set(TERMS) - present), "overfit": of,
                     "score_before_overfit": raw, "score": raw * of["factor"]})
    composite = float(np.mean([r["score"] for r in rows])) if rows else float("nan")
    return {"composite": composite, "rejected": any(r["overfit"]["verdict"].endswith("reject") for r in rows),
            "measure": held.measure_name, "benchmarks": rows}


def paired_difference(ch_routes: np.ndarray, king_routes: np.ndarray, held: HeldOut, cfg: CompositeConfig,
                      ch: dict, king: dict, live_ch: dict[str, LiveRows] | None = None,
                      live_king: dict[str, LiveRows] | None = None) -> dict:
    """`paired_outcomes` for two one-step heads given by their routes."""
    n = np.arange(len(ch_routes))
    return paired_outcomes(held.measure[n, ch_routes], held.measure[n, king_routes], ch_routes, king_routes, held, cfg,
                           ch, king, live_ch, live_king)


def paired_outcomes(got_c: np.ndarray, got_k: np.ndarray, dec_c, dec_k, held: HeldOut, cfg: CompositeConfig,
                    ch: dict, king: dict, live_ch: dict[str, LiveRows] | None = None,
                    live_king: dict[str, LiveRows] | None = None, turns_c: np.ndarray | None = None,
                    turns_k: np.ndarray | None = None) -> dict:
    """Paired bootstrap of composite(challenger) − composite(king): within each benchmark the eval
    rows and the live sample are resampled (the same draw for both heads), the weights and overfit
    factors of the full-sample scores held fixed. `turns_c`/`turns_k`: calls per row (cached
    efficiency; None: one). Returns mean (the full-sample difference), low, high."""
    rng = np.random.default_rng(cfg.seed)
    got_c, got_k = np.asarray(got_c, float), np.asarray(got_k, float)
    turns_c = np.ones(len(got_c)) if turns_c is None else np.asarray(turns_c, float)
    turns_k = np.ones(len(got_k)) if turns_k is None else np.asarray(turns_k, float)
    differs = np.asarray(dec_c, dtype=object) != np.asarray(dec_k, dtype=object)
    per_c = {r["benchmark"]: r for r in ch["benchmarks"]}
    per_k = {r["benchmark"]: r for r in king["benchmarks"]}
    diffs = np.zeros(cfg.n_boot)
    names = held.names()
    for b in names:
        e = held.eval_rows(b)
        if not len(e):
            continue
        idx = e[rng.integers(0, len(e), size=(cfg.n_boot, len(e)))]
        lc, lk = (live_ch or {}).get(b), (live_king or {}).get(b)
        lidx = rng.integers(0, len(lc.quality), size=(cfg.n_boot, len(lc.quality))) if lc is not None and len(lc.quality) else None
        for sign, got, lr, row, calls in ((1.0, got_c, lc, per_c[b], turns_c), (-1.0, got_k, lk, per_k[b], turns_k)):
            w = row["weights"]
            cached = got[idx].mean(axis=1)
            s = w["cached"] * cached
            if lidx is not None and lr is not None and row["live"] is not None:
                q, turns = lr.quality[lidx], lr.turns_or_calls()[lidx]
                s = s + w["live"] * q.mean(axis=1) + w["efficiency"] * q.sum(axis=1) / np.maximum(turns.sum(axis=1), 1)
            elif row["efficiency"] is not None:
                s = s + w["efficiency"] * got[idx].sum(axis=1) / np.maximum(calls[idx].sum(axis=1), 1)
            if row["novelty"] is not None and sign > 0:
                s = s + w["novelty"] * differs[idx].mean(axis=1)
            diffs += sign * s * row["overfit"]["factor"]
    diffs /= max(len(names), 1)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"mean": ch["composite"] - king["composite"], "low": float(lo), "high": float(hi), "n_boot": cfg.n_boot}


def composite_lines(score: dict, label: str = "composite") -> list[str]:
    """The composite and every term per benchmark, as text."""
    lines = [f"{label} {score['composite']:.4f}{'  REJECTED (overfit)' if score['rejected'] else ''}  "
             f"(measure: {score['measure']})"]
    for r in score["benchmarks"]:
        of = r["overfit"]
        fmt = lambda v: "  n/a " if v is None else f"{v:.4f}"  # noqa: E731
        gap = "n/a" if of["gap"] is None else f"{of['gap']:+.4f} ± {of['gap_se']:.4f}"
        lines.append(f"  {r['benchmark']:<14} score {r['score']:.4f} = ({r['weights']['cached']:.3f}·cached {fmt(r['cached'])}"
                     f" + {r['weights']['live']:.3f}·live {fmt(r['live'])} + {r['weights']['efficiency']:.3f}·eff {fmt(r['efficiency'])}"
                     f" + {r['weights']['novelty']:.3f}·novelty {fmt(r['novelty'])}) × {of['factor']:.2f} "
                     f"[eval {r['n_eval']}, audit {r['n_audit']}, live {r['n_live']}; gap {gap}: {of['verdict']}]"
                     + (f" left out: {', '.join(r['left_out'])}" if r["left_out"] else ""))
    return lines


def composite_markdown(score: dict, king: dict | None = None) -> str:
    rows = ["| benchmark | score | cached | live | efficiency | novelty | eval / audit / live n | eval − audit gap | overfit |",
            "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "–" if v is None else f"{v:.4f}"  # noqa: E731
    for r in score["benchmarks"]:
        of = r["overfit"]
        gap = "–" if of["gap"] is None else f"{of['gap']:+.4f} ± {of['gap_se']:.4f}"
        rows.append(f"| {r['benchmark']} | {r['score']:.4f} | {fmt(r['cached'])} | {fmt(r['live'])} | {fmt(r['efficiency'])} | "
                    f"{fmt(r['novelty'])} | {r['n_eval']} / {r['n_audit']} / {r['n_live']} | {gap} | "
                    f"{of['verdict']} × {of['factor']:.2f} |")
    head = f"**composite {score['composite']:.4f}**" + (" (rejected: overfit)" if score["rejected"] else "")
    if king is not None:
        head += f" vs king {king['composite']:.4f}"
    return head + f" (measure: {score['measure']})\n\n" + "\n".join(rows)
