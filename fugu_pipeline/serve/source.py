"""Where the server's router comes from: a fixed `Router`, the promoted pointer (followed on
every batch), or a callable; a reload that fails, or that gives a router this server cannot serve,
keeps the last good one and says why (`reload_error`). A server may also run with no one-step
router at all, only a multi-turn coordinator (`RouterSource.absent` says why; one-step requests
then get a 400 naming what is missing; `run.providers` decides which a path gives)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.route.router import Router, RouterError
from fugu_pipeline.train.pointer import POINTER

log = logging.getLogger("fugu_pipeline.serve")


class RouterSource:
    """The Router for the next batch, from a `Router`, a `PromotedRouter` or a callable. When a
    reload fails the last good router keeps serving and `reload_error` says why. Hold `lock`
    while using the router: a reload may close the encoder of the one it replaces."""

    def __init__(self, provider: Router | PromotedRouter | Callable[[], Router] | None,
                 check: Callable[[Router], None] | None = None, *, absent: str | None = None):
        self.absent = None  # why there is no one-step router (a coordinator alone is served)
        if provider is None:
            self.absent = absent or "this server has no one-step router"

            def missing() -> Router:
                raise RuntimeError(self.absent)

            self._get = missing
        elif isinstance(provider, Router):
            self._get: Callable[[], Router] = lambda: provider
        elif hasattr(provider, "refresh"):
            self._get = provider.refresh  # type: ignore[union-attr]
        elif callable(provider):
            self._get = provider
        else:
            raise TypeError(f"router_provider must be a Router, a PromotedRouter or a callable, not {type(provider).__name__}")
        self.last: Router | None = None
        self.reload_error: str | None = None
        self.lock = threading.Lock()
        self._check = check  # raises ValueError for a router this server cannot serve (e.g. unknown workers)

    def get(self) -> Router:
        try:
            router = self._get()
            if router is not self.last and self._check is not None:
                self._check(router)
        except Exception as exc:
            if self.last is None:
                raise
            msg = f"{type(exc).__name__}: {exc}"
            if msg != self.reload_error:
                log.error("router reload failed; still serving %s: %s", self.last.path, msg)
            self.reload_error = msg
            return self.last
        self.last, self.reload_error = router, None
        return router


def checkpoint_tag(router: Router) -> str:
    m = router.checkpoint.manifest
    return f"{m.method}/{m.content_hash or Path(router.path).name}"


def load_router_provider(checkpoint_or_models_dir: str | Path, *, device: str = "auto", dtype: str = "auto",
                         encoder: str | None = None) -> Router | PromotedRouter:
    """A models directory with `promoted/current.json` gives a PromotedRouter (follows promotions);
    a checkpoint directory gives a fixed Router (a one-step router, or a cascade)."""
    from fugu_pipeline.policies.registry import load_promoted, load_router

    path = Path(checkpoint_or_models_dir)
    if (path / POINTER).exists():
        return load_promoted(path, device=device, dtype=dtype, encoder=encoder)
    if (path / "manifest.json").exists() or path.is_file():
        return load_router(path, device=device, dtype=dtype, encoder=encoder)
    raise RouterError(f"{path} is neither a checkpoint directory (manifest.json + head.safetensors) nor a models "
                      f"directory with {POINTER}; pass a trained checkpoint or the models directory")
