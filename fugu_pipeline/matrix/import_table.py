"""A wide table of routing outcomes -> reward-matrix rows (`fugu-lite import table`).

One row per prompt, one column per worker holding its score in [0, 1]: the layout of RouterBench,
of most leaderboard exports and of a spreadsheet someone keeps by hand. CSV, TSV, Parquet or JSON
Lines (each optionally .gz). The columns are named by the caller (`TableSpec`); nothing else in
the file is trusted: every worker column must be numeric or boolean with every value in [0, 1],
every worker id must follow the import rule, the split column may hold only train/val/test, task
ids must be unique. Each problem names the file, the column and the data row (1-based, header
not counted), and nothing is written. polars reads the file: no code in it is run (a pickle
would be; convert one with `pandas.read_pickle(p).to_parquet(q)` where you trust it).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import Field, model_validator

from fugu_pipeline.matrix.import_common import (
    TableOptions,
    answer_texts,
    assign_split,
    blank_mask,
    check_workers,
    fail,
    id_stem,
    read_bytes,
    rows_from_split_files,
    rows_named,
    tag_in_distribution,
)
from fugu_pipeline.matrix.import_format import RewardRow
from fugu_pipeline.tasks.messages import routed_text

FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
SPLIT_VALUES = ("train", "val", "test")


class TableSpec(TableOptions):
    """Which columns of the table mean what."""

    prompt_column: str = Field("prompt", min_length=1)
    workers: list[str] | Literal["auto"] = Field(
        "auto", description="the worker score columns; auto = every numeric or boolean column no other option names")
    domain_column: str | None = None
    split_column: str | None = None
    id_column: str | None = None
    cost_column: str | None = Field(None, description="each worker's cost column, as a template with {worker}, e.g. '{worker}|total_cost'")
    answer_column: str | None = Field(None, description="each worker's reply (or final answer) column, as a template with "
                                      "{worker}, e.g. '{worker}|model_response': kept as the row's answers (cascades read them)")
    drop_incomplete: bool = False
    score_field: str = Field("score", min_length=1, description="where a worker's column holds records (SPROUT: "
                             "{score, num_input_tokens, ...}), the field holding the score")
    prices: Path | None = Field(None, description="a YAML of worker: {input, output} USD per million tokens: the cost of "
                                "each call from its record's token counts")
    input_tokens_field: str = "num_input_tokens"
    output_tokens_field: str = "num_output_tokens"

    @model_validator(mode="after")
    def _check(self) -> "TableSpec":
        if self.cost_column is not None and self.prices is not None:
            raise ValueError("cost_column reads each call's cost; prices compute it from token counts: pick one")
        if self.cost_column is not None and "{worker}" not in self.cost_column:
            raise ValueError(f"cost_column {self.cost_column!r} must contain {{worker}}, e.g. '{{worker}}|total_cost'")
        if self.answer_column is not None and "{worker}" not in self.answer_column:
            raise ValueError(f"answer_column {self.answer_column!r} must contain {{worker}}, e.g. '{{worker}}|model_response'")
        self.check_splits(self.split_column)
        if self.workers != "auto" and len(set(self.workers)) != len(self.workers):
            raise ValueError("workers lists a column twice")
        return self

    def named(self) -> list[str]:
        return [c for c in (self.prompt_column, self.domain_column, self.split_column, self.id_column) if c]


def scaled(s: pl.Series, spec: TableOptions, path: Path, col: str, rows: pl.Series, guessed: bool = False) -> pl.Series:
    """Scores mapped from the spec's scale onto [0, 1]; a score outside the scale is refused with
    its rows (nulls pass through). `guessed`: the column was taken as a worker by --workers auto."""
    lo, hi = spec.scale()
    bad = s.is_not_null() & ((s < lo) | (s > hi))
    if bad.any():
        how = (f"outside --score-range [{lo:g}, {hi:g}]" if spec.score_range else
               "outside [0, 1]")
        hint = "" if spec.score_range else "; give their scale with --score-range (a judge's 1-10: --score-range 1,10)"
        if guessed:
            hint += (f". If {col!r} is not a worker's score, --workers auto took it for one: name what it is "
                     "(--id-column, --domain-column) or list the workers with --workers")
        raise fail(path, f"column {col!r}: scores {how} in rows {rows_named(rows, bad)} (e.g. {s.filter(bad)[0]}){hint}")
    return s if spec.score_range is None else (s - lo) / (hi - lo)


def prompt_texts(s: pl.Series, path: Path) -> pl.Series:
    """Each row's prompt as the text a router reads. Text stays text. A conversation, a list of
    messages with `role` and `content` (OpenAI's chat format, as call logs keep it), becomes its last
    user message: what `serve` routes a request on (`tasks/messages.py`). A list of strings, a
    conversation's user turns (MT-Bench's `turns`), becomes its first turn, the one that opens it."""
    dt = s.dtype
    if dt == pl.String and table_format(path) == "jsonl" and s.str.starts_with("[").any():
        raw = _jsonl_values(path, s.name)  # polars writes a list as JSON text where the rows mix text and lists
        if len(raw) == len(s) and any(not isinstance(v, str) for v in raw if v is not None):
            return pl.Series(s.name, [_one_prompt(v, path, i) for i, v in enumerate(raw, start=1)], dtype=pl.String)
    if isinstance(dt, pl.List):
        inner = dt.inner
        if isinstance(inner, pl.Struct) and "content" in {f.name for f in inner.fields}:
            return pl.Series(s.name, [routed_text(v) if v else None for v in s.to_list()], dtype=pl.String)
        if inner == pl.String:
            return pl.Series(s.name, [v[0] if v else None for v in s.to_list()], dtype=pl.String)
    if dt.is_nested() or dt == pl.Object:
        raise fail(path, f"column {s.name!r} holds {dt}: name a column of text, of messages (a list of role and content) "
                         "or of a conversation's turns (a list of strings)")
    return s.cast(pl.String)


def _jsonl_values(path: Path, col: str) -> list:
    """The column's values in a JSON Lines file as JSON gives them, a row a non-blank line."""
    import json

    return [json.loads(x).get(col) for x in read_bytes(path, "a jsonl table").decode("utf-8").split("\n") if x.strip()]


def _one_prompt(v, path: Path, row: int) -> str | None:
    """One prompt value as `prompt_texts` reads a column of them."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(isinstance(m, dict) and "content" in m for m in v):
        return routed_text(v)
    if isinstance(v, list) and v and all(isinstance(t, str) for t in v):
        return v[0]
    raise fail(path, f"row {row}: the prompt is {type(v).__name__} {str(v)[:60]!r}: give text, a list of messages "
                     "(role and content) or a list of turns")


def table_format(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    suffix = Path(name).suffix
    if suffix not in FORMATS:
        raise fail(path, f"unknown table format {suffix or '(no suffix)'!r}; use one of {', '.join(sorted(FORMATS))} (optionally .gz)")
    return FORMATS[suffix]


_DUPLICATED = re.compile(r"(.+)_duplicated_\d+")  # polars' name for a header's repeated column


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _refuse_lone_surrogates(path: Path, data: bytes) -> None:
    """JSON may escape half of a UTF-16 pair (`\\ud800`) with no other half: no text holds it,
    and polars would read it as U+0000 without a word. Name the line instead. A quick scan first;
    only the lines it flags are parsed."""
    if not _SURROGATE_ESCAPE.search(data):
        return
    import json

    for n, line in enumerate(data.split(b"\n"), start=1):
        if not _SURROGATE_ESCAPE.search(line):
            continue
        try:
            json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise fail(path, f"line {n}: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
                             "which is not text; fix or drop that line") from None
        except ValueError:
            continue  # not JSON: polars names it


def _ragged_row(data: bytes, kind: str) -> str | None:
    """The first row of a CSV or TSV with more cells than its header, in words, or None. Polars
    names no row for it."""
    import csv

    try:
        lines = data.decode("utf-8-sig").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None
    opts = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == "tsv" else {"delimiter": ","}
    reader = csv.reader(lines, **opts)
    try:
        header = next(reader)
        start = reader.line_num + 1
        for row, cells in enumerate(reader, start=1):
            if len(cells) > len(header):
                return (f"row {row} (line {start}) has {len(cells)} cells where the header names "
                        f"{len(header)} columns: a stray {'tab' if kind == 'tsv' else 'comma'} in a cell"
                        f"{'' if kind == 'tsv' else ' that is not quoted'}, or a missing column name; fix that row")
            start = reader.line_num + 1
    except (StopIteration, csv.Error):
        return None
    return None


def read_table(path: Path, rows: bool = False, text: list[str] | tuple[str, ...] = ()) -> pl.DataFrame:
    """The file as a polars frame; with `rows`, a file without data rows is refused. The `text`
    columns of a CSV or TSV are read as text (`007` stays `007`). A TSV has no quoting (a cell may
    hold `"`). A header naming a column twice is refused."""
    kind = table_format(path)
    data = io.BytesIO(read_bytes(path, f"a {kind} table"))
    if kind == "jsonl":
        _refuse_lone_surrogates(path, data.getvalue())
    try:
        if kind in ("csv", "tsv"):
            df = pl.read_csv(data, separator="\t" if kind == "tsv" else ",", infer_schema_length=None,
                             quote_char=None if kind == "tsv" else '"', schema_overrides=dict.fromkeys(text, pl.String))
        elif kind == "parquet":
            df = pl.read_parquet(data)
        else:
            df = pl.read_ndjson(data, infer_schema_length=None)
    except Exception as exc:  # polars raises several error types for a malformed file
        ragged = _ragged_row(data.getvalue(), kind) if kind in ("csv", "tsv") else None
        if ragged:
            raise fail(path, ragged) from None
        raise fail(path, f"cannot read it as {kind}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
    twice = [c for c in df.columns if (m := _DUPLICATED.fullmatch(c)) and m.group(1) in df.columns]
    if twice:
        raise fail(path, f"the header names column {_DUPLICATED.fullmatch(twice[0]).group(1)!r} twice; give each column its own name")
    if rows and df.height == 0:
        raise fail(path, "the table has no rows")
    return df


def text_column(df: pl.DataFrame, col: str, path: Path) -> pl.Series:
    """A column as text; one that cannot be (bytes that are not UTF-8) is refused with its name."""
    try:
        return df[col].cast(pl.String)
    except Exception as exc:  # polars raises ComputeError, InvalidOperationError, ...
        raise fail(path, f"column {col!r} ({df[col].dtype}) cannot be read as text: {str(exc).splitlines()[0][:120]}") from None


def _is_record(dtype, field: str) -> bool:
    return isinstance(dtype, pl.Struct) and field in {f.name for f in dtype.fields}


def _worker_columns(df: pl.DataFrame, spec: TableSpec, path: Path) -> tuple[list[str], str]:
    cols = df.columns
    if spec.workers != "auto":
        absent = [w for w in spec.workers if w not in cols]
        if absent:
            raise fail(path, f"no column {absent[0]!r} (--workers); the table's columns: {cols[:40]}")
        workers, how = list(spec.workers), "--workers"
    elif records := [c for c in cols if c not in spec.named() and _is_record(df[c].dtype, spec.score_field)]:
        workers, how = records, f"auto: the {len(records)} columns of records with a {spec.score_field!r} field"
    else:
        templates = [re.compile(re.escape(t).replace(re.escape("{worker}"), ".+"))
                     for t in (spec.cost_column, spec.answer_column) if t]
        cost_re = re.compile("|".join(f"(?:{t.pattern})" for t in templates)) if templates else None  # not a worker
        workers = [c for c in cols if c not in spec.named() and (df[c].dtype.is_numeric() or df[c].dtype == pl.Boolean)
                   and not (cost_re and cost_re.fullmatch(c))]
        how = f"auto: the {len(workers)} numeric columns no other option names"
        costly = [c for c in workers if "cost" in c.lower()]
        if costly:
            raise fail(path, f"--workers auto would take column {costly[0]!r} as a worker's score; it looks like a cost: "
                             "pass --cost-column with a {worker} template (e.g. '{worker}|total_cost') or list --workers")
        for c in cols:  # a score column that one stray cell turned into text would silently drop a worker
            if c not in spec.named() and df[c].dtype == pl.String and not (cost_re and cost_re.fullmatch(c)):
                _refuse_almost_numbers(df[c], path, spec.scale())
    if len(workers) < 2:
        records = {c: [f.name for f in df[c].dtype.fields][:8] for c in cols if isinstance(df[c].dtype, pl.Struct)}
        hint = (f"; columns {list(records)[:3]} hold records with fields {next(iter(records.values()))}: name the score's "
                "field with --score-field" if records and spec.workers == "auto" else "")
        raise fail(path, f"found {len(workers)} worker column(s) {workers}; routing needs at least 2 (--workers a,b,...){hint}")
    check_workers(path, workers, "column")
    return workers, how


def _refuse_almost_numbers(s: pl.Series, path: Path, scale: tuple[float, float]) -> None:
    """A text column whose cells are mostly numbers on the scores' scale is a worker's scores with
    bad cells: refuse it, naming the first bad row, rather than leave the worker out. (A column of
    reference answers, 42 or 3/4, is not on the scale and stays unread.)"""
    filled = s.is_not_null() & (s.str.strip_chars() != "")
    parsed = s.cast(pl.Float64, strict=False)
    bad = filled & parsed.is_null()
    on_scale = parsed.drop_nulls().is_between(*scale).all()
    if filled.sum() and bad.any() and on_scale and (filled & ~bad).sum() * 2 >= filled.sum():
        row = int(bad.arg_max()) + 1
        raise fail(path, f"column {s.name!r} holds numbers but row {row} holds {s[row - 1]!r}: a worker's score must be a "
                         f"number in every row (fix the cell), or list the workers with --workers to leave {s.name!r} out")


def _worker_score(df: pl.DataFrame, w: str, spec: TableSpec, path: Path) -> pl.Series:
    """A worker's score column, or the score field of its column of records."""
    s = df[w]
    if isinstance(s.dtype, pl.Struct):
        if not _is_record(s.dtype, spec.score_field):
            raise fail(path, f"column {w!r} holds records without a {spec.score_field!r} field (fields: "
                             f"{[f.name for f in s.dtype.fields][:12]}); name the score's field with --score-field")
        s = s.struct.field(spec.score_field).alias(w)
    return numbers(pl.DataFrame({w: s}), w, path, "a worker's score")


def numbers(df: pl.DataFrame, col: str, path: Path, what: str, rows: pl.Series | None = None) -> pl.Series:
    """The column as floats; a column of anything else is refused, naming the first cell that is not
    a number (`rows`: the data row of each, default 1, 2, ...)."""
    s = df[col]
    if not (s.dtype.is_numeric() or s.dtype == pl.Boolean or s.dtype == pl.Null):
        where = ""
        if s.dtype == pl.String:
            bad = s.is_not_null() & s.cast(pl.Float64, strict=False).is_null()
            if bad.any():
                i = int(bad.arg_max())
                where = f"; row {i + 1 if rows is None else rows[i]} holds {s[i]!r}"
            elif s.null_count() == s.len():
                where = "; every cell is empty"
        raise fail(path, f"column {col!r} ({what}) is {s.dtype}, not numbers{where}")
    return s.cast(pl.Float64)


def import_table(path, spec: TableSpec | None = None, *, split: str | None = None,
                 stem: str | None = None) -> tuple[list[RewardRow], dict]:
    """Rows of the table and notes on what was read (workers, splits, dropped rows). With
    `spec.test_file` or `spec.val_file`, each file's rows take that file's split; `split` is that
    split for one file, `stem` what its default task ids start with."""
    path, spec = Path(path), spec or TableSpec()
    if split is None and (spec.test_file or spec.val_file):
        return rows_from_split_files(path, spec.val_file, spec.test_file,
                                     lambda p, s, stem: import_table(p, spec, split=s, stem=stem))
    df = read_table(path, rows=True, text=spec.named())
    absent = [c for c in spec.named() if c not in df.columns]
    if absent:
        raise fail(path, f"no column {absent[0]!r}; the table's columns: {df.columns[:40]}")
    for c in spec.named():
        if c != spec.prompt_column and (df[c].dtype.is_nested() or df[c].dtype == pl.Object):
            raise fail(path, f"column {c!r} holds {df[c].dtype}, not text: name a column of plain values")
    workers, workers_from = _worker_columns(df, spec, path)
    stem = stem or id_stem(path)
    row_ids = pl.Series([f"{stem}-{i:06d}" for i in range(df.height)])  # the row in the file, kept if rows are dropped
    line = pl.int_range(1, df.height + 1, eager=True)  # the data row named in messages, kept if rows are dropped
    scores = pl.DataFrame({w: _worker_score(df, w, spec, path) for w in workers})
    incomplete = scores.select(pl.any_horizontal(pl.all().is_null() | pl.all().is_nan())).to_series()
    notes: dict = {"table": f"{df.height} rows x {len(df.columns)} columns", "workers_from": workers_from}
    cost_cols = {t.replace("{worker}", w) for w in workers for t in (spec.cost_column, spec.answer_column) if t}
    unread = [c for c in df.columns if c not in {*spec.named(), *workers, *cost_cols}]
    if unread:
        notes["columns_not_read"] = unread[:20] + ([f"... {len(unread) - 20} more"] if len(unread) > 20 else [])
    prompts = prompt_texts(df[spec.prompt_column], path)  # before any row is dropped: a jsonl's values are read by row
    if incomplete.any():
        if not spec.drop_incomplete:
            raise fail(path, f"{int(incomplete.sum())} row(s) miss a worker's score (rows {rows_named(line, incomplete)}); "
                             "pass --drop-incomplete to leave them out")
        notes["dropped_incomplete"] = int(incomplete.sum())
        df, scores, row_ids, line, prompts = (x.filter(~incomplete) for x in (df, scores, row_ids, line, prompts))
        if df.height == 0:
            raise fail(path, "every row misses a worker's score")
    guessed = spec.workers == "auto"
    scores = pl.DataFrame({w: scaled(scores[w], spec, path, w, line, guessed) for w in workers})
    empty = blank_mask(prompts)
    if empty.any():
        raise fail(path, f"column {spec.prompt_column!r}: empty prompt in rows {rows_named(line, empty)}")
    ids = text_column(df, spec.id_column, path) if spec.id_column else row_ids
    dup = ids.is_duplicated() | ids.is_null()
    if dup.any():
        raise fail(path, f"column {spec.id_column!r}: missing or repeated task ids in rows {rows_named(line, dup)}")
    if split is not None:
        splits = [split] * df.height
    elif spec.split_column:
        splits = text_column(df, spec.split_column, path).str.strip_chars().str.to_lowercase()
        wrong = ~splits.is_in(SPLIT_VALUES) | splits.is_null()
        if wrong.any():
            raise fail(path, f"column {spec.split_column!r}: a split must be one of {', '.join(SPLIT_VALUES)}; rows {rows_named(line, wrong)}")
        splits, notes["splits_from"] = splits.to_list(), f"column {spec.split_column!r}"
    else:
        tf, vf = spec.fractions()
        splits = [assign_split(t, spec.seed, tf, vf) for t in ids.to_list()]
        notes["splits_from"] = f"drawn from (seed {spec.seed}, task id): test {tf}, val {vf}"
    domains = (text_column(df, spec.domain_column, path).fill_null("general").to_list() if spec.domain_column
               else ["general"] * df.height)
    costs = None
    if spec.cost_column:
        cols = {w: spec.cost_column.replace("{worker}", w) for w in workers}  # not str.format: other braces stay text
        gone = [c for c in cols.values() if c not in df.columns]
        if gone:
            raise fail(path, f"no cost column {gone[0]!r} (--cost-column {spec.cost_column!r})")
        cost = pl.DataFrame({w: numbers(df, c, path, "a cost", line) for w, c in cols.items()})
        for w, c in cols.items():
            bad = cost[w].is_null() | cost[w].is_nan() | (cost[w] < 0)
            if bad.any():
                raise fail(path, f"column {c!r}: missing or negative cost in rows {rows_named(line, bad)}")
        costs = cost.rows()
    elif spec.prices is not None:
        from fugu_pipeline.matrix.import_prices import load_prices, token_costs

        prices = load_prices(spec.prices, workers)
        costs = token_costs(df, workers, prices, (spec.input_tokens_field, spec.output_tokens_field), path, line).rows()
        notes["cost_from"] = f"token counts x the prices in {Path(spec.prices).name}"
    answers = None
    if spec.answer_column:
        cols = {w: spec.answer_column.replace("{worker}", w) for w in workers}
        gone = [c for c in cols.values() if c not in df.columns]
        if gone:
            raise fail(path, f"no answer column {gone[0]!r} (--answer-column {spec.answer_column!r})")
        answers = list(zip(*(answer_texts(df[c], path, line) for c in cols.values())))
    q = scores.rows()
    rows = [RewardRow(task_id=t, prompt=p, domain=d, split=s, worker_ids=workers, quality=list(q[i]),
                      cost_usd=None if costs is None else list(costs[i]),
                      answers=None if answers is None else list(answers[i]))
            for i, (t, p, d, s) in enumerate(zip(ids.to_list(), prompts.to_list(), domains, splits))]
    return tag_in_distribution(rows), notes
