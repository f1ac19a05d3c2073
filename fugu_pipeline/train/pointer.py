"""The promoted pointer: `models/promoted/current.json` names the promoted checkpoint.

Locally it is replaced atomically (temporary file, fsync, rename, fsync of the folder), so a
reader sees the old pointer or the new one, never half of one; each write first removes the
`.current.json.*.tmp` files an earlier writer killed mid-write left behind (never a live writer's:
`files.remove_stale_temps`). When `models_dir` is an
object-store URL (FUGU_MODELS_URL, fugu_pipeline/storage.py) it is one PUT of the whole object,
which S3 makes visible all at once, and `write_pointer(..., expected=...)` makes it a
compare-and-swap (If-Match), so two promotions cannot silently overwrite each other.
`checkpoint` is relative to the models folder (or absolute when the checkpoint lives elsewhere);
a relative path that leaves the models folder (`../x`) is refused. A pointer that does not parse,
is not a JSON object, or has no non-empty `checkpoint` string raises PointerError (one line: the
file, what is wrong, what to do), never a raw JSON or key error.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from fugu_pipeline.files import atomic_write, remove_stale_temps
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.storage import PreconditionFailed, etag, get_bytes, is_url, join, put_bytes

POINTER = Path("promoted") / "current.json"
ROLES_POINTER = Path("promoted") / "roles.json"  # the promoted multi-turn coordinator (its own king)
TRIAGE_POINTER = Path("promoted") / "triage.json"  # the promoted triage head (its own king)


class PointerError(CheckpointError):
    """The promoted pointer is damaged; the message names the file and the field."""


def pointer_location(models_dir: str | Path, pointer_file: Path = POINTER) -> str:
    return join(str(models_dir), pointer_file.as_posix()) if is_url(models_dir) else str(Path(models_dir) / pointer_file)


def read_pointer(models_dir: str | Path, pointer_file: Path = POINTER) -> dict | None:
    """The pointer, checked (`check_pointer`); None when there is none. PointerError when damaged."""
    where = pointer_location(models_dir, pointer_file)
    if is_url(models_dir):
        raw = get_bytes(where)
        if raw is None:
            return None
    else:
        if Path(where).exists() and not Path(where).is_file():  # a link to /dev/zero would be read forever
            raise _damaged(where, "not a regular file")
        if Path(models_dir).exists() and not Path(models_dir).is_dir():
            raise PointerError(f"{models_dir}: a file, not a models folder; pass the folder that holds "
                               f"{pointer_file.as_posix()} (e.g. models)")
        try:
            raw = Path(where).read_bytes()
        except FileNotFoundError:
            return None
    try:
        pointer = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _damaged(where, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise _damaged(where, "empty file" if not raw.strip() else f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return check_pointer(pointer, where)


def check_pointer(pointer, where: str | Path = POINTER) -> dict:
    """`pointer` when it is a JSON object whose `checkpoint` is a non-empty string that stays in the
    models folder when relative (and whose `content_hash`, when present, is a string); else PointerError."""
    if not isinstance(pointer, dict):
        raise _damaged(where, f"a JSON {type(pointer).__name__ if pointer is not None else 'null'}, not an object")
    ckpt = pointer.get("checkpoint")
    if "checkpoint" not in pointer:
        raise _damaged(where, 'no "checkpoint" field')
    if not isinstance(ckpt, str) or not ckpt.strip():
        raise _damaged(where, f'"checkpoint" is {json.dumps(ckpt)}, not a non-empty path string')
    if not (is_url(ckpt) or Path(ckpt).is_absolute()):
        norm = posixpath.normpath(ckpt.replace("\\", "/"))
        if norm == "." or norm == ".." or norm.startswith("../"):
            raise _damaged(where, f'"checkpoint" {ckpt!r} leaves the models folder')
    if not isinstance(pointer.get("content_hash", ""), str):
        raise _damaged(where, f'"content_hash" is {json.dumps(pointer.get("content_hash"))}, not a string')
    return pointer


def _damaged(where: str | Path, why: str) -> PointerError:
    return PointerError(f"{where}: not a valid promoted pointer ({why}); re-run promotion or restore it")


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
    remove_stale_temps(Path(models_dir) / pointer_file)
    return atomic_write(Path(models_dir) / pointer_file, text)


def pointer_target(models_dir: str | Path, pointer: dict) -> str | Path:
    """The checkpoint directory a pointer names (a URL when the models folder is one)."""
    p = check_pointer(pointer, pointer_location(models_dir))["checkpoint"]
    if is_url(p) or Path(p).is_absolute():
        return p if is_url(p) else Path(p)
    return join(str(models_dir), p) if is_url(models_dir) else Path(models_dir) / p
