"""BenchGen task batches: JSON Lines files of `Task` records.

A batch is all or nothing: any bad line fails the whole batch with every problem listed by file
and line, and nothing of that batch is written anywhere. A task id names one task across all
batches; a batch reusing an id another batch holds is refused whole, naming both files and lines
(see "task ids across batches" below for why, and which batch keeps the id).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from fugu_pipeline.tasks.schema import GRADER_TYPES, Task

BATCH_SUFFIXES = (".jsonl",)
_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class TaskFileError(ValueError):
    """A batch file is invalid. `problems` holds (line, message) pairs."""

    def __init__(self, path: Path, problems: list[tuple[int, str]]):
        self.path = path
        self.problems = problems
        if len(problems) == 1 and not problems[0][0]:  # one problem of the whole file: one line
            super().__init__(f"{path}: {problems[0][1]} (nothing of this batch was written)")
            return
        shown = "\n".join(f"  {path}:{line}: {msg}" if line else f"  {path}: {msg}" for line, msg in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(
            f"{path}: {len(problems)} problem(s); nothing of this batch was written. "
            f"Fix the lines below and run again.\n{shown}{more}"
        )

    def first_problem(self) -> str:
        """The first problem in one line: `name:line: message (+N more)`."""
        line, msg = self.problems[0] if self.problems else (0, str(self))
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        where = f"{shown_name(self.path.name)}:{line}" if line else shown_name(self.path.name)
        return f"{where}: {' '.join(str(msg).split())[:300]}{more}"


BATCH_NAME_RULE = ("a batch file name (without .jsonl) must start with a letter or digit and hold only "
                   "letters, digits, '_', '.' and '-' (at most 128 characters)")


def shown_name(name: str) -> str:
    """A file name as a message shows it: as is when printable, else escaped (a newline in a name
    would forge a second log line, an escape sequence would drive the terminal)."""
    return name if name.isprintable() else ascii(name)


class BatchNameError(TaskFileError):
    """A batch file whose name cannot be a partition key. One line: the file, and the rule."""

    def __init__(self, path: Path, name: str):
        self.path = path
        self.problems = [(0, f"batch name {name!r} refused")]
        ValueError.__init__(self, f"{shown_name(path.name)}: refused: {BATCH_NAME_RULE}; rename the file")


class NotABatchFileError(TaskFileError):
    """A `*.jsonl` entry that is not a regular file (a directory, FIFO, device, or a symlink to one
    or to nothing). Never opened: a FIFO blocks its reader, /dev/zero never ends. One line."""

    def __init__(self, path: Path):
        self.path = path
        self.problems = [(0, "not a regular file")]
        ValueError.__init__(self, f"{shown_name(path.name)}: refused: not a regular file (a directory, FIFO, device, or a symlink "
                                  "to one or to nothing); a batch must be a plain .jsonl file; move it out of the folder")


def batch_name(path: Path) -> str:
    """The partition key of a batch file: its file name without `.jsonl`. Raises `BatchNameError`."""
    name = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.stem
    if not _BATCH_NAME.match(name):
        raise BatchNameError(path, name)
    return name


def list_batch_files(folder: Path) -> list[Path]:
    """Every `*.jsonl` file of the folder, sorted, whatever its name (see `scan_batch_files`)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(BATCH_SUFFIXES))


def scan_batch_files(folder: Path) -> tuple[list[tuple[str, Path]], list[TaskFileError]]:
    """The batch files of a folder as (batch name, path), and the `*.jsonl` entries refused for
    their name or for not being a regular file. A refused entry never stops the others: callers
    report each refusal (one line) and run the rest."""
    batches: list[tuple[str, Path]] = []
    refused: list[TaskFileError] = []
    if not folder.is_dir():
        return batches, refused
    for path in sorted(p for p in folder.iterdir() if p.name.endswith(BATCH_SUFFIXES)):
        if not path.is_file():
            refused.append(NotABatchFileError(path))
            continue
        try:
            batches.append((batch_name(path), path))
        except BatchNameError as exc:
            refused.append(exc)
    return batches, refused


def _describe(err: dict) -> str:
    loc = ".".join(str(x) for x in err["loc"] if x not in GRADER_TYPES)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "union_tag_invalid":
        msg = f"unknown grader type {err.get('input', {}).get('type')!r}; use one of {', '.join(GRADER_TYPES)}"
    elif err["type"] == "union_tag_not_found":
        msg = "grader needs a 'type' field"
    return f"field '{loc}': {msg}" if loc else msg


def parse_task_line(line: str) -> Task | list[str] | None:
    """One line of a batch file: its `Task`, or the problems that refuse it, or None for a blank line."""
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return [f"malformed JSON: {exc.msg} at column {exc.colno}"]
    if not isinstance(obj, dict):
        return [f"expected a JSON object, got {type(obj).__name__}"]
    try:
        return Task.model_validate(obj)
    except ValidationError as exc:
        tid = obj.get("task_id")
        prefix = f"task {tid[:80]!r}{'...' if len(tid) > 80 else ''}: " if isinstance(tid, str) else ""
        return [prefix + _describe(e) for e in exc.errors()]


def read_text(path: Path) -> str:
    """A batch file's text, a UTF-8 BOM read past. Raises `TaskFileError` (missing, a folder, not
    readable, not UTF-8)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(path, [(0, "file not found")]) from None
    except IsADirectoryError:
        raise TaskFileError(path, [(0, "a folder, not a batch file: pass one JSON Lines file of tasks")]) from None
    except PermissionError:
        raise TaskFileError(path, [(0, "not readable by this user (permission denied)")]) from None
    except UnicodeDecodeError as exc:
        raise TaskFileError(path, [(0, f"not UTF-8 text: {exc}")]) from None
    # a UTF-8 BOM (Windows editors, Excel's "CSV UTF-8" export) is read past, as the reward-matrix import does;
    # json.loads refused the first line with "Unexpected UTF-8 BOM"
    return text.removeprefix("\ufeff")


def split_lines(text: str) -> list[str]:
    """JSON Lines end at "\n" only: str.splitlines would also cut at U+0085, U+2028 and other
    characters that a valid JSON string may hold raw (one of dcrouter's prompts has U+0085)."""
    return text.split("\n")


def read_batch(path: str | Path) -> list[tuple[int, Task]]:
    """Parse and validate a whole batch file: (line number, task) of every task. Raises
    `TaskFileError` naming every bad line."""
    path = Path(path)
    tasks: list[tuple[int, Task]] = []
    problems: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(split_lines(read_text(path)), start=1):
        got = parse_task_line(line)
        if got is None:
            continue
        if isinstance(got, list):
            problems.extend((lineno, msg) for msg in got)
            continue
        if got.task_id in first_line:
            problems.append((lineno, f"duplicate task_id {got.task_id!r} (first on line {first_line[got.task_id]})"))
            continue
        first_line[got.task_id] = lineno
        tasks.append((lineno, got))
    if problems:
        raise TaskFileError(path, problems)
    if not tasks:
        raise TaskFileError(path, [(0, "the batch holds no tasks")])
    return tasks


def load_tasks(path: str | Path) -> list[Task]:
    """Parse and validate a whole batch file. Raises `TaskFileError` naming every bad line."""
    return [t for _, t in read_batch(path)]


# --------------------------------------------------------------------------- task ids across batches
#
# Every stage keys a task by its id alone: the reward matrix (`tasks.task_id` is its primary key;
# `rewards` and `reward_wide` rows), training's hash folds and splits, the trajectory store, the
# routes of a report. Keying cells by (batch, task) instead would let one id name two prompts in one
# matrix, and a batch file copied under another name would put each of its tasks in twice (a
# duplicate training row, or one row in both a training and a test split). So a task id is unique
# across batches, and a batch that reuses an id another batch holds is refused whole, like a batch
# with a bad line; the other batches go on.
#
# Which batch keeps an id never depends on file names. Batches claim ids in this order, and a batch
# is refused when an id of it is held by a batch before it (a refused batch holds nothing):
#   1. batches whose responses are already collected (`settled`): what was paid for stays;
#   2. then the older file (modification time): the batch that came first keeps its ids;
#   3. then the name, only to order equal times reproducibly.


@dataclass
class BatchIds:
    """A batch file and the (task id, line) of its tasks: all of them, or only the ids some other
    batch holds too (the outcome is the same: only shared ids decide anything)."""

    batch: str
    path: Path
    ids: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Clash:
    """Task `task_id` of `batch` (`path`, `line`), held by batch `owner` (`owner_path`, `owner_line`)."""

    task_id: str
    batch: str
    path: Path
    line: int
    owner: str
    owner_path: Path
    owner_line: int


def claim_order(batches: Iterable[BatchIds], settled: Collection[str] = ()) -> list[BatchIds]:
    """The batches in the order they claim task ids: collected first, then the older file, then the name."""

    def key(b: BatchIds):
        try:
            mtime = os.stat(b.path).st_mtime_ns
        except OSError:  # gone since it was read: last
            mtime = 2**63
        return (b.batch not in settled, mtime, b.batch)

    return sorted(batches, key=key)


def find_clashes(batches: Iterable[BatchIds], settled: Collection[str] = ()) -> dict[str, list[Clash]]:
    """The batches refused for a task id another batch holds, each with its clashes in line order;
    a batch not named keeps every id it has."""
    owner: dict[str, tuple[BatchIds, int]] = {}
    refused: dict[str, list[Clash]] = {}
    for b in claim_order(batches, settled):
        clashes = [Clash(tid, b.batch, b.path, line, owner[tid][0].batch, owner[tid][0].path, owner[tid][1])
                   for tid, line in b.ids if tid in owner]
        if clashes:
            refused[b.batch] = sorted(clashes, key=lambda c: c.line)
            continue
        for tid, line in b.ids:
            owner[tid] = (b, line)
    return refused


def clash_message(c: Clash, here: Task | None, there: Task | None) -> str:
    """One line for a clash: the other file and line, whether the two tasks are one and the same
    (a copy) or differ (and in what), and what to do."""
    other = shown_name(c.owner_path.name)
    head = f"task_id {c.task_id[:80]!r} is also in batch {c.owner!r} ({other}:{c.owner_line})"
    if here is None or there is None:
        return f"{head}; task ids must be unique across batches: give this task another id, or remove the line"
    if here == there:
        return (f"{head}, the same task: a task is collected once; remove this line (or this file, if it copies "
                f"{other}), or delete {other} if this file replaces it")
    differ = [f for f in Task.model_fields if f != "task_id" and getattr(here, f) != getattr(there, f)]
    what = "another prompt" if "prompt" in differ else ", ".join(differ)
    return f"{head} with {what}; task ids must be unique across batches: give one of the two tasks another id"


NAMED_CLASHES = 20  # clashes described in full (with both tasks compared) per refused batch


def clash_error(path: Path, clashes: list[Clash], task_at: Callable[[Path, int], Task | None]) -> TaskFileError:
    """The `TaskFileError` refusing a batch for its clashes. `task_at(path, line)` is the task on
    that line of that file (None: unknown), to tell a copy from another task."""
    return TaskFileError(path, [(c.line, clash_message(c, task_at(c.path, c.line), task_at(c.owner_path, c.owner_line))
                                 if k < NAMED_CLASHES else clash_message(c, None, None))
                                for k, c in enumerate(clashes)])


def load_all_batches(benchgen_dir: Path, refused: list[TaskFileError] | None = None,
                     settled: Collection[str] = ()) -> list[tuple[str, Task]]:
    """Every task of every batch file, task ids unique across batches (see above: `settled` names
    the batches already collected, which keep their ids first). A bad file raises `TaskFileError`;
    with `refused` (a list) it is appended there and left out whole instead, so one bad batch does
    not stop the others (the reward matrix builds from the rest)."""
    loaded: dict[str, tuple[Path, list[tuple[int, Task]]]] = {}
    for b, path in scan_batch_files(benchgen_dir)[0]:  # badly named files are refused where they are listed
        try:
            loaded[b] = (path, read_batch(path))
        except TaskFileError as exc:
            if refused is None:
                raise
            refused.append(exc)
    clashes = find_clashes([BatchIds(b, path, [(t.task_id, line) for line, t in rows]) for b, (path, rows) in loaded.items()],
                           settled)
    at = {(path, line): t for path, rows in loaded.values() for line, t in rows} if clashes else {}
    out: list[tuple[str, Task]] = []
    for b, (path, rows) in loaded.items():
        if b in clashes:
            exc = clash_error(path, clashes[b], lambda p, line: at.get((p, line)))
            if refused is None:
                raise exc
            refused.append(exc)
            continue
        out.extend((b, t) for _, t in rows)
    return out
