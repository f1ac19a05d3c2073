"""The shared store at the assets' edges: what a step pulls from FUGU_DATA_URL / FUGU_MODELS_URL
before it runs and pushes after (fugu_pipeline/storage.py says what each write guarantees).

Every step keeps working on the project's local folders with their local guarantees (a response
line fsynced per call, the matrix renamed into place); the store is how machines share them:

| what | pulled by | pushed by | on the store |
|---|---|---|---|
| `responses/<batch>/<worker>.jsonl` | `responses` (to resume), `reward_matrix` (all) | `responses`, after its calls, failed or not | one PUT of the whole file; one writer per partition (the run queue's `dagster/partition` limit) |
| `embeddings/<fingerprint>/` | every step that reads features | the same, when it encoded something | shards are immutable, uniquely named PUTs; `meta.json` a conditional PUT (first writer wins) |
| `models/<method>/<hash>/` | `load_promoted(URL)`, the promotion step (the king) | each trainer, after saving | weights, then the manifest (the commit object) |
| `models/promoted/current.json` | the promotion step, `load_promoted(URL)` | the promotion step | compare-and-swap PUT (If-Match on the version read before deciding) |

The reward matrix is not shared: each machine that needs it rebuilds it from the shared response
files (it is a pure function of them and the worker config, with the same `data_version`
everywhere), because DuckDB allows one writer per file and no remote writer at all, and a copy of
the `.duckdb` file on the store would be a second source of truth to keep in step.
A pulled file whose store version was already pulled (or pushed) from here is not downloaded again:
the version is kept beside it (`.<name>.etag`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fugu_pipeline.paths import ProjectPaths
from fugu_pipeline.storage import (
    PreconditionFailed,
    download,
    download_dir,
    etag,
    get_bytes,
    join,
    list_dirs,
    list_names,
    put_bytes,
    sync_checkpoint,
)
from fugu_pipeline.train.pointer import POINTER, pointer_location

MANIFEST = "manifest.json"


def _seen_file(local: Path) -> Path:
    return local.with_name(f".{local.name}.etag")


def _remember(local: Path, tag: str | None) -> None:
    if tag:
        _seen_file(local).write_text(tag)


def _seen(local: Path) -> str | None:
    p = _seen_file(local)
    return p.read_text() if p.exists() else None


@dataclass
class SharedStore:
    paths: ProjectPaths
    data_url: str | None
    models_url: str | None

    @classmethod
    def of(cls, paths: ProjectPaths) -> "SharedStore | None":
        return cls(paths, paths.data_url, paths.models_url) if (paths.data_url or paths.models_url) else None

    # ------------------------------------------------------------------ responses

    def _responses_url(self, batch: str, worker: str) -> str:
        return join(self.data_url, "responses", batch, f"{worker}.jsonl")

    def pull_responses(self, batch: str, worker: str) -> bool:
        """Take the store's file when it changed since this machine last saw it. True if downloaded."""
        if not self.data_url:
            return False
        local = self.paths.responses / batch / f"{worker}.jsonl"
        url = self._responses_url(batch, worker)
        tag = etag(url)
        if tag is None or tag == _seen(local):
            return False
        download(url, local)
        _remember(local, tag)
        return True

    def push_responses(self, batch: str, worker: str) -> bool:
        if not self.data_url:
            return False
        local = self.paths.responses / batch / f"{worker}.jsonl"
        if not local.exists():
            return False
        url = self._responses_url(batch, worker)
        put_bytes(url, local.read_bytes())
        _remember(local, etag(url))
        return True

    def pull_all_responses(self) -> int:
        """Every partition file on the store that changed since this machine saw it; returns how many."""
        if not self.data_url:
            return 0
        n = 0
        for batch in list_dirs(join(self.data_url, "responses")):
            for name, tag in list_names(join(self.data_url, "responses", batch), ".jsonl").items():
                local = self.paths.responses / batch / name
                if tag != _seen(local):
                    download(join(self.data_url, "responses", batch, name), local)
                    _remember(local, tag)
                    n += 1
        return n

    # ------------------------------------------------------------------ embeddings

    def pull_embeddings(self, cache_root: Path) -> int:
        """Shards (and meta.json) of every fingerprint on the store that this machine lacks."""
        if not self.data_url:
            return 0
        n = 0
        base = join(self.data_url, "embeddings")
        for fp in list_dirs(base):
            local_dir = cache_root / fp
            for name in list_names(join(base, fp)):
                if not (local_dir / name).exists():
                    download(join(base, fp, name), local_dir / name)
                    n += 1
        return n

    def push_embeddings(self, cache_root: Path) -> int:
        """Shards this machine wrote that the store lacks; meta.json only if the store has none."""
        if not self.data_url or not cache_root.is_dir():
            return 0
        n = 0
        base = join(self.data_url, "embeddings")
        for local_dir in sorted(p for p in cache_root.iterdir() if p.is_dir()):
            remote = list_names(join(base, local_dir.name))
            meta = local_dir / "meta.json"
            if meta.exists() and "meta.json" not in remote:
                try:
                    put_bytes(join(base, local_dir.name, "meta.json"), meta.read_bytes(), if_absent=True)
                except PreconditionFailed:
                    pass  # another machine wrote it first: same fingerprint, same meaning
            for shard in sorted(local_dir.glob("*.safetensors")):
                if shard.name not in remote:
                    put_bytes(join(base, local_dir.name, shard.name), shard.read_bytes())
                    n += 1
        return n

    # ------------------------------------------------------------------ checkpoints and the pointer

    def push_checkpoint(self, local_dir: Path) -> str | None:
        """Upload a checkpoint folder (content-addressed; manifest last) and the files written beside
        it since (`budget.json`, `policy.json`): `storage.sync_checkpoint`."""
        if not self.models_url:
            return None
        rel = local_dir.resolve().relative_to(self.paths.models.resolve()).as_posix()
        url = join(self.models_url, rel)
        sync_checkpoint(local_dir, url, last=MANIFEST)
        return url

    def pull_promoted(self) -> str | None:
        """The store's pointer and the checkpoint it names, into the local models folder, so the
        promotion step compares challengers against the deployment's king. Returns the pointer's
        version (for the compare-and-swap push), None when the store has no pointer."""
        if not self.models_url:
            return None
        version = etag(pointer_location(self.models_url))
        raw = get_bytes(pointer_location(self.models_url))
        if raw is None:
            return None
        pointer = json.loads(raw)
        rel = str(pointer["checkpoint"])
        local = self.paths.models / rel
        if not (local / MANIFEST).exists():  # the whole folder: weights, the files beside them, the manifest last
            download_dir(join(self.models_url, rel), local, last=MANIFEST)
        from fugu_pipeline.files import atomic_write

        atomic_write(self.paths.models / POINTER, raw)
        return version

    def push_promoted(self, expected_version: str | None) -> bool:
        """Publish the local pointer (and its checkpoint) when it differs from the store's, as a
        compare-and-swap on the version pulled before deciding. Raises PreconditionFailed when
        another machine promoted meanwhile (run the step again: it will face the new king)."""
        if not self.models_url:
            return False
        local = self.paths.models / POINTER
        if not local.exists():
            return False
        pointer = json.loads(local.read_text())
        king = self.paths.models / pointer["checkpoint"]
        self.push_checkpoint(king)  # the files beside it may be newer
        for other in run_checkpoints(king):  # the run's checkpoints its description sends a cap it cannot keep to
            if (self.paths.models / other / MANIFEST).is_file():
                self.push_checkpoint(self.paths.models / other)
        if get_bytes(pointer_location(self.models_url)) == local.read_bytes():
            return False
        if expected_version is None:
            put_bytes(pointer_location(self.models_url), local.read_bytes(), if_absent=True)
        else:
            put_bytes(pointer_location(self.models_url), local.read_bytes(), if_match=expected_version)
        return True


def run_checkpoints(checkpoint: Path) -> list[str]:
    """The tags `policy.json` beside a checkpoint names for caps it cannot keep (route/shipped.py), or []."""
    from fugu_pipeline.route.shipped import checkpoint_tag, read_shipped

    try:
        shipped = read_shipped(checkpoint, checkpoint_tag(checkpoint)[1])[0]
    except (OSError, ValueError):  # no manifest to read: nothing beside it is pushed either
        return []
    return sorted(shipped.cap_checkpoints()) if shipped is not None else []
