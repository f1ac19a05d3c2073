"""The default operating point as the budget calibration saves it (`budget.json`'s `default`) and
the `Router` routes by it when a request states no cap. How a one-shot head's point is chosen (the
cheapest λ-routing not significantly below always the strongest worker, out of fold) is
`policies/oneshot/default_point.py`."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from fugu_pipeline.cost_cap import CostCap
from fugu_pipeline.train.groups import CLUSTER_PREFIX

DEFAULT_MARGIN = 0.005
# the low end of a cheaper policy's 95% interval against the strongest may reach this far below 0 and
# no further (`train.selection.cheapest_not_below`): the one-shot default and a cascade's `floor`
DEFAULT_FLOOR = 0.02


Finite = Annotated[float, Field(allow_inf_nan=False)]


class PointClusters(BaseModel):
    """The prompt clusters a default point per group routes by (`train/clusters.PromptClusters`, for an
    import without domains): each request's prompt features, standardised by `center` and `scale`,
    go to the cluster of the most similar centroid."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(min_length=2)
    center: list[Finite] = Field(min_length=1)
    scale: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(min_length=1)
    centroids: list[list[Finite]]
    silhouette: float | None = None
    null_silhouette: float | None = None
    examples: dict[str, str] = Field(default_factory=dict)
    _model: object = PrivateAttr(None)  # the numpy `train/clusters.PromptClusters` of these lists

    @model_validator(mode="after")
    def _consistent(self) -> "PointClusters":
        dim = len(self.center)
        if len(self.scale) != dim:
            raise ValueError(f"scale has {len(self.scale)} columns, center {dim}")
        if len(self.centroids) != len(self.names) or any(len(c) != dim for c in self.centroids):
            raise ValueError(f"centroids must be {len(self.names)} rows (one per name) of {dim} columns")
        if len(set(self.names)) != len(self.names) or not all(n.startswith(CLUSTER_PREFIX) for n in self.names):
            raise ValueError(f"names must be distinct and each start with {CLUSTER_PREFIX!r}")
        norms = np.linalg.norm(np.asarray(self.centroids, np.float64), axis=1)
        if np.abs(norms - 1).max() > 1e-3:
            raise ValueError("centroids must be unit rows (spherical k-means)")
        return self

    @classmethod
    def of(cls, c) -> "PointClusters":
        """From a fitted `train/clusters.PromptClusters`."""
        return cls(names=list(c.names), center=c.center.tolist(), scale=c.scale.tolist(), centroids=c.centroids.tolist(),
                   silhouette=float(c.silhouette), null_silhouette=float(c.null_silhouette), examples=dict(c.examples))

    def assign(self, features: np.ndarray) -> list[str]:
        """The cluster of each row of `features` (N, dim): the prompt features the head reads."""
        from fugu_pipeline.train.clusters import PromptClusters

        X = np.asarray(features, np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.center):
            raise ValueError(f"the default point's prompt clusters read {len(self.center)} feature columns; these "
                             f"prompts have {X.shape[-1] if X.ndim else 0}")
        if self._model is None:  # built once per loaded point: serving assigns every batch
            self._model = PromptClusters(np.asarray(self.center), np.asarray(self.scale), np.asarray(self.centroids),
                                         list(self.names))
        return [str(g) for g in self._model.assign(X)]


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
    # for an import without domains, `per_domain` is per prompt cluster: the clusters each request is put in
    clusters: PointClusters | None = None
    # a head shipped under the cap `train` was given: a request without a cap is routed as one asking
    # this cap, its λ following the spend (route/follow.py); `lam` is the cap's λ on the calibration
    cap: CostCap | None = None

    @model_validator(mode="after")
    def _groups_known(self) -> "DefaultPoint":
        if self.clusters is not None:
            unknown = sorted(set(self.per_domain) - set(self.clusters.names))
            if unknown or not self.per_domain:
                raise ValueError(f"per_domain must name prompt clusters of `clusters` ({unknown[:3]} are not)"
                                 if unknown else "a point with prompt clusters needs a λ per cluster (per_domain)")
        return self

    @property
    def by(self) -> str:
        """What the points are per: "domain" or "prompt cluster"."""
        return "prompt cluster" if self.clusters is not None else "domain"

    def group_keys(self, domains, features=None) -> list | None:
        """Each request's group (what `lambdas` reads): its domain, or the nearest prompt cluster of
        its prompt features (N, dim) for a point per prompt cluster."""
        if self.clusters is None:
            return None if domains is None else list(domains)
        if features is None:
            raise ValueError("this default point is per prompt cluster: the prompts' features are needed")
        return self.clusters.assign(features)

    def routing(self, lam: float | None) -> str:
        """How a request is routed at λ `lam` (None: always the strongest worker)."""
        return f"λ = {lam:.4g}" if lam is not None else f"always {self.strongest_worker}"

    def pooled(self) -> str:
        """How a request of a domain without a point of its own is routed."""
        if self.cap is not None:
            return f"the {self.cap.describe()} it was trained under, λ following the spend"
        return self.routing(self.lam if self.kind == "lambda" else None)

    def per_domain_text(self) -> str:
        """`per domain (code: λ = 0.1; mc: always c; other domains: λ = 0.02)` (or per prompt cluster);
        "" without points per group."""
        if not self.per_domain:
            return ""
        per = "; ".join(f"{d}: {self.routing(v)}" for d, v in sorted(self.per_domain.items()))
        return f"per {self.by} ({per}{self.others()})"

    def others(self) -> str:
        """`; other domains: λ = 0.02`: how the groups without a point of their own are routed ("" when
        every prompt cluster has one: every prompt falls in one of them)."""
        if self.clusters is not None and set(self.per_domain) == set(self.clusters.names):
            return ""
        return f"; other {self.by}s: {self.pooled()}"

    def describe(self) -> str:
        per = self.per_domain_text()
        return f"the default operating point, {per}" if per else f"the default operating point ({self.pooled()})"

    def lambdas(self, domains, n: int) -> np.ndarray:
        """Each request's λ (NaN: always the strongest worker), by its group (`group_keys`: its domain
        or prompt cluster)."""
        pooled = float(self.lam) if self.kind == "lambda" and self.lam is not None else np.nan
        out = np.full(n, pooled)
        if self.per_domain and domains is not None:
            for k, d in enumerate(domains):
                if d is not None and d in self.per_domain:
                    v = self.per_domain[d]
                    out[k] = np.nan if v is None else float(v)
        return out
