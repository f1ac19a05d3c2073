"""The description of what the cascade step ships (`route/shipped.py`), made from the choice itself:
the winning candidate's out-of-fold figures, its checkpoint, and how it routes (a cascade's plan; a
one-shot head at the operating point its candidate was scored at)."""

from __future__ import annotations

from pathlib import Path

from fugu_pipeline.route.shipped import ShippedPolicy, checkpoint_tag
from fugu_pipeline.train.selection import STRONGEST


def shipped_policy(fit, shipped_path: Path, head_routes: dict | None = None) -> ShippedPolicy:
    """`fit` (a `fit.CascadeFit`) as shipped from `shipped_path`. A one-shot head scored at its
    default operating point (its route in `head_routes`) ships with that point, read from its
    `budget.json` where the heads step saved it; one scored by its plain argmax ships with none."""
    win = next(c for c in fit.candidates if c.name == fit.selected)
    strong = next((c for c in fit.candidates if c.name == STRONGEST), win)
    tag, content_hash = checkpoint_tag(shipped_path)
    kind = win.kind if win.kind in ("one-shot", "cascade") else "best worker"
    point = None
    if kind == "one-shot" and win.name in (head_routes or {}):
        from fugu_pipeline.route.budget import load_calibration

        cal = load_calibration(shipped_path)
        point = cal.default if cal is not None else None
    top = max(fit.worker_quality, key=fit.worker_quality.get) if fit.worker_quality else None
    n = len(next(iter(fit.oof.values()))) if fit.oof else None
    return ShippedPolicy(kind=kind, name=win.name, checkpoint=tag, content_hash=content_hash, operating_point=point,
                         plan=None if kind == "one-shot" else fit.policy.describe(), strongest_worker=top,
                         oof_accuracy=win.quality, oof_cost_usd=win.cost_usd, strongest_accuracy=strong.quality,
                         strongest_cost_usd=strong.cost_usd, difference=(win.vs_strongest, win.vs_low, win.vs_high),
                         n_rows=n, reason=fit.reason)
