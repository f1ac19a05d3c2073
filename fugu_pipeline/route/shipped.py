"""What ships, said once: the description of the policy `fugu-lite train` chose (`policy.json` beside
the shipped checkpoint), which `train` prints, `evaluate` shows, and `route`, `ask` and `serve`
report and route by.

It is computed where the choice is made, from the figures the choice read (out of fold over the
non-test rows): by the heads step when no cascade runs (the selected head at its default operating
point, `policies/oneshot/default_point.py`), by the cascade step otherwise (the candidate that won,
`policies/cascade/fit.py`: a cascade, always the strongest worker, or a one-shot head at the very
operating point it was scored at). Nothing downstream recomputes it: the `Router` routes a one-shot
checkpoint with no cap asked by `operating_point` (before the head's own `budget.json` default),
and every reader prints `lines()` or reports `public()`.

Like `budget.json`, the file sits beside the checkpoint, so the checkpoint's content hash is
untouched; it names the hash it was written for, and one written for other weights is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fugu_pipeline.route.default_point import DefaultPoint

POLICY_FILE = "policy.json"


class CapRow(BaseModel):
    """One row of `train`'s table at caps that a checkpoint of the same run serves."""

    model_config = ConfigDict(extra="forbid")

    policy: str  # the table's row: "one-shot", "cascade" or "plans per group"
    checkpoint: str  # `<method>/<content hash>` of the checkpoint that serves a cap asked this way
    accuracy: float  # out of fold over the non-test rows
    minus_strongest: tuple[float, float, float]  # accuracy − the strongest's: mean, 95% paired interval
    cost_share: float | None = None  # its out-of-fold cost as a share of the strongest's


class CapChoice(BaseModel):
    """At one share of the table at caps: the rows a checkpoint of the run serves, the most accurate
    first (ties: the shipped checkpoint's). A cap asked later that the shipped checkpoint cannot keep
    is served by the first row's checkpoint that can (`Router.cap_router`)."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(gt=0, le=1)
    rows: list[CapRow] = Field(min_length=1)

    def why(self) -> str:
        best = self.rows[0]
        others = "; ".join(f"{r.policy} ({r.checkpoint}) {r.accuracy:.4f}, {r.minus_strongest[0]:+.4f}" for r in self.rows[1:])
        return (f"out of fold at {self.share:.0%} of the strongest worker's cost, {best.policy} ({best.checkpoint}) "
                f"scored {best.accuracy:.4f}, {best.minus_strongest[0]:+.4f} against the strongest"
                + (f" (beside {others})" if others else ""))


class ShippedPolicy(BaseModel):
    """The shipped policy and the out-of-fold figures it was chosen on."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["one-shot", "cascade", "best worker"]
    name: str  # as the choice's table names it ("one-shot ridge", "cascade ≤ 50% of the strongest's cost", ...)
    checkpoint: str  # `<method>/<content hash>`: how clients see it (never a path)
    content_hash: str
    operating_point: DefaultPoint | None = None  # a one-shot head with no cap asked (None: its plain route)
    plan: str | None = None  # a cascade (or the strongest alone): its plan in words
    strongest_worker: str | None = None
    oof_accuracy: float | None = None
    oof_cost_usd: float | None = None  # mean expected $ per request
    strongest_accuracy: float | None = None
    strongest_cost_usd: float | None = None
    difference: tuple[float, float, float] | None = None  # accuracy − the strongest's: mean, 95% paired interval
    n_rows: int | None = Field(None, ge=0)
    reason: str = ""
    # a cap asked later (route, ask, evaluate, serve) that this checkpoint cannot keep: the checkpoints
    # of the run that serve each share of the table at caps, the most accurate out of fold first; the
    # nearest share decides (`for_cap`, `Router.cap_router`)
    at_caps: list[CapChoice] = []

    def cap_checkpoints(self) -> set[str]:
        """The tags of the run's other checkpoints a cap asked later may go to (`at_caps`)."""
        return {r.checkpoint for c in self.at_caps for r in c.rows} - {self.checkpoint}

    def for_cap(self, cap) -> CapChoice | None:
        """The table share nearest to `cap` (a `CostCap`; dollars are read as a share of the strongest's
        out-of-fold cost; equally near: the lower share), or None when the table holds none or the
        cap's share cannot be known."""
        if not self.at_caps:
            return None
        share = cap.share
        if share is None:
            if not self.strongest_cost_usd or self.strongest_cost_usd <= 0:
                return None
            share = cap.usd_per_1k / 1000 / self.strongest_cost_usd
        return min(self.at_caps, key=lambda c: (abs(c.share - share), c.share))

    @property
    def cost_share(self) -> float | None:
        """Its expected cost as a share of always the strongest worker's (None when either is unknown)."""
        if self.oof_cost_usd is None or not self.strongest_cost_usd:
            return None
        return self.oof_cost_usd / self.strongest_cost_usd

    def how(self) -> str:
        """How it routes, in words."""
        if self.kind != "one-shot":
            return f"plan {self.plan}" if self.plan else self.kind
        p = self.operating_point
        if p is None:
            return "its plain route (no operating point: the head's argmax)"
        if p.cap is not None:
            return p.pooled()
        if p.per_domain:
            return p.per_domain_text()
        if p.kind == "strongest":
            return f"always {p.strongest_worker}"
        return "its plain route (λ = 0)" if not p.lam else f"λ-routing at λ = {p.lam:.4g}"

    def describe(self) -> str:
        """The one line `train` prints and `evaluate`, `route` and `serve` repeat."""
        head = f"shipped policy: {self.name} ({self.checkpoint}), {self.how()}"
        if self.oof_accuracy is None:
            return head + "; no out-of-fold accuracy against the strongest worker was measured"
        d = self.difference or (0.0, 0.0, 0.0)
        share = self.cost_share
        cost = "" if self.oof_cost_usd is None else f", ${self.oof_cost_usd * 1000:.4g} per 1,000" + (
            "" if share is None else f" = {share:.0%} of {self.strongest_worker}'s cost")
        return (f"{head}: out-of-fold accuracy {self.oof_accuracy:.4f} against always {self.strongest_worker} "
                f"{self.strongest_accuracy:.4f} over {self.n_rows} non-test rows, difference {d[0]:+.4f} "
                f"[{d[1]:+.4f}, {d[2]:+.4f}]{cost}")

    def lines(self) -> list[str]:
        return [self.describe(), *([f"why: {self.reason}"] if self.reason else []), *self.cap_lines()]

    def cap_lines(self) -> list[str]:
        """How a cap asked later is served: each share's checkpoint, and why."""
        if not self.at_caps:
            return []
        return [f"a cap asked later (route, ask, evaluate, serve) that {self.checkpoint} cannot keep goes to the run's "
                "checkpoint most accurate out of fold at the nearest of these shares that keeps it:"] + [
                    f"  {c.share:.0%}: {', '.join(r.checkpoint for r in c.rows)} ({c.why()})" for c in self.at_caps]

    def public(self) -> dict:
        """What `route`, `ask`, `serve` and `/health` report: no paths, the figures it was chosen on."""
        p = self.operating_point
        return {"kind": self.kind, "name": self.name, "checkpoint": self.checkpoint, "routes_by": self.how(),
                **({"lambda": p.lam} if p is not None and p.kind == "lambda" else {}),
                **({"lambda_per_domain": dict(p.per_domain), "grouped_by": p.by} if p is not None and p.per_domain else {}),
                **({"plan": self.plan} if self.plan else {}),
                "oof_accuracy": self.oof_accuracy, "strongest_worker": self.strongest_worker,
                "strongest_accuracy": self.strongest_accuracy, "cost_share_of_strongest": self.cost_share,
                "difference": list(self.difference) if self.difference else None, "n_rows": self.n_rows,
                **({"at_caps": [{"share": c.share, "policy": c.rows[0].policy, "checkpoint": c.rows[0].checkpoint,
                                 "oof_accuracy": c.rows[0].accuracy} for c in self.at_caps]} if self.at_caps else {}),
                "line": self.describe()}

    def save(self, checkpoint_dir: str | Path) -> Path:
        from fugu_pipeline.files import atomic_write

        return atomic_write(Path(checkpoint_dir) / POLICY_FILE, json.dumps(self.model_dump(mode="json"), indent=1))


def read_shipped(checkpoint_dir: str | Path, content_hash: str) -> tuple[ShippedPolicy | None, str]:
    """(the description beside a checkpoint, "") when there is one written for these weights, else
    (None, why not: "" when there is none at all)."""
    path = Path(checkpoint_dir) / POLICY_FILE
    if not path.is_file():
        return None, ""
    try:
        got = ShippedPolicy.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        return None, f"{path} cannot be read ({why}); train again to write it, or delete it"
    if got.content_hash != content_hash:
        return None, f"{path} was written for checkpoint {got.content_hash[:40]}, not this one ({content_hash}); ignored"
    return got, ""


def serving_point(shipped: ShippedPolicy | None, calibration, head) -> DefaultPoint | None:
    """The operating point a one-shot head routes by when a request asks no cap, or None (its plain
    route): the shipped description's (the point `train` chose and printed) when there is one, else the
    budget calibration's default; None where it routes by λ and the calibration (the cost model) is
    missing or the head predicts no quality. What the `Router` serves, `evaluate` reports and the
    contest scores."""
    point = shipped.operating_point if shipped is not None and shipped.kind == "one-shot" else \
        None if calibration is None else calibration.default
    if point is None:
        return None
    by_lambda = point.kind == "lambda" or any(v is not None for v in point.per_domain.values())
    if by_lambda and (calibration is None or not hasattr(head, "predict_quality")):
        return None
    return point


def point_problem(point: DefaultPoint | None, checkpoint) -> str:
    """Why `point` cannot route `checkpoint`'s requests (one line), or "": prompt clusters that read
    another number of feature columns than the checkpoint's (files copied from another run)."""
    dim = checkpoint.manifest.feature_contract.dim
    if point is None or point.clusters is None or len(point.clusters.center) == dim:
        return ""
    return (f"checkpoint {checkpoint.path}: its default operating point's prompt clusters (policy.json / budget.json "
            f"beside it) read {len(point.clusters.center)} feature columns, and the checkpoint's features have {dim}: "
            "they were written for other features; train again, or delete the two files to serve the head's plain route")


def served_point_of(checkpoint, calibration=None):
    """(`serving_point`, the calibration it routes with) of a loaded checkpoint, from the files beside
    it (`calibration`: one drawn on other data, used when it holds a default point); CheckpointError
    (`point_problem`) when that point cannot route it."""
    from fugu_pipeline.route.budget import usable_calibration
    from fugu_pipeline.train.checkpoints import CheckpointError

    m = checkpoint.manifest
    if calibration is None or calibration.default is None:
        calibration = usable_calibration(checkpoint.path, m.content_hash, list(m.worker_ids))[0]
    shipped = read_shipped(checkpoint.path, m.content_hash)[0]
    point = serving_point(shipped, calibration, checkpoint.head)
    if problem := point_problem(point, checkpoint):
        raise CheckpointError(problem)
    return point, calibration


def checkpoint_tag(checkpoint_dir: str | Path) -> tuple[str, str]:
    """(`<method>/<content hash>`, content hash) of a saved checkpoint, read from its manifest."""
    manifest = json.loads((Path(checkpoint_dir) / "manifest.json").read_text(encoding="utf-8"))
    h = manifest.get("content_hash") or Path(checkpoint_dir).name
    return f"{manifest.get('method')}/{h}", h
