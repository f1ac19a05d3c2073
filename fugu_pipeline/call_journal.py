"""The in-flight journal: a paid network call is announced on disk before it is made.

A worker or judge call over the network is billed by someone else the moment it is served; the
process that made it may be killed before it learns the cost. So before each such call the cost
ledger's appender (`ledger.py`) writes one line here, fsynced: the call's id, what it is for and
its worst-case cost. When the call's cost reaches the ledger (a line carrying the same `call`
id), or the call fails before any answer (nothing was billed), an end line follows.

    <ledger>.in-flight/<pid>-<random>.jsonl    one file per open appender, held under an
                                               exclusive flock for as long as it lives

A file whose lock nobody holds belongs to a process that died. The next appender to open the
ledger (`CostLedger.settle_in_flight`) reads it: every call begun and not ended whose id no ledger
line carries was in flight at the crash, and gets one ledger line at its worst-case cost
(`worst_case: true`), so a call that may have been billed is never missing, and is counted once.
Then the file is removed. A call announced but never sent (a kill between the two) is counted
at its worst case too: the client cannot tell the two apart.

Calls to the mock pool are not announced: no one bills them but the process itself, so one whose
process dies before its ledger line costs nothing. No torch, no dagster.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from fugu_pipeline.settings import settings

class Intent(BaseModel):
    """A call about to be made: what the ledger line of its cost will say, bar the cost."""

    model_config = ConfigDict(extra="forbid")

    call: str
    kind: str
    worker_id: str = ""
    task_id: str = ""
    ref: str = ""
    worst_usd: float | None = None  # None: nothing prices the worker


def journal_dir(ledger_path: Path) -> Path:
    return ledger_path.with_name(ledger_path.name + ".in-flight")


def new_call_id() -> str:
    return secrets.token_hex(8)


class Journal:
    """This process's journal file: made on the first `begin`, removed by `close` when every call
    it announced has ended."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path: Path | None = None
        self._fd: int | None = None
        self.open_calls: set[str] = set()

    def _write(self, obj: dict, sync: bool) -> None:
        if self._fd is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            tmp = self.folder / f".{name}.tmp"  # locked before it takes a name another appender reads
            self._fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self.path = self.folder / f"{name}.jsonl"
            os.rename(tmp, self.path)
            _fsync_dir(self.folder)
        line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        if os.write(self._fd, line) != len(line):
            raise OSError(f"{self.path}: short write")
        if sync:
            os.fsync(self._fd)

    def begin(self, intent: Intent) -> None:
        """Durable before it returns: the call may be made."""
        self._write({"begin": intent.model_dump(mode="json")}, sync=True)
        self.open_calls.add(intent.call)

    def end(self, calls: list[str], *, sync: bool) -> None:
        """The calls' costs are in the ledger (`sync` False: the ledger line is the durable record, this
        line only spares a reader the search), or they failed unbilled (`sync` True)."""
        mine = [c for c in calls if c in self.open_calls]
        if mine:
            self._write({"end": mine}, sync=sync)
            self.open_calls.difference_update(mine)

    def close(self) -> None:
        if self._fd is None:
            return
        if not self.open_calls and self.path is not None:
            self.path.unlink(missing_ok=True)  # every call ended: nothing left to settle
        os.close(self._fd)  # the lock goes with it: a file left behind is settled by the next appender
        self._fd, self.path = None, None


def read_journal(path: Path) -> list[Intent]:
    """The calls a journal began and did not end (a torn or unreadable line is skipped: the line
    before it was the last one written whole)."""
    begun: dict[str, Intent] = {}
    ended: set[str] = set()
    for raw in path.read_bytes().split(b"\n"):
        try:
            obj = json.loads(raw)
            if "begin" in obj:
                i = Intent.model_validate(obj["begin"])
                begun[i.call] = i
            else:
                ended.update(str(c) for c in obj["end"])
        except (ValueError, KeyError, TypeError):
            continue
    return [i for c, i in begun.items() if c not in ended]


def dead_journals(folder: Path, own: Path | None) -> Iterator[tuple[Path, int]]:
    """(path, locked descriptor) of every journal whose owner is gone (its lock is free); the caller
    settles it, removes it and closes the descriptor. A journal still locked is a live appender's."""
    if not folder.is_dir():
        return
    for p in sorted(folder.glob("*.jsonl")):
        if own is not None and p == own:
            continue
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:  # settled by another appender meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not p.exists():  # removed by the appender that settled it before we took the lock
            os.close(fd)
            continue
        yield p, fd


def calls_in(path: Path, wanted: set[str]) -> set[str]:
    """Which of the call ids `wanted` a line of the ledger at `path` carries (read line by line)."""
    found: set[str] = set()
    if not path.exists():
        return found
    with open(path, "rb") as fh:
        for line in fh:
            if b'"call"' not in line:
                continue
            try:
                c = json.loads(line).get("call")
            except (ValueError, AttributeError):
                continue
            if c in wanted:
                found.add(c)
    return found


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crash_point(name: str) -> None:
    """Test-only fault injection (the kill -9 tests): with FUGU_TEST_CRASH_AT="<name>:<n>" in the
    environment, the process SIGKILLs itself the n-th time it passes the point `name`. Points on the
    collection path (`collect/partition.py`): `intent` (the call announced, not made), `ledger` (its
    cost line written, its record not), `record` (both written). Unset: nothing happens."""
    at = settings().crash_at()
    if not at or at[0] != name:
        return
    with _CRASH_LOCK:
        _CRASH_SEEN[name] = _CRASH_SEEN.get(name, 0) + 1
        if _CRASH_SEEN[name] == at[1]:
            os.kill(os.getpid(), signal.SIGKILL)


_CRASH_LOCK = threading.Lock()
_CRASH_SEEN: dict[str, int] = {}
