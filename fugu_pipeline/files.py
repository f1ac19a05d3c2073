"""Crash-safe file replacement: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(x.split()[1], 8) for x in fh if x.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022


def _mode_for(path: Path) -> int:
    """The mode a replaced file keeps, or the one `open` would give a new file (mkstemp's 0600
    would hide a shared matrix or pointer from the other users of a project)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path`, and fsync
    the folder so the rename itself survives a power loss. The file keeps its mode (a new one gets
    the umask's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
