"""Crash-safe file replacement: a reader sees the old file or the new one, never half of one.

A writer killed between creating its temporary file and renaming it (`kill -9`, a power loss)
leaves `.<name>.<random>.tmp` beside the file. `remove_stale_temps` removes those, and only
those: a writer holds an exclusive `flock` on its temporary file from the moment it has opened it
until the rename, the kernel drops that lock when the writer dies, so a temporary file whose lock
can be taken has no live writer. A file younger than `STALE_TEMP_AGE_S` is left alone as well: it
covers the instant between creating the file and locking it.

`last_line` and `count_lines` read an append-only file by offset (the cost ledger's tail check).
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path

STALE_TEMP_AGE_S = 10.0


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
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until after the rename: see remove_stale_temps
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb", closefd=False) as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    return path


def remove_stale_temps(path: str | Path, min_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Remove the temporary files `atomic_write` left beside `path` when a writer died before its
    rename (see the module docstring); a live writer's file is never touched. Returns those removed."""
    path = Path(path)
    removed = []
    try:
        candidates = [p for p in path.parent.iterdir()
                      if p.name.startswith(f".{path.name}.") and p.name.endswith(".tmp")]
    except OSError:  # no folder yet: nothing was left
        return removed
    now = time.time()
    for p in candidates:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile (its writer renamed it), a link, or not ours to open
            continue
        try:
            st = os.fstat(fd)
            if not os.path.samestat(st, os.lstat(p)) or now - st.st_mtime < min_age_s:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer is alive
                continue
            p.unlink()
            removed.append(p)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


CHUNK_BYTES = 1 << 20  # what a streamed read holds in memory at once


class FileTooLargeError(ValueError):
    """A file larger than it may be, or not a regular file; refused before (or while) it is read."""


def _check_size(path: Path, st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FileTooLargeError(f"{path}: not a regular file (a folder, device, pipe or socket)")
    if st.st_size > limit:
        raise FileTooLargeError(f"{path}: {st.st_size:,} bytes, over the cap of {limit:,}")


def stream_file(path: str | Path, limit: int, *hashers, sink=None) -> int:
    """Read `path` once, in chunks of `CHUNK_BYTES`, into every hasher (`hashlib` objects) and into
    `sink` (a binary file) when given; the number of bytes. A device, pipe or socket, and a file
    of more than `limit` bytes, are refused (FileTooLargeError) without being read; a file that
    grows past `limit` while it is read is refused when the reading reaches the limit."""
    path = Path(path)
    _check_size(path, os.stat(path), limit)  # a FIFO would block `open` itself
    with open(path, "rb") as fh:
        _check_size(path, os.fstat(fh.fileno()), limit)  # the file opened, should the name have moved
        n = 0
        while chunk := fh.read(min(CHUNK_BYTES, limit + 1 - n)):
            n += len(chunk)
            if n > limit:
                raise FileTooLargeError(f"{path}: grew past the cap of {limit:,} bytes while being read")
            for h in hashers:
                h.update(chunk)
            if sink is not None:
                sink.write(chunk)
    return n


def count_lines(fd: int, end: int) -> int:
    """Newlines in the file's first `end` bytes (for a line number in an error)."""
    n, pos = 0, 0
    while pos < end:
        data = os.pread(fd, min(2**20, end - pos), pos)
        if not data:
            break
        n += data.count(b"\n")
        pos += len(data)
    return n


def last_line(fd: int, end: int) -> tuple[int, bytes]:
    """(offset, bytes) of the last line of the file's first `end` bytes (its newline included when it has one)."""
    block = 4096
    while True:
        start = max(0, end - block)
        data = os.pread(fd, end - start, start)
        nl = data.rfind(b"\n", 0, len(data) - 1)
        if nl >= 0 or start == 0:
            return start + nl + 1, data[nl + 1:]
        block *= 2
