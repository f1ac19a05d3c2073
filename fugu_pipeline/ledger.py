"""The cost ledger: every paid call a project makes, one hash-chained line each.

    data/ledger/costs.jsonl        (`LEDGER_FILE`, relative to the project)

One `LedgerEntry` a line: what was paid for (`kind`: `collection` a worker's answer to a task,
`judge` the grading call behind it, `session` one turn of a multi-turn session, `live` a call of
the composite's live term, `import` the recorded cost of imported routing data), the worker, the
task, what it cost, and `prev`, the hash of the line before (the first line's `prev` is
`GENESIS`). A line's `hash` is the sha256 of its canonical JSON without `hash`. Editing, dropping
or reordering any line breaks every hash after it, so the last line's hash (the ledger's head)
pins the whole history.

A training receipt (`train/exchange.py`) cites the head, the number of lines and the totals per
kind; `verify_ledger` recomputes all of them from the file, so a receipt whose figures the
ledger does not support is refused (`evaluate/gates.py`).

Appending is cheap and safe with several writers: the file is held open; each append takes an
exclusive `flock`, reads the previous hash (remembered from this process's last append when the
file did not grow since, else from the file's last line), writes one line with a single
`write(2)` on an O_APPEND descriptor, fsyncs, and lets go. A torn last line (a crash mid-write)
is cut before the next append, as in the response store. One fsync per paid call of collection,
beside the one the response store already makes (`benchmarks/bench_clients.py --ledger` measures
both); session turns, which a coordinator's training makes by the ten thousand, are appended in
batches (`append_many`: one write and one fsync for up to 256 lines, and at the end of the run).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.hashing import canonical_json, sha256_text

LEDGER_FILE = Path("data") / "ledger" / "costs.jsonl"
GENESIS = "0" * 64
KINDS = ("collection", "judge", "session", "live", "import")
PAID_FOR_TRAINING = ("collection", "judge", "session", "import")  # what a head's training data can have cost
Kind = Literal["collection", "judge", "session", "live", "import"]


class LedgerError(ValueError):
    """The ledger is damaged (a broken chain, a line that does not parse); the message names the line."""


class LedgerEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1, description="1 for the first line, then one more each line")
    at: float = Field(description="unix time of the append")
    kind: Kind
    worker_id: str = ""
    task_id: str = ""
    ref: str = Field("", description="where the call belongs: a batch, a session head, a head judged live, an import file")
    cost_usd: float = Field(ge=0)
    prev: str
    hash: str = ""

    def digest(self) -> str:
        return sha256_text(canonical_json(self.model_dump(mode="json", exclude={"hash"})))


class KindTotal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    cost_usd: float = 0.0


class LedgerSummary(BaseModel):
    """What a receipt cites and a host recomputes: the head hash, the number of lines, the totals."""

    model_config = ConfigDict(extra="forbid")

    head: str = GENESIS
    lines: int = 0
    totals: dict[str, KindTotal] = Field(default_factory=dict)

    def paid(self, kinds: tuple[str, ...] = PAID_FOR_TRAINING) -> float:
        return float(sum(t.cost_usd for k, t in self.totals.items() if k in kinds))

    def describe(self) -> str:
        parts = ", ".join(f"{k} {t.calls} for ${t.cost_usd:.4f}" for k, t in sorted(self.totals.items())) or "no paid call"
        return f"{self.lines} line(s), head {self.head[:12]}…: {parts}"


def _round(x: float) -> float:
    return round(float(x), 10)


def summarize(entries: list[LedgerEntry]) -> LedgerSummary:
    totals: dict[str, KindTotal] = {}
    for e in entries:
        t = totals.setdefault(e.kind, KindTotal())
        t.calls += 1
        t.cost_usd += e.cost_usd
    for t in totals.values():
        t.cost_usd = _round(t.cost_usd)
    return LedgerSummary(head=entries[-1].hash if entries else GENESIS, lines=len(entries), totals=totals)


def read_entries(path: str | Path) -> list[LedgerEntry]:
    """Every line of a ledger, with its chain checked; LedgerError (naming the line) when a line
    does not parse, is out of sequence, or does not hold the previous line's hash or its own.
    A missing file is an empty ledger; a torn last line (no newline) is not a line yet."""
    p = Path(path)
    if not p.exists():
        return []
    if not p.is_file():
        raise LedgerError(f"{p}: not a regular file")
    raw = p.read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] != b"":  # a torn last line: what a crash mid-write leaves
        lines = lines[:-1]
    out: list[LedgerEntry] = []
    prev = GENESIS
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            if n == len(lines):
                break
            raise LedgerError(f"{p} line {n}: empty line inside the ledger")
        try:
            e = LedgerEntry.model_validate_json(line)
        except ValueError as exc:
            raise LedgerError(f"{p} line {n}: not a ledger entry ({str(exc).splitlines()[0][:160]})") from None
        if e.seq != n:
            raise LedgerError(f"{p} line {n}: seq {e.seq}, expected {n} (a line dropped or moved)")
        if e.prev != prev:
            raise LedgerError(f"{p} line {n}: prev {e.prev[:12]}… is not the hash of line {n - 1} ({prev[:12]}…): "
                              "a line before it was edited, dropped or reordered")
        if e.digest() != e.hash:
            raise LedgerError(f"{p} line {n}: its hash does not match its content (edited: cost, worker, task or time)")
        out.append(e)
        prev = e.hash
    return out


def verify_ledger(path: str | Path) -> LedgerSummary:
    """The recomputed summary of a ledger file (LedgerError when its chain is broken)."""
    return summarize(read_entries(path))


class CostLedger:
    """Appends to one ledger file (module docstring). Thread-safe; several processes may append."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._known: tuple[int, str, int] | None = None  # (file size, last hash, last seq) after our last append

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _tail(self, fd: int) -> tuple[str, int]:
        """(hash, seq) of the last complete line; a torn last line is cut first."""
        size = os.fstat(fd).st_size
        if self._known is not None and self._known[0] == size:
            return self._known[1], self._known[2]
        if size == 0:
            return GENESIS, 0
        block = 4096
        while True:
            start = max(0, size - block)
            data = os.pread(fd, size - start, start)
            if not data.endswith(b"\n"):
                cut = data.rfind(b"\n")
                if cut < 0 and start > 0:
                    block *= 2
                    continue
                os.ftruncate(fd, start + cut + 1)
                os.fsync(fd)
                size = start + cut + 1
                if size == 0:
                    return GENESIS, 0
                continue
            body = data[:-1]
            nl = body.rfind(b"\n")
            if nl < 0 and start > 0:
                block *= 2
                continue
            last = LedgerEntry.model_validate_json(body[nl + 1:])
            return last.hash, last.seq

    def append(self, kind: str, cost_usd: float, *, worker_id: str = "", task_id: str = "", ref: str = "") -> LedgerEntry:
        return self.append_many([(kind, cost_usd, worker_id, task_id, ref)])[0]

    def append_many(self, calls: list[tuple[str, float, str, str, str]]) -> list[LedgerEntry]:
        """Append (kind, cost_usd, worker_id, task_id, ref) lines in one write and one fsync."""
        if not calls:
            return []
        with self._lock:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                prev, seq = self._tail(fd)
                out = []
                for kind, cost_usd, worker_id, task_id, ref in calls:
                    seq += 1
                    e = LedgerEntry(seq=seq, at=round(time.time(), 3), kind=kind, worker_id=worker_id, task_id=task_id,
                                    ref=ref, cost_usd=_round(max(0.0, float(cost_usd or 0.0))), prev=prev)
                    e.hash = prev = e.digest()
                    out.append(e)
                data = b"".join(e.model_dump_json().encode("utf-8") + b"\n" for e in out)
                n = os.write(fd, data)
                if n != len(data):
                    raise OSError(f"{self.path}: short write ({n} of {len(data)} bytes)")
                os.fsync(fd)
                self._known = (os.fstat(fd).st_size, out[-1].hash, out[-1].seq)
                return out
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._known = None

    def __enter__(self) -> "CostLedger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def project_ledger(project_dir: str | Path) -> Path:
    return Path(project_dir) / LEDGER_FILE
