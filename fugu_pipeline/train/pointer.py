"""The promoted pointer: `models/promoted/current.json` names the promoted checkpoint (DESIGN §3).

Locally it is replaced atomically (temporary file, fsync, rename, fsync of the folder), so a
reader sees the old pointer or the new one, never half of one. When `models_dir` is an
object-store URL (FUGU_MODELS_URL, fugu_pipeline/storage.py) it is one PUT of the whole object,
which S3 makes visible all at once, and `write_pointer(..., expected=...)` makes it a
compare-and-swap (If-Match), so two promotions cannot silently overwrite each other.
`checkpoint` is relative to the models folder (or absolute when the checkpoint lives elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

from fugu_pipeline.files import atomic_write
from fugu_pipeline.storage import PreconditionFailed, etag, get_bytes, is_url, join, put_bytes

POINTER = Path("promoted") / "current.json"
ROLES_POINTER = Path("promoted") / "roles.json"  # the promoted multi-turn coordinator (its own king)


def pointer_location(models_dir: str | Path, pointer_file: Path = POINTER) -> str:
    return join(str(models_dir), pointer_file.as_posix()) if is_url(models_dir) else str(Path(models_dir) / pointer_file)


def read_pointer(models_dir: str | Path, pointer_file: Path = POINTER) -> dict | None:
    if is_url(models_dir):
        raw = get_bytes(pointer_location(models_dir, pointer_file))
        return None if raw is None else json.loads(raw)
    path = Path(models_dir) / pointer_file
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def pointer_version(models_dir: str | Path, pointer_file: Path = POINTER) -> str | None:
    """The pointer's current version (etag), for a compare-and-swap write; None when absent."""
    return etag(pointer_location(models_dir, pointer_file))


def write_pointer(models_dir: str | Path, pointer: dict, pointer_file: Path = POINTER,
                  expected: str | None = None) -> str | Path:
    """Atomically replace models/promoted/current.json (or `pointer_file`): a reader sees the old
    or the new one. `expected`: the version read before deciding (pointer_version); the write
    fails with storage.PreconditionFailed when another promotion replaced it since."""
    text = json.dumps(pointer, indent=2, sort_keys=True) + "\n"
    where = pointer_location(models_dir, pointer_file)
    if is_url(models_dir):
        put_bytes(where, text, if_match=expected)
        return where
    if expected is not None and pointer_version(models_dir, pointer_file) != expected:
        raise PreconditionFailed(f"{where} changed since it was read")
    return atomic_write(Path(models_dir) / pointer_file, text)


def pointer_target(models_dir: str | Path, pointer: dict) -> str | Path:
    """The checkpoint directory a pointer names (a URL when the models folder is one)."""
    p = str(pointer["checkpoint"])
    if is_url(p) or Path(p).is_absolute():
        return p if is_url(p) else Path(p)
    return join(str(models_dir), p) if is_url(models_dir) else Path(models_dir) / p
