"""What ships, from the candidates' out-of-fold figures (`crossfit.CrossFit`), in each way of choosing:

- `cheapest` (no cap, quality-only weights): the cheapest candidate whose accuracy is not
  significantly below always the strongest worker's (`train.selection.cheapest_not_below`); the
  per-domain policy (`groups.py`) is one more candidate, already held to the same rule per domain
  and for the whole.
- `cap`: the candidate with the best out-of-fold accuracy among those whose out-of-fold mean cost is
  within the cap (ties: the cheaper). No significance rule stands between the user's cap and the
  best policy within it: the user chose to spend less; the best worker within the cap is one of the
  candidates, and every figure carries its interval. A one-shot head scored at the cap (`AT_CAP`)
  ships with the λ its budget calibration chooses for that cap (`cap_point`), which it serves with
  no cap asked.
- `utility` (the utility prices cost): a candidate replaces the best worker only when its utility
  gain over it has a paired bootstrap 95% interval above zero; among those the best mean wins.

`shipped_policy`: the description of what ships (`route/shipped.py`), made from the choice itself:
the winning candidate's out-of-fold figures, its checkpoint, and how it routes (a cascade's plan; a
one-shot head at the operating point its candidate was scored at).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fugu_pipeline.route.shipped import CapChoice, CapRow, ShippedPolicy, checkpoint_tag
from fugu_pipeline.train.selection import STRONGEST, cheapest_not_below, interval

BEST_WORKER = "always the best worker"
BEST_IN_CAP = "always the best worker within the cap"
PER_DOMAIN = "cascade per domain"
PER_CLUSTER = "cascade per prompt cluster"  # the same, for groups learnt from the prompts (groups.py)
# under a pooled cap: a plan per group, the cap shared among them (groups.share_cap)
SHARED_DOMAIN = "cascade per domain, the cap shared"
SHARED_CLUSTER = "cascade per prompt cluster, the cap shared"
# under a pooled cap: a one-shot head routed at the λ that keeps the cap ("one-shot <name> at the cap")
AT_CAP = " at the cap"


@dataclass
class CandidateFigure:
    name: str
    kind: str  # "best worker" | "strongest" | "one-shot" | "cascade"
    mean: float  # out-of-fold utility (utility mode) or quality
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


def paired_interval(diff: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    n = len(diff)
    means = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def kind_of(name: str, mode: str, heads) -> str:
    if name in (BEST_WORKER, BEST_IN_CAP) or (name == STRONGEST and mode == "cheapest"):
        return "best worker"
    return "strongest" if name == STRONGEST else "one-shot" if head_of(name) in (heads or {}) else "cascade"


def head_of(name: str) -> str:
    """The one-shot head a candidate's name is of ("one-shot <name>" or that at the cap)."""
    return name.removesuffix(AT_CAP)


def candidates(cf, mode: str, baseline: str, heads, n_boot: int, seed: int, over_cap) -> list[CandidateFigure]:
    """Every candidate's figures, against the baseline (the strongest in `cheapest` mode) and against
    the strongest, each with its paired 95% interval. `over_cap(cost per row)`: a note when the
    mean cost is over a cap, else ""."""
    ref_name = STRONGEST if mode == "cheapest" else baseline
    out = []
    for name in cf.names:
        v = cf.figure[name]
        vs, vs_lo, vs_hi = interval(cf.quality[name] - cf.quality[STRONGEST], n_boot, seed)
        diff = v - cf.figure[ref_name]
        lo, hi = paired_interval(diff, n_boot, seed) if name != ref_name else (0.0, 0.0)
        note = "unavailable: no plan within this share of the strongest's cost in some fold" if name in cf.missing else ""
        note = over_cap(cf.cost[name]) or note
        out.append(CandidateFigure(name, kind_of(name, mode, heads), float(v.mean()), float(cf.quality[name].mean()),
                                   float(cf.cost[name].mean()), float(diff.mean()), lo, hi, note, vs, vs_lo, vs_hi))
    return out


def against(win: CandidateFigure, strongest_worker: str) -> str:
    return (f"; against {STRONGEST} ({strongest_worker}): accuracy {win.vs_strongest:+.4f} [{win.vs_low:+.4f}, "
            f"{win.vs_high:+.4f}]")


def pick_cheapest(cands: list[CandidateFigure], strongest_worker: str, margin: float, n: int, floor: float | None = None):
    """(winner, reason, the `cheapest_not_below` pick)."""
    pick = cheapest_not_below(cands, STRONGEST, strongest_worker, margin, n, floor)
    return next(c for c in cands if c.name == pick.name), pick.reason, pick


def pick_capped(cands: list[CandidateFigure], cf, cap_text: str, baseline: str, strongest_worker: str, n_boot: int,
                seed: int) -> tuple[CandidateFigure, str]:
    """The best out-of-fold accuracy within the cap (see the module docstring); none within it: the
    baseline (the cheapest worker when no worker fits), with the reason."""
    ok = [c for c in cands if not c.note]
    if not ok:
        win = next(c for c in cands if c.name == baseline)
        return win, (f"no policy's out-of-fold mean cost is within the cap ({cap_text}), so {baseline} ships"
                     + against(win, strongest_worker))
    win = max(ok, key=lambda c: (c.quality, -c.cost_usd))
    acc = interval(cf.quality[win.name], n_boot, seed)
    usd = interval(cf.cost[win.name] * 1000, n_boot, seed)
    base = next(c for c in cands if c.name == baseline)
    gain = "" if win.name == baseline else (f"; against {baseline} {base.quality:.4f}: {win.gain:+.4f} [{win.low:+.4f}, "
                                            f"{win.high:+.4f}]")
    return win, (f"{win.name} has the best out-of-fold accuracy within the cap ({cap_text}): {acc[0]:.4f} [{acc[1]:.4f}, "
                 f"{acc[2]:.4f}] at ${usd[0]:.4g} [{usd[1]:.4g}, {usd[2]:.4g}] per 1,000 requests{gain}"
                 + against(win, strongest_worker))


def pick_utility(cands: list[CandidateFigure], baseline: str, strongest_worker: str) -> tuple[CandidateFigure, str]:
    ok = [c for c in cands if c.kind not in ("best worker", "strongest") and c.low > 0 and not c.note.startswith("over")]
    if ok:
        win = max(ok, key=lambda c: (c.mean, -c.cost_usd))
        reason = (f"{win.name} gains {win.gain:+.4f} over {baseline} out of fold, 95% interval [{win.low:+.4f}, "
                  f"{win.high:+.4f}] above zero, and has the best out-of-fold utility of those that do")
    else:
        win = next(c for c in cands if c.name == baseline)
        reason = (f"no policy's out-of-fold gain over {baseline} has a 95% interval above zero, so the best worker ships "
                  "(doing no harm)")
    return win, reason + against(win, strongest_worker)


def shipped_policy(fit, shipped_path: Path, head_routes: dict | None = None, cascade_path: Path | None = None,
                   one_shot_path: Path | None = None) -> ShippedPolicy:
    """`fit` (a `fit.CascadeFit`) as shipped from `shipped_path`. A one-shot head scored at its
    default operating point (its route in `head_routes`) ships with that point, read from its
    `budget.json` where the heads step saved it; one scored by its plain argmax ships with none.
    With `cascade_path` (the saved cascade) it holds `cap_choices` for a cap asked later
    (`one_shot_path`: the selected head, the table's one-shot row)."""
    win = next(c for c in fit.candidates if c.name == fit.selected)
    strong = next((c for c in fit.candidates if c.name == STRONGEST), win)
    tag, content_hash = checkpoint_tag(shipped_path)
    kind = win.kind if win.kind in ("one-shot", "cascade") else "best worker"
    point = None
    top = max(fit.worker_quality, key=fit.worker_quality.get) if fit.worker_quality else None
    n = len(next(iter(fit.oof.values()))) if fit.oof else None
    if kind == "one-shot" and win.name.endswith(AT_CAP):
        point = cap_point(fit, win, strong, shipped_path, top, n)
    elif kind == "one-shot" and win.name in (head_routes or {}):
        from fugu_pipeline.route.budget import load_calibration

        cal = load_calibration(shipped_path)
        point = cal.default if cal is not None else None
    return ShippedPolicy(kind=kind, name=win.name, checkpoint=tag, content_hash=content_hash, operating_point=point,
                         plan=None if kind == "one-shot" else fit.policy.describe() + follows_words(
                             getattr(fit, "cap_usd", None), getattr(fit, "group_caps", None), kind == "best worker"),
                         strongest_worker=top,
                         oof_accuracy=win.quality, oof_cost_usd=win.cost_usd, strongest_accuracy=strong.quality,
                         strongest_cost_usd=strong.cost_usd, difference=(win.vs_strongest, win.vs_low, win.vs_high),
                         n_rows=n, reason=fit.reason,
                         at_caps=cap_choices(fit.cap_rows or [], cascade_path, one_shot_path, tag) if cascade_path else [])


def follows_words(cap_usd: float | None, group_caps: dict | None, alone: bool) -> str:
    """How a checkpoint trained under the pooled cap `cap_usd` keeps it (`spend.py`), in words after
    its plan (`train`'s shipped line, `evaluate`'s report); `alone`: it shipped one worker alone."""
    if cap_usd is None:
        return ""
    usd = f"${cap_usd * 1000:.4g} per 1,000 requests"
    if alone:
        return f", kept while its running spend allows it under the cap it was trained under ({usd}), else a cheaper saved point"
    shared = " (each group following its part)" if group_caps else ""
    return (f", then following the spend under the cap it was trained under ({usd}){shared}: each request the most "
            "accurate saved point within the effective cap")


def cap_choices(rows: list[dict], cascade_path: Path, one_shot_path: Path | None, shipped_tag: str) -> list[CapChoice]:
    """For each share of the table at caps (`choice.cap_table`'s rows), the rows a saved checkpoint
    serves a cap asked later with, the most accurate out of fold first (ties: the shipped checkpoint):
    the one-shot row by the selected head (under the cap, λ following the spend), and the cascade by
    its saved points: plans per group sharing the cap where it holds a frontier per group (what
    `spend.request_shares` does with a cap asked), else the pooled row."""
    import json

    from fugu_pipeline.policies.cascade.choice import GROUPED, TABLE_SHARES
    from fugu_pipeline.policies.cascade.spend import group_parts

    manifest = json.loads((Path(cascade_path) / "manifest.json").read_text(encoding="utf-8"))
    grouped = group_parts(manifest.get("head_params") or {}, manifest.get("metrics") or {}) is not None
    serves = {GROUPED if grouped else "cascade": checkpoint_tag(cascade_path)[0],
              **({"one-shot": checkpoint_tag(one_shot_path)[0]} if one_shot_path is not None else {})}
    out = []
    for share in TABLE_SHARES:
        got = [CapRow(policy=r["policy"], checkpoint=serves[r["policy"]], accuracy=r["accuracy"][0],
                      minus_strongest=tuple(r["minus_strongest"]), cost_share=r["share_of_strongest"])
               for r in rows if r["share"] == share and r["policy"] in serves and r["accuracy"] is not None]
        if got:
            out.append(CapChoice(share=share, rows=sorted(got, key=lambda r: (-r.accuracy, r.checkpoint != shipped_tag))))
    return out


def cap_point(fit, win: CandidateFigure, strong: CandidateFigure, shipped_path: Path, top: str | None, n: int | None):
    """The operating point a one-shot head shipped under a cap serves with no cap asked: the cap the
    fit was made under, routed as a request naming that cap is (its λ following the spend from the
    one its budget calibration, `budget.json`, chooses), with the out-of-fold figures it was chosen on."""
    from fugu_pipeline.cost_cap import DEFAULT_MARGIN_Z, CostCap
    from fugu_pipeline.route.budget import load_calibration
    from fugu_pipeline.route.default_point import DefaultPoint

    cal = load_calibration(shipped_path)
    if cal is None:
        raise ValueError(f"{shipped_path}: no budget.json beside the head, so it cannot serve the cap it was chosen under")
    cap = CostCap(usd_per_1k=fit.cap_usd * 1000, margin_z=fit.cap_z if fit.cap_z is not None else DEFAULT_MARGIN_Z)
    op = cal.choose(cap, strict=False)
    said = "" if op.met_on_validation else " (not met on the calibration's validation rows: the cheapest point)"
    return DefaultPoint(kind="lambda", lam=op.lam, cap=cap, strongest_worker=top or "", n_rows=max(int(n or 1), 1),
                        reason=f"the cap it was trained under, ${fit.cap_usd * 1000:.4g} per 1,000 requests, λ following "
                               f"the spend from the λ its budget calibration chooses for it, {op.lam:.4g}{said}", oof_accuracy=win.quality, oof_cost_usd=win.cost_usd,
                        strongest_accuracy=strong.quality, strongest_cost_usd=strong.cost_usd,
                        difference=(win.vs_strongest, win.vs_low, win.vs_high))
