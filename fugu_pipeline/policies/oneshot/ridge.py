"""`ridge`: closed-form multi-output ridge regression from standardised features (+ the standardised
one-hot of the domain) to every worker's quality and utility.

It reads a column range of the feature vector: all of it, only the embedding, or only the
lexical statistics block (`features/lexical.py`, when the contract has `lexical: true`). Columns
are standardised with the training rows' mean and spread (stored as buffers), so the penalty
`alpha` treats every column alike. An unknown or unseen domain gets the one-hot's training mean,
i.e. a zero standardised block: the prediction of an average domain.

Fitting is one eigendecomposition of Zᵀ Z per fit, after which every alpha of a grid costs a
matrix product (`RidgePath`), so a whole grid over 5 folds takes well under a second on the
public routing data sets. In the study, ridge on the lexical statistics ranked GSM8K prompts as well as
the embedding did, and helped inside ensembles on GSM8K and MMLU (README, "Heads and selection").
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from fugu_pipeline.train.head_base import register
from fugu_pipeline.policies.oneshot.predictors import QualityPredictor, column_scale

Inputs = Literal["all", "embedding", "lexical"]
DOMAIN_WEIGHT = 10.0


def column_range(inputs: str, dim: int, lexical_dim: int) -> tuple[int, int]:
    """[start, end) of the feature columns that `inputs` names, for vectors whose last `lexical_dim`
    columns are the lexical block (0: none)."""
    if inputs == "all":
        return 0, dim
    if inputs == "embedding":
        return 0, dim - lexical_dim
    if inputs == "lexical":
        if lexical_dim <= 0:
            raise ValueError("ridge inputs 'lexical' needs features with the lexical block (encoder setting lexical: true)")
        return dim - lexical_dim, dim
    raise ValueError(f"ridge inputs must be all, embedding or lexical, got {inputs!r}")


def _onehot(codes: np.ndarray, v: int) -> np.ndarray:
    oh = np.zeros((len(codes), v))
    known = codes >= 0
    oh[np.nonzero(known)[0], codes[known]] = 1.0
    return oh


class RidgePath:
    """The design of one fit, decomposed once: `solve(alpha)` gives the weights for any alpha (the
    bias is the targets' mean, `bias`, since every column is centred)."""

    def __init__(self, x: np.ndarray, codes: np.ndarray, n_domains: int, y: np.ndarray):
        x = np.asarray(x, np.float64)
        self.mean, self.scale = x.mean(0), column_scale(x)
        oh = _onehot(codes, n_domains)
        # the domain's columns are scaled up DOMAIN_WEIGHT-fold, so the penalty on them is alpha /
        # DOMAIN_WEIGHT²: the known domain is a reliable input the prediction leans on (a near-free
        # per-domain intercept), not one more column the embedding may stand in for
        self.dmean, self.dscale = oh.mean(0), column_scale(oh) / DOMAIN_WEIGHT
        z = np.concatenate([(x - self.mean) / self.scale, (oh - self.dmean) / self.dscale], axis=1)
        self.bias = y.mean(0)
        evals, self.evecs = np.linalg.eigh(z.T @ z)
        self.evals = np.clip(evals, 0.0, None)
        self.proj = self.evecs.T @ (z.T @ (y - self.bias))

    def solve(self, alpha: float) -> np.ndarray:
        return self.evecs @ (self.proj / (self.evals + alpha)[:, None])


@register
class RidgeHead(QualityPredictor):
    kind = "ridge"

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = (), alpha: float = 100.0,
                 col_start: int = 0, col_end: int | None = None, domain_onehot: bool = True):
        super().__init__(dim, n_workers, domains)
        col_end = dim if col_end is None else int(col_end)
        if not 0 <= col_start < col_end <= dim:
            raise ValueError(f"ridge columns [{col_start}, {col_end}) do not fit {dim}-dim features")
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        self.alpha, self.col_start, self.col_end = float(alpha), int(col_start), col_end
        self.domain_onehot = bool(domain_onehot)
        d, v = col_end - col_start, (len(self.domains) if self.domain_onehot else 0)
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("scale", torch.ones(d))
        self.register_buffer("domain_mean", torch.zeros(v))
        self.register_buffer("domain_scale", torch.ones(v))
        self.register_buffer("weight", torch.zeros(d + v, 2 * n_workers))  # quality then utility
        self.register_buffer("bias", torch.zeros(2 * n_workers))

    def _params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "col_start": self.col_start, "col_end": self.col_end, "domain_onehot": self.domain_onehot}

    @classmethod
    def fit(cls, features: np.ndarray, target: np.ndarray, utility: np.ndarray, domains: list[str], *,
            alpha: float = 100.0, inputs: Inputs = "all", lexical_dim: int = 0, domain_onehot: bool = True) -> "RidgeHead":
        return cls.from_path(*cls.path(features, target, utility, domains, inputs, lexical_dim, domain_onehot), alpha)

    @classmethod
    def path(cls, features, target, utility, domains, inputs: str = "all", lexical_dim: int = 0,
             domain_onehot: bool = True) -> tuple["RidgeHead", RidgePath]:
        """An unfitted head of the right shape and the decomposed design of these rows."""
        doms = [str(d) for d in domains]
        dim, w = features.shape[1], target.shape[1]
        start, end = column_range(inputs, dim, lexical_dim)
        head = cls(dim, w, sorted(set(doms)), 1.0, start, end, domain_onehot)
        codes = head.domain_codes(doms, len(doms)).numpy() if domain_onehot else np.full(len(doms), -1)
        y = np.concatenate([np.asarray(target, np.float64), np.asarray(utility, np.float64)], axis=1)
        return head, RidgePath(np.asarray(features)[:, start:end], codes, len(head.domains) if domain_onehot else 0, y)

    @classmethod
    def from_path(cls, template: "RidgeHead", rp: RidgePath, alpha: float) -> "RidgeHead":
        head = cls(template.dim, template.n_workers, template.domains, alpha, template.col_start, template.col_end,
                   template.domain_onehot)
        head.mean.copy_(torch.from_numpy(rp.mean))
        head.scale.copy_(torch.from_numpy(rp.scale))
        head.domain_mean.copy_(torch.from_numpy(rp.dmean))
        head.domain_scale.copy_(torch.from_numpy(rp.dscale))
        head.weight.copy_(torch.from_numpy(rp.solve(alpha)))
        head.bias.copy_(torch.from_numpy(rp.bias))
        return head.finalize()

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = (x.float()[:, self.col_start:self.col_end] - self.mean) / self.scale
        if self.domain_onehot and len(self.domains):
            oh = self.domain_mean.expand(len(z), -1).clone()
            known = codes >= 0
            rows = known.nonzero().squeeze(1)
            oh[rows] = 0.0
            oh[rows, codes[known]] = 1.0
            z = torch.cat([z, (oh - self.domain_mean) / self.domain_scale], dim=1)
        out = z @ self.weight + self.bias
        w = self.n_workers
        return out[:, :w].clamp(0.0, 1.0), out[:, w:]

    def table_problems(self) -> list[str]:
        p = []
        if not (self.scale > 0).all() or not (self.domain_scale > 0).all():
            p.append("scale and domain_scale must be > 0")
        if not torch.isfinite(self.weight).all() or not torch.isfinite(self.bias).all():
            p.append("weight and bias must be finite")
        return p
