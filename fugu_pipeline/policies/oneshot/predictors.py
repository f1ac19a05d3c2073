"""Quality predictors: heads that predict every worker's quality (in [0, 1]) and utility from the
frozen features and, when known, the task's domain.

- `domain_prior`: empirical-Bayes per-domain means. For a domain seen n_d times in training,
  q̂_d = (n_d·mean_d + m·pooled) / (n_d + m); an unseen or unknown domain gets the pooled mean
  (which routes like the best fixed worker). The domain vocabulary is a head parameter.
- `knn`: cosine k-nearest neighbours over the stored neighbour set (the training rows' features,
  per-worker quality and utility). Uniform (or softmax(sim / T)) weights; the domain prior joins as
  `prior_weight` pseudo-neighbours, q̂ = (k·knn + m·prior) / (k + m); `same_domain_bonus` is
  added to the similarity of neighbours from the query's own domain, so they come first. With
  `cosine_dims` the similarity reads only the first columns (the embedding, when the vector ends
  with the lexical block).
- `mlp`: a bag of small MLPs (or logistic regressions, hidden=0) over standardised features
  (+ a scaled one-hot of the domain), BCE on the observed quality of every worker.

Every head here routes by predicted utility (`forward(x, domains)`), exposes
`predict_quality(x, domains)`, and stores `routing_map`: its centred utility predictions on a
fixed probe set (seeded random unit vectors, half with a training domain each), which is what
the duplicate gate compares and what `sanity()` recomputes, so an edited table is refused.
The study behind the defaults (k=100 uniform, prior as 30 pseudo-neighbours, same-domain bonus 1,
prior m=20) is summarised in the README.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fugu_pipeline.train.head_base import RoutingHead, register

PROBE_ROWS = 64
_CHUNK = 2048


def column_scale(x: np.ndarray) -> np.ndarray:
    """Per-column spread for standardising: the standard deviation, or 1e6 for a column constant in
    training (it carries no information; a value unseen at serving then moves nothing instead of
    being multiplied by 1e6: e.g. a lexical statistic that was 0 on every training prompt)."""
    std = np.asarray(x, np.float64).std(0)
    return np.where(std > 1e-6, std, 1e6)


class QualityPredictor(RoutingHead):
    """Base of the heads that predict quality and utility and take the domain at routing time."""

    uses_domains = True

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = ()):
        super().__init__(dim, n_workers)
        self.domains = [str(d) for d in domains]
        if len(set(self.domains)) != len(self.domains):
            raise ValueError("the domain vocabulary has duplicates")
        self._index = {d: i for i, d in enumerate(self.domains)}
        self.register_buffer("routing_map", torch.zeros(PROBE_ROWS, n_workers))

    # ------------------------------------------------------------------ interface
    def domain_codes(self, domains, n: int) -> torch.Tensor:
        """Index of each row's domain in the vocabulary; -1 for None or a domain never trained on."""
        if domains is None:
            return torch.full((n,), -1, dtype=torch.long)
        return torch.tensor([self._index.get(d, -1) if d is not None else -1 for d in domains], dtype=torch.long)

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(quality (N, W), utility (N, W)) for rows with these domain codes."""
        raise NotImplementedError

    def predict_both(self, x: torch.Tensor, domains=None) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.as_tensor(x, dtype=torch.float32)
        return self.predict(x, self.domain_codes(domains, len(x)))

    def forward(self, x: torch.Tensor, domains=None) -> torch.Tensor:
        return self.predict_both(x, domains)[1]

    def predict_quality(self, x: torch.Tensor, domains=None) -> torch.Tensor:
        return self.predict_both(x, domains)[0].clamp(0.0, 1.0)

    def head_params(self) -> dict[str, Any]:
        return {"domains": list(self.domains), **self._params()}

    def _params(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ probe and checks
    def probe(self) -> tuple[torch.Tensor, list[str | None]]:
        g = torch.Generator().manual_seed(0)
        z = F.normalize(torch.randn(PROBE_ROWS, self.dim, generator=g), dim=-1)
        vocab = self.probe_domains()
        doms = [vocab[i % len(vocab)] if vocab and i % 2 == 0 else None for i in range(PROBE_ROWS)]
        return z, doms

    def probe_domains(self) -> list[str]:
        return self.domains

    def compute_routing_map(self) -> torch.Tensor:
        z, doms = self.probe()
        was_training = self.training
        self.eval()
        with torch.no_grad():
            u = self.predict_both(z, doms)[1].float()
        self.train(was_training)
        return u - u.mean(dim=1, keepdim=True)

    def finalize(self) -> "QualityPredictor":
        """Call after fitting: stores the routing map, returns the head in eval mode."""
        self.eval()
        for m in self.modules():
            if isinstance(m, QualityPredictor) and m is not self:
                m.routing_map.copy_(m.compute_routing_map())
        self.routing_map.copy_(self.compute_routing_map())
        return self

    def sanity(self) -> list[str]:
        problems = self.table_problems()
        if problems:
            return problems
        recomputed = self.compute_routing_map()
        if not torch.isfinite(recomputed).all():
            return ["the head's predictions on the probe set are not finite"]
        if not torch.allclose(recomputed, self.routing_map, atol=1e-3, rtol=1e-3):
            return ["routing_map does not match the head's own predictions on the probe set (tensors edited after saving)"]
        return []

    def table_problems(self) -> list[str]:
        return []


def _in_unit(name: str, t: torch.Tensor) -> list[str]:
    if t.numel() and (t.min() < -1e-6 or t.max() > 1 + 1e-6):
        return [f"{name} must lie in [0, 1] (found {float(t.min()):.3g}..{float(t.max()):.3g})"]
    return []


@register
class DomainPriorHead(QualityPredictor):
    kind = "domain_prior"

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = (), m: float = 20.0):
        super().__init__(dim, n_workers, domains)
        if m < 0:
            raise ValueError(f"m must be >= 0, got {m}")
        self.m = float(m)
        v = len(self.domains)
        for name, shape in (("table_quality", (v, n_workers)), ("table_utility", (v, n_workers)),
                            ("pooled_quality", (n_workers,)), ("pooled_utility", (n_workers,)), ("counts", (v,))):
            self.register_buffer(name, torch.zeros(shape))

    def _params(self) -> dict[str, Any]:
        return {"m": self.m}

    @classmethod
    def fit(cls, dim: int, quality: np.ndarray, utility: np.ndarray, domains: list[str], m: float = 20.0,
            vocab: list[str] | None = None) -> "DomainPriorHead":
        doms = np.asarray([str(d) for d in domains])
        vocab = sorted(set(doms.tolist())) if vocab is None else list(vocab)
        head = cls(dim, quality.shape[1], vocab, m)
        head.fill(quality, utility, doms)
        return head.finalize()

    def fill(self, quality: np.ndarray, utility: np.ndarray, doms: np.ndarray) -> None:
        q, u = np.asarray(quality, np.float64), np.asarray(utility, np.float64)
        gq, gu = q.mean(0), u.mean(0)
        self.pooled_quality.copy_(torch.from_numpy(gq))
        self.pooled_utility.copy_(torch.from_numpy(gu))
        for i, d in enumerate(self.domains):
            s = doms == d
            n = float(s.sum())
            self.counts[i] = n
            if n + self.m > 0:
                self.table_quality[i] = torch.from_numpy((q[s].sum(0) + self.m * gq) / (n + self.m))
                self.table_utility[i] = torch.from_numpy((u[s].sum(0) + self.m * gu) / (n + self.m))
            else:
                self.table_quality[i], self.table_utility[i] = torch.from_numpy(gq), torch.from_numpy(gu)

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        known = (codes >= 0).unsqueeze(1)
        idx = codes.clamp(min=0)
        if len(self.domains) == 0:
            return self.pooled_quality.expand(len(codes), -1).clone(), self.pooled_utility.expand(len(codes), -1).clone()
        q = torch.where(known, self.table_quality[idx], self.pooled_quality)
        u = torch.where(known, self.table_utility[idx], self.pooled_utility)
        return q, u

    def table_problems(self) -> list[str]:
        p = _in_unit("table_quality", self.table_quality) + _in_unit("pooled_quality", self.pooled_quality)
        if (self.counts < 0).any():
            p.append("counts must be >= 0")
        return p


def topk_neighbours(xn: torch.Tensor, codes: torch.Tensor | None, bank: torch.Tensor, bank_codes: torch.Tensor,
                    kmax: int, bonus: float, presorted: "SortedBank | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarities, indices) of the kmax most similar bank rows per query, most similar first.
    Cosine similarity (both sides L2-normalised), plus `bonus` for a bank row of the query's own
    (known) domain."""
    return topk_neighbours_each(xn, codes, bank, bank_codes, kmax, [bonus], presorted)[bonus]


def topk_neighbours_each(xn: torch.Tensor, codes: torch.Tensor | None, bank: torch.Tensor, bank_codes: torch.Tensor,
                         kmax: int, bonuses, presorted: "SortedBank | None" = None) -> dict[float, tuple[torch.Tensor, torch.Tensor]]:
    """`topk_neighbours` for every bonus in `bonuses`, from one matrix product per chunk of queries.

    The bank is sorted by domain once, and so are the queries; each chunk of queries takes one
    product with the whole bank (read once however many domains the chunk holds). A query's row of
    it then falls into three column ranges: the rows before its domain's, its own domain's, and
    the rows after. One top-k within each range gives at most 3·kmax candidates. A bonus only
    raises the candidates of the query's own range, so each bonus's top kmax is among them, and is
    found by a top-k over those candidates alone. The (queries × bank) product and its top-k are
    done once for every bonus. A query of an unknown domain (code -1) gets no bonus. `presorted`:
    `sort_bank(bank, bank_codes)`, kept by a caller that asks again with the same bank."""
    kmax = min(kmax, len(bank))
    bonuses = list(dict.fromkeys(float(b) for b in bonuses))
    n = len(xn)
    if not n or not kmax:
        return {b: (torch.zeros(n, kmax), torch.zeros(n, kmax, dtype=torch.long)) for b in bonuses}
    if codes is None or not any(bonuses):
        v, i = _chunked_topk(xn, bank, kmax)
        return {b: (v, i) for b in bonuses}
    order, sbank, scodes = presorted if presorted is not None else sort_bank(bank, bank_codes)
    out = {b: (torch.empty(n, kmax, dtype=xn.dtype), torch.empty(n, kmax, dtype=torch.long)) for b in bonuses}
    qorder = torch.argsort(codes, stable=True)
    for s in range(0, n, _CHUNK // 2):  # a range's top-k copies its columns: half a chunk keeps the peak
        part = qorder[s:s + _CHUNK // 2]
        sims = xn[part] @ sbank.T  # one product for every domain of the chunk: the bank is read once
        pcodes = codes[part]
        done = 0
        for d, count in zip(*(t.tolist() for t in torch.unique_consecutive(pcodes, return_counts=True))):
            rows, block = part[done:done + count], sims[done:done + count]
            done += count
            if d < 0:
                v, i = torch.topk(block, kmax, dim=1)
                for b in bonuses:
                    out[b][0][rows], out[b][1][rows] = v, order[i]
                continue
            lo = int(torch.searchsorted(scodes, d))
            hi = int(torch.searchsorted(scodes, d, right=True))
            found = [(*torch.topk(block[:, a:z], min(kmax, z - a), dim=1), a, a == lo and z == hi)
                     for a, z in ((0, lo), (lo, hi), (hi, len(sbank))) if z > a]
            idx = torch.cat([i + a for _, i, a, _ in found], dim=1)
            for b in bonuses:
                vals = torch.cat([v + b if own else v for v, _, _, own in found], dim=1)
                v, j = torch.topk(vals, kmax, dim=1)
                out[b][0][rows], out[b][1][rows] = v, order[idx.gather(1, j)]
    return out


class SortedBank(NamedTuple):
    """A neighbour bank sorted by domain code (stable): `bank[order]`, `codes[order]`."""

    order: torch.Tensor
    bank: torch.Tensor
    codes: torch.Tensor


def sort_bank(bank: torch.Tensor, bank_codes: torch.Tensor) -> SortedBank:
    order = torch.argsort(bank_codes, stable=True)
    return SortedBank(order, bank[order], bank_codes[order])


def _chunked_topk(xn: torch.Tensor, bank: torch.Tensor, kmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarities, indices) of each query's kmax most similar bank rows, a chunk of queries at a time
    (at least one query: `topk_neighbours_each` answers none itself)."""
    vs, ix = [], []
    for s in range(0, len(xn), _CHUNK):
        v, i = torch.topk(xn[s:s + _CHUNK] @ bank.T, kmax, dim=1)
        vs.append(v)
        ix.append(i)
    return torch.cat(vs), torch.cat(ix)


def neighbour_mean(sims: torch.Tensor, idx: torch.Tensor, table: torch.Tensor, k: int, temperature: float | None) -> torch.Tensor:
    """Weighted mean of `table` over each row's first k neighbours (uniform, or softmax(sim/T))."""
    s, i = sims[:, :k], idx[:, :k]
    if temperature:
        w = torch.softmax((s - s.max(dim=1, keepdim=True).values) / temperature, dim=1)
    else:
        w = torch.full_like(s, 1.0 / max(s.shape[1], 1))
    return torch.einsum("nk,nkw->nw", w, table[i])


@register
class KNNHead(QualityPredictor):
    kind = "knn"

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = (), n_neighbours: int = 1,
                 k: int = 100, prior_weight: float = 30.0, same_domain_bonus: float = 1.0,
                 temperature: float | None = None, prior_m: float = 20.0, cosine_dims: int | None = None):
        super().__init__(dim, n_workers, domains)
        if cosine_dims is not None and not 1 <= cosine_dims <= dim:
            raise ValueError(f"cosine_dims must lie in 1..{dim}, got {cosine_dims}")
        self.cosine_dims = None if cosine_dims is None or cosine_dims == dim else int(cosine_dims)
        if n_neighbours < 1 or k < 1:
            raise ValueError(f"knn needs n_neighbours >= 1 and k >= 1, got {n_neighbours}, {k}")
        if prior_weight < 0 or same_domain_bonus < 0 or (temperature is not None and temperature <= 0):
            raise ValueError("prior_weight and same_domain_bonus must be >= 0, temperature > 0 or None")
        self.n_neighbours, self.k = int(n_neighbours), int(k)
        self.prior_weight, self.same_domain_bonus = float(prior_weight), float(same_domain_bonus)
        self.temperature = None if temperature is None else float(temperature)
        self.register_buffer("neighbours", torch.zeros(n_neighbours, self.cosine_dims or dim))
        self.register_buffer("neighbour_quality", torch.zeros(n_neighbours, n_workers))
        self.register_buffer("neighbour_utility", torch.zeros(n_neighbours, n_workers))
        self.register_buffer("neighbour_domain", torch.full((n_neighbours,), -1.0))  # vocabulary index, -1 none
        self.prior = DomainPriorHead(dim, n_workers, domains, prior_m)

    def _params(self) -> dict[str, Any]:
        return {"n_neighbours": self.n_neighbours, "k": self.k, "prior_weight": self.prior_weight,
                "same_domain_bonus": self.same_domain_bonus, "temperature": self.temperature, "prior_m": self.prior.m,
                **({"cosine_dims": self.cosine_dims} if self.cosine_dims else {})}

    @classmethod
    def fit(cls, features: np.ndarray, quality: np.ndarray, utility: np.ndarray, domains: list[str], *,
            k: int = 100, prior_weight: float = 30.0, same_domain_bonus: float = 1.0,
            temperature: float | None = None, prior_m: float = 20.0, cosine_dims: int | None = None) -> "KNNHead":
        doms = np.asarray([str(d) for d in domains])
        vocab = sorted(set(doms.tolist()))
        n, dim = features.shape
        head = cls(dim, quality.shape[1], vocab, n, k, prior_weight, same_domain_bonus, temperature, prior_m, cosine_dims)
        x = np.asarray(features, np.float32)[:, : head.cosine_dims or dim]
        head.neighbours.copy_(F.normalize(torch.from_numpy(x), dim=-1))
        head.neighbour_quality.copy_(torch.from_numpy(np.asarray(quality, np.float32)))
        head.neighbour_utility.copy_(torch.from_numpy(np.asarray(utility, np.float32)))
        head.neighbour_domain.copy_(head.domain_codes(doms.tolist(), n).float())
        head.prior.fill(quality, utility, doms)
        return head.finalize()

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xn = F.normalize(x.float()[:, : self.cosine_dims or self.dim], dim=-1)
        sims, idx = topk_neighbours(xn, codes, self.neighbours, self.neighbour_domain.long(), self.k, self.same_domain_bonus,
                                    self._sorted_bank())
        k = idx.shape[1]
        q = neighbour_mean(sims, idx, self.neighbour_quality, k, self.temperature)
        u = neighbour_mean(sims, idx, self.neighbour_utility, k, self.temperature)
        if self.prior_weight > 0:
            pq, pu = self.prior.predict(x, codes)
            m = self.prior_weight
            q, u = (k * q + m * pq) / (k + m), (k * u + m * pu) / (k + m)
        return q, u

    def _sorted_bank(self) -> SortedBank:
        """The neighbours sorted by domain, made once per neighbour table (a loaded or edited table
        makes it again): routing asks with a few prompts at a time."""
        key = tuple((t.data_ptr(), t._version) for t in (self.neighbours, self.neighbour_domain))
        if getattr(self, "_sorted_key", None) != key:
            with torch.inference_mode(False), torch.no_grad():  # kept for later calls, in or out of inference mode
                self._sorted = sort_bank(self.neighbours, self.neighbour_domain.long())
            self._sorted_key = key
        return self._sorted

    def table_problems(self) -> list[str]:
        p = _in_unit("neighbour_quality", self.neighbour_quality) + self.prior.table_problems()
        norms = self.neighbours.norm(dim=1)
        if len(norms) and (norms - 1).abs().max() > 1e-3:
            p.append("neighbours must be L2-normalised rows (cosine neighbours)")
        d = self.neighbour_domain
        if len(d) and (d.min() < -1 or d.max() >= max(len(self.domains), 0) or (d != d.round()).any()):
            p.append("neighbour_domain must hold vocabulary indices (or -1)")
        return p


@register
class MLPHead(QualityPredictor):
    kind = "mlp"

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = (), hidden: int = 256,
                 n_models: int = 3, dropout: float = 0.3, domain_onehot: bool = True):
        super().__init__(dim, n_workers, domains)
        if hidden < 0 or n_models < 1 or not 0 <= dropout < 1:
            raise ValueError("mlp needs hidden >= 0, n_models >= 1 and 0 <= dropout < 1")
        self.hidden, self.n_models, self.dropout = int(hidden), int(n_models), float(dropout)
        self.domain_onehot = bool(domain_onehot) and len(self.domains) > 0
        d_in = dim + (len(self.domains) if self.domain_onehot else 0)

        def net() -> nn.Sequential:
            if self.hidden == 0:
                return nn.Sequential(nn.Dropout(self.dropout), nn.Linear(d_in, n_workers))
            return nn.Sequential(nn.Dropout(self.dropout), nn.Linear(d_in, self.hidden), nn.GELU(),
                                 nn.Dropout(self.dropout), nn.Linear(self.hidden, n_workers))

        self.nets = nn.ModuleList([net() for _ in range(self.n_models)])
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        self.register_buffer("utility_scale", torch.ones(1))  # utility = scale * quality + offset
        self.register_buffer("utility_offset", torch.zeros(n_workers))

    def _params(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "n_models": self.n_models, "dropout": self.dropout,
                "domain_onehot": self.domain_onehot}

    def inputs(self, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        z = (x.float() - self.mean) / self.scale
        if self.domain_onehot:
            oh = torch.zeros(len(z), len(self.domains))
            known = codes >= 0
            oh[known.nonzero().squeeze(1), codes[known]] = 3.0
            z = torch.cat([z, oh], dim=1)
        return z

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.inputs(x, codes)
        q = torch.stack([torch.sigmoid(net(z)) for net in self.nets]).mean(0)
        return q, self.utility_scale * q + self.utility_offset

    @classmethod
    def fit(cls, features: np.ndarray, target: np.ndarray, utility: np.ndarray, domains: list[str], *,
            hidden: int = 256, n_models: int = 3, dropout: float = 0.3, domain_onehot: bool = True,
            epochs: int = 30, lr: float = 1e-3, weight_decay: float = 1e-2, batch_size: int = 128,
            seed: int = 0) -> "MLPHead":
        """`target` (N, W) in [0, 1]: the observed quality (or utility rescaled to [0, 1] when the
        data has no quality). The utility map `utility ≈ a·target + b_w` is fitted by least squares."""
        doms = [str(d) for d in domains]
        X = np.asarray(features, np.float32)
        T = np.asarray(target, np.float32)
        head = cls(X.shape[1], T.shape[1], sorted(set(doms)), hidden, n_models, dropout, domain_onehot)
        head.mean.copy_(torch.from_numpy(X.mean(0)))
        head.scale.copy_(torch.from_numpy(column_scale(X)))
        a, b = _utility_map(T.astype(np.float64), np.asarray(utility, np.float64))
        head.utility_scale.fill_(a)
        head.utility_offset.copy_(torch.from_numpy(b))
        z = head.inputs(torch.from_numpy(X), head.domain_codes(doms, len(doms)))
        t = torch.from_numpy(T)
        for j, net in enumerate(head.nets):
            torch.manual_seed(seed * 1000 + j)  # the initial weights and dropout masks
            gen = torch.Generator().manual_seed(seed * 1000 + j)  # the batch order
            for p_, init in zip(net.parameters(), _fresh_init(net, seed * 1000 + j)):
                p_.data.copy_(init)
            opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
            net.train()
            for _ in range(epochs):
                perm = torch.randperm(len(z), generator=gen)
                for s in range(0, len(z), batch_size):
                    b_ = perm[s:s + batch_size]
                    loss = F.binary_cross_entropy_with_logits(net(z[b_]), t[b_])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            net.eval()
        return head.finalize()

    def table_problems(self) -> list[str]:
        return [] if (self.scale > 0).all() else ["scale must be > 0"]


def _fresh_init(net: nn.Module, seed: int) -> list[torch.Tensor]:
    """Seeded initial weights, so a fit does not depend on what ran before it."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in net.parameters():
        if p.dim() > 1:
            bound = 1.0 / np.sqrt(p.shape[1])
            out.append((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
        else:
            out.append(torch.zeros(p.shape))
    return out


def _utility_map(target: np.ndarray, utility: np.ndarray) -> tuple[float, np.ndarray]:
    """(a, b): utility ≈ a·target + b per worker (one slope, one offset per worker), least squares."""
    tc = target - target.mean(0)
    uc = utility - utility.mean(0)
    denom = float((tc * tc).sum())
    a = float((tc * uc).sum() / denom) if denom > 1e-12 else 1.0
    return a, utility.mean(0) - a * target.mean(0)
