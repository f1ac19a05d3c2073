"""The candidate families of `fugu-lite train`: each expands its grid from `configs/train.yaml`,
predicts every grid point for held-out rows from a fit on other rows (`predict_grid`, the
building block of out-of-fold and leave-one-domain-out predictions), and fits the chosen point
on all the rows it may use (`fit`).

Predictions are (quality (n, W) or None, scores (n, W)); the scores route (argmax) and are the
predicted utility for the quality predictors. kNN computes the neighbours once per fold and
same-domain bonus, then reads every k, prior weight and temperature off them, exactly as
`KNNHead.predict` does (a test checks they agree).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fugu_pipeline.features.routing_data import RoutingData, carve_validation
from fugu_pipeline.policies.oneshot.configs import KNNGrid, MLPGrid, PriorGrid, RidgeGrid, SFTConfig, SFTGrid
from fugu_pipeline.policies.oneshot.predictors import (
    DomainPriorHead,
    KNNHead,
    MLPHead,
    QualityPredictor,
    neighbour_mean,
    topk_neighbours_each,
)
from fugu_pipeline.policies.oneshot.ridge import RidgeHead, column_range
from fugu_pipeline.train.selection import fold_ids

Preds = dict[str, tuple[np.ndarray | None, np.ndarray]]


@dataclass
class FitData:
    """The non-test rows as arrays: what every family fits and predicts on (row i = rows[i] of data)."""

    data: RoutingData
    rows: np.ndarray  # indices into data
    features: np.ndarray
    target: np.ndarray  # (n, W) in [0, 1]: the quality, or the utility rescaled when there is no quality
    utility: np.ndarray
    domains: np.ndarray  # str
    target_is_quality: bool

    @classmethod
    def from_data(cls, data: RoutingData, rows: np.ndarray) -> "FitData":
        u = data.utility[rows]
        if data.quality is not None:
            target, is_q = np.clip(data.quality[rows], 0.0, 1.0), True
        else:
            lo, hi = float(u.min()), float(u.max())
            target, is_q = (u - lo) / (hi - lo) if hi > lo else np.full_like(u, 0.5), False
        return cls(data=data, rows=np.asarray(rows), features=data.features[rows], target=target, utility=u,
                   domains=np.asarray(data.domains, dtype=str)[rows], target_is_quality=is_q)

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def lexical_dim(self) -> int:
        """Columns of the lexical block at the end of each vector (0 without it)."""
        return self.dim - self.data.contract.embedding_dim

    @property
    def cosine_dims(self) -> int | None:
        """What kNN's cosine reads: the embedding columns when the lexical block follows them."""
        return self.data.contract.embedding_dim if self.lexical_dim else None


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class Family:
    kind = ""
    member_ok = True  # its heads can join an ensemble

    def grid(self, fd: "FitData | None" = None) -> list[tuple[str, dict[str, Any]]]:
        """(name, params) of every grid point; `fd`: the rows it will fit (a grid may depend on their columns)."""
        raise NotImplementedError

    def predict_grid(self, fd: FitData, tr: np.ndarray, te: np.ndarray, domains) -> Preds:
        raise NotImplementedError

    def fit(self, fd: FitData, rows: np.ndarray, params: dict[str, Any]):
        raise NotImplementedError

    def parts(self, fd: FitData) -> list["Family"]:
        """The family as pieces of the same kind whose grids, in order, make up its grid and whose
        inputs differ (ridge on all columns, ridge on the lexical block): each piece's predictions
        can then be kept on their own (`reuse.py`)."""
        return [self]

    def reads(self, fd: FitData) -> list | None:
        """Everything `predict_grid` reads of `fd` besides the rows' split into folds (arrays and
        JSON-able values): equal values give equal predictions. None: not named (always refitted)."""
        return None

    def _identity(self) -> list:
        return [type(self).__name__, self.cfg.model_dump(mode="json"), getattr(self, "seed", None)]


def _both(head: QualityPredictor, x: np.ndarray, domains) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        q, u = head.predict_both(torch.from_numpy(np.ascontiguousarray(x, np.float32)), None if domains is None else list(domains))
    return q.numpy().astype(np.float64), u.numpy().astype(np.float64)


class PriorFamily(Family):
    kind = "domain_prior"

    def __init__(self, grid: PriorGrid):
        self.cfg = grid

    def grid(self, fd: FitData | None = None):
        return [(f"domain_prior m={_fmt(m)}", {"m": float(m)}) for m in self.cfg.m]

    def fit(self, fd, rows, params):
        return DomainPriorHead.fit(fd.dim, fd.target[rows], fd.utility[rows], fd.domains[rows].tolist(), **params)

    def predict_grid(self, fd, tr, te, domains):
        return {name: _both(self.fit(fd, tr, p), fd.features[te], domains) for name, p in self.grid()}

    def reads(self, fd):
        """Per-domain means of the targets: no feature column."""
        return self._identity() + [fd.target, fd.utility, fd.domains]


class KNNFamily(Family):
    kind = "knn"

    def __init__(self, grid: KNNGrid):
        self.cfg = grid

    def grid(self, fd: FitData | None = None):
        out = []
        for k, pw, b, t in itertools.product(self.cfg.k, self.cfg.prior_weight, self.cfg.same_domain_bonus, self.cfg.temperature):
            name = f"knn k={k} prior={_fmt(float(pw))} bonus={_fmt(float(b))}" + ("" if t is None else f" T={_fmt(float(t))}")
            out.append((name, {"k": int(k), "prior_weight": float(pw), "same_domain_bonus": float(b),
                               "temperature": None if t is None else float(t), "prior_m": float(self.cfg.prior_m)}))
        return out

    def fit(self, fd, rows, params):
        return KNNHead.fit(fd.features[rows], fd.target[rows], fd.utility[rows], fd.domains[rows].tolist(),
                           cosine_dims=fd.cosine_dims, **params)

    def predict_grid(self, fd, tr, te, domains):
        vocab = sorted(set(fd.domains[tr].tolist()))
        index = {d: i for i, d in enumerate(vocab)}
        cols = fd.cosine_dims or fd.dim
        bank = F.normalize(torch.from_numpy(fd.features[tr, :cols].astype(np.float32)), dim=-1)
        bank_codes = torch.tensor([index[d] for d in fd.domains[tr]], dtype=torch.long)
        codes = torch.full((len(te),), -1, dtype=torch.long) if domains is None else \
            torch.tensor([index.get(d, -1) for d in domains], dtype=torch.long)
        xn = F.normalize(torch.from_numpy(fd.features[te, :cols].astype(np.float32)), dim=-1)
        tq = torch.from_numpy(fd.target[tr].astype(np.float32))
        tu = torch.from_numpy(fd.utility[tr].astype(np.float32))
        prior = DomainPriorHead(fd.dim, tq.shape[1], vocab, self.cfg.prior_m)
        prior.fill(fd.target[tr], fd.utility[tr], fd.domains[tr])
        pq, pu = prior.predict(xn, codes)
        kmax = max(self.cfg.k)
        out: Preds = {}
        grid = self.grid()
        near = topk_neighbours_each(xn, codes, bank, bank_codes, kmax, [p["same_domain_bonus"] for _, p in grid])
        for name, p in grid:
            sims, idx = near[p["same_domain_bonus"]]
            k = min(p["k"], idx.shape[1])
            q = neighbour_mean(sims, idx, tq, k, p["temperature"])
            u = neighbour_mean(sims, idx, tu, k, p["temperature"])
            m = p["prior_weight"]
            if m > 0:
                q, u = (k * q + m * pq) / (k + m), (k * u + m * pu) / (k + m)
            out[name] = (q.numpy().astype(np.float64), u.numpy().astype(np.float64))
        return out

    def reads(self, fd):
        """The cosine's columns (the embedding without the lexical block) and the targets."""
        return self._identity() + [fd.features[:, : fd.cosine_dims or fd.dim], fd.target, fd.utility, fd.domains]


class RidgeFamily(Family):
    """Closed-form ridge: one decomposition per fold and column range, then every alpha is cheap."""

    kind = "ridge"

    def __init__(self, grid: RidgeGrid):
        self.cfg = grid

    def grid(self, fd: FitData | None = None):
        lex = 0 if fd is None else fd.lexical_dim
        out = []
        for inputs in dict.fromkeys(self.cfg.inputs):
            if inputs != "all" and not lex:
                continue  # no lexical block: 'lexical' does not apply and 'embedding' is 'all'
            for a in self.cfg.alpha:
                out.append((f"ridge {inputs} alpha={_fmt(float(a))}",
                            {"alpha": float(a), "inputs": inputs, "lexical_dim": lex, "domain_onehot": self.cfg.domain_onehot}))
        return out

    def fit(self, fd, rows, params):
        return RidgeHead.fit(fd.features[rows], fd.target[rows], fd.utility[rows], fd.domains[rows].tolist(), **params)

    def predict_grid(self, fd, tr, te, domains):
        out: Preds = {}
        paths: dict[str, tuple] = {}
        for name, p in self.grid(fd):
            if p["inputs"] not in paths:
                paths[p["inputs"]] = RidgeHead.path(fd.features[tr], fd.target[tr], fd.utility[tr], fd.domains[tr].tolist(),
                                                    p["inputs"], p["lexical_dim"], p["domain_onehot"])
            template, rp = paths[p["inputs"]]
            out[name] = _both(RidgeHead.from_path(template, rp, p["alpha"]), fd.features[te], domains)
        return out

    def parts(self, fd):
        inputs = list(dict.fromkeys(p["inputs"] for _, p in self.grid(fd)))
        if len(inputs) < 2:
            return [self]
        return [RidgeFamily(self.cfg.model_copy(update={"inputs": [i]})) for i in inputs]

    def reads(self, fd):
        """The columns of its inputs (one range per part), the targets, and the grid as resolved."""
        grid = self.grid(fd)
        ranges = sorted({column_range(p["inputs"], fd.dim, p["lexical_dim"]) for _, p in grid})
        return (self._identity() + [[[n, p] for n, p in grid]] + [fd.features[:, a:b] for a, b in ranges]
                + [fd.target, fd.utility, fd.domains])


class MLPFamily(Family):
    kind = "mlp"

    def __init__(self, grid: MLPGrid, seed: int = 0):
        self.cfg, self.seed = grid, seed

    def grid(self, fd: FitData | None = None):
        out = []
        for h, ep, wd, dr in itertools.product(self.cfg.hidden, self.cfg.epochs, self.cfg.weight_decay, self.cfg.dropout):
            out.append((f"mlp h={h} epochs={ep} wd={_fmt(float(wd))} dropout={_fmt(float(dr))} x{self.cfg.n_models}",
                        {"hidden": int(h), "epochs": int(ep), "weight_decay": float(wd), "dropout": float(dr),
                         "n_models": self.cfg.n_models, "lr": self.cfg.lr, "batch_size": self.cfg.batch_size}))
        return out

    def fit(self, fd, rows, params):
        return MLPHead.fit(fd.features[rows], fd.target[rows], fd.utility[rows], fd.domains[rows].tolist(),
                           seed=self.seed, **params)

    def predict_grid(self, fd, tr, te, domains):
        return {name: _both(self.fit(fd, tr, p), fd.features[te], domains) for name, p in self.grid()}


class SFTFamily(Family):
    """The linear heads of the SFT stage, early-stopped on a hash-carved tenth of the rows they fit."""

    kind = "sft"
    member_ok = False

    def __init__(self, grid: SFTGrid, seed: int = 0):
        self.cfg, self.seed = grid, seed

    def grid(self, fd: FitData | None = None):
        return [(f"sft {h} lr={_fmt(float(lr))}", {"head": h, "lr": float(lr)}) for h in self.cfg.head for lr in self.cfg.lr]

    def config(self, params) -> SFTConfig:
        return SFTConfig(head=params["head"], lr=params["lr"], weight_decay=self.cfg.weight_decay, epochs=self.cfg.epochs,
                         patience=self.cfg.patience, seed=self.seed)

    def _train(self, data: RoutingData, params):
        from fugu_pipeline.policies.oneshot.sft import train_sft

        return train_sft(data, self.config(params), log=lambda m: None, force=True)

    def fit(self, fd, rows, params):
        """The final fit keeps the data's own splits: train on 'train', stop early on 'val' (carved
        from train when the data has none)."""
        return self._train(carve_validation(fd.data, 0.1, self.seed + 1), params)

    def predict_grid(self, fd, tr, te, domains):
        sub = fd.data.subset(fd.rows[tr])
        inner = fold_ids(sub.task_ids, 10, self.seed + 1) == 0
        sub = dataclasses.replace(sub, splits=np.where(inner, "val", "train"), data_version="")
        if not inner.any():  # a small fold (a few dozen rows): still one row to stop on
            sub = carve_validation(sub, 0.1, self.seed + 1)
        x = torch.from_numpy(fd.features[te].astype(np.float32))
        out: Preds = {}
        for name, p in self.grid():
            head = self._train(sub, p).head()
            with torch.no_grad():
                s = head(x).numpy().astype(np.float64)
                q = head.predict_quality(x).numpy().astype(np.float64) if hasattr(head, "predict_quality") else None
            out[name] = (q, s)
        return out


def families_for(cfg, seed: int = 0) -> list[Family]:
    """The enabled families of a TrainSetConfig's `heads`, in a fixed order."""
    h = cfg.heads
    out: list[Family] = []
    if h.domain_prior is not None:
        out.append(PriorFamily(h.domain_prior))
    if h.knn is not None:
        out.append(KNNFamily(h.knn))
    if h.ridge is not None:
        out.append(RidgeFamily(h.ridge))
    if h.mlp is not None:
        out.append(MLPFamily(h.mlp, seed))
    if h.sft is not None:
        out.append(SFTFamily(h.sft, seed))
    return out
