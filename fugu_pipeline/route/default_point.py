"""The default operating point as the budget calibration saves it (`budget.json`'s `default`) and
the `Router` routes by it when a request states no cap. How a one-shot head's point is chosen (the
cheapest λ-routing not significantly below always the strongest worker, out of fold) is
`policies/oneshot/default_point.py`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MARGIN = 0.005
# the low end of a cheaper policy's 95% interval against the strongest may reach this far below 0 and
# no further (`train.selection.cheapest_not_below`): the one-shot default and a cascade's `floor`
DEFAULT_FLOOR = 0.02


class DefaultPoint(BaseModel):
    """The operating point used when a request gives no cap."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["lambda", "strongest"]
    lam: float | None = Field(None, ge=0, allow_inf_nan=False)  # kind "lambda": the λ of q̂ − λ·ĉ/c_ref
    strongest_worker: str  # the most accurate worker on the non-test rows (kind "strongest": every request goes there)
    reason: str
    oof_accuracy: float
    oof_cost_usd: float  # mean expected $ per request, out of fold
    strongest_accuracy: float
    strongest_cost_usd: float
    difference: tuple[float, float, float]  # accuracy − the strongest's: mean, 95% interval
    margin: float = DEFAULT_MARGIN
    floor: float | None = None  # the non-inferiority bound it was chosen under (None: a point saved before it existed)
    n_rows: int = Field(ge=1)

    def describe(self) -> str:
        what = f"λ = {self.lam:.4g}" if self.kind == "lambda" else f"always {self.strongest_worker}"
        return f"the default operating point ({what})"
