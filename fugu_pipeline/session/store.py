"""The trajectory store: every finished session, once per (task, head hash, seed, greedy), append-only.

`<root>/<context>.jsonl`, one `Trajectory` per line, appended like the response store
(`collect/store.py`, whose writer it uses): one `write(2)` on an O_APPEND descriptor and an fsync per
finished trajectory, an exclusive lock per file, a torn last line cut before the next append. A
killed run therefore loses at most the sessions in flight, and a re-run (or a re-evaluation of the
same head) finds every finished trajectory and calls nothing for it.

`context` names everything else a trajectory depends on (the workers and judge, the session rules,
the role prompts and transcript format, the encoder's fingerprint): `context_key(...)`. A change to
any of them starts a new file instead of reusing trajectories that no longer apply.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from fugu_pipeline.collect.store import PartitionWriter
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.roles import PROMPT_VERSION
from fugu_pipeline.session.transcript import TRANSCRIPT_VERSION

STORE_VERSION = 1
Key = tuple[str, str, int, bool]


def context_key(worker_specs: list[dict], judge: dict | None, max_turns: int, encoder_fingerprint: str | None,
                extra: dict | None = None) -> str:
    """The store file a trajectory belongs to (module docstring)."""
    return sha256_text(canonical_json({
        "v": STORE_VERSION, "workers": worker_specs, "judge": judge, "max_turns": max_turns,
        "encoder": encoder_fingerprint, "prompts": PROMPT_VERSION, "transcript": TRANSCRIPT_VERSION,
        **(extra or {}),
    }))[:16]


def trajectory_key(task_id: str, head: str, seed: int, greedy: bool) -> Key:
    return (task_id, head, int(seed), bool(greedy))


class TrajectoryStore:
    """The trajectories of one context under `root` (module docstring)."""

    def __init__(self, root: str | Path, context: str):
        self.path = Path(root) / f"{context}.jsonl"
        self.context = context
        self._writer: PartitionWriter | None = None
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.appended = 0

    def read(self) -> tuple[dict[Key, Trajectory], list[Trajectory]]:
        """(the latest finished trajectory per key, every record including stopped ones)."""
        done: dict[Key, Trajectory] = {}
        every: list[Trajectory] = []
        if not self.path.exists():
            return done, every
        for raw in self.path.read_bytes().split(b"\n"):
            if not raw.strip():
                continue
            try:
                tr = Trajectory.model_validate_json(raw)
            except ValueError:
                continue  # a torn last line: that session is simply not finished
            every.append(tr)
            if tr.status == "ok":
                done[trajectory_key(tr.task_id, tr.head, tr.seed, tr.greedy)] = tr
        return done, every

    def open(self) -> "TrajectoryStore":
        """Take the file's lock now (idempotent): a second run on the same store fails here, before
        it pays for any call, instead of at its first append with those sessions lost."""
        with self._lock:
            if self._writer is None:
                self._writer = PartitionWriter(self.path)
        return self

    def append(self, tr: Trajectory) -> None:
        """One write + fsync, now. Opens the file (and takes its lock) on first use."""
        self.open()
        with self._lock:
            self._writer.append(tr)
            self.appended += 1

    def submit(self, tr: Trajectory) -> None:
        """Append on the store's writer thread (the same write + fsync, off the caller's thread, so
        the fsyncs overlap the sessions still running). `flush()` waits for them."""
        if self._error is not None:
            raise self._error
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="trajectory-store", daemon=True)
            self._thread.start()
        self._queue.put(tr)

    def _drain(self) -> None:
        while True:
            tr = self._queue.get()
            try:
                if tr is not None and self._error is None:
                    self.append(tr)
            except BaseException as exc:  # surfaced by flush()
                self._error = exc
            finally:
                self._queue.task_done()
            if tr is None:
                return

    def flush(self) -> None:
        """Wait until every submitted trajectory is on disk; raise the writer's error, if any."""
        self._queue.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> "TrajectoryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
