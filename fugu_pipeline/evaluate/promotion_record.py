"""Where a promotion attempt is recorded and how the pointer is swapped (`promotion.py` decides).

`models/promoted/history.jsonl` gets one line per decision; the pointer is written first, so the
history never claims a promotion whose pointer was not written, and a write that fails is recorded
as a failed attempt the rate limit does not count. `promotion_lock` holds `models/promoted/.lock`
for a whole local attempt; `check_writable` is run before anything is scored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

from fugu_pipeline.evaluate.gates import DEFAULT_SUBMITTER
from fugu_pipeline.storage import PreconditionFailed
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.train.pointer import POINTER, PointerError, pointer_version, read_pointer, write_pointer


def append_history(models_dir: str | Path, record: dict, history: str = "history.jsonl") -> None:
    """Append one fsynced line to models/promoted/<history>."""
    path = Path(models_dir) / POINTER.parent / history
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_UNREAD = object()


def apply(decision, challenger, models_dir: str | Path, *, report_path: str | None = None,
          submitter: str = DEFAULT_SUBMITTER, extra: dict | None = None, expected_version=_UNREAD,
          pointer_file: Path = POINTER, history: str = "history.jsonl") -> dict | None:
    """Record the decision (`promotion.Decision`) on the challenger (`promotion.Candidate`); when it
    promotes, swap the pointer (a challenger outside the models folder is first copied into it).
    Returns the new pointer or None. `pointer_file` and `history`: the kind's (a coordinator's
    `promoted/roles.json` and `roles-history.jsonl`, ...).

    The pointer is written before the history line, so the history never says "promoted" for a
    pointer that was not written. `expected_version` (`pointer.pointer_version`, read before the
    king was loaded): the write is refused when the pointer changed since (another promotion), and
    the attempt is recorded as failed (not counted by the rate limit) and raised as CheckpointError."""
    from fugu_pipeline.train.exchange import import_checkpoint

    models_dir = Path(models_dir)
    now = _now()
    try:
        previous = read_pointer(models_dir, pointer_file)
    except PointerError:  # a damaged pointer being replaced (replace_broken_king): the history says why
        previous = None
    record = {"at": now, **decision.as_dict(), "method": challenger.method, "content_hash": challenger.content_hash,
              "previous": (previous or {}).get("checkpoint"), "submitter": submitter, **(extra or {})}
    if not decision.promote:
        append_history(models_dir, record, history)
        return None
    try:
        rel = relative_to(challenger.path, models_dir)
        if rel is None:  # a pack folder from elsewhere: keep a copy with the other checkpoints
            rel = relative_to(import_checkpoint(challenger.path, models_dir, expected_hash=challenger.content_hash),
                              models_dir)
        pointer = {"checkpoint": rel, "method": challenger.method, "content_hash": challenger.content_hash,
                   "promoted_at": now, "test_utility": challenger.mean, "reasons": decision.reasons,
                   "composite": decision.figures.get("composite"), "submitter": submitter,
                   "report": report_path, "previous": (previous or {}).get("checkpoint")}
        if expected_version is not _UNREAD and pointer_version(models_dir, pointer_file) != expected_version:
            raise PreconditionFailed(f"{models_dir / pointer_file} changed since it was read: another promotion replaced the king")
        write_pointer(models_dir, pointer, pointer_file)
    except (OSError, CheckpointError, PreconditionFailed) as exc:
        why = f"the promoted pointer was not written: {exc}"
        append_history(models_dir, {**record, "promote": False, "reasons": [*record["reasons"], f"FAIL {why}"],
                                    "not_an_attempt": True}, history)
        raise CheckpointError(f"{models_dir / pointer_file}: {why}; nothing was promoted, run the promotion again "
                              "(it faces the current king)") from None
    append_history(models_dir, record, history)
    return pointer


def relative_to(path: str | Path, models_dir: Path) -> str | None:
    """`path` relative to the models folder, or None when it is outside. Lexical (symlinks are not
    resolved): a `models/<method>` that links elsewhere is still inside the models folder."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(models_dir))
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else Path(rel).as_posix()


def check_writable(models_dir: str | Path) -> None:
    """CheckpointError (one line) unless the models folder and models/promoted/ take new files and
    history.jsonl takes a line: checked before anything is scored (live calls cost money)."""
    models_dir = Path(models_dir)
    promoted = models_dir / POINTER.parent
    try:
        promoted.mkdir(parents=True, exist_ok=True)
        for folder in (models_dir, promoted):
            with tempfile.TemporaryFile(dir=folder, prefix=".writable-"):
                pass
        os.close(os.open(promoted / "history.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as exc:
        where = exc.filename or promoted
        raise CheckpointError(f"{where}: cannot write ({exc.strerror or exc}); promotion records every attempt in "
                              f"{promoted} and may copy the challenger into {models_dir}: make them writable "
                              "or pass another --models-dir. Nothing was scored") from None


@contextlib.contextmanager
def promotion_lock(models_dir: str | Path, name: str = ".lock"):
    """Hold models/promoted/<name> for one whole promotion attempt (flock: also between threads):
    a second attempt waits, then faces the king the first one promoted."""
    path = Path(models_dir) / POINTER.parent / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _pointer_or_none(models_dir: str | Path, pointer_file: Path = POINTER) -> dict | None:
    try:
        return read_pointer(models_dir, pointer_file)
    except PointerError:
        return None
