"""The workers' replies kept in the reward matrix, as a (tasks x workers) grid, and their final answers.

An imported matrix keeps them in the `answers` table (the import row's `answers` and
`answer_kind`); a collected one in the `answer` column of `responses` (the latest graded call of
each cell). `read_answers` reads both, for the tasks and workers asked, in that order; a cell
without a reply is None. Each task's answer kind is the import's, else its grader's
(`final_answer.kind_for_grader`), else detected from the prompt and the replies.

A matrix built before replies were kept has no `answers` table: its imported rows read as having
none, its collected ones still have theirs in `responses`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fugu_pipeline.matrix.read import RewardMatrixError, open_read_only
from fugu_pipeline.tasks.final_answer import detect_kind, extract, kind_for_grader

_IMPORTED = "SELECT task_id, worker_id, answer, kind FROM answers"
_COLLECTED = ("SELECT r.task_id, r.worker_id, r.answer, NULL AS kind FROM responses r "
              "JOIN rewards g ON g.task_id = r.task_id AND g.worker_id = r.worker_id WHERE r.status = 'ok'")


@dataclass
class AnswerGrid:
    """Replies (N, W) in the order asked, each task's answer kind, and the final answers."""

    task_ids: list[str]
    worker_ids: list[str]
    text: np.ndarray  # object (N, W): str or None
    kinds: list[str]  # per task
    final: np.ndarray  # object (N, W): the comparable final answer (str) or None
    version: str  # sha256 of every (task, worker, reply, kind), 16 hex digits

    def coverage(self) -> dict[str, float]:
        """Share of tasks with a reply, per worker."""
        have = np.vectorize(lambda a: a is not None, otypes=[bool])(self.text) if self.text.size else np.zeros(self.text.shape, bool)
        return {w: float(have[:, j].mean()) if len(have) else 0.0 for j, w in enumerate(self.worker_ids)}

    def subset(self, rows: np.ndarray) -> "AnswerGrid":
        rows = np.asarray(rows, dtype=np.int64)
        return AnswerGrid([self.task_ids[i] for i in rows], self.worker_ids, self.text[rows],
                          [self.kinds[i] for i in rows], self.final[rows], self.version)


def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()[0])


def read_answers(db_path: Path, task_ids: list[str], worker_ids: list[str]) -> AnswerGrid:
    """The replies of these tasks and workers (the matrix's ids), in this order, with each task's
    kind and every cell's final answer; RewardMatrixError when the matrix holds none at all."""
    with open_read_only(Path(db_path)) as con:
        rows = con.execute(_COLLECTED).fetchall()
        if _has_table(con, "answers"):
            rows += con.execute(_IMPORTED).fetchall()
        info = {t: (p, g) for t, p, g in con.execute("SELECT task_id, prompt, grader_type FROM tasks").fetchall()}
    row_of = {t: i for i, t in enumerate(task_ids)}
    col_of = {w: j for j, w in enumerate(worker_ids)}
    text = np.full((len(task_ids), len(worker_ids)), None, dtype=object)
    given_kind: dict[str, str] = {}
    digest = hashlib.sha256()
    for t, w, a, k in sorted(rows, key=lambda r: (r[0], r[1])):
        i, j = row_of.get(t), col_of.get(w)
        if i is None or j is None or a is None:
            continue
        text[i, j] = a
        if k:
            given_kind[t] = k
        digest.update(f"{t}\x1f{w}\x1f{k or ''}\x1f{a}\x1e".encode("utf-8", "replace"))
    if len(task_ids) and not any(a is not None for a in text.ravel()):
        raise RewardMatrixError(f"{db_path}: the matrix holds no worker replies, so no answer can be compared: import "
                                "the rows with `answers` (one reply per worker, in worker_ids order), or collect the "
                                "responses with the pipeline, then rebuild the matrix")
    kinds = []
    for i, t in enumerate(task_ids):
        prompt, grader = info.get(t, ("", None))
        kinds.append(given_kind.get(t) or kind_for_grader(grader) or detect_kind(prompt or "", list(text[i])))
    final = np.full(text.shape, None, dtype=object)
    for i in range(text.shape[0]):
        for j in range(text.shape[1]):
            if text[i, j] is not None:
                final[i, j] = extract(text[i, j], kinds[i])
    return AnswerGrid(list(task_ids), list(worker_ids), text, kinds, final, digest.hexdigest()[:16])


def require_answers(grid: AnswerGrid, workers: list[str], min_share: float = 0.5) -> None:
    """RewardMatrixError naming the first worker with replies on fewer than `min_share` of the
    tasks: a cascade that called it could never read its answer."""
    cov = grid.coverage()
    short = [(w, cov[w]) for w in workers if cov.get(w, 0.0) < min_share]
    if short:
        shown = ", ".join(f"{w} ({c:.0%})" for w, c in short[:5])
        raise RewardMatrixError(f"worker(s) {shown} have replies on too few tasks (under {min_share:.0%}) for a cascade to "
                                "read their answers: import their replies (`answers`), or leave them out of the "
                                "cascade (cascade.workers in configs/train.yaml)")
