"""A long table of routing outcomes -> reward-matrix rows (`fugu-lite import long`).

One row per (prompt, worker): the layout of a production call log, of per-sample leaderboard
details and of EmbedLLM's correctness files. The rows are grouped by task (the id column, else the
prompt text) and pivoted to one reward-matrix row per task with a score per worker. The prompts
may sit in a second table (`prompts`, one row per task id), as EmbedLLM keeps them.

Nothing in the files is trusted. Each problem names the file, the column and the data rows
(1-based, header not counted), and nothing is written:
- a worker id that breaks the import rule, a missing or non-numeric score, a score outside [0, 1]
  (or outside `score_range`, the scale mapped onto [0, 1], e.g. a judge's 1-10);
- a task whose rows disagree on its prompt, domain or split;
- a (task, worker) pair given twice (`duplicates="mean"` averages repeated samples instead);
- a task without a score from every worker (`drop_incomplete` leaves it out and counts it);
- a response whose task id the prompts table lacks, or a prompts table with a repeated id.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import Field, field_validator, model_validator

from fugu_pipeline.matrix.import_common import (
    TableOptions,
    answer_texts,
    assign_split,
    blank_mask,
    check_workers,
    fail,
    id_stem,
    rows_from_split_files,
    rows_named,
    tag_in_distribution,
)
from fugu_pipeline.matrix.import_format import RewardRow, check_worker_id, worker_names
from fugu_pipeline.matrix.import_table import SPLIT_VALUES, numbers, prompt_texts, read_table, scaled, text_column

_ROW = "__fugu_row"  # the 1-based data row of the file, carried through filters
# the importer's own columns: a worker id starts with a letter or digit, so none can clash with these
_KEY, _WORKER, _SCORE, _ANSWER = "__fugu_key", "__fugu_worker", "__fugu_score", "__fugu_answer"


class LongSpec(TableOptions):
    """Which columns of the long table (and of the optional prompts table) mean what."""

    worker_column: str = Field("model", min_length=1)
    score_column: str = Field("score", min_length=1)
    prompt_column: str = Field("prompt", min_length=1)
    id_column: str | None = Field(None, description="the task id; default: tasks are told apart by their prompt text")
    prompts: Path | None = Field(None, description="a table of the tasks (id, prompt, and domain/split when named), "
                                                   "one row per id; needs id_column")
    domain_column: str | None = None
    split_column: str | None = None
    cost_column: str | None = Field(None, description="the cost in USD of this row's call")
    latency_column: str | None = Field(None, description="the latency in seconds of this row's call")
    answer_column: str | None = Field(None, description="this row's reply (or its final answer): kept as the task's "
                                      "answers, which cascades read; with --duplicates mean, the first sample's")
    workers: list[str] | Literal["auto"] = Field("auto", description="auto = every worker the file names, sorted")
    duplicates: Literal["refuse", "mean"] = "refuse"
    drop_incomplete: bool = False

    @field_validator("workers", mode="before")
    @classmethod
    def _names(cls, v):
        """As `--workers` gives them, or import_options as one YAML string: "c, a"."""
        return worker_names(v) if isinstance(v, (str, list, tuple)) else v

    @model_validator(mode="after")
    def _check(self) -> "LongSpec":
        if self.prompts is not None and not self.id_column:
            raise ValueError("a prompts table is joined by task id: name the id column (--id-column)")
        self.check_splits(self.split_column)
        if self.workers != "auto" and len(set(self.workers)) != len(self.workers):
            raise ValueError("workers lists a worker twice")
        for c in (self.cost_column, self.latency_column, self.answer_column):
            if c and "{worker}" in c:
                raise ValueError(f"{c!r}: in a long table each row is one worker's call, so its cost is one column, "
                                 "not a {worker} template")
        return self

    def task_columns(self) -> list[str]:
        """Columns that describe the task, not the call: one value per task."""
        return [c for c in (self.prompt_column, self.domain_column, self.split_column) if c]

    def text_columns(self) -> list[str]:
        """Columns read as text from a CSV (an id `007` stays `007`)."""
        return [c for c in (self.worker_column, self.id_column, *self.task_columns(), self.answer_column) if c]


def _need(df: pl.DataFrame, path: Path, cols: list[str], what: str, prompt: str | None = None) -> pl.DataFrame:
    """`df` with every column in `cols` checked, its prompt column (when among them) as the text a
    router reads (`prompt_texts`: a conversation becomes its last user message)."""
    for c in cols:
        if c not in df.columns:
            raise fail(path, f"no column {c!r} ({what}); the table's columns: {df.columns[:40]}")
        if c != prompt and (df[c].dtype.is_nested() or df[c].dtype == pl.Object):
            raise fail(path, f"column {c!r} holds {df[c].dtype}, not plain values")
    return df.with_columns(prompt_texts(df[prompt], path)) if prompt in cols else df


def _task_table(spec: LongSpec, responses: pl.DataFrame, path: Path) -> tuple[pl.DataFrame, Path]:
    """One row per task key: `key`, the task columns, and the rows where the task was read."""
    if spec.prompts is None:
        src, src_path = responses, path
    else:
        src_path = Path(spec.prompts)
        src = read_table(src_path, text=spec.text_columns()).with_row_index(_ROW, offset=1)
        src = _need(src, src_path, [spec.id_column, *spec.task_columns()], "the prompts table", spec.prompt_column)
        src = src.with_columns(text_column(src, spec.id_column, src_path).alias(_KEY))
        dup = src[_KEY].is_duplicated() | src[_KEY].is_null()
        if dup.any():
            raise fail(src_path, f"column {spec.id_column!r}: missing or repeated task ids in rows {rows_named(src[_ROW], dup)}")
    tasks = src.select(_KEY, _ROW, *[text_column(src, c, src_path).alias(c) for c in spec.task_columns()])
    for c in spec.task_columns():  # one value per task, or the file contradicts itself
        n = tasks.group_by(_KEY).agg(pl.col(c).n_unique().alias("n"), pl.col(_ROW).alias("rows")).filter(pl.col("n") > 1)
        if n.height:
            first = n.row(0, named=True)
            shown = ", ".join(str(r) for r in first["rows"][:5])
            raise fail(src_path, f"column {c!r}: task {first[_KEY]!r} has {first['n']} different values (rows {shown}); "
                                 f"{n.height} task(s) disagree like this. A task's {c} must be the same on each of its rows")
    empty = blank_mask(tasks[spec.prompt_column])
    if empty.any():
        raise fail(src_path, f"column {spec.prompt_column!r}: empty prompt in rows {rows_named(tasks[_ROW], empty)}")
    if spec.split_column:
        splits = tasks[spec.split_column].str.strip_chars().str.to_lowercase()
        wrong = ~splits.is_in(SPLIT_VALUES) | splits.is_null()
        if wrong.any():
            raise fail(src_path, f"column {spec.split_column!r}: a split must be one of {', '.join(SPLIT_VALUES)}; "
                                 f"rows {rows_named(tasks[_ROW], wrong)}")
        tasks = tasks.with_columns(splits.alias(spec.split_column))
    return tasks.unique(_KEY, keep="first", maintain_order=True), src_path


def import_long(path, spec: LongSpec | None = None, *, split: str | None = None,
                stem: str | None = None) -> tuple[list[RewardRow], dict]:
    """Reward-matrix rows from a long table, and notes on what was read. With `spec.test_file` or
    `spec.val_file`, each file's tasks take that file's split; `split` is that split for one file,
    `stem` what its default task ids start with."""
    path, spec = Path(path), spec or LongSpec()
    if split is None and (spec.test_file or spec.val_file):
        return rows_from_split_files(path, spec.val_file, spec.test_file,
                                     lambda p, s, stem: import_long(p, spec, split=s, stem=stem))
    df = read_table(path, rows=True, text=spec.text_columns()).with_row_index(_ROW, offset=1)
    own = [spec.worker_column, spec.score_column] + [c for c in (spec.id_column, spec.cost_column, spec.latency_column) if c]
    if spec.answer_column:  # checked here, where every row is still in the file's order: a bad reply names its row
        if spec.answer_column not in df.columns:
            raise fail(path, f"no column {spec.answer_column!r} (the workers' replies); the table's columns: {df.columns[:40]}")
        df = df.with_columns(pl.Series(_ANSWER, answer_texts(df[spec.answer_column], path, df[_ROW]), dtype=pl.String))
    df = _need(df, path, own + ([] if spec.prompts else spec.task_columns()), "the responses table", spec.prompt_column)
    notes: dict = {"table": f"{df.height} rows x {len(df.columns) - 1} columns"}

    workers_s = text_column(df, spec.worker_column, path).str.strip_chars()
    if workers_s.is_null().any():
        raise fail(path, f"column {spec.worker_column!r}: missing worker in rows {rows_named(df[_ROW], workers_s.is_null())}")
    df = df.with_columns(workers_s.alias(_WORKER))
    if spec.workers != "auto":
        absent = [w for w in spec.workers if w not in set(workers_s.unique().to_list())]
        if absent:
            raise fail(path, f"column {spec.worker_column!r} never names worker {absent[0]!r} (--workers)")
        other = ~df[_WORKER].is_in(spec.workers)
        if other.any():
            notes["rows_of_other_workers"] = int(other.sum())
            df = df.filter(~other)
    seen = sorted(df[_WORKER].unique().to_list())  # sorted: the same columns whatever the rows' order
    for w in seen:
        try:
            check_worker_id(w)
        except ValueError as exc:
            raise fail(path, f"column {spec.worker_column!r}: {w!r} (rows {rows_named(df[_ROW], df[_WORKER] == w)}) "
                             f"cannot be a worker id: {exc}") from None
    workers = list(spec.workers) if spec.workers != "auto" else seen
    check_workers(path, workers, f"column {spec.worker_column!r}: worker")
    if len(workers) < 2:
        raise fail(path, f"column {spec.worker_column!r} names {len(workers)} worker(s) {workers}; routing needs at least 2")

    score = numbers(df, spec.score_column, path, "a worker's score", df[_ROW])
    missing = score.is_null() | score.is_nan()
    if missing.any() and not spec.drop_incomplete:
        raise fail(path, f"column {spec.score_column!r}: missing score in rows {rows_named(df[_ROW], missing)}; "
                         "pass --drop-incomplete to leave those tasks out")
    score = scaled(score.fill_nan(None), spec, path, spec.score_column, df[_ROW])
    extra = {}
    for col, name, what in ((spec.cost_column, "cost", "a call's cost in USD"), (spec.latency_column, "latency", "a call's latency in s")):
        if col:
            v = numbers(df, col, path, what, df[_ROW])
            wrong = v.is_null() | v.is_nan() | (v < 0) | v.is_infinite()
            if wrong.any():
                raise fail(path, f"column {col!r}: missing, negative or infinite {name} in rows {rows_named(df[_ROW], wrong)}")
            extra[name] = v
    df = df.with_columns(score.alias(_SCORE), *[v.alias(f"__fugu_{n}") for n, v in extra.items()])

    if spec.id_column:
        key = text_column(df, spec.id_column, path)
        if key.is_null().any():
            raise fail(path, f"column {spec.id_column!r}: missing task id in rows {rows_named(df[_ROW], key.is_null())}")
    else:  # the prompt text tells tasks apart; the id is stable under reordering and dropped rows
        text = df[spec.prompt_column]
        stem = stem or id_stem(path)
        ids = {p: f"{stem}-{hashlib.sha256(p.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
               for p in text.drop_nulls().unique().to_list()}
        key = text.replace_strict(ids, default=None, return_dtype=pl.String)
    df = df.with_columns(key.alias(_KEY))

    tasks, task_path = _task_table(spec, df, path)
    if spec.prompts is not None:
        unknown = ~df[_KEY].is_in(tasks[_KEY])
        if unknown.any():
            raise fail(path, f"column {spec.id_column!r}: task ids the prompts table {task_path.name} lacks, rows "
                             f"{rows_named(df[_ROW], unknown)} (e.g. {df[_KEY].filter(unknown)[0]!r})")
        if split is None:  # with a file per split, the other splits' prompts have no responses here
            notes["prompts_without_responses"] = int((~tasks[_KEY].is_in(df[_KEY])).sum())

    pairs = df.group_by(_KEY, _WORKER, maintain_order=True).agg(
        pl.len().alias("n"), pl.col(_ROW).alias("rows"), pl.col(_SCORE).mean(), pl.col(_SCORE).null_count().alias("nulls"),
        *[pl.col(f"__fugu_{c}").mean().alias(c) for c in extra],
        *([pl.col(_ANSWER).first().alias("answer")] if spec.answer_column else []))
    twice = pairs.filter(pl.col("n") > 1)
    if twice.height:
        if spec.duplicates == "refuse":
            first = twice.row(0, named=True)
            raise fail(path, f"task {first[_KEY]!r} has {first['n']} rows for worker {first[_WORKER]!r} (rows "
                             f"{', '.join(str(r) for r in first['rows'][:5])}); {twice.height} (task, worker) pair(s) repeat. "
                             "Pass --duplicates mean to average repeated samples, or remove the repeats")
        notes["pairs_averaged"] = twice.height
    pairs = pairs.filter(pl.col("nulls") == 0) if spec.duplicates == "refuse" else pairs.filter(pl.col(_SCORE).is_not_null())
    counts = pairs.group_by(_KEY).agg(pl.col(_WORKER).n_unique().alias("k"))
    order = df.select(_KEY).unique(maintain_order=True)
    counts = order.join(counts, on=_KEY, how="left").with_columns(pl.col("k").fill_null(0))
    incomplete = counts.filter(pl.col("k") < len(workers))
    complete = counts.height - incomplete.height
    if incomplete.height and complete * 10 < counts.height:  # a log of calls, not a matrix
        raise fail(path, f"only {complete} of {counts.height} tasks have a score from every one of the {len(workers)} workers "
                         f"(a task has {counts['k'].median():g} on median): a router learns from prompts every worker answered. "
                         "A production log, where each prompt went to one worker, is not enough: replay its prompts to every "
                         "worker (`fugu-lite generate --tasks ... --workers W.yaml`), or keep with --workers the ones that answered them all")
    if incomplete.height:
        if not spec.drop_incomplete:
            shown = ", ".join(repr(k) for k in incomplete[_KEY].head(5).to_list())
            raise fail(path, f"{incomplete.height} task(s) lack a score from some of the {len(workers)} workers (e.g. {shown}); "
                             "pass --drop-incomplete to leave them out, or --workers to keep only the workers every task has")
        notes["dropped_incomplete"] = incomplete.height
    keys = counts.filter(pl.col("k") == len(workers))[_KEY]
    if keys.len() == 0:
        raise fail(path, "no task has a score from every worker")

    wide = {name: pairs.pivot(on=_WORKER, index=_KEY, values=name)
            for name in (_SCORE, *extra, *(["answer"] if spec.answer_column else []))}
    tasks = tasks.filter(pl.col(_KEY).is_in(keys))
    tasks = tasks.join(pl.DataFrame({_KEY: keys}).with_row_index("_order"), on=_KEY).sort("_order")
    cells = {name: tasks.select(_KEY).join(t, on=_KEY, how="left", maintain_order="left").select(workers).rows()
             for name, t in wide.items()}
    if split is not None:
        splits = [split] * tasks.height
    elif spec.split_column:
        splits = tasks[spec.split_column].to_list()
        notes["splits_from"] = f"column {spec.split_column!r}"
    else:
        tf, vf = spec.fractions()
        splits = [assign_split(t, spec.seed, tf, vf) for t in tasks[_KEY].to_list()]
        notes["splits_from"] = f"drawn from (seed {spec.seed}, task id): test {tf}, val {vf}"
    domains = tasks[spec.domain_column].fill_null("general").to_list() if spec.domain_column else ["general"] * tasks.height
    notes["workers"] = workers
    rows = [RewardRow(task_id=t, prompt=p, domain=d, split=s, worker_ids=workers, quality=list(cells[_SCORE][i]),
                      cost_usd=list(cells["cost"][i]) if "cost" in cells else None,
                      latency_s=list(cells["latency"][i]) if "latency" in cells else None,
                      answers=list(cells["answer"][i]) if "answer" in cells else None)
            for i, (t, p, d, s) in enumerate(zip(tasks[_KEY].to_list(), tasks[spec.prompt_column].to_list(), domains, splits))]
    return tag_in_distribution(rows), notes
