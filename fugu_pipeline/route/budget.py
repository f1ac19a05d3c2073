"""Budget mode: route under a cost cap, with costs known before the call ("No leakage").

Expected cost: `route/expected_cost.py` (ĉ(x, w), fitted on TRAINING rows only).

Routing rule: argmax_w q̂(x, w) − λ · ĉ(x, w) / c_ref, with q̂ the head's predicted quality in
[0, 1] and c_ref the mean expected cost of the reference worker (the one with the best training
quality: "the strongest model") on training rows.

Choosing λ for a cap (`BudgetCalibration`, computed on rows no held-out (test) row is among): the
curve over the λ grid records each λ's mean expected cost per request and its standard error on
those rows; for a cap (USD per 1,000 requests, or a share of the reference worker's expected cost
on the same rows) the smallest λ with mean + z·SE <= cap is chosen. A head fitted on train only has
its curve drawn on the validation rows with its own predictions. A head refitted on train + val
(what `fugu-lite train` saves) has it drawn on every non-test row with its out-of-fold predictions
(a fair quality; the rows the out-of-fold choice of a cap's λ it is scored at is made on, fold by
fold, and five times validation's on an 80/20 split, so the margin of z·SE costs less of the cap);
each λ's cost is then the higher of those routes' and the saved head's own routes' on the same
rows, so the head that is served keeps within the cap too (with the fold models' cost alone, a
per-domain head served at 2x a cap it "met"). z (the safety margin in standard errors) defaults to
1.645: on dcrouter a 30% cap chosen on validation without it came out at 30.7% on test. The
calibration is a small JSON file beside the checkpoint (`budget.json`), so `route` and `serve`
apply a cap without the data.

Heads: any head with `predict_quality(features[, domains]) -> (N, W)` in [0, 1]. A head without
one (a softmax policy scores workers; it has no quality to trade against cost) is refused with
`BudgetError`. numpy only; torch is touched only when the head is a torch module.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fugu_pipeline.cost_cap import DEFAULT_MARGIN_Z, CostCap, within_cap  # noqa: F401 (DEFAULT_MARGIN_Z: this module's API too)
from fugu_pipeline.route.default_point import DefaultPoint
from fugu_pipeline.route.expected_cost import ALL, BudgetError, ExpectedCost, fit_expected_cost  # noqa: F401 (this module's API too)
from fugu_pipeline.route.follow import CapFollower, curve_index

CALIBRATION_FILE = "budget.json"
LAMBDAS = tuple([0.0] + np.geomspace(1e-3, 100.0, 161).tolist())


# --------------------------------------------------------------------------- what the user asks

Budget = CostCap  # the cap (fugu_pipeline/cost_cap.py), under the name `route_batch(budget=...)` has always taken


# --------------------------------------------------------------------------- quality


def require_quality_head(head, kind: str = ""):
    """The head's `predict_quality`, or BudgetError saying why a head without one cannot budget."""
    fn = getattr(head, "predict_quality", None)
    if fn is None:
        raise BudgetError(
            f"head kind {kind or type(head).__name__!r} has no quality estimate (predict_quality): it scores workers "
            "as a policy, so there is no predicted quality to trade against cost. Budget mode needs a head that "
            "predicts quality (train-sft with `head: quality` in the config, or any head exposing predict_quality)")
    return fn


def quality_of(head, features: np.ndarray, domains: list[str] | None = None, *, kind: str = "") -> np.ndarray:
    """The head's predicted quality (N, W) in [0, 1], float64. Heads written as torch modules get a
    tensor, others the numpy array; `domains` is passed to heads whose `predict_quality` takes it."""
    fn = require_quality_head(head, kind)
    x = np.ascontiguousarray(features, dtype=np.float32)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    args = (x, list(domains)) if len(params) >= 2 and domains is not None else (x,)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(head, torch.nn.Module):
        with torch.inference_mode():
            q = fn(torch.from_numpy(x), *args[1:])
        q = q.float().cpu().numpy()
    else:
        q = fn(*args)
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 2 or q.shape[0] != len(x):
        raise BudgetError(f"predict_quality returned shape {q.shape}, expected ({len(x)}, workers)")
    if not np.isfinite(q).all() or q.min() < -1e-6 or q.max() > 1 + 1e-6:
        raise BudgetError("predict_quality must return finite values in [0, 1]")
    return np.clip(q, 0.0, 1.0)


def budget_scores(q_hat: np.ndarray, c_hat: np.ndarray, lam: float, c_ref: float) -> np.ndarray:
    return q_hat - lam * c_hat / (c_ref if c_ref > 0 else 1.0)


# --------------------------------------------------------------------------- calibration


class CurvePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lam: float = Field(ge=0, allow_inf_nan=False)
    cost_usd: float = Field(ge=0, allow_inf_nan=False)  # mean expected cost per request of the routes on validation
    cost_se: float = Field(ge=0, allow_inf_nan=False)
    share: float = Field(ge=0, allow_inf_nan=False)  # that mean over the reference worker's mean expected cost on the same rows
    share_se: float = Field(ge=0, allow_inf_nan=False)
    quality: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)  # validation quality of the routes (the rows' labels: validation is for choosing)
    cost_from: str = "head"  # "head": the served head's routes; "out_of_fold": the fold models' (the costlier of the two)


class OperatingPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budget: Budget
    lam: float
    met_on_validation: bool
    val_cost_usd_per_1k: float
    val_share: float
    val_quality: float | None = None
    note: str = ""


class BudgetCalibration(BaseModel):
    """What `route` and `serve` need to honour a cap, computed once on validation rows."""

    model_config = ConfigDict(extra="forbid")

    format_version: Literal[1] = 1
    checkpoint: str = ""  # the checkpoint's content hash
    data_version: str = ""
    worker_ids: list[str]
    reference_worker: str
    reference_cost_usd: float = Field(ge=0, allow_inf_nan=False)  # c_ref: mean expected cost of the reference worker on training rows
    cost_model: ExpectedCost
    n_val: int = Field(ge=1)  # the rows the curve is drawn on (`curve_rows`)
    val_reference_cost_usd: float = Field(ge=0, allow_inf_nan=False)  # its mean expected cost on those rows (the share's base)
    # which rows: "validation" (a head fitted on train only: its own predictions) or "non-test" (a head
    # refitted on train + val: every non-test row, with its out-of-fold predictions)
    curve_rows: Literal["validation", "non-test"] = "validation"
    curve: list[CurvePoint] = Field(min_length=1)
    reference_note: str = ""  # why the reference is not the strongest worker (that one costs nothing)
    default: DefaultPoint | None = None  # the operating point with no cap asked (route/default_point.py)

    @model_validator(mode="after")
    def _consistent(self) -> "BudgetCalibration":
        if self.reference_worker not in self.worker_ids:
            raise ValueError(f"reference_worker {self.reference_worker[:60]!r} is not among worker_ids")
        if self.cost_model.worker_ids != self.worker_ids:
            raise ValueError("cost_model.worker_ids differ from worker_ids")
        for a, b in zip(self.curve, self.curve[1:]):  # a larger λ never routes to a costlier worker
            if b.lam <= a.lam or b.cost_usd > a.cost_usd * (1 + 1e-9) + 1e-15:
                raise ValueError(f"curve is not a λ sweep: at λ={b.lam:g} after λ={a.lam:g} the λ must grow and the "
                                 "cost must not")
        return self

    def rows_text(self) -> str:
        """The rows the curve is drawn on, in words ("288 validation rows")."""
        return (f"{self.n_val} validation rows" if self.curve_rows == "validation" else
                f"{self.n_val} non-test rows (out of fold)")

    def choose(self, budget: Budget, *, strict: bool = True) -> OperatingPoint:
        """The smallest λ whose cost on the calibration's rows (+ margin) is within the cap. When no λ
        meets it: BudgetError naming the cap and the cheapest cost those rows allow (strict, what `route`,
        `serve` and `evaluate` do), or the cheapest point flagged `met_on_validation=False`."""
        got = smallest_within(self.curve, budget)
        if got is not None:
            p, met, note = got, True, ""
        else:
            p = min(self.curve, key=lambda p: need(p, budget))
            met = False
            need_usd = (p.cost_usd + budget.margin_z * p.cost_se) * 1000
            need_share = p.share + budget.margin_z * p.share_se
            field = "budget usd_per_1k" if budget.usd_per_1k is not None else "budget share"
            asked = f"{budget.usd_per_1k:g}" if budget.usd_per_1k is not None else f"{budget.share:g}"
            least = (f"${need_usd:.4g} per 1,000 requests" if budget.usd_per_1k is not None else
                     f"a share of {need_share:.4g} ({need_share:.1%} of {self.reference_worker}'s cost)")
            note = (f"{field} {asked}: no operating point meets this cap on the calibration's {self.rows_text()}; the "
                    f"cheapest routing costs ${p.cost_usd * 1000:.4g} per 1,000 requests ({p.share:.1%} of "
                    f"{self.reference_worker}'s cost), {least} with the margin of {budget.margin_z:g} standard "
                    f"errors. Raise the cap to at least {least}, or lower the margin (--budget-margin-z / margin_z)")
            if strict:
                raise BudgetError(note)
        return OperatingPoint(budget=budget, lam=p.lam, met_on_validation=met, val_cost_usd_per_1k=p.cost_usd * 1000,
                              val_share=p.share, val_quality=p.quality, note=note)

    def cap_usd(self, budget: Budget) -> float:
        """The cap in USD per request: a share is of the reference worker's mean expected cost on the
        curve's rows (the share's base, as `choose` reads it)."""
        return budget.usd_per_request(self.val_reference_cost_usd or self.reference_cost_usd or 1.0)

    def curve_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return curve_arrays(self.curve)

    def scores(self, q_hat: np.ndarray, prompts: list[str], domains: list[str] | None, lam: float) -> np.ndarray:
        return budget_scores(q_hat, self.cost_model.predict(prompts, domains), lam, self.reference_cost_usd)

    def save(self, checkpoint_dir: str | Path) -> Path:
        from fugu_pipeline.files import atomic_write

        return atomic_write(Path(checkpoint_dir) / CALIBRATION_FILE, json.dumps(self.model_dump(mode="json"), indent=1))


def need(p: CurvePoint, budget: Budget) -> float:
    """A curve point's cost plus the cap's margin of standard errors, in the cap's unit."""
    if budget.usd_per_1k is not None:
        return (p.cost_usd + budget.margin_z * p.cost_se) * 1000
    return p.share + budget.margin_z * p.share_se


def smallest_within(curve: list[CurvePoint], budget: Budget) -> CurvePoint | None:
    """The rule a cap's λ is chosen by: the smallest λ whose cost plus the margin is within the cap."""
    limit = budget.usd_per_1k if budget.usd_per_1k is not None else budget.share
    ok = [p for p in curve if within_cap(need(p, budget), limit)]
    return min(ok, key=lambda p: p.lam) if ok else None


def curve_arrays(curve: list[CurvePoint]) -> tuple[np.ndarray, np.ndarray]:
    """(each λ of a curve, its mean expected cost), what a cap that follows the spend picks from."""
    return (np.array([p.lam for p in curve], dtype=np.float64), np.array([p.cost_usd for p in curve], dtype=np.float64))


def follow_routes(q_hat: np.ndarray, c_hat: np.ndarray, c_ref: float, curve_of, follower: CapFollower,
                  order=None, mask: np.ndarray | None = None,
                  actual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows routed under a cap that follows the spend (`route/follow.py`), one at a time in `order`
    (default: as given): row k at the smallest λ of its curve (`curve_of(k)`: the curve's λs and
    mean expected costs) within the follower's effective cap, then its route (the best allowed
    worker, `mask`) counted: its expected cost, settled to `actual` (N, W: what each worker's reply
    to the row cost, recorded rows) where that is finite. (scores (N, W), each row's λ, each row's
    effective cap)."""
    n = len(q_hat)
    if order is not None and sorted(order) != list(range(n)):
        raise ValueError(f"the order must list each of the {n} rows once")
    if actual is not None:  # a cell with no recorded cost counts its expected cost
        actual = np.where(np.isfinite(actual), actual, c_hat)
    scores, lam, eff = np.empty_like(q_hat, dtype=np.float64), np.zeros(n), np.zeros(n)
    for k in range(n) if order is None else order:
        lams, costs = curve_of(k)
        eff[k] = follower.effective()
        lam[k] = lams[curve_index(costs, eff[k])]
        scores[k] = budget_scores(q_hat[k], c_hat[k], lam[k], c_ref)
        best = int(np.argmax(scores[k] if mask is None else np.where(mask, scores[k], -np.inf)))
        follower.record(float((c_hat if actual is None else actual)[k, best]))  # settled at once: the reply is recorded
    return scores, lam, eff


def cap_route_oof(q_oof: np.ndarray, c_hat: np.ndarray, c_ref: float, ref: int, folds: np.ndarray,
                  budgets: list[Budget], order: np.ndarray, lambdas=LAMBDAS,
                  actual: np.ndarray | None = None) -> list[np.ndarray | None]:
    """Per budget, each row's route as a head serving it routes out of fold: the rows in `order`
    (`follow.traffic_order`) through one follower of the cap (`follow_routes`, settled to `actual`,
    the rows' recorded cost per worker, where given), each row at the λ of the curve drawn on the
    other folds' rows. `q_oof` out-of-fold quality predictions, `c_hat` the expected cost model's
    (N, W), `ref` the reference worker a share is of (its mean expected cost on these rows). None
    for a budget some fold's other rows do not keep with its margin at any λ (serving refuses such a
    cap). Each fold's curve is drawn once for every budget."""
    curves = {}
    for f in np.unique(folds):
        tr = folds != f
        curves[f] = route_curve(q_oof[tr], c_hat[tr], c_ref, ref, lambdas=lambdas) if tr.sum() > 1 else []
    arrays = {f: curve_arrays(c) for f, c in curves.items()}
    base = float(c_hat[:, ref].mean()) or c_ref or 1.0  # the share's base, as `route_curve` draws it
    routes: list[np.ndarray | None] = []
    for budget in budgets:
        if any(smallest_within(c, budget) is None for c in curves.values()):
            routes.append(None)
            continue
        scores, _, _ = follow_routes(q_oof, c_hat, c_ref, lambda k: arrays[folds[k]],
                                     CapFollower(budget.usd_per_request(base)), order, actual=actual)
        routes.append(np.argmax(scores, axis=1))
    return routes


def redraw_hint(checkpoint_dir: str | Path) -> str:
    return (f"draw it again with `fugu-lite evaluate --checkpoint {checkpoint_dir} --data <the training data>`, which "
            "chooses λ for a cap on its validation split")


def load_calibration(checkpoint_dir: str | Path) -> BudgetCalibration | None:
    """The calibration beside a checkpoint; None when there is none; BudgetError (naming the file
    and what to do) when it cannot be read or holds values no calibration can have."""
    path = Path(checkpoint_dir) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        return BudgetCalibration.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        if isinstance(exc, ValidationError):
            e = exc.errors()[0]
            where = ".".join(str(x) for x in e["loc"])
            why = "not valid JSON" if e["type"] == "json_invalid" else \
                (f"{where}: " if where else "") + e["msg"].removeprefix("Value error, ")
        else:
            why = str(exc)
        raise BudgetError(f"{path} cannot be used ({why}); {redraw_hint(checkpoint_dir)}") from None


def usable_calibration(checkpoint_dir: str | Path, content_hash: str,
                       worker_ids: list[str]) -> tuple[BudgetCalibration | None, str]:
    """(the calibration beside a checkpoint, "") when it can serve these weights, else (None, why not)."""
    try:
        cal = load_calibration(checkpoint_dir)
    except BudgetError as exc:
        return None, str(exc)
    path = Path(checkpoint_dir) / CALIBRATION_FILE
    if cal is None:
        return None, (f"no budget calibration beside {checkpoint_dir} ({CALIBRATION_FILE}): run `fugu-lite evaluate "
                      f"--checkpoint {checkpoint_dir} --data <the training data>`, which chooses λ for a cap on its "
                      "validation split (training data that records no cost per call has none: there is nothing to "
                      "budget)")
    if not cal.checkpoint:  # every calibration this code writes names its checkpoint
        return None, (f"{path} names no checkpoint (its 'checkpoint' field is empty), so it cannot be told apart from "
                      f"another head's curve over the same workers; {redraw_hint(checkpoint_dir)}")
    if cal.checkpoint != content_hash:
        return None, (f"{path} was drawn for checkpoint {cal.checkpoint[:40]}, not this one ({content_hash}); "
                      f"{redraw_hint(checkpoint_dir)}")
    if list(cal.worker_ids) != list(worker_ids):
        return None, (f"{path} is for workers {cal.worker_ids[:8]}, and this checkpoint routes among {worker_ids[:8]}; "
                      f"{redraw_hint(checkpoint_dir)}")
    return cal, ""


REFINE_SHARE = 0.02  # the curve is refined between two λs whose shares differ by more than this
REFINE_POINTS = 400  # at most this many λs added by refining
REFINE_FLOOR = 1e-6  # no λ below this is added (a jump at λ → 0 is a tie in predicted quality, which no λ splits)


def route_curve(q_hat: np.ndarray, c_hat: np.ndarray, c_ref: float, ref: int,
                quality: np.ndarray | None = None, lambdas=LAMBDAS, *, refine: bool = True) -> list[CurvePoint]:
    """Each λ's mean expected cost (and SE), its share of the reference's mean expected cost, and
    (where labels are given: validation) the routes' mean quality. `refine`: where two neighbouring
    λs of the grid differ by more than `REFINE_SHARE` of the reference's cost (predicted gains close
    together: many rows change worker at once), λs are added between them (bisection, up to
    `REFINE_POINTS`), so a cap between them is met close to it, not at the next grid point's cost."""
    n = len(q_hat)
    base = float(c_hat[:, ref].mean()) or c_ref or 1.0  # a share of $0 does not exist: of its training mean

    def point(lam: float) -> CurvePoint:
        r = np.argmax(budget_scores(q_hat, c_hat, lam, c_ref), axis=1)
        c = c_hat[np.arange(n), r]
        se = float(c.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        return CurvePoint(lam=float(lam), cost_usd=float(c.mean()), cost_se=se, share=float(c.mean()) / base,
                          share_se=se / base, quality=None if quality is None else float(quality[np.arange(n), r].mean()))

    out = [point(lam) for lam in lambdas]
    added, dead = 0, set()
    while refine and added < REFINE_POINTS:
        gaps = [k for k in range(len(out) - 1) if out[k].share - out[k + 1].share > REFINE_SHARE
                and out[k + 1].lam > REFINE_FLOOR and out[k + 1].lam - out[k].lam > 1e-6 * out[k + 1].lam
                and out[k].lam not in dead]
        if not gaps:
            break
        for k in reversed(gaps[: REFINE_POINTS - added]):
            lo, hi = out[k].lam, out[k + 1].lam
            mid = point(max(math.sqrt(lo * hi) if lo > 0 else hi / 2, REFINE_FLOOR))
            added += 1
            if mid.lam < hi and out[k + 1].cost_usd <= mid.cost_usd <= out[k].cost_usd:  # between them, not noise
                out.insert(k + 1, mid)
            else:
                dead.add(lo)
    return out


def costlier(honest: list[CurvePoint], served: list[CurvePoint]) -> list[CurvePoint]:
    """Per λ, the honest curve's quality with the higher of the two costs. `honest` routes with
    out-of-fold predictions (a fair quality), `served` with the saved head's own predictions on the
    same rows (what it will route: a head refitted on train + val can be more or less willing to
    pay than its fold models). A λ is chosen only where both keep within the cap."""
    out = []
    for h, v in zip(honest, served):
        out.append(h if h.share >= v.share else h.model_copy(update={
            "cost_usd": v.cost_usd, "cost_se": v.cost_se, "share": v.share, "share_se": v.share_se, "cost_from": "head"}))
    return out


def calibrate(q_hat_val: np.ndarray, val_prompts: list[str], val_domains: list[str], val_quality: np.ndarray | None,
              train_prompts: list[str], train_domains: list[str], train_cost: np.ndarray, train_quality: np.ndarray,
              worker_ids: list[str], *, checkpoint: str = "", data_version: str = "",
              q_served_val: np.ndarray | None = None, curve_rows: str = "validation") -> BudgetCalibration:
    """Fit the expected cost on training rows, name the reference (best training quality), and
    record the λ curve on the `val_*` rows (`curve_rows`: the validation rows, or every non-test
    row). No held-out (test) row enters. `q_served_val`: the saved head's own predictions on those
    rows when `q_hat_val` are out-of-fold ones; each λ's cost is then the higher of the two
    routings' (`costlier`)."""
    require_validation_rows(len(val_prompts))
    model = fit_expected_cost(train_prompts, train_domains, train_cost, worker_ids)
    c_train = model.predict(train_prompts, train_domains).mean(axis=0)
    if not (c_train > 0).any():
        raise BudgetError("the training rows record no cost for any worker, so there is no expected cost to budget; "
                          "train on rows that record what each call cost")
    # the reference: the best training quality among workers that cost anything (a share of $0 means nothing)
    quality = np.nanmean(np.asarray(train_quality, dtype=np.float64), axis=0)
    paid = np.flatnonzero(c_train > 0)
    strongest, ref = int(np.argmax(quality)), int(paid[np.argmax(quality[paid])])
    note = "" if ref == strongest else (
        f"{worker_ids[strongest]} (the best training quality) costs nothing on the training rows, so a share is of "
        f"{worker_ids[ref]}'s cost, the strongest worker that costs anything")
    c_ref = float(c_train[ref])
    c_val = model.predict(val_prompts, val_domains)
    curve = route_curve(q_hat_val, c_val, c_ref, ref, val_quality)
    if q_served_val is not None:  # the served head's routes at the same λs
        oof = [p.model_copy(update={"cost_from": "out_of_fold"}) for p in curve]
        curve = costlier(oof, route_curve(q_served_val, c_val, c_ref, ref, val_quality, [p.lam for p in curve],
                                          refine=False))
    return BudgetCalibration(checkpoint=checkpoint, data_version=data_version, worker_ids=list(worker_ids),
                             reference_worker=worker_ids[ref], reference_cost_usd=c_ref, cost_model=model,
                             n_val=len(val_prompts), val_reference_cost_usd=float(c_val[:, ref].mean()), curve=curve,
                             reference_note=note, curve_rows=curve_rows)


def require_validation_rows(n: int) -> None:
    if n < 2:
        raise BudgetError(f"the validation split has {n} row{'' if n == 1 else 's'}, and a cap's λ is chosen on "
                          "validation with a margin of standard errors of its cost, which needs 2 rows or more; give "
                          "the data more validation rows (a larger --val-fraction on import, or rows with split 'val')")


def calibrate_checkpoint(checkpoint, data, q_val: np.ndarray | None = None, *,
                         q_oof: np.ndarray | None = None) -> BudgetCalibration:
    """`calibrate` for a loaded checkpoint over `RoutingData` (train rows fit the cost, val rows the λ
    curve). `q_val`: the head's quality on the validation rows when its own predictions there would
    be in-sample (a head refitted on train + val: its out-of-fold predictions); default: the head's.
    `q_oof`: such a head's out-of-fold quality on every non-test row (in order), which the curve is
    then drawn on instead (the rows the out-of-fold choice of a cap's λ is scored on)."""
    if data.cost_usd is None or not np.any(np.nan_to_num(data.cost_usd) > 0):  # an import without costs holds zeros
        raise BudgetError("this data records no cost per call, so there is nothing to budget; import it with its costs "
                          "(import table --cost-column or --prices, import long --cost-column, dcrouter's default_llm.json) "
                          "or collect it with workers that report cost")
    if data.quality is None:
        raise BudgetError("budget mode needs per-worker quality in the data (the head predicts it)")
    if list(checkpoint.manifest.worker_ids) != list(data.worker_ids):
        raise BudgetError(f"checkpoint workers {checkpoint.manifest.worker_ids} differ from the data's {data.worker_ids}")
    train = data.split("train")
    require_quality_head(checkpoint.head, checkpoint.manifest.head_kind)
    if q_oof is not None:
        rows = np.flatnonzero(data.splits != "test")
        val, q_val, where = data.subset(rows), q_oof, "non-test"
    else:
        val, where = data.split("val"), "validation"
    require_validation_rows(len(val.prompts))
    served = quality_of(checkpoint.head, val.features, val.domains, kind=checkpoint.manifest.head_kind)
    if q_val is None:
        q_val, served = served, None
    elif np.shape(q_val) != (len(val.prompts), len(data.worker_ids)) or not np.isfinite(q_val).all():
        raise BudgetError(f"{where} quality has shape {np.shape(q_val)}, expected {(len(val.prompts), len(data.worker_ids))}")
    return calibrate(np.clip(np.asarray(q_val, dtype=np.float64), 0.0, 1.0), val.prompts, val.domains, val.quality,
                     train.prompts, train.domains, train.cost_usd, train.quality, data.worker_ids,
                     checkpoint=checkpoint.manifest.content_hash, data_version=data.data_version, q_served_val=served,
                     curve_rows=where)


def calibrate_beside(path: str | Path, data, log=lambda m: print(m, file=sys.stderr), q_val=None, *,
                     q_oof=None, strict: bool = False):
    """The budget calibration (the λ curve) of a checkpoint over `data`, when the head
    predicts quality and the data records cost; None otherwise (the reason logged). It is written
    beside the checkpoint (`budget.json`, what `route` and `serve` read) when `data` is the data the
    checkpoint was trained on, or when there is none yet (or it cannot be used); other data (evaluating elsewhere) gets a
    calibration for its report only, and the training one is kept. A `budget.json` already drawn
    on this data for this checkpoint is used as it is (`fugu-lite train` draws it on out-of-fold
    predictions, `q_oof` over every non-test row or `q_val` over the validation rows, which the
    refitted head cannot reproduce). The command line and the
    training assets both call it after saving a checkpoint. `strict` (a cap was asked for): BudgetError
    with the reason instead of None."""
    from fugu_pipeline.train.checkpoints import load_checkpoint

    ckpt = load_checkpoint(path)
    target = Path(path) / CALIBRATION_FILE
    kept, problem = usable_calibration(path, ckpt.manifest.content_hash, ckpt.manifest.worker_ids)
    if target.exists() and kept is None:  # unreadable, or for other weights: drawn again below
        log(f"budget calibration: {problem.split('; draw it again')[0]}; drawing it again")
    if q_val is None and q_oof is None and kept is not None:
        if kept.checkpoint == ckpt.manifest.content_hash and kept.data_version == data.data_version:
            log(f"budget calibration: {target} (drawn on this data's {kept.rows_text()})")
            return kept
    try:
        cal = calibrate_checkpoint(ckpt, data, q_val, q_oof=q_oof)
    except BudgetError as exc:
        if strict:
            raise
        log(f"budget mode: not available for this checkpoint ({str(exc).split(':')[0]})")
        return None
    if ckpt.manifest.data_version == data.data_version or kept is None:
        cal.save(path)
        log(f"budget calibration: {target} (reference {cal.reference_worker}, {cal.rows_text()})")
    else:
        log(f"budget calibration: on this data's {cal.rows_text()}, for this report only ({target} keeps "
            "the one from the training data)")
    return cal
