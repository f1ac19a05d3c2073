"""The response store: one append-only JSON Lines file per (batch, worker) partition.

`<root>/<batch>/<worker>.jsonl`. Each finished call is one line written with a single `write(2)`
on an O_APPEND descriptor and fsync'ed before the next result is taken, so a kill at any instant
loses at most the calls in flight. A torn last line (power loss mid-write) is ignored on read and
cut off before the next append. Partition runs never touch DuckDB.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path

from fugu_pipeline.collect.records import CallRecord


# A quote, then a colon: every key of a line ends so; an escaped quote inside a string can too, so
# the count is an upper bound on the keys, never fewer.
_KEY_END = re.compile(rb'"\s*:')


def _first_wins(pairs: list) -> dict:
    d: dict = {}
    for k, v in pairs:
        d.setdefault(k, v)
    return d


def _repeats(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise KeyError("a key repeats")
    return d


def _record(raw: bytes) -> CallRecord | None:
    """The call record of a line, None when it is not one. strict: a string where a number belongs
    (or the reverse) is damage, as in the bulk build. A key named twice: its first value holds, as
    in the bulk build's read_json (the validator alone would keep the last)."""
    try:
        rec = CallRecord.model_validate_json(raw, strict=True)
    except ValueError:
        rec = None
    if rec is not None and not _repeats_a_key(raw, rec):
        return rec
    if rec is None and not _repeats_a_key(raw, None):
        return None
    try:
        return CallRecord.model_validate_json(json.dumps(json.loads(raw, object_pairs_hook=_first_wins)), strict=True)
    except ValueError:
        return None


def _repeats_a_key(raw: bytes, rec: CallRecord | None) -> bool:
    """Whether the line names a key twice: the validator keeps the last value, DuckDB's read_json
    (the bulk build) the first, and the two builds must agree. Cheap for a record's usual line: when
    the key ends counted equal the fields it set, no key can repeat; only otherwise (or for a line
    that is not a record: `rec` None) is the line parsed again to find out."""
    if rec is not None and len(_KEY_END.findall(raw)) == len(rec.model_fields_set):
        return False
    try:
        json.loads(raw, object_pairs_hook=_repeats)
    except KeyError:
        return True
    except ValueError:
        return False
    return False


class PartitionBusyError(RuntimeError):
    pass


class PartitionRecords(dict):
    """The latest record of every cell of a partition (task_id -> CallRecord), plus the lines of its
    file that could not be read: `skipped_lines` (1-based line numbers). A torn last line is what a
    crash mid-write leaves (its call is simply made again); an unreadable line before it is damage."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.skipped_lines: list[int] = []
        self.torn_last_line = False

    @property
    def n_skipped(self) -> int:
        return len(self.skipped_lines)

    def skipped_note(self) -> str | None:
        """One line saying how many lines were skipped and where; None when none were."""
        if not self.skipped_lines:
            return None
        shown = ", ".join(map(str, self.skipped_lines[:10])) + (" ..." if self.n_skipped > 10 else "")
        damaged = self.n_skipped - int(self.torn_last_line)
        what = []
        if damaged:
            what.append(f"{damaged} damaged (not JSON, not a call record, or a record of another partition: "
                        "those cells are called again)")
        if self.torn_last_line:
            what.append("a torn last line (a write cut off by a crash; cut before the next append)")
        return f"{self.path}: skipped {self.n_skipped} unreadable line(s) (line {shown}): " + "; ".join(what)


class ResponseStore:
    """The per-partition response files under `root`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, batch: str, worker_id: str) -> Path:
        return self.root / batch / f"{worker_id}.jsonl"

    def read(self, batch: str, worker_id: str) -> PartitionRecords:
        """The latest record of every cell of the partition (a later line replaces an earlier).
        Lines that cannot be read are skipped and counted, with their line numbers
        (`PartitionRecords.skipped_lines`, `skipped_note()`), never silently: a line that is not
        JSON, not a call record (a field missing, of the wrong JSON type, or a number a call cannot
        produce: `records.py`), or the record of another worker or batch than the file's."""
        p = self.path(batch, worker_id)
        out = PartitionRecords(p)
        if not p.exists():
            return out
        with p.open("rb") as fh:
            data = fh.read()
        lines = data.split(b"\n")
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            rec = _record(raw)
            if rec is None:
                out.skipped_lines.append(lineno)
                out.torn_last_line = lineno == len(lines)  # no newline after it: cut off mid-write
                continue
            if rec.worker_id != worker_id or rec.batch != batch:  # a record of another partition, pasted here
                out.skipped_lines.append(lineno)
                out.torn_last_line = False
                continue
            out[rec.task_id] = rec
        return out

    def batches(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def collected_batches(self) -> set[str]:
        """The batches with at least one non-empty partition file: some of their cells were paid for
        (a batch refused before collection has none). Their task ids come first (`tasks/loading.py`)."""
        out = set()
        for b in self.batches():
            try:
                if any(p.stat().st_size for p in (self.root / b).glob("*.jsonl")):
                    out.add(b)
            except OSError:  # a file removed meanwhile
                continue
        return out

    def open_writer(self, batch: str, worker_id: str) -> "PartitionWriter":
        return PartitionWriter(self.path(batch, worker_id))


class PartitionWriter:
    """Exclusive appender for one partition file (a second concurrent run fails clearly)."""

    def __init__(self, path: Path):
        self.path = path
        self.cut_tail_bytes = 0  # bytes of a torn last line cut off on open
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise PartitionBusyError(
                f"{path}: another run is collecting this partition right now; wait for it to finish"
            ) from None
        self._repair_tail()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the new file's directory entry is durable too
        finally:
            os.close(dfd)

    def _repair_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 1))
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            cut = data.rfind(b"\n") + 1
            self.cut_tail_bytes = len(data) - cut
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: CallRecord) -> None:
        line = record.model_dump_json().encode("utf-8") + b"\n"
        n = os.write(self._fd, line)
        if n != len(line):  # regular files do not short-write short lines, but never assume
            raise OSError(f"{self.path}: short write ({n} of {len(line)} bytes)")
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    def __enter__(self) -> "PartitionWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
