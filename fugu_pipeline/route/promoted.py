"""The router downstream code uses: it follows the promoted pointer.

    from fugu_pipeline import load_promoted      # policies/registry.py: any kind of router
    router = load_promoted("models")
    decision = router.route("Prove that ...", domain="math")
    decision.worker_id, decision.scores, decision.score_kind   # what the head scored each worker on

`load_promoted` follows `models/promoted/current.json`: when a new checkpoint is promoted, the
next `route` call uses it, without a restart. A damaged pointer, one naming a checkpoint that is
missing or cannot be loaded, or one whose `content_hash` is not the checkpoint it names, raises
RouterError (one line, naming the pointer) from `load_promoted` and from `route`;
`serve` keeps routing with the last good router and reports why (`reload_error`). `models_dir` may be an object-store URL
(`load_promoted("s3://bucket/models")`, fugu_pipeline/storage.py): the pointer is read from the
store on each call (one small GET), and a newly named checkpoint is downloaded once into this
machine's cache (checkpoints are content-addressed, so a cached one never goes stale).

A swapped-out router is never closed here: other threads (a server's routing batch, a `route`
call that fetched it a moment ago) may still be encoding with it. It is dropped, and its encoder
is freed when the last of them lets go of it (reference counting), so a reader never meets a
closed encoder and the old weights do not outlive their last user.

Which `Router` class runs a checkpoint is the caller's to say (`router_for`): the policies registry
(`policies/registry.py`, whose `load_promoted` this is behind) knows every kind; without one, only
one-step checkpoints load.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from fugu_pipeline.route.router import RouteDecision, Router, RouterError
from fugu_pipeline.storage import download_dir, is_url, local_cache
from fugu_pipeline.train.pointer import POINTER, PointerError, pointer_location, pointer_target, read_pointer

CHECKPOINT_FILES = ("head.safetensors", "manifest.json")  # the manifest commits the checkpoint: last


def promoted_checkpoint_path(models_dir: str | Path) -> Path:
    ptr = _read(models_dir)
    if ptr is None:
        raise RouterError(
            f"no promoted router in {models_dir}: materialize `promoted_router` (or run `fugu-lite pipeline`), "
            "or pass a checkpoint directory explicitly"
        )
    return local_checkpoint(pointer_target(models_dir, ptr))


def _read(models_dir: str | Path) -> dict | None:
    """The pointer; a damaged one is a RouterError (one line: the file, what is wrong, what to do)."""
    try:
        return read_pointer(models_dir)
    except PointerError as exc:
        raise RouterError(str(exc)) from None


def check_identity(models_dir: str | Path, ptr: dict, manifest, pointer_file: Path = POINTER) -> None:
    """RouterError when the checkpoint the pointer names is not the one it promoted (its
    content_hash differs from the manifest's, which loading has verified against the weights)."""
    want = ptr.get("content_hash")
    if want and want != manifest.content_hash:
        raise RouterError(f"{pointer_location(models_dir, pointer_file)}: content_hash {want} but {ptr['checkpoint']} holds checkpoint "
                          f"{manifest.content_hash}: not the promoted checkpoint; re-run promotion or restore it")


def local_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder on this machine: itself when local; for a store URL, a copy in the local
    cache, downloaded once (weights first, the manifest last, then renamed into place)."""
    if not is_url(path):
        return Path(path)
    url = str(path).rstrip("/")
    method, name = url.rsplit("/", 2)[-2:]
    local = local_cache(url.rsplit("/", 2)[0]) / method / name
    if (local / "manifest.json").exists():
        return local
    tmp = local.parent / f".tmp-{name}-{os.getpid()}"
    got = download_dir(url, tmp, last="manifest.json")  # the files beside the weights too: budget.json, policy.json, ...
    for fname in CHECKPOINT_FILES:
        if fname not in got:
            raise RouterError(f"{url} has no {fname}: not a committed checkpoint (an upload cut short, or a wrong pointer)")
    try:
        os.replace(tmp, local)
    except OSError:  # another process downloaded it first
        if not (local / "manifest.json").exists():
            raise
    return local


class PromotedRouter:
    """Follows the promoted pointer: each call checks it (one small read) and swaps in a newly
    promoted checkpoint, reusing the loaded encoder when the feature contract is unchanged.
    Thread-safe: a swap never closes the router it replaces (see the module docstring)."""

    def __init__(self, models_dir: str | Path, *, device: str = "auto", dtype: str = "auto", encoder: str | None = None,
                 router_for: Callable[..., type[Router]] | None = None, attach: Callable[..., None] | None = None):
        self.models_dir = str(models_dir) if is_url(models_dir) else Path(models_dir)
        self.router_for = router_for or (lambda checkpoint: Router)  # the Router class of a loaded checkpoint
        self.attach = attach  # (router, models_dir, **options): what else a new router loads (the registry's)
        self._opts = {"device": device, "dtype": dtype, "encoder": encoder}
        self._router: Router | None = None
        self._key: tuple | None = None
        self._current: tuple[Router | None, tuple | None] = (None, None)
        self._lock = threading.Lock()
        self.reloads = 0
        self.refresh()

    def refresh(self) -> Router:
        from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

        router, key = self._current  # one tuple: the router and the pointer it came from, read together
        if router is not None and _key(_read(self.models_dir)) == key:
            return router
        with self._lock:
            # read the pointer again under the lock: the key and the path come from one pointer,
            # and a thread that waited here never swaps back to a checkpoint read before the wait
            ptr = _read(self.models_dir)
            key = _key(ptr)
            if self._router is not None and key == self._key:
                return self._router
            path = promoted_checkpoint_path(self.models_dir) if ptr is None else local_checkpoint(pointer_target(self.models_dir, ptr))
            old = self._router
            try:
                ckpt = load_checkpoint(path)
            except CheckpointError as exc:
                if ptr is None:
                    raise
                raise RouterError(f"{pointer_location(self.models_dir)}: the promoted checkpoint {ptr['checkpoint']!r} "
                                  f"cannot be loaded ({exc}); re-run promotion or restore it") from None
            if ptr is not None:
                check_identity(self.models_dir, ptr, ckpt.manifest)
            kind = self.router_for(ckpt)  # a one-step router, or another kind's (a cascade)
            if old is not None and ckpt.manifest.feature_contract == old.checkpoint.manifest.feature_contract:
                new = kind(ckpt, old.encoder)  # same features: keep the loaded encoder
                new.check_probe()  # as Router.load does: scores that overflow are refused at load
            else:
                # other features: a new encoder. The old router is not closed: a thread may be
                # encoding with it right now; it is freed when its last user drops it.
                new = kind.load(path, **self._opts)
            if self.attach is not None:
                self.attach(new, self.models_dir, **self._opts)
            self._router, self._key = new, key
            self._current = (new, key)
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

    def close(self) -> None:
        """Shut down: close the current router's encoder. Call it only when nothing routes any more."""
        with self._lock:
            if self._router is not None:
                self._router.close()
            self._router, self._key = None, None
            self._current = (None, None)


def _key(ptr: dict | None) -> tuple:
    return (ptr or {}).get("content_hash"), (ptr or {}).get("checkpoint")

