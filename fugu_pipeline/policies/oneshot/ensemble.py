"""`ensemble`: a calibrated, weighted ensemble of quality predictors, the members embedded.

Each member m predicts quality q_m and utility u_m. The ensemble routes by Σ w_m·u_m and predicts
quality Σ w_m·σ(a_m·logit(q_m) + b_m): every member's quality is first put on a common, calibrated
scale by temperature scaling (a_m, b_m fitted on out-of-fold predictions, `temperature_fit`).
The weights are the counts of a greedy forward selection with replacement on out-of-fold
predictions (`fit.py`), so they are chosen on validation only. The members are whole heads
(`members.<i>.*` in the state dict; their kinds and parameters in `head_params`), so the
checkpoint stands alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fugu_pipeline.train.head_base import build_head, register
from fugu_pipeline.policies.oneshot.predictors import QualityPredictor


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(1e-4, 1 - 1e-4)
    return torch.log(p / (1 - p))


@register
class EnsembleHead(QualityPredictor):
    kind = "ensemble"

    def __init__(self, dim: int, n_workers: int, domains: list[str] | tuple = (), members: list[dict] | tuple = ()):
        super().__init__(dim, n_workers, domains)
        specs = _member_specs(members)
        if any(s["kind"] == self.kind for s in specs):
            raise ValueError("an ensemble's members cannot be ensembles")
        self.member_specs = specs
        self.members = torch.nn.ModuleList([build_head(s["kind"], dim, n_workers, s["params"]) for s in specs])
        if not all(isinstance(m, QualityPredictor) for m in self.members):
            raise ValueError("ensemble members must be quality predictors (knn, domain_prior, ridge, mlp)")
        self.register_buffer("member_weights", torch.full((len(specs),), 1.0 / len(specs)))
        self.register_buffer("calibration", torch.tensor([[1.0, 0.0]] * len(specs)))

    def _params(self) -> dict[str, Any]:
        return {"members": [{"kind": s["kind"], "params": s["params"]} for s in self.member_specs]}

    @classmethod
    def from_members(cls, members: list[QualityPredictor], weights: list[float],
                     calibration: list[tuple[float, float]]) -> "EnsembleHead":
        first = members[0]
        vocab = sorted({d for m in members for d in m.domains})
        head = cls(first.dim, first.n_workers, vocab, [{"kind": m.kind, "params": m.head_params()} for m in members])
        for dst, src in zip(head.members, members):
            dst.load_state_dict(src.state_dict())
        w = torch.tensor(weights, dtype=torch.float32)
        head.member_weights.copy_(w / w.sum())
        head.calibration.copy_(torch.tensor(calibration, dtype=torch.float32))
        return head.finalize()

    def predict_both(self, x: torch.Tensor, domains=None) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.as_tensor(x, dtype=torch.float32)
        q = torch.zeros(len(x), self.n_workers)
        u = torch.zeros(len(x), self.n_workers)
        for m, w, (a, b) in zip(self.members, self.member_weights, self.calibration):
            qm, um = m.predict_both(x, domains)
            q = q + w * torch.sigmoid(a * _logit(qm) + b)
            u = u + w * um
        return q, u

    def predict(self, x: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("an ensemble passes the domain names to its members: use predict_both")

    def probe_domains(self) -> list[str]:
        return self.domains

    def table_problems(self) -> list[str]:
        w = self.member_weights
        p = []
        if (w < 0).any() or abs(float(w.sum()) - 1.0) > 1e-4:
            p.append("member_weights must be >= 0 and sum to 1")
        if (self.calibration[:, 0] <= 0).any():
            p.append("calibration slopes must be > 0 (a negative slope reverses a member's ranking)")
        for i, m in enumerate(self.members):
            p.extend(f"member {i} ({m.kind}): {msg}" for msg in m.sanity())
        return p


def _member_specs(members) -> list[dict[str, Any]]:
    """The members' {"kind", "params"}, checked: they come from a manifest's head_params."""
    if not isinstance(members, (list, tuple)):
        raise ValueError(f"members must be a list of {{\"kind\", \"params\"}} objects, got a {type(members).__name__}")
    if not members:
        raise ValueError("an ensemble needs at least one member")
    specs = []
    for i, m in enumerate(members):
        if not isinstance(m, dict):
            raise ValueError(f"member {i} is a {type(m).__name__}, not an object with \"kind\" and \"params\"")
        if not isinstance(m.get("kind"), str):
            raise ValueError(f'member {i} has no "kind" string (its head kind, e.g. "knn")')
        params = m.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f'member {i} ({m["kind"]}): "params" is a {type(params).__name__}, not an object')
        specs.append({"kind": m["kind"], "params": dict(params)})
    return specs


def temperature_fit(pred: np.ndarray, observed: np.ndarray, iters: int = 100) -> tuple[float, float]:
    """(a, b) minimising the binary cross-entropy of σ(a·logit(pred) + b) against observed quality
    in [0, 1] (damped Newton steps on a 2-parameter logistic problem). a is kept > 0."""
    p = np.clip(np.asarray(pred, np.float64).ravel(), 1e-4, 1 - 1e-4)
    z, y = np.log(p / (1 - p)), np.asarray(observed, np.float64).ravel()
    ok = np.isfinite(y)
    z, y = z[ok], y[ok]

    def loss(a: float, b: float) -> float:
        t = a * z + b
        return float(np.mean(np.logaddexp(0, t) - y * t))

    a, b = 1.0, 0.0
    for _ in range(iters):
        s = 1 / (1 + np.exp(-np.clip(a * z + b, -30, 30)))
        g = np.array([np.mean((s - y) * z), np.mean(s - y)])
        h = s * (1 - s)
        H = np.array([[np.mean(h * z * z), np.mean(h * z)], [np.mean(h * z), np.mean(h)]]) + 1e-6 * np.eye(2)
        step = np.linalg.solve(H, g)
        t, f0 = 1.0, loss(a, b)
        while (loss(a - t * step[0], b - t * step[1]) > f0 or a - t * step[0] <= 1e-3) and t > 1e-4:
            t /= 2
        if a - t * step[0] <= 1e-3:
            break
        a, b = a - t * step[0], b - t * step[1]
        if np.abs(t * step).max() < 1e-7:
            break
    return float(a), float(b)


def calibrate(pred: np.ndarray, ab: tuple[float, float]) -> np.ndarray:
    a, b = ab
    p = np.clip(pred, 1e-4, 1 - 1e-4)
    return 1 / (1 + np.exp(-(a * np.log(p / (1 - p)) + b)))
