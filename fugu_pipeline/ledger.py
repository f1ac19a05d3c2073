"""The cost ledger: every paid call a project makes, one hash-chained line each.

    data/ledger/costs.jsonl        (`LEDGER_FILE`, relative to the project)

One `LedgerEntry` a line: what was paid for (`kind`: `collection` a worker's answer to a task,
`judge` the grading call behind it, `session` one turn of a multi-turn session, `live` a call of
the composite's live term, `import` the recorded cost of imported routing data), the worker, the
task, what it cost, and `prev`, the hash of the line before (the first line's `prev` is
`GENESIS`). A line's `hash` is the sha256 of its canonical JSON without `hash`. Editing, dropping
or reordering any line breaks every hash after it, so the last line's hash (the ledger's head)
pins the whole history. Each line is signed by the collector that wrote it (`collector_key.py`:
`key` the fingerprint of its ed25519 key, `sig` the signature of `hash`), so the head alone does
not pin the figures: a ledger written from scratch, or edited with its hashes recomputed, carries
no signature of a key the host trusts, and `verify_ledger(path, trusted)` names its first such line.

A training receipt (`train/exchange.py`) cites the head, the number of lines and the totals per
kind; `verify_ledger` recomputes all of them from the file, so a receipt whose figures the
ledger does not support is refused (`evaluate/gates.py`).

Appending is cheap and safe with several writers: the file is held open; each append takes an
exclusive `flock`, reads the previous hash (remembered from this process's last append when the
file did not grow since, else from the file's last line), writes one line with a single
`write(2)` on an O_APPEND descriptor, fsyncs, and lets go. A torn last line (a crash mid-write)
or a last line that is not a ledger entry (garbage) is cut before the next append, with a warning,
and collection goes on; a kill at any instant loses at most the lines of the write in flight. One fsync per paid call of collection,
beside the one the response store already makes (`benchmarks/bench_clients.py --ledger` measures
both); session turns, which a coordinator's training makes by the ten thousand, are appended in
batches (`append_many`: one write and one fsync for up to 256 lines, and at the end of the run).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.collector_key import CollectorKey, LineVerifier, load_collector_key
from fugu_pipeline.hashing import canonical_json, sha256_text

log = logging.getLogger(__name__)

LEDGER_FILE = Path("data") / "ledger" / "costs.jsonl"
GENESIS = "0" * 64
MAX_GARBAGE_TAIL_LINES = 16  # a file that ends with more lines that are not entries is not a ledger: not cut
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
    key: str = Field("", description="fingerprint of the collector key that signed the line (collector_key.py)")
    hash: str = ""
    sig: str = Field("", description="the collector's ed25519 signature of `hash` (base64)")

    def digest(self) -> str:
        body = self.model_dump(mode="json", exclude={"hash", "sig"})
        if not body["key"]:  # an unsigned line hashes as lines did before lines were signed
            del body["key"]
        return sha256_text(canonical_json(body))


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


def read_entries(path: str | Path, trusted: dict[str, str] | None = None) -> list[LedgerEntry]:
    """Every line of a ledger, with its chain checked; LedgerError (naming the line) when a line
    does not parse, is out of sequence, or does not hold the previous line's hash or its own.
    With `trusted` (fingerprint -> public key, `collector_key.trusted_keys`), every line must also
    be signed by one of those keys. A missing file is an empty ledger; a torn last line (no
    newline) is not a line yet."""
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
    verifier = LineVerifier(trusted) if trusted is not None else None
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
        why = verifier.problem(e.key, e.hash, e.sig) if verifier is not None else None
        if why:
            raise LedgerError(f"{p} line {n}: {why}")
        out.append(e)
        prev = e.hash
    return out


def verify_ledger(path: str | Path, trusted: dict[str, str] | None = None) -> LedgerSummary:
    """The recomputed summary of a ledger file (LedgerError when its chain is broken, or with
    `trusted`, when a line is not signed by a trusted collector key)."""
    return summarize(read_entries(path, trusted))


class CostLedger:
    """Appends to one ledger file (module docstring). Thread-safe; several processes may append.
    `key`: the collector key that signs each line (default: the host's, made on first use; it is
    loaded here, so a key that cannot be used stops collection before any call is paid)."""

    def __init__(self, path: str | Path, key: CollectorKey | None = None):
        self.path = Path(path)
        self.key = key if key is not None else load_collector_key(create=True)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._known: tuple[int, str, int] | None = None  # (file size, last hash, last seq) after our last append

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _tail(self, fd: int) -> tuple[str, int]:
        """(hash, seq) of the last line. A torn last line (no newline: a crash mid-write) and last
        lines that are not ledger entries (garbage) are cut first, each with a warning, so one bad
        tail never stops collection; a file whose last `MAX_GARBAGE_TAIL_LINES` + 1 lines are all
        garbage is not a ledger and is left whole (LedgerError)."""
        size = os.fstat(fd).st_size
        if self._known is not None and self._known[0] == size:
            return self._known[1], self._known[2]
        end, cuts, last = size, [], None
        while end > 0:
            start, line = _last_line(fd, end)
            if line.endswith(b"\n"):
                try:
                    last = LedgerEntry.model_validate_json(line[:-1])
                    break
                except ValueError:
                    if sum(c[2] for c in cuts) >= MAX_GARBAGE_TAIL_LINES:
                        raise LedgerError(f"{self.path}: its last {len(cuts) + 1} lines are not ledger entries: not a cost "
                                          "ledger (nothing cut); move it aside or give another ledger path") from None
            cuts.append((start, end, line.endswith(b"\n")))
            end = start
        for start, stop, complete in cuts:
            what = "a last line that is not a ledger entry" if complete else "a torn last line (a write cut off mid-way)"
            log.warning("%s: cut %s (%d bytes at byte %d) before appending", self.path, what, stop - start, start)
        if cuts:
            os.ftruncate(fd, end)
            os.fsync(fd)
        return (last.hash, last.seq) if last is not None else (GENESIS, 0)

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
                                    ref=ref, cost_usd=_round(max(0.0, float(cost_usd or 0.0))), prev=prev,
                                    key=self.key.fingerprint)
                    e.hash = prev = e.digest()
                    e.sig = self.key.sign(e.hash)
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


def _last_line(fd: int, end: int) -> tuple[int, bytes]:
    """(offset, bytes) of the last line of the file's first `end` bytes (its newline included when it has one)."""
    block = 4096
    while True:
        start = max(0, end - block)
        data = os.pread(fd, end - start, start)
        nl = data.rfind(b"\n", 0, len(data) - 1)
        if nl >= 0 or start == 0:
            return start + nl + 1, data[nl + 1:]
        block *= 2


def project_ledger(project_dir: str | Path) -> Path:
    return Path(project_dir) / LEDGER_FILE
