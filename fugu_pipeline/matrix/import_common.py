"""What every importer shares: file reading with errors that name the file, the deterministic
split draw from (seed, task id), and the id/ood tags."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.matrix.import_format import (
    MAX_ANSWER_CHARS,
    RewardRow,
    check_worker_id,
    check_worker_set,
    is_blank,
    read_bytes,
)
from fugu_pipeline.tasks.loading import TaskFileError


def fail(path: Path, msg: str, line: int = 0) -> TaskFileError:
    return TaskFileError(Path(path), [(line, msg)])


def option_errors(exc: Exception, name=lambda field: field) -> str:
    """A pydantic ValidationError of an importer's options as its reasons, each led by the option's
    name as the caller spells it (`--worker-column`, `import_options.worker_column`); any other
    error as its text."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join((f"{name('.'.join(str(x) for x in e['loc']))}: " if e["loc"] else "")
                     + e["msg"].removeprefix("Value error, ") for e in errors())


_SHOWN = 5  # rows named per problem


def rows_named(row_numbers: pl.Series, mask: pl.Series) -> str:
    """The first few of `row_numbers` where `mask` holds, and how many more."""
    idx = row_numbers.filter(mask).to_list()
    more = f" and {len(idx) - _SHOWN} more" if len(idx) > _SHOWN else ""
    return ", ".join(str(i) for i in idx[:_SHOWN]) + more


def read_text(path: Path, what: str) -> str:
    try:
        return read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(path, f"not UTF-8 text: {exc}") from None


def answer_texts(s: pl.Series, path: Path, rows: pl.Series) -> list[str | None]:
    """A column of workers' replies (or final answers) as text, null where unknown: numbers and
    booleans become their text; records, lists or a runaway reply are refused, naming the column
    and the data rows (`rows`: each value's row in the file)."""
    if s.dtype.is_nested() or s.dtype == pl.Object:
        raise fail(path, f"column {s.name!r} (a worker's reply) holds {s.dtype}, not text, in rows "
                         f"{rows_named(rows, s.is_not_null())}: give each reply as text, or leave the cell empty")
    text = s.cast(pl.String)
    long = text.str.len_chars() > MAX_ANSWER_CHARS
    if long.any():
        raise fail(path, f"column {s.name!r}: a reply of more than {MAX_ANSWER_CHARS:,} characters in rows "
                         f"{rows_named(rows, long)}: cut it to its final part, or leave the cell empty")
    return text.to_list()


def blank_mask(texts: pl.Series) -> pl.Series:
    return pl.Series([is_blank(t) for t in texts.to_list()], dtype=pl.Boolean)


def check_workers(path: Path, workers: list[str], where: str) -> None:
    """Every worker id follows the import rule and the set can be the matrix's columns (no two ids
    equal but for case, none named task_id, split or domain); else one error naming the file."""
    for w in workers:
        try:
            check_worker_id(w)
        except ValueError as exc:
            raise fail(path, f"{where} {w!r} cannot be a worker id: {exc}") from None
    try:
        check_worker_set(workers)
    except ValueError as exc:
        raise fail(path, f"{where}s: {exc}") from None


def unit(seed: int, task_id: str) -> float:
    """A uniform number in [0, 1) that depends only on (seed, task_id)."""
    h = hashlib.sha256(f"{seed}\x00{task_id}".encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def assign_split(task_id: str, seed: int = 0, test_fraction: float = 0.3, val_fraction: float = 0.1) -> str:
    if test_fraction < 0 or val_fraction < 0 or test_fraction + val_fraction >= 1:
        raise ValueError(f"need test_fraction >= 0, val_fraction >= 0 and a sum below 1; got {test_fraction} and {val_fraction}")
    u = unit(seed, task_id)
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


class TableOptions(BaseModel):
    """What the table importers (`table`, `long`) share: where rows get their split (a column named
    by the importer's spec, fractions drawn from (seed, task id), or a file per split) and the scale
    of the scores."""

    model_config = ConfigDict(extra="forbid")

    score_range: tuple[float, float] | None = Field(
        None, description="the scores' scale, e.g. (1, 10) for a judge's score: mapped linearly onto [0, 1]; "
        "default: the scores are in [0, 1] already")
    seed: int = 0
    test_fraction: float | None = None
    val_fraction: float | None = None
    test_file: Path | None = Field(None, description="a second file of the same layout whose tasks are the test split "
                                                     "(the main file's are train)")
    val_file: Path | None = Field(None, description="a file of the same layout whose tasks are the val split")

    def fractions(self) -> tuple[float, float]:
        return (0.3 if self.test_fraction is None else self.test_fraction,
                0.1 if self.val_fraction is None else self.val_fraction)

    def scale(self) -> tuple[float, float]:
        return self.score_range or (0.0, 1.0)

    def check_splits(self, split_column: str | None) -> None:
        if self.score_range is not None and not all(map(math.isfinite, self.score_range)):
            raise ValueError(f"score_range {list(self.score_range)}: give finite numbers, the lowest possible score, then the highest")
        if self.score_range is not None and not self.score_range[0] < self.score_range[1]:
            raise ValueError(f"score_range {list(self.score_range)}: give the lowest possible score, then the highest")
        drawn = self.test_fraction is not None or self.val_fraction is not None
        if (self.test_file or self.val_file) and (split_column or drawn):
            raise ValueError("test_file and val_file give the splits by file; drop the split column and the fractions")
        if split_column and drawn:
            raise ValueError("the split column gives every row its split; test_fraction and val_fraction draw them: pick one")
        assign_split("", 0, *self.fractions())  # checks the fractions


def tag_in_distribution(rows: list[RewardRow]) -> list[RewardRow]:
    """Add `id` to rows whose domain occurs among the training rows, `ood` to the others."""
    seen = {r.domain for r in rows if r.split == "train"}
    return [r.model_copy(update={"tags": [t for t in r.tags if t not in ("id", "ood")]
                                 + ["id" if r.domain in seen else "ood"]}) for r in rows]


# What to do when a reward-matrix JSONL holds no test rows (said by `fugu-lite train` and `evaluate`).
HOLD_OUT_HINT = ("rows without a 'split' field count as train; hold some out with `fugu-lite import jsonl R.jsonl "
                 "--output R2.jsonl --test-fraction 0.3`, or give rows \"split\": \"test\"")


def id_stem(path: Path) -> str:
    """What a default task id starts with: the file's name up to its first dot (`rb` of `rb.csv.gz`)."""
    return Path(path).name.split(".")[0]


def in_order(row: RewardRow, workers: list[str]) -> RewardRow:
    """`row` with its per-worker lists in the order of `workers` (the same set)."""
    at = [row.worker_ids.index(w) for w in workers]
    lists = {k: [v[i] for i in at] for k in ("rewards", "quality", "cost_usd", "latency_s") if (v := getattr(row, k)) is not None}
    return row.model_copy(update={"worker_ids": list(workers), **lists})


def rows_from_split_files(path: Path, val_file: Path | None, test_file: Path | None, read_one) -> tuple[list[RewardRow], dict]:
    """Rows of `path` as train, of `val_file` as val, of `test_file` as test (EmbedLLM ships its
    splits as train.csv, val.csv, test.csv). `read_one(file, split, stem)` reads one file; `stem`
    starts its default task ids (the file's name up to its first dot, with the split added where
    two files would share it: `rb.train.csv` and `rb.test.csv`). Every file must name the same
    workers (in any column order); a task id in two files is refused; a training row whose prompt a
    held-out file also holds is dropped (counted), as the dcrouter importer does."""
    parts = [(Path(path), "train")] + [(Path(f), s) for f, s in ((val_file, "val"), (test_file, "test")) if f is not None]
    names = [p.resolve() for p, _ in parts]
    if len(set(names)) < len(names):
        raise fail(parts[0][0], "the same file is named for two splits; give each split its own file")
    stems = [id_stem(p) for p, _ in parts]
    if len(set(stems)) < len(stems):
        stems = [f"{stem}-{split}" for stem, (_, split) in zip(stems, parts)]
    rows: list[RewardRow] = []
    notes: dict = {"splits_from": ", ".join(f"{s}: {p.name}" for p, s in parts), "files": {}}
    where: dict[str, str] = {}
    workers: list[str] | None = None
    for (p, split), stem in zip(parts, stems):
        got, file_notes = read_one(p, split, stem)
        file_notes.pop("splits_from", None)
        if workers is None:
            workers = got[0].worker_ids
        elif got[0].worker_ids != workers:
            gone, new = sorted(set(workers) - set(got[0].worker_ids)), sorted(set(got[0].worker_ids) - set(workers))
            if gone or new:
                raise fail(p, f"its workers differ from {parts[0][0].name}'s (missing {gone[:5]}, extra {new[:5]}); "
                              "pass --workers to keep the ones every file has")
            got = [in_order(r, workers) for r in got]
        for r in got:
            if r.task_id in where:
                raise fail(p, f"task id {r.task_id!r} is also in {where[r.task_id]}: a task is in one split only")
            where[r.task_id] = p.name
        notes["files"][p.name] = {"split": split, "rows": len(got), **file_notes}
        rows += got
    held_out = {r.prompt for r in rows if r.split != "train"}
    kept = [r for r in rows if r.split != "train" or r.prompt not in held_out]
    if len(kept) < len(rows):
        notes["train_rows_dropped_as_in_a_held_out_file"] = len(rows) - len(kept)
    return tag_in_distribution(kept), notes
