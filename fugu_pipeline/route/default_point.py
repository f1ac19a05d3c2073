"""The default operating point as the budget calibration saves it (`budget.json`'s `default`) and
the `Router` routes by it when a request states no cap. How a one-shot head's point is chosen (the
cheapest λ-routing not significantly below always the strongest worker, out of fold) is
`policies/oneshot/default_point.py`."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
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
    # a point per domain (`policies/oneshot/default_point.py`): domain -> its λ, or None for always the
    # strongest worker there; the domains not named (too few rows, unseen, none) take `kind`/`lam`
    per_domain: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)] | None] = Field(default_factory=dict)

    def routing(self, lam: float | None) -> str:
        """How a request is routed at λ `lam` (None: always the strongest worker)."""
        return f"λ = {lam:.4g}" if lam is not None else f"always {self.strongest_worker}"

    def pooled(self) -> str:
        """How a request of a domain without a point of its own is routed."""
        return self.routing(self.lam if self.kind == "lambda" else None)

    def per_domain_text(self) -> str:
        """`per domain (code: λ = 0.1; mc: always c; other domains: λ = 0.02)`; "" without points per domain."""
        if not self.per_domain:
            return ""
        per = "; ".join(f"{d}: {self.routing(v)}" for d, v in sorted(self.per_domain.items()))
        return f"per domain ({per}; other domains: {self.pooled()})"

    def describe(self) -> str:
        per = self.per_domain_text()
        return f"the default operating point, {per}" if per else f"the default operating point ({self.pooled()})"

    def lambdas(self, domains, n: int) -> np.ndarray:
        """Each request's λ (NaN: always the strongest worker), by its domain."""
        pooled = float(self.lam) if self.kind == "lambda" and self.lam is not None else np.nan
        out = np.full(n, pooled)
        if self.per_domain and domains is not None:
            for k, d in enumerate(domains):
                if d is not None and d in self.per_domain:
                    v = self.per_domain[d]
                    out[k] = np.nan if v is None else float(v)
        return out
