"""Object-store paths (fsspec / universal-pathlib): what machines share through `s3://...` (or
`gs://`, `az://`, `file://`) URLs for `data/` and `models/`.

Settings (environment):
- FUGU_DATA_URL, FUGU_MODELS_URL: the shared `data/` and `models/` (unset: local only).
- FUGU_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL): an S3-compatible service other than AWS (MinIO, a
  loopback moto server); credentials come the usual way (AWS_ACCESS_KEY_ID, ...).
- FUGU_STORE_RETRIES (default 5): attempts per request, with backoff, for answers that are safe to
  repeat (5xx, throttling, timeouts, dropped connections). Every request here is safe to repeat:
  a whole-object GET, a whole-object PUT of the same bytes, a listing; nothing appends.
- FUGU_STORE_TIMEOUT_S (default 30): connect and read timeout of one request.
When the retries run out, StoreError names the service, the operation, the URL and these settings.

What "atomic" means on a store (the contract each writer keeps):
- S3 (and GCS, Azure Blob) has no rename: a copy plus delete is two requests, not atomic. A PUT,
  though, replaces one object whole, and S3 reads are strongly consistent after it: a reader sees
  the old object or the new one, never half. So every file that must be read whole (the promoted
  pointer, a response file, an embedding shard, meta.json) is one PUT of the finished bytes, never
  a write-then-rename. Where two writers could race on one key, the write is a conditional PUT:
  `put_bytes(..., if_absent=True)` (`If-None-Match: *`: the first writer wins, e.g. an
  embedding-cache meta.json) and `put_bytes(..., if_match=etag)` (compare-and-swap, e.g. the
  promoted pointer, so two promotions can never silently overwrite each other).
- An artefact of several objects (a checkpoint: weights + manifest) is committed by its last
  object: the manifest is written after the weights and names their sha256, so a reader never takes
  a checkpoint without a manifest, and a manifest whose weights do not match is refused on load.
- `file://` paths and local paths keep write-then-rename (fugu_pipeline/files.py).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fugu_pipeline.files import atomic_write
from fugu_pipeline.settings import env_name, settings

class StoreError(RuntimeError):
    """The object store did not answer, or refused; the message names the service and the settings."""


class PreconditionFailed(StoreError):
    """A conditional PUT lost: the object exists (if_absent) or changed (if_match) since it was read."""


def is_url(path: str | os.PathLike | None) -> bool:
    """True for an object-store URL (s3://, gs://, memory://, ...); local paths and file:// are not."""
    s = str(path or "")
    return "://" in s and not s.startswith("file://")


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])


def endpoint() -> str | None:
    return settings().s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None


def retries() -> int:
    return settings().store_retries


def timeout_s() -> float:
    return settings().store_timeout_s


def service(url: str) -> str:
    scheme = url.split("://", 1)[0]
    if scheme in ("s3", "s3a"):
        where = endpoint() or "AWS S3"
        return f"S3 at {where}"
    return f"the {scheme}:// store"


def settings_note(url: str) -> str:
    fields = ["store_retries", "store_timeout_s"]
    if url.startswith("s3"):
        fields.insert(0, "s3_endpoint_url")
    now = settings()
    return ", ".join(f"{env_name(f)}={getattr(now, f) if f in now.model_fields_set else '(default)'}" for f in fields)


_FS_CACHE: dict[tuple, Any] = {}


def filesystem(url: str):
    """The fsspec filesystem for a URL, with the endpoint, timeouts and the SDK's own retries off
    (retries happen here, the same way for every store, so the final error can say how many)."""
    import fsspec

    scheme = url.split("://", 1)[0]
    key = (scheme, endpoint(), timeout_s())
    if key not in _FS_CACHE:
        options: dict[str, Any] = {}
        if scheme in ("s3", "s3a"):
            client_kwargs = {"endpoint_url": endpoint()} if endpoint() else {}
            options = {"client_kwargs": client_kwargs,
                       "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                                         "connect_timeout": timeout_s(), "read_timeout": timeout_s()}}
        fs = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
        if hasattr(fs, "retries"):
            fs.retries = 1  # s3fs's own retry loop: off, ours counts
        _FS_CACHE[key] = fs
    return _FS_CACHE[key]


def upath(url: str):
    """A universal-pathlib path over the same filesystem (for code that walks paths)."""
    from upath import UPath

    return UPath(url, **getattr(filesystem(url), "storage_options", {}))


def _status(exc: BaseException | None) -> int | None:
    """The HTTP status behind an error, looking through the causes (s3fs re-raises botocore's
    ClientError as an OSError with an errno, the status kept on the cause)."""
    seen = 0
    while exc is not None and seen < 8:
        for attr in ("status_code", "status"):
            v = getattr(exc, attr, None)
            if isinstance(v, int):
                return v
        resp = getattr(exc, "response", None)
        if isinstance(resp, dict) and resp.get("ResponseMetadata", {}).get("HTTPStatusCode"):
            return resp["ResponseMetadata"]["HTTPStatusCode"]
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _transient(exc: BaseException) -> bool:
    """Safe to send again: the service failed (5xx), throttled, timed out or dropped the connection."""
    if isinstance(exc, (FileNotFoundError, PreconditionFailed, PermissionError)):
        return False
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    text = f"{type(exc).__name__} {exc}".lower()
    return any(s in text for s in ("timeout", "timed out", "connection", "slowdown", "internalerror",
                                   "serviceunavailable", "503", "500", "reset by peer", "broken pipe"))


def call(op: str, url: str, fn: Callable[[], Any]) -> Any:
    """Run one store request, retrying transient failures with jittered exponential backoff."""
    attempts = retries()
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (FileNotFoundError, PreconditionFailed):
            raise
        except Exception as exc:  # noqa: BLE001  (classified below; fsspec backends raise their own types)
            if _precondition(exc):
                raise PreconditionFailed(f"{op} {url}: precondition failed (another writer got there first)") from None
            last = exc
            if not _transient(exc) or attempt == attempts:
                break
            time.sleep(min(4.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random()))
    status = _status(last) if last else None
    what = f"HTTP {status}" if status else f"{type(last).__name__}: {str(last)[:200]}"
    tried = f"after {attempt} attempt(s)" if last is not None and _transient(last) else "not retried (not a transient error)"
    raise StoreError(f"{service(url)} failed {op} {url}: {what}, {tried}. Check the service, or the settings "
                     f"({settings_note(url)})") from last


def _precondition(exc: BaseException) -> bool:
    # s3fs turns S3's 412 into FileExistsError ("pre-conditions you specified did not hold")
    text = f"{type(exc).__name__} {exc}"
    return (_status(exc) == 412 or isinstance(exc, FileExistsError) or "PreconditionFailed" in text
            or "pre-conditions you specified did not hold" in text)


# --------------------------------------------------------------------------- whole objects


def get_bytes(url: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    if not is_url(url):
        p = Path(url.removeprefix("file://"))
        return p.read_bytes() if p.exists() else None
    fs = filesystem(url)
    try:
        return call("GET", url, lambda: fs.cat_file(url))
    except FileNotFoundError:
        return None


def etag(url: str) -> str | None:
    """The object's version tag (None when absent); for local files, a hash of the content."""
    if not is_url(url):
        data = get_bytes(url)
        return None if data is None else hashlib.sha256(data).hexdigest()
    fs = filesystem(url)
    try:
        info = call("HEAD", url, lambda: fs.info(url))
    except FileNotFoundError:
        return None
    return str(info.get("ETag") or info.get("etag") or info.get("md5") or info.get("size"))


def put_bytes(url: str, data: bytes | str, *, if_absent: bool = False, if_match: str | None = None) -> None:
    """Replace the object whole (one PUT; write-then-rename for local paths). `if_absent`: only
    when it does not exist yet; `if_match`: only when its etag is still this one. Either raises
    PreconditionFailed when another writer got there first."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not is_url(url):
        path = Path(url.removeprefix("file://"))
        if if_absent and path.exists():
            raise PreconditionFailed(f"{path} exists")
        if if_match is not None and etag(str(path)) != if_match:
            raise PreconditionFailed(f"{path} changed since it was read")
        atomic_write(path, raw)
        return
    fs = filesystem(url)
    kwargs: dict[str, str] = {}
    if if_absent:
        kwargs["IfNoneMatch"] = "*"
    if if_match is not None:
        kwargs["IfMatch"] = if_match
    call("PUT", url, lambda: fs.pipe_file(url, raw, **kwargs))


def remove(url: str) -> None:
    """Delete one object; one that is not there is no error (as S3's DELETE)."""
    if not is_url(url):
        Path(url.removeprefix("file://")).unlink(missing_ok=True)
        return
    fs = filesystem(url)
    try:
        call("DELETE", url, lambda: fs.rm_file(url))
    except FileNotFoundError:
        pass


def list_names(url: str, suffix: str = "") -> dict[str, str]:
    """name -> etag of the objects directly under `url` (a "folder"); {} when none."""
    if not is_url(url):
        d = Path(url.removeprefix("file://"))
        return {p.name: str(p.stat().st_mtime_ns) for p in d.iterdir() if p.is_file() and p.name.endswith(suffix)} if d.is_dir() else {}
    fs = filesystem(url)
    try:
        entries = call("LIST", url, lambda: fs.ls(url, detail=True, refresh=True))
    except FileNotFoundError:
        return {}
    out = {}
    for e in entries:
        if e.get("type") == "file" and e["name"].endswith(suffix):
            out[e["name"].rsplit("/", 1)[-1]] = str(e.get("ETag") or e.get("size"))
    return out


def list_dirs(url: str) -> list[str]:
    if not is_url(url):
        d = Path(url.removeprefix("file://"))
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []
    fs = filesystem(url)
    try:
        entries = call("LIST", url, lambda: fs.ls(url, detail=True, refresh=True))
    except FileNotFoundError:
        return []
    return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")


# --------------------------------------------------------------------------- folders


def download(url: str, local: Path) -> bool:
    """Copy one object to a local file (write-then-rename). False when the object does not exist."""
    data = get_bytes(url)
    if data is None:
        return False
    atomic_write(local, data)
    return True


def sync_checkpoint(local: Path, url: str, last: str) -> int:
    """Bring a checkpoint folder on the store up to date with `local`: its weights and `last` (the
    manifest, which commits the set: uploaded after the others) when the store lacks them (the folder
    is content-addressed, so they never change), and every small JSON file beside them (a budget
    calibration, the description of what ships) whenever the store's bytes differ, as they are written
    after the checkpoint, and removed from the store when they are gone here (a description of what
    ships, written when the heads shipped, removed when a cascade ships instead). The folder's own
    files only, as `download_dir` copies them back (a report folder written inside it stays local).
    Returns the number of objects written or removed."""
    files = sorted(p for p in local.iterdir() if p.is_file() and not p.name.startswith("."))
    files.sort(key=lambda p: p.name == last)  # stable: the commit object goes last
    n = 0
    for p in files:
        target = join(url, p.name)
        mutable = p.suffix == ".json" and p.name != last
        if mutable and get_bytes(target) == p.read_bytes():
            continue
        if not mutable and etag(target) is not None:
            continue
        put_bytes(target, p.read_bytes())
        n += 1
    here = {p.name for p in files}
    for name in list_names(url, ".json"):
        if name != last and name not in here:
            remove(join(url, name))
            n += 1
    return n


def download_dir(url: str, local: Path, last: str) -> list[str]:
    """Every object directly under `url` into `local` (each written then renamed), `last` (the
    commit object) after the others. Returns the names copied."""
    names = sorted(sorted(list_names(url)), key=lambda n: n == last)
    for name in names:
        download(join(url, name), local / name)
    return names


def local_cache(url: str) -> Path:
    """Where this machine keeps its copies of objects under `url` (FUGU_STORE_CACHE, default
    ~/.cache/fugu_pipeline/store/<hash of the URL>)."""
    return settings().store_cache_dir() / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
