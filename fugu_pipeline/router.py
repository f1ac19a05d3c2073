"""The router downstream code uses: a checkpoint plus the encoder its contract names.

    from fugu_pipeline import load_promoted
    router = load_promoted("models")
    decision = router.route("Prove that ...", domain="math")
    decision.worker_id, decision.probabilities

`load_promoted` follows `models/promoted/current.json`: when a new checkpoint is promoted, the
next `route` call uses it, without a restart.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.schemas import FeatureContract

POINTER = Path("promoted") / "current.json"


class RouterError(RuntimeError):
    pass


@dataclass
class RouteDecision:
    worker_id: str
    probabilities: dict[str, float]
    ranking: list[str]  # best first: the fallback order
    checkpoint: str = ""
    extra: dict = field(default_factory=dict)


def encoder_settings_for(contract: FeatureContract, device: str = "auto", dtype: str = "auto", encoder: str | None = None):
    """EncoderSettings that reproduce a checkpoint's feature contract. `encoder` overrides where the
    model is loaded from (e.g. the same model in another directory); the contract is then checked."""
    from fugu_pipeline.encoder import EncoderSettings

    return EncoderSettings(
        model=encoder or contract.encoder_id, revision=contract.revision, device=device, dtype=dtype,
        max_length=contract.max_length, pooling=contract.pooling, token_position=contract.token_position,
        layer=contract.layer, normalize=contract.normalize, prompt_template=contract.prompt_template,
    )


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class Router:
    """A loaded checkpoint and its encoder. Thread-safe for concurrent `route_batch` calls."""

    def __init__(self, checkpoint, encoder, *, encoder_override: str | None = None):
        self.checkpoint = checkpoint
        self.encoder = encoder
        self.worker_ids: list[str] = list(checkpoint.manifest.worker_ids)
        self.path = str(checkpoint.path)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, checkpoint_path: str | Path, *, device: str = "auto", dtype: str = "auto", encoder: str | None = None) -> "Router":
        from fugu_pipeline.checkpoints import load_checkpoint
        from fugu_pipeline.encoder import Encoder

        probe = load_checkpoint(checkpoint_path)
        settings = encoder_settings_for(probe.manifest.feature_contract, device, dtype, encoder)
        enc = Encoder.load(settings)
        expected = enc.feature_contract()
        if encoder is not None:  # a relocated model: same contract apart from where it lives
            expected = expected.model_copy(update={"encoder_id": probe.manifest.feature_contract.encoder_id})
        ckpt = load_checkpoint(checkpoint_path, expected_contract=expected)
        return cls(ckpt, enc)

    def scores(self, prompts: list[str], domains: list[str] | None = None, cost_weight: float | None = None) -> np.ndarray:
        import torch

        feats = self.encoder.encode(prompts, domains)
        head = self.checkpoint.head
        with self._lock, torch.inference_mode():
            x = torch.from_numpy(feats)
            if cost_weight is not None and hasattr(head, "route_scores"):
                s = head.route_scores(x, cost_weight, head.expected_cost)  # normalised cost, learnt on train
            else:
                s = head(x)
        return s.float().numpy()

    def route_batch(
        self,
        prompts: list[str],
        domains: list[str | None] | None = None,
        *,
        allowed: list[str] | None = None,
        cost_weight: float | None = None,
    ) -> list[RouteDecision]:
        """Route many prompts in one encoder pass. `allowed` restricts the workers (unknown ids
        are an error); `cost_weight` trades quality for cost with a quality head."""
        if allowed is not None:
            unknown = [w for w in allowed if w not in self.worker_ids]
            if unknown:
                raise RouterError(f"unknown worker(s) {unknown}; this router knows {self.worker_ids}")
            if not allowed:
                raise RouterError("the allowed worker list is empty")
        doms = [d or "general" for d in domains] if domains is not None else None
        scores = self.scores(prompts, doms, cost_weight)
        mask = np.array([allowed is None or w in allowed for w in self.worker_ids])
        scores = np.where(mask, scores, -np.inf)
        probs = _softmax(scores)
        out = []
        for row_s, row_p in zip(scores, probs):
            order = [int(i) for i in np.argsort(-row_s, kind="stable") if mask[i]]
            out.append(RouteDecision(
                worker_id=self.worker_ids[order[0]],
                probabilities={w: float(p) for w, p, ok in zip(self.worker_ids, row_p, mask) if ok},
                ranking=[self.worker_ids[i] for i in order],
                checkpoint=self.path,
            ))
        return out

    def route(self, prompt: str, domain: str | None = None, **kw) -> RouteDecision:
        return self.route_batch([prompt], [domain], **kw)[0]

    def close(self) -> None:
        self.encoder.close()


# --------------------------------------------------------------------------- promoted pointer


def read_pointer(models_dir: str | Path) -> dict | None:
    path = Path(models_dir) / POINTER
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def promoted_checkpoint_path(models_dir: str | Path) -> Path:
    ptr = read_pointer(models_dir)
    if ptr is None:
        raise RouterError(
            f"no promoted router in {models_dir}: materialize `promoted_router` (or run `fugu-lite pipeline`), "
            "or pass a checkpoint directory explicitly"
        )
    p = Path(ptr["checkpoint"])
    return p if p.is_absolute() else Path(models_dir) / p


class PromotedRouter:
    """Follows the promoted pointer: each call checks it (one small read) and swaps in a newly
    promoted checkpoint, reusing the loaded encoder when the feature contract is unchanged."""

    def __init__(self, models_dir: str | Path, *, device: str = "auto", dtype: str = "auto", encoder: str | None = None):
        self.models_dir = Path(models_dir)
        self._opts = {"device": device, "dtype": dtype, "encoder": encoder}
        self._router: Router | None = None
        self._key: tuple | None = None
        self._lock = threading.Lock()
        self.reloads = 0
        self.refresh()

    def refresh(self) -> Router:
        from fugu_pipeline.checkpoints import load_checkpoint

        ptr = read_pointer(self.models_dir)
        key = (ptr or {}).get("content_hash"), (ptr or {}).get("checkpoint")
        with self._lock:
            if self._router is not None and key == self._key:
                return self._router
            path = promoted_checkpoint_path(self.models_dir)
            old = self._router
            ckpt = load_checkpoint(path)
            if old is not None and ckpt.manifest.feature_contract == old.checkpoint.manifest.feature_contract:
                new = Router(ckpt, old.encoder)  # same features: keep the loaded encoder
            else:
                new = Router.load(path, **self._opts)
                if old is not None:
                    old.close()
            self._router, self._key = new, key
            self.reloads += 1
            return new

    @property
    def router(self) -> Router:
        return self.refresh()

    @property
    def worker_ids(self) -> list[str]:
        return self.router.worker_ids

    def route(self, prompt: str, domain: str | None = None, **kw) -> RouteDecision:
        return self.refresh().route(prompt, domain, **kw)

    def route_batch(self, prompts, domains=None, **kw) -> list[RouteDecision]:
        return self.refresh().route_batch(prompts, domains, **kw)


def load_promoted(models_dir: str | Path = "models", **kw) -> PromotedRouter:
    """The promoted router for downstream code; picks up new promotions without a restart."""
    return PromotedRouter(models_dir, **kw)
