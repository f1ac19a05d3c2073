"""The trajectory store: every finished session, once per (task, head hash, seed, greedy), in one
SQLite file per context, compressed, indexed, append-only.

`<root>/<context>.sqlite` (standard-library `sqlite3`, WAL journal, `synchronous=FULL`) holds
- `trajectories`: one row per finished (or stopped) session, keyed and indexed by
  (task_id, head, seed, greedy), its record zlib-compressed JSON without the turns' texts;
- `turns`: one row per served request (`TurnRecord.request_sha`, the turn memo's key): the reply's
  text, cost, tokens and model, compressed, stored ONCE however many sessions reused it (the
  candidates of a CMA-ES generation share most of their turns).
That is what replay and training need: a stored trajectory is read back whole (texts re-attached),
and a turn paid for in an earlier, even killed, run is served from `turns` instead of called again.

Opening does not read the file: the runner looks up each (task, head, seed, greedy) it is about to
run, and each request it is about to send, by index (`get`, `completion`). So opening a store of
100,000 sessions takes the same time as opening an empty one (`benchmarks/bench_trajectory_store.py`
measures size and open time).

Durability as for the response store: a finished trajectory is committed (one transaction with its
new turns, fsynced) before `flush()` returns, and after `before_commit` (the cost ledger's lines of
its paid turns: a turn stored is a turn counted); appends from `submit` are committed on the store's
writer thread in groups, so the fsyncs overlap the sessions still running. A killed run loses at
most the sessions in flight (SQLite rolls back a torn transaction), and a re-run finds every
committed trajectory and calls nothing for it. One run at a time writes a store: `open()` takes
an exclusive lock on `<context>.sqlite.lock`, so a second run fails before it pays for any call.

`context` names everything else a trajectory depends on (the workers and judge, the session rules,
the role prompts, the transcript format and worker window, the encoder's fingerprint):
`context_key(...)`. A change to any of them starts a new file instead of reusing trajectories that
no longer apply.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sqlite3
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

from fugu_pipeline.collect.store import PartitionBusyError
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.session.records import Trajectory, TurnRecord
from fugu_pipeline.session.roles import PROMPT_VERSION
from fugu_pipeline.session.transcript import TRANSCRIPT_VERSION, window_info
from fugu_pipeline.workers.contract import Completion

STORE_VERSION = 2
Key = tuple[str, str, int, bool]
# A preset zlib dictionary: the field names every record repeats. Small records compress ~2x better with it.
_ZDICT = (b'{"index": 1, "role": "worker", "chosen_worker": "", "served_by": "", "status": "ok", "text": null, '
          b'"extractable": true, "verdict": null, "verdict_detail": null, "prompt_tokens": , "completion_tokens": , '
          b'"cost_usd": 0.00, "cost_source": "mock", "latency_s": , "attempts": 1, "served_model": "", '
          b'"fallback_errors": [], "worker_probs": {}, "role_probs": {"thinker": 0., "worker": 0., "verifier": 0.}, '
          b'"request_sha": "", "reused": false}, {"task_id": "", "prompt_hash": "", "domain": "", "head": "", '
          b'"seed": , "greedy": true, "status": "ok", "stop_reason": "committed", "accepted", "max_turns", '
          b'"turns": [], "committed_turn": , "answer": "The answer is ", "quality": 1.0, "grade_detail": "", '
          b'"judge_cost_usd": 0.0, "error": null, "finished_at": 1')
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL, head TEXT NOT NULL, seed INTEGER NOT NULL, greedy INTEGER NOT NULL,
    status TEXT NOT NULL, prompt_hash TEXT NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS trajectories_key ON trajectories (task_id, head, seed, greedy, status);
CREATE TABLE IF NOT EXISTS turns (sha TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
"""


def context_key(worker_specs: list[dict], judge: dict | None, max_turns: int, encoder_fingerprint: str | None,
                extra: dict | None = None) -> str:
    """The store file a trajectory belongs to (module docstring)."""
    return sha256_text(canonical_json({
        "v": STORE_VERSION, "workers": worker_specs, "judge": judge, "max_turns": max_turns,
        "encoder": encoder_fingerprint, "prompts": PROMPT_VERSION, "transcript": TRANSCRIPT_VERSION,
        "window": window_info(), **(extra or {}),
    }))[:16]


def trajectory_key(task_id: str, head: str, seed: int, greedy: bool) -> Key:
    return (task_id, head, int(seed), bool(greedy))


def _pack(obj) -> bytes:
    c = zlib.compressobj(6, zdict=_ZDICT)
    return c.compress(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()) + c.flush()


def _unpack(blob: bytes):
    d = zlib.decompressobj(zdict=_ZDICT)
    return json.loads(d.decompress(blob) + d.flush())


_TURN_FIELDS = ("text", "cost_usd", "cost_source", "latency_s", "prompt_tokens", "completion_tokens", "served_model")


class TrajectoryStore:
    """The trajectories of one context under `root` (module docstring)."""

    def __init__(self, root: str | Path, context: str):
        self.path = Path(root) / f"{context}.sqlite"
        self.context = context
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._lock = threading.RLock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.appended = 0
        self._turns_in_db: set[str] = set()  # turn shas this store committed: not compressed again
        self.before_commit = None  # called before each commit: the run's cost ledger writes the turns' lines

    # ----------------------------------------------------------------- opening

    def open(self) -> "TrajectoryStore":
        """Take the store's lock and open the database (idempotent, reads no record): a second run on
        the same store fails here, before it pays for any call."""
        with self._lock:
            if self._db is not None:
                return self
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(str(self.path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise PartitionBusyError(f"{self.path}: another run is using this trajectory store right now; "
                                         "wait for it to finish") from None
            self._lock_fd = fd
            try:
                self._db = self._connect()
            except sqlite3.DatabaseError as exc:
                self._unlock()
                raise ValueError(f"{self.path}: not a readable trajectory store ({exc}); move it aside and run "
                                 "again (its sessions will be run again)") from None
        return self

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta VALUES ('store_version', ?)", (str(STORE_VERSION),))
        db.execute("INSERT OR IGNORE INTO meta VALUES ('context', ?)", (self.context,))
        return db

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----------------------------------------------------------------- lookups (by index)

    def get(self, key: Key) -> Trajectory | None:
        """The latest finished (status ok) trajectory of this key, or None."""
        self.open()
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM trajectories WHERE task_id=? AND head=? AND seed=? AND greedy=? AND status='ok' "
                "ORDER BY seq DESC LIMIT 1", (key[0], key[1], int(key[2]), int(bool(key[3])))).fetchone()
            return self._trajectory(row[0]) if row else None

    def completion(self, sha: str) -> Completion | None:
        """The stored reply of one served request (the turn memo's key), or None."""
        self.open()
        with self._lock:
            row = self._db.execute("SELECT data FROM turns WHERE sha=?", (sha,)).fetchone()
        if row is None:
            return None
        t = _unpack(row[0])
        return Completion(answer=t["text"] or "", cost_usd=t["cost_usd"], cost_source=t["cost_source"],
                          latency_s=t["latency_s"], prompt_tokens=t["prompt_tokens"],
                          completion_tokens=t["completion_tokens"], served_model=t["served_model"], finish_reason="stop")

    def _trajectory(self, blob: bytes) -> Trajectory:
        obj = _unpack(blob)
        shas = [t.get("request_sha") for t in obj["turns"] if t.get("text") is None and t.get("request_sha")]
        texts: dict[str, str | None] = {}
        for sha in set(shas):
            row = self._db.execute("SELECT data FROM turns WHERE sha=?", (sha,)).fetchone()
            texts[sha] = _unpack(row[0])["text"] if row else None
        for t in obj["turns"]:
            if t.get("text") is None and t.get("request_sha") in texts:
                t["text"] = texts[t["request_sha"]]
        return Trajectory.model_validate(obj)

    def __len__(self) -> int:
        self.open()
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0])

    def iter_all(self) -> Iterator[Trajectory]:
        """Every stored record (stopped ones included), oldest first: for reports and tests, not for opening."""
        self.open()
        with self._lock:
            blobs = [r[0] for r in self._db.execute("SELECT data FROM trajectories ORDER BY seq")]
        for b in blobs:
            with self._lock:
                yield self._trajectory(b)

    def read(self) -> tuple[dict[Key, Trajectory], list[Trajectory]]:
        """(the latest finished trajectory per key, every record): reads everything; tools only."""
        every = list(self.iter_all())
        done = {trajectory_key(t.task_id, t.head, t.seed, t.greedy): t for t in every if t.status == "ok"}
        return done, every

    # ----------------------------------------------------------------- appending

    def _insert(self, trs: list[Trajectory]) -> None:
        rows, turns, new = [], [], {}
        for tr in trs:
            obj = tr.model_dump(mode="json")
            for t in obj["turns"]:
                sha = t.get("request_sha")
                if t["status"] == "ok" and sha:
                    # a turn already committed (candidates share most turns) would be ignored by INSERT OR
                    # IGNORE anyway: skip compressing it again
                    if sha not in self._turns_in_db and sha not in new:
                        new[sha] = len(turns)
                        turns.append((sha, _pack({k: t[k] for k in _TURN_FIELDS})))
                    t["text"] = None  # kept once, in `turns`
            rows.append((tr.task_id, tr.head, int(tr.seed), int(tr.greedy), tr.status, tr.prompt_hash, _pack(obj)))
        if self.before_commit is not None:
            self.before_commit()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR IGNORE INTO turns VALUES (?, ?)", turns)
            db.executemany("INSERT INTO trajectories (task_id, head, seed, greedy, status, prompt_hash, data) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._turns_in_db.update(new)
        self.appended += len(trs)

    def append(self, tr: Trajectory | list[Trajectory]) -> None:
        """Commit one trajectory (or several in one transaction) now."""
        self.open()
        with self._lock:
            self._insert(tr if isinstance(tr, list) else [tr])

    def submit(self, tr: Trajectory) -> None:
        """Append on the store's writer thread (committed in groups, off the caller's thread, so the
        fsyncs overlap the sessions still running). `flush()` waits for them."""
        if self._error is not None:
            raise self._error
        self.open()
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="trajectory-store", daemon=True)
            self._thread.start()
        self._queue.put(tr)

    def _drain(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(x is None for x in batch)
            trs = [x for x in batch if x is not None]
            try:
                if trs and self._error is None:
                    self.append(trs)
            except BaseException as exc:  # surfaced by flush()
                self._error = exc
            finally:
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def flush(self) -> None:
        """Wait until every submitted trajectory is committed; raise the writer's error, if any."""
        self._queue.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._unlock()

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def turn_completion(t: TurnRecord) -> Completion:
    """A stored turn as the reply the memo hands back."""
    return Completion(answer=t.text or "", cost_usd=t.cost_usd, cost_source=t.cost_source, latency_s=t.latency_s,
                      prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
                      served_model=t.served_model, finish_reason="stop")
