"""The cost cap: one model, one syntax, one validation and one test of "within the cap", for every
place a cost is capped (a one-step head's λ, a cascade's plan, the server's requests, the reports).

A cap is dollars per 1,000 requests (`usd_per_1k`) or a share of the strongest worker's expected
cost on the same rows (`share`), exactly one of them, and `margin_z`: where the cap is met by a mean
cost measured on validation rows (a one-step head's λ, `route/budget.py`), the mean plus `margin_z`
standard errors must be within it. Written the same way everywhere:

    --cap usd_per_1k=2.5          --cap share=0.3          --cap share=0.3,margin_z=1
    cap: {usd_per_1k: 2.5}        cap: share=0.3           (a YAML block, a cascade config)
    "fugu_budget": {"share": 0.3} "fugu_budget": "share=0.3"  (a request to `fugu-lite serve`)

Each value is a finite number: `usd_per_1k` in (0, 1e9], `share` in (0, 1000], `margin_z` in [0,
100]; anything else (`inf`, `nan`, a negative, a word) is refused in one line naming where it came
from (`CapError`). The files that stored a cap before (a cascade manifest's config, a report's
operating point) hold the same keys and load as they are.

"Within the cap" is `within_cap(cost, limit)`: cost ≤ limit × (1 + TOLERANCE). The tolerance is
relative, so it means the same for a cap in dollars per request, per 1,000 requests or a share: it
only absorbs float rounding (a mean summed in another order), never a real excess.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_MARGIN_Z = 1.645
TOLERANCE = 1e-9  # relative: float rounding of the same costs summed in another order, never a real excess
KEYS = ("usd_per_1k", "share", "margin_z")
SYNTAX = "usd_per_1k=<dollars per 1,000 requests> or share=<fraction of the strongest worker's cost>"


class CapError(ValueError):
    """A cap that cannot be used; the message names where it came from and what a cap looks like."""


def within_cap(cost: float, limit: float) -> bool:
    """Whether `cost` (a mean, a mean plus its margin, a share) is within `limit` of the same unit."""
    return cost <= limit * (1.0 + TOLERANCE)


def split_fields(text: str) -> dict[str, str]:
    """`usd_per_1k=2.5,margin_z=1` -> {"usd_per_1k": "2.5", "margin_z": "1"}; ValueError when it is
    not that shape."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key not in KEYS or key in fields or not value.strip():
            raise ValueError(f"give {SYNTAX}, optionally with ,margin_z=<standard errors>")
        fields[key] = value.strip()
    return fields


class CostCap(BaseModel):
    """A cost cap (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_1k: float | None = Field(None, gt=0, le=1e9, allow_inf_nan=False,
                                     description="expected cost in USD per 1,000 requests")
    share: float | None = Field(None, gt=0, le=1000, allow_inf_nan=False,
                                description="expected cost as a share of the strongest worker's, e.g. 0.3")
    margin_z: float = Field(DEFAULT_MARGIN_Z, ge=0, le=100, allow_inf_nan=False,
                            description="where the cap is met on validation: the mean plus this many standard errors")

    @model_validator(mode="before")
    @classmethod
    def _spelled(cls, value):
        """The command-line form (`share=0.3`) wherever a cap is read: a YAML value, a request field."""
        return split_fields(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one(self) -> "CostCap":
        if (self.usd_per_1k is None) == (self.share is None):
            raise ValueError("give exactly one of usd_per_1k (USD per 1,000 requests) and share (of the strongest "
                             "worker's cost, e.g. 0.3)")
        return self

    @classmethod
    def parse(cls, text: str, where: str = "--cap") -> "CostCap":
        """The cap `text` (`usd_per_1k=2.5`, `share=0.3`, `share=0.3,margin_z=1`) or CapError in one
        line naming `where` (the flag or field it came from)."""
        try:
            return cls.model_validate(split_fields(text))
        except ValidationError as exc:
            raise CapError(f"{where} {text}: {cap_problem(exc)}; e.g. usd_per_1k=2.5 or share=0.3") from None
        except ValueError as exc:
            raise CapError(f"{where} {text[:80]}: {exc}") from None

    def usd_per_request(self, strongest_cost: float) -> float:
        """The cap in USD per request, given the strongest worker's expected cost per request."""
        return self.usd_per_1k / 1000.0 if self.usd_per_1k is not None else self.share * strongest_cost

    def spelled(self) -> str:
        """The cap as the flags take it: `usd_per_1k=2.5`, `share=0.3` (and `,margin_z=` when not the default)."""
        main = f"usd_per_1k={self.usd_per_1k:g}" if self.usd_per_1k is not None else f"share={self.share:g}"
        return main + ("" if self.margin_z == DEFAULT_MARGIN_Z else f",margin_z={self.margin_z:g}")

    def amount(self) -> str:
        """`$2.5 per 1,000 requests`, `30% of the strongest worker's cost`."""
        return f"${self.usd_per_1k:g} per 1,000 requests" if self.usd_per_1k is not None else \
            f"{self.share:.0%} of the strongest worker's cost"

    def describe(self) -> str:
        return f"cap {self.amount()} (margin {self.margin_z:g} SE)"


def cap_problem(exc: ValidationError) -> str:
    """A CostCap ValidationError as `field: what is wrong` (the first problem)."""
    e = exc.errors(include_url=False)[0]
    field = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "finite_number":
        msg = f"must be a finite number, got {e['input']}"
    return f"{field}: {msg}" if field else msg
