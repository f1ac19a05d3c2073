"""The live term's store: every live outcome of a one-step head or a cascade, once per (head, task, seed).

`<root>/<context>.jsonl` (`data/live/`), one `LiveRecord` a line, appended with one `write(2)` and
an fsync each under an exclusive `flock` (several evaluations may append at once; a torn last line
left by a crash is cut first). `context` hashes the workers and the judge, so a changed pool
starts a new file.

A re-judgement (the same challenger against the same king, a second promotion run, `validate`
again) reads every outcome it needs here and calls nothing. An outcome is also found by
(task, worker, seed) from another head: two heads that route a task to the same worker share one
answer, so their paired difference carries no sampling noise of that cell. A cascade's outcome is
kept under the worker key `cascade:<content hash>`, its own (`policies/cascade/live.py`). The coordinator's
live sessions need no store of their own: they are trajectories, stored per (task, head, seed)
by the trajectory store (`session/store.py`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from fugu_pipeline.hashing import canonical_json, sha256_text


class LiveRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    head: str
    task_id: str
    seed: int
    worker: str
    quality: float
    calls: int = 1
    turns: int = 1
    cost_usd: float = 0.0
    error: str | None = None


def live_context(workers: list[dict], judge: dict | None) -> str:
    return sha256_text(canonical_json({"v": 1, "workers": workers, "judge": judge}))[:16]


class LiveStore:
    """The live outcomes of one context (module docstring)."""

    def __init__(self, root: str | Path, context: str):
        self.path = Path(root) / f"{context}.jsonl"
        self._by_head: dict[tuple[str, str, int], LiveRecord] = {}
        self._by_cell: dict[tuple[str, str, int], LiveRecord] = {}
        self._read()

    def _read(self) -> None:
        if not self.path.exists():
            return
        for line in self.path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            try:
                self._index(LiveRecord.model_validate_json(line))
            except ValueError:
                continue  # a torn last line: its call is made again

    def _index(self, rec: LiveRecord) -> None:
        self._by_head[(rec.head, rec.task_id, rec.seed)] = rec
        if rec.error is None:
            self._by_cell.setdefault((rec.task_id, rec.worker, rec.seed), rec)

    def get(self, head: str, task_id: str, worker: str, seed: int) -> LiveRecord | None:
        """This head's outcome, else another head's on the same (task, worker, seed) (module docstring)."""
        rec = self._by_head.get((head, task_id, seed))
        if rec is not None and rec.worker == worker:
            return rec
        return self._by_cell.get((task_id, worker, seed))

    def put(self, rec: LiveRecord) -> None:
        import fcntl
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = rec.model_dump_json().encode("utf-8") + b"\n"
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line: cut it before appending
                tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
                os.ftruncate(fd, size - len(tail) + tail.rfind(b"\n") + 1)
            if os.write(fd, line) != len(line):
                raise OSError(f"{self.path}: short write")
            os.fsync(fd)
        finally:
            os.close(fd)  # closing releases the lock
        self._index(rec)
