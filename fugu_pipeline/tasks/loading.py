"""BenchGen task batches: JSON Lines files of `Task` records.

A batch is all or nothing: any bad line fails the whole batch with every problem listed by file
and line, and nothing of that batch is written anywhere.
"""

from __future__ import annotations

import json
import re
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


def load_tasks(path: str | Path) -> list[Task]:
    """Parse and validate a whole batch file. Raises `TaskFileError` naming every bad line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(path, [(0, "file not found")]) from None
    except UnicodeDecodeError as exc:
        raise TaskFileError(path, [(0, f"not UTF-8 text: {exc}")]) from None
    # a UTF-8 BOM (Windows editors, Excel's "CSV UTF-8" export) is read past, as the reward-matrix import does;
    # json.loads refused the first line with "Unexpected UTF-8 BOM"
    text = text.removeprefix("\ufeff")
    tasks: list[Task] = []
    problems: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    # JSON Lines end at "\n" only: str.splitlines would also cut at U+0085, U+2028 and other characters
    # that a valid JSON string may hold raw (one of dcrouter's prompts has U+0085)
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append((lineno, f"malformed JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(obj, dict):
            problems.append((lineno, f"expected a JSON object, got {type(obj).__name__}"))
            continue
        try:
            task = Task.model_validate(obj)
        except ValidationError as exc:
            tid = obj.get("task_id")
            prefix = f"task {tid[:80]!r}{'...' if len(tid) > 80 else ''}: " if isinstance(tid, str) else ""
            problems.extend((lineno, prefix + _describe(e)) for e in exc.errors())
            continue
        if task.task_id in first_line:
            problems.append((lineno, f"duplicate task_id {task.task_id!r} (first on line {first_line[task.task_id]})"))
            continue
        first_line[task.task_id] = lineno
        tasks.append(task)
    if problems:
        raise TaskFileError(path, problems)
    if not tasks:
        raise TaskFileError(path, [(0, "the batch holds no tasks")])
    return tasks


def load_all_batches(benchgen_dir: Path, refused: list[TaskFileError] | None = None) -> list[tuple[str, Task]]:
    """Every task of every batch file, checking that task ids are unique across batches. A bad
    file raises `TaskFileError`; with `refused` (a list) it is appended there and left out whole
    instead, so one bad batch does not stop the others (the reward matrix builds from the rest)."""
    out: list[tuple[str, Task]] = []
    seen: dict[str, str] = {}
    for b, path in scan_batch_files(benchgen_dir)[0]:  # badly named files are refused where they are listed
        try:
            tasks = load_tasks(path)
            clash = next((t for t in tasks if t.task_id in seen), None)
            if clash is not None:
                raise TaskFileError(path, [(0, f"task_id {clash.task_id!r} is also in batch {seen[clash.task_id]!r}; "
                                               "task ids must be unique across batches")])
        except TaskFileError as exc:
            if refused is None:
                raise
            refused.append(exc)
            continue
        for t in tasks:
            seen[t.task_id] = b
            out.append((b, t))
    return out
