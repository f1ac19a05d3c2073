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
and collection goes on. A last line that is a ledger entry but not one to chain onto (its hash not
its content's, not following the line before it, signed by a key that is neither this collector's
nor trusted) stops the append with one line naming the file and the line: signing a line after it
would vouch for it.

No paid call is missed, none is counted twice, whatever instant a kill lands at:
- a call's cost line is written (fsynced) BEFORE the record of its answer (the response store's,
  the live store's, a trajectory), and carries the call's id (`call`), as the record does; a kill
  between the two leaves a counted call whose answer is lost, and its cell is called again;
- a call over the network is announced first (`begin`: the in-flight journal, `call_journal.py`,
  fsynced) with its worst-case cost; the first appender after a kill counts every announced call
  that no line carries at that worst case (`worst_case: true`) and says so (`settle_in_flight`);
  a call whose task is cancelled in flight in a process that lives on is counted so at once
  (`abandon`; a live run stopped by another call's 401);
- session turns are kept (`defer`) and appended in batches (one write and one fsync for up to 256
  lines) and always before the trajectory store commits a session that used them.
One fsync per paid call of collection, beside the one the response store already makes and the
journal's (`benchmarks/bench_clients.py --ledger` measures them).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fugu_pipeline.call_journal import Intent, Journal, calls_in, dead_journals, journal_dir, new_call_id, read_journal
from fugu_pipeline.config_files import first_validation_error
from fugu_pipeline.files import count_lines, last_line
from fugu_pipeline.collector_key import CollectorKey, LineVerifier, fingerprint, load_collector_key, read_trusted
from fugu_pipeline.hashing import canonical_json, sha256_text

log = logging.getLogger(__name__)

LEDGER_FILE = Path("data") / "ledger" / "costs.jsonl"
GENESIS = "0" * 64
MAX_LINE_BYTES = 4096  # a ledger line is about 450 bytes: a longer one is not read
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
    call: str = Field("", description="the call's id: the in-flight journal's (call_journal.py) and its record's")
    worst_case: bool = Field(False, description="the call was in flight when its process died (or its task was "
                                                "cancelled): its worst-case cost")
    hash: str = ""
    sig: str = Field("", description="the collector's ed25519 signature of `hash` (base64)")

    def digest(self) -> str:
        body = self.model_dump(mode="json", exclude={"hash", "sig"})
        for k in ("key", "call", "worst_case"):  # a line without them hashes as lines did before they existed
            if not body[k]:
                del body[k]
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


def summarize(entries: Iterable[LedgerEntry]) -> LedgerSummary:
    """The summary of entries (a list, or `iter_entries`' stream: nothing is kept)."""
    totals: dict[str, KindTotal] = {}
    head, lines = GENESIS, 0
    for e in entries:
        t = totals.setdefault(e.kind, KindTotal())
        t.calls += 1
        t.cost_usd += e.cost_usd
        head, lines = e.hash, lines + 1
    for t in totals.values():
        t.cost_usd = _round(t.cost_usd)
    return LedgerSummary(head=head, lines=lines, totals=totals)


def iter_entries(path: str | Path, trusted: dict[str, str] | None = None, *,
                 max_bytes: int | None = None) -> Iterator[LedgerEntry]:
    """Every line of a ledger, read one line at a time, with its chain checked; LedgerError (naming
    the line) when a line does not parse, is longer than `MAX_LINE_BYTES`, is out of sequence, or
    does not hold the previous line's hash or its own. With `trusted` (fingerprint -> public key,
    `collector_key.trusted_keys`), every line must also be signed by one of those keys. A file of
    more than `max_bytes` is refused before any of it is read. A missing file is an empty ledger;
    a torn last line (no newline) is not a line yet."""
    p = Path(path)
    if not p.exists():
        return
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        raise LedgerError(f"{p}: not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise LedgerError(f"{p}: {st.st_size:,} bytes, over the cap of {max_bytes:,} a ledger may take here: refused unread")
    prev, n, read = GENESIS, 0, 0
    verifier = LineVerifier(trusted) if trusted is not None else None
    with open(p, "rb") as fh:
        while line := fh.readline(MAX_LINE_BYTES + 1):
            n += 1
            read += len(line)
            if len(line) > MAX_LINE_BYTES:
                raise LedgerError(f"{p} line {n}: longer than {MAX_LINE_BYTES:,} bytes: not a ledger line (refused "
                                  "without reading the rest)")
            if max_bytes is not None and read > max_bytes:
                raise LedgerError(f"{p}: grew past the cap of {max_bytes:,} bytes while being read")
            if not line.endswith(b"\n"):  # a torn last line: what a crash mid-write leaves
                return
            if not line.strip():
                raise LedgerError(f"{p} line {n}: empty line inside the ledger")
            try:
                e = LedgerEntry.model_validate_json(line)
            except ValidationError as exc:
                raise LedgerError(f"{p} line {n}: not a ledger entry ({first_validation_error(exc)})") from None
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
            yield e
            prev = e.hash


def read_entries(path: str | Path, trusted: dict[str, str] | None = None) -> list[LedgerEntry]:
    """Every line of a ledger as a list (`iter_entries`)."""
    return list(iter_entries(path, trusted))


def verify_ledger(path: str | Path, trusted: dict[str, str] | None = None, *, max_bytes: int | None = None) -> LedgerSummary:
    """The recomputed summary of a ledger file, read line by line (LedgerError when its chain is
    broken, or with `trusted`, when a line is not signed by a trusted collector key)."""
    return summarize(iter_entries(path, trusted, max_bytes=max_bytes))


class CostLedger:
    """Appends to one ledger file (module docstring). Thread-safe; several processes may append.
    `key`: the collector key that signs each line (default: the host's, made on first use; it is
    loaded here, so a key that cannot be used stops collection before any call is paid).
    `trusted` (fingerprint -> public key): collector keys besides `key` whose lines may end the
    ledger when it is appended to (default: those of the project's `models/promoted/collector_keys.json`
    when the ledger is at the project's `data/ledger/costs.jsonl`).

    A paid network call goes through `begin` (announced in the in-flight journal, `call_journal.py`)
    then `pay` (its lines, carrying its id) or `void` (it failed before any answer); session turns
    use `defer` and `flush` (one write for many lines)."""

    def __init__(self, path: str | Path, key: CollectorKey | None = None, *, trusted: dict[str, str] | None = None):
        self.path = Path(path)
        self.key = key if key is not None else load_collector_key(create=True)
        self.trusted = {**self.key.retired, self.key.fingerprint: self.key.public_key, **(trusted or {})}
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._known: tuple[int, str, int] | None = None  # (file size, last hash, last seq) after our last append
        self._journal = Journal(journal_dir(self.path))
        self._pending: list[tuple] = []
        self._abandoned: set[str] = set()  # calls counted at their worst case when cancelled in flight
        self._settled = False  # the journals of killed runs settled
        self._ready = False  # and the tail checked
        self.notes: list[str] = []  # what settling the calls of killed runs found (also logged)

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _tail(self, fd: int) -> tuple[str, int]:
        """(hash, seq) of the last line. A torn last line (no newline: a crash mid-write) and last
        lines that are not ledger entries (garbage) are cut first, each with a warning, so one bad
        tail never stops collection; a file whose last `MAX_GARBAGE_TAIL_LINES` + 1 lines are all
        garbage is not a ledger and is left whole (LedgerError). A last line that is a ledger entry
        but not one to chain onto (edited, duplicated, out of sequence, or signed by a key that is
        neither this collector's nor trusted) is a LedgerError naming the line: nothing is cut."""
        size = os.fstat(fd).st_size
        if self._known is not None and self._known[0] == size:
            return self._known[1], self._known[2]
        end, cuts, last = size, [], None
        while end > 0:
            start, line = last_line(fd, end)
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
        if last is not None:
            self._check_tail(fd, start, last)
        for start, stop, complete in cuts:
            what = "a last line that is not a ledger entry" if complete else "a torn last line (a write cut off mid-way)"
            log.warning("%s: cut %s (%d bytes at byte %d) before appending", self.path, what, stop - start, start)
        if cuts:
            os.ftruncate(fd, end)
            os.fsync(fd)
        return (last.hash, last.seq) if last is not None else (GENESIS, 0)

    def _check_tail(self, fd: int, start: int, last: LedgerEntry) -> None:
        """Refuse to chain onto `last` (the entry at byte `start`) unless it is whole, follows the line
        before it and is signed by this collector or a trusted one."""
        restore = "restore the ledger from a copy, or move it aside to start a new one"
        why, todo = None, restore
        if last.digest() != last.hash:
            why = "its hash does not match its content (edited after it was written)"
        elif not last.key or not last.sig:
            why = "not signed by a collector (written by hand, or without a collector key)"
        else:
            trusted = self.trusted if last.key in self.trusted else {**self._project_trusted(), **self.trusted}
            if last.key not in trusted:
                why = (f"signed by collector key {last.key}, not this collector's ({self.key.fingerprint}) nor one this "
                       "host trusts")
                todo = (f"if {last.key} is this host's older key or another of its collectors, trust it (fugu-lite "
                        "collector-key --trust NAME PUBLIC_KEY), else move the ledger aside to start a new one")
            else:
                why = LineVerifier(trusted).problem(last.key, last.hash, last.sig)
        if why is None:
            prev_hash, prev_seq = GENESIS, 0
            if start > 0:
                try:
                    before = LedgerEntry.model_validate_json(last_line(fd, start)[1])
                    prev_hash, prev_seq = before.hash, before.seq
                except ValueError:
                    why = "the line before it is not a ledger entry"
            if why is None and (last.prev != prev_hash or last.seq != prev_seq + 1):
                why = (f"it does not follow the line before it (seq {last.seq} after {prev_seq}, prev {last.prev[:12]}… "
                       f"where that line's hash is {prev_hash[:12]}…): a line duplicated, moved or pasted in")
        if why is not None:
            raise LedgerError(f"{self.path} line {count_lines(fd, start) + 1}: {why}: nothing appended; {todo}")

    def _project_trusted(self) -> dict[str, str]:
        """The collector keys of the project's models/promoted/collector_keys.json, for a ledger at the
        project's data/ledger/costs.jsonl (empty elsewhere)."""
        if self.path.parent.name != LEDGER_FILE.parent.name or self.path.parent.parent.name != LEDGER_FILE.parts[0]:
            return {}
        keys = read_trusted(self.path.parent.parent.parent / "models")
        return {fingerprint(k["public_key"]): k["public_key"] for k in keys.values()}

    # ----------------------------------------------------------------- paid calls

    def begin(self, kind: str, *, worker_id: str = "", task_id: str = "", ref: str = "", worst_usd: float | None = None,
              announce: bool = True) -> str:
        """A new call's id. `announce` (a call over the network): it is in the in-flight journal,
        fsynced, before this returns, with its worst-case cost (None: nothing prices it)."""
        call = new_call_id()
        with self._lock:
            self._settle_once()  # before a run's first call: a ledger that cannot be appended to stops it here
            if announce:
                self._journal.begin(Intent(call=call, kind=kind, worker_id=worker_id, task_id=task_id, ref=ref,
                                           worst_usd=worst_usd))
        return call

    def pay(self, call: str, lines: list[tuple[str, float, str, str, str]]) -> list[LedgerEntry]:
        """The call's cost lines (kind, cost_usd, worker_id, task_id, ref), carrying its id, in one write."""
        with self._lock:
            if call in self._abandoned:  # counted at its worst case when its task was cancelled (`abandon`)
                return []
            out = self.append_many([(*line, call) for line in lines])
            self._journal.end([call], sync=False)
            return out

    def abandon(self, call: str, line: tuple[str, float, str, str, str]) -> list[LedgerEntry]:
        """A call given up while in flight (its task cancelled, its answer never read): it may have
        been billed, so it is counted now, at its worst case (`worst_case: true`), as a later run
        would count it after a kill. Once: a call already paid or voided is left as it is (a paying
        thread may finish after its task was cancelled), and a `pay` after this is ignored."""
        with self._lock:
            if call not in self._journal.open_calls:  # ended already, or never announced (a mock call)
                return []
            out = self.append_many([(*line, call, True)])
            self._journal.end([call], sync=False)
            self._abandoned.add(call)
            return out

    def void(self, call: str) -> None:
        """The call failed before any answer: nothing was billed, nothing is counted."""
        with self._lock:
            self._journal.end([call], sync=True)

    def defer(self, kind: str, cost_usd: float, *, worker_id: str = "", task_id: str = "", ref: str = "",
              call: str = "") -> int:
        """Keep a line for the next `flush` (or append); the number of lines kept."""
        with self._lock:
            self._pending.append((kind, cost_usd, worker_id, task_id, ref, call))
            return len(self._pending)

    def flush(self) -> None:
        """Append the kept lines (one write, one fsync)."""
        self.append_many([])

    def settle_in_flight(self) -> list[str]:
        """Count the calls that were in flight when an earlier run was killed (`call_journal.py`):
        each announced call no line carries gets one at its worst-case cost. Returns (and logs) one
        note per killed run that left such calls."""
        with self._lock:
            self._settled = True
            notes = []
            for p, fd in dead_journals(self._journal.folder, self._journal.path):
                try:
                    lost = read_journal(p)
                    if lost:
                        have = calls_in(self.path, {i.call for i in lost})
                        lost = [i for i in lost if i.call not in have]
                    if lost:
                        self.append_many([(i.kind, i.worst_usd or 0.0, i.worker_id, i.task_id, i.ref, i.call, True)
                                          for i in lost])
                        unpriced = sum(i.worst_usd is None for i in lost)
                        notes.append(f"{self.path}: {len(lost)} call(s) were in flight when a run was killed: counted at "
                                     f"their worst case, ${sum(i.worst_usd or 0.0 for i in lost):.4f}"
                                     + (f" ({unpriced} unpriced, at $0)" if unpriced else "")
                                     + "; their answers were lost, so their cells are called again")
                    p.unlink(missing_ok=True)
                finally:
                    os.close(fd)
            for n in notes:
                log.warning("%s", n)
            self.notes += notes
            return notes

    def check(self) -> None:
        """Settle what killed runs left in flight and check the ledger's tail (LedgerError, one line,
        when it cannot be appended to): what a run does before its first paid call."""
        with self._lock:
            self._settle_once()

    def _settle_once(self) -> None:
        if self._ready:
            return
        if not self._settled:
            self.settle_in_flight()
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            self._tail(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._ready = True

    # ----------------------------------------------------------------- appending

    def append(self, kind: str, cost_usd: float, *, worker_id: str = "", task_id: str = "", ref: str = "") -> LedgerEntry:
        return self.append_many([(kind, cost_usd, worker_id, task_id, ref)])[0]

    def append_many(self, calls: list[tuple]) -> list[LedgerEntry]:
        """Append (kind, cost_usd, worker_id, task_id, ref[, call[, worst_case]]) lines, after any kept
        by `defer`, in one write and one fsync; returns the entries of `calls`."""
        with self._lock:
            self._settle_once()
            pending, self._pending = self._pending, []
            lines = pending + list(calls)
            if not lines:
                return []
            out = self._write(lines)
            self._journal.end([c[5] for c in pending if len(c) > 5 and c[5]], sync=False)
            return out[len(pending):]

    def _write(self, lines: list[tuple]) -> list[LedgerEntry]:
        fd = self._open()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            prev, seq = self._tail(fd)
            out = []
            for kind, cost_usd, worker_id, task_id, ref, *more in lines:
                seq += 1
                e = LedgerEntry(seq=seq, at=round(time.time(), 3), kind=kind, worker_id=worker_id, task_id=task_id,
                                ref=ref, cost_usd=_round(max(0.0, float(cost_usd or 0.0))), prev=prev,
                                key=self.key.fingerprint, call=more[0] if more else "",
                                worst_case=bool(more[1]) if len(more) > 1 else False)
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
            try:
                if self._pending:
                    self.flush()
            finally:
                self._journal.close()
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                    self._known = None

    def __enter__(self) -> "CostLedger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def settle_killed_runs(path: str | Path) -> list[str]:
    """Settle the calls a killed run left in flight in the ledger at `path` (`CostLedger.settle_in_flight`),
    before the ledger is read as a whole (a pack cites it); the collector key is loaded only when
    a killed run left a journal."""
    if not any(journal_dir(Path(path)).glob("*.jsonl")):
        return []
    with CostLedger(path) as book:
        return book.settle_in_flight()


def project_ledger(project_dir: str | Path) -> Path:
    return Path(project_dir) / LEDGER_FILE
