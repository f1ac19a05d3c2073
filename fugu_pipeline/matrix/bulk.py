"""The collected reward matrix built in bulk: DuckDB reads every response file at once
(`read_json` over the partition files), and Python touches no row.

Same guarantees and the same result as `build(from_collection(...))`, table for table and with
the same `data_version` (a test compares them on the sample data and on damaged files):
- the latest record of a cell wins: within a partition file a later line replaces an earlier one
  (the scan keeps file order and the insert keeps the scan's order: the rowid is the line order);
- a record counts only if its prompt hash equals the task's (a reworded task is collected again;
  compared as 64-bit hashes of the two texts, see `BOOKKEEPING`);
- a torn last line, or any line that is not a call record (a field missing or of the wrong JSON
  type, a status other than ok/failed, a number out of its range: NaN, a negative cost, a quality
  above 1; or the record of another worker or batch than its file's), is skipped, as
  `ResponseStore.read` skips it (`records.py` holds the rules; `_sound_record` is them in SQL);
- skipped lines are counted and named by file and line number, as the collection run names them
  (`PartitionRecords.skipped_note`): the build counts each file's lines (a byte scan, on a thread
  while DuckDB reads the same files) and, only for a file where they differ from the records it
  kept, has the store's reader find which lines;
- only files of configured workers and of batches with a batch file are read;
- utility is computed in SQL from the same formula, in the same operation order, as
  `UtilityConfig.utility`, so every float is bit-identical;
- the database is built beside the old file and renamed into place (`building`);
- the response files are read on a second connection while the batch files are read and validated
  (the files of a batch refused then are dropped again), and the data version is computed while
  reward_wide is written: two cores work where one did, with the same result.

Where the time goes at scale is printed by benchmarks/bench_matrix.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import get_args

import duckdb

from fugu_pipeline.collect.records import MAX_COUNT, CostSource
from fugu_pipeline.reward import MAX_AMOUNT
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.matrix.build import RESPONSE_COLUMNS, building, finish, insert_workers, wide_columns
from fugu_pipeline.matrix.bulk_tasks import read_batches
from fugu_pipeline.tasks.loading import scan_batch_files
from fugu_pipeline.matrix.read import RewardMatrixError
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.settings import settings
from fugu_pipeline.workers.config import WorkersConfig

# The call record's fields, each read as JSON (so its JSON type can be checked), by kind.
_STRINGS_REQUIRED = ("task_id", "worker_id", "batch", "prompt_hash", "status")
_STRINGS = ("answer", "grade_detail", "cost_source", "finish_reason", "requested_model", "served_model", "provider",
            "error", "model_fingerprint")
_NUMBERS = ("quality", "cost_usd", "judge_cost_usd", "latency_s", "ttft_s", "finished_at")
_COUNTS = ("prompt_tokens", "completion_tokens", "attempts")
RECORD_FIELDS = (*_STRINGS_REQUIRED, *_STRINGS, *_NUMBERS, *_COUNTS)
# read_json's columns: every field as its JSON text (also the read spec of benchmarks/bench_matrix.py's typed floor)
RECORD_COLUMNS = "{" + ", ".join(f"'{c}': 'JSON'" for c in RECORD_FIELDS) + "}"


def _json_types() -> str:
    """The SQL test that every field of a line is of its JSON type in the store's reader
    (`CallRecord`, strict, `records.py`); a JSON null, like a missing field, is the default. Read
    from the JSON text of each value, never parsed again: a string starts with a quote, a number
    casts from its text (a string holding a number does not: it starts with a quote), a count is
    an integer literal."""
    tests = [f"left(j_{c}, 1) = '\"'" for c in _STRINGS_REQUIRED]
    tests += [f"(j_{c} IS NULL OR left(j_{c}, 1) = '\"')" for c in _STRINGS]
    tests += [f"(j_{c} IS NULL OR {c} IS NOT NULL)" for c in (*_NUMBERS, *_COUNTS)]
    return " AND ".join(tests)


def _sound_record() -> str:
    """The SQL test of a line the store's reader would accept as a record of its file's partition:
    every field of its JSON type (`types_ok`), every number within its range. Built from this
    module's field names and `records.py`'s limits only."""
    tests = ["types_ok"]
    tests += [f"({c} IS NULL OR isfinite({c}))" for c in _NUMBERS]
    tests += [f"({c} IS NULL OR {c} BETWEEN 0 AND {MAX_COUNT})" for c in _COUNTS]
    tests += ["(quality IS NULL OR quality BETWEEN 0 AND 1)", "status IN ('ok', 'failed')",
              "(status = 'failed' OR quality IS NOT NULL)",
              f"(cost_source IS NULL OR cost_source IN {tuple(get_args(CostSource))!r})"]
    tests += [f"(coalesce({c}, 0) BETWEEN 0 AND {MAX_AMOUNT!r})" for c in ("cost_usd", "judge_cost_usd", "latency_s", "ttft_s")]
    tests += ["worker_id = part_worker", "batch = part_batch"]  # a record of another partition is damage
    return " AND ".join(tests)


def _typed_columns() -> str:
    """Each field's value from its JSON text: a string unescaped (NULL when the value is not a
    string), a number cast from its text, a count only from an integer literal."""
    # a string without a backslash holds no escape: its text between the quotes is its value, unparsed
    cols = [f"CASE WHEN left(j_{c}, 1) = '\"' THEN CASE WHEN contains(j_{c}, '\\') THEN j_{c} ->> '$' "
            f"ELSE substr(j_{c}::VARCHAR, 2, length(j_{c}::VARCHAR) - 2) END END AS {c}" for c in (*_STRINGS_REQUIRED, *_STRINGS)]
    cols += [f"TRY_CAST(CAST(j_{c} AS VARCHAR) AS DOUBLE) AS {c}" for c in _NUMBERS]
    # an integer literal: a number's text (DuckDB writes a float with a point or an exponent) without either
    cols += [f"CASE WHEN NOT contains(j_{c}::VARCHAR, '.') AND NOT contains(lower(j_{c}::VARCHAR), 'e') "
             f"THEN TRY_CAST(j_{c}::VARCHAR AS BIGINT) END AS {c}" for c in _COUNTS]
    return ", ".join(cols)


# While the build runs, `responses` also holds, for every line read: the index of its file in the
# list read, its prompt hash and whether it is a sound record; its line order is the table's rowid
# (see `LOAD_RECORDS`). They let the build count skipped lines and keep only the latest sound record
# of a cell whose prompt hash matches its task (the rest is deleted), then they are dropped: the
# table is written once, never copied. The prompt hash is kept as DuckDB's 64-bit `hash()` of its text
# and compared with the same hash of the task's: 8 bytes a line where the text took 64 (1.3 GB written
# and dropped again at 20 M lines). Unequal hashes are unequal texts, so a record of a reworded task is
# always dropped; only a record whose stale prompt hash collides in all 64 bits with its task's
# current one would be kept (odds of 2^-64 a record).
BOOKKEEPING = {"rec_file": "INTEGER", "rec_prompt_hash": "UBIGINT", "rec_sound": "BOOLEAN"}
# The values `from_collection` stores: a missing field's default where the record has one.
# A count out of the INTEGER range is stored as NULL: its line is no sound record, and is deleted.
_STORED = {"cost_usd": "coalesce(cost_usd, 0.0)", "cost_source": "coalesce(cost_source, 'none')",
           "judge_cost_usd": "coalesce(judge_cost_usd, 0.0)", "latency_s": "coalesce(latency_s, 0.0)",
           "finished_at": "coalesce(finished_at, 0.0)",
           **{c: f"CASE WHEN {c} BETWEEN 0 AND {MAX_COUNT} THEN {c} END" for c in _COUNTS}}
_STORED["attempts"] = f"coalesce({_STORED['attempts']}, 1)"
# Every line of every partition file (one row per line that is not blank: `records=true` makes any
# other line, torn or not an object, a row of NULLs), with the partition of its file (looked up by
# the scan's `file_index` in the lists bound as $batches and $workers: no join), as a typed record
# with `sound`: whether the store's reader would take it. Each value is converted once (the plan's
# projections share it: EXPLAIN shows no field typed twice), and the JSON texts are not kept. Nothing
# is materialized: the lines stream from the scan into the table (a materialized step held every
# typed line at once, and spilled at scale).
# The line order is the order of the insert: DuckDB keeps the row order of a scan of one table
# function through SELECT, WHERE and CTEs made of them, and an INSERT (with `preserve_insertion_order`,
# set by the build) appends in that order, so within a file a later line has a larger rowid. No
# window numbers the lines: over every line at once it was a blocking step that spilled at scale.
LOAD_RECORDS = (
    "INSERT INTO responses (" + ", ".join([*RESPONSE_COLUMNS, *BOOKKEEPING]) + ") "
    "WITH typed AS NOT MATERIALIZED (SELECT file_index, part_batch, part_worker, "
    + ", ".join(RECORD_FIELDS) + ", " + _json_types() + " AS types_ok FROM (SELECT *, " + _typed_columns()
    + " FROM (SELECT file_index, $batches[file_index::BIGINT + 1] AS part_batch, $workers[file_index::BIGINT + 1] AS part_worker, "
    + ", ".join(f"{c} AS j_{c}" for c in RECORD_FIELDS)
    + " FROM read_json($files, format='newline_delimited', records=true, columns=" + RECORD_COLUMNS
    + ", ignore_errors=true, maximum_object_size=$max_bytes))))"
    " SELECT " + ", ".join(_STORED.get(c, c) for c in RESPONSE_COLUMNS)
    + ", $numbers[file_index::BIGINT + 1], hash(prompt_hash), (" + _sound_record() + ") IS TRUE FROM typed"
)
# The longest line read_json takes at first, and at most: a longer line than the first (a runaway
# answer) is read on a second pass sized to the largest file; beyond the most, the build stops.
FIRST_OBJECT_BYTES = 16 * 2**20
MAX_OBJECT_BYTES = 2**30
# Then only what `from_collection` keeps stays: sound records; of a cell, the latest line of its file
# (where no task has two sound lines in a file, no retried cell, that search is skipped); and only
# if its prompt hash is its task's in the file's batch (a reworded task is collected again).
DROP_UNSOUND = "DELETE FROM responses WHERE NOT rec_sound"
# Whether a cell may be repeated: a 64-bit hash of each (file, task) is sorted and compared with its
# neighbour (numbers, not a hash table of strings). Two cells whose hashes collide only make the exact
# `DROP_EARLIER` run, which then deletes nothing more than it must.
CELL_HASHES = "SELECT hash(rec_file, task_id) AS h FROM responses"
DROP_EARLIER = """
DELETE FROM responses USING (SELECT rec_file AS file, task_id AS task, max(rowid) AS last FROM responses GROUP BY ALL) latest
WHERE responses.rec_file = latest.file AND responses.task_id = latest.task AND responses.rowid < latest.last
"""
DROP_UNMATCHED = """
DELETE FROM responses WHERE NOT EXISTS (
  SELECT 1 FROM tasks t WHERE t.task_id = responses.task_id AND t.batch = responses.batch
    AND hash(t.prompt_hash) = responses.rec_prompt_hash)
"""
# Whether `DROP_UNMATCHED` has anything to delete, joined on the task id alone (task ids are unique in
# `tasks`) with the batch and prompt hash compared after: a narrower join than the delete's. A row it
# counts that the delete would keep (none while task ids are unique) only makes the delete run.
UNMATCHED = """
SELECT count(*) FROM responses r LEFT JOIN tasks t ON t.task_id = r.task_id
WHERE t.batch IS DISTINCT FROM r.batch OR hash(t.prompt_hash) IS DISTINCT FROM r.rec_prompt_hash
"""
# The graded cells, with the worker of the file (as `from_collection` takes it: every row left is a
# sound record, whose worker and batch are its file's, so no lookup of the file is needed) and their utility,
# computed in SQL from the same formula in the same operation order as `UtilityConfig.utility`, so
# every float is bit-identical (a test holds them side by side). The weights are bound parameters.
INSERT_REWARDS = """
INSERT INTO rewards
SELECT task_id, worker_id, position, quality, cost_usd, latency_s,
       ? * quality - ? * least(greatest(cost_usd, 0.0) / ?, ?) - ? * least(greatest(latency_s, 0.0) / ?, ?)
FROM (SELECT r.task_id, r.worker_id, w.position, r.quality, r.cost_usd + r.judge_cost_usd AS cost_usd, r.latency_s
      FROM responses r JOIN workers w ON w.worker_id = r.worker_id
      WHERE r.status = 'ok' AND r.quality IS NOT NULL)
"""
BATCHES_KEPT = "SELECT DISTINCT batch FROM tasks ORDER BY 1"


def utility_parameters(u: UtilityConfig) -> list[float]:
    """`INSERT_REWARDS`'s parameters, in its order."""
    return [u.quality_weight, u.cost_weight, u.cost_scale_usd, u.cap, u.latency_weight, u.latency_scale_s, u.cap]


def repeated_cells(con) -> bool:
    """Whether `responses` may hold a cell twice in one file (`CELL_HASHES`): False only when none does."""
    import numpy as np

    hashes = con.execute(CELL_HASHES).fetchnumpy()["h"]
    hashes = np.asarray(hashes, dtype=np.uint64)
    hashes.sort()  # in place: 8 bytes a line
    return bool(np.any(hashes[1:] == hashes[:-1]))


def partition_files(responses_dir: Path, batches: list[str], worker_ids: list[str]) -> list[tuple[str, str, str]]:
    """(path, batch, worker) of every existing partition file of these batches and workers."""
    out = []
    for b in batches:
        for w in worker_ids:
            p = responses_dir / b / f"{w}.jsonl"
            if p.exists() and p.stat().st_size:
                out.append((str(p), b, w))
    return out


def line_count(path: str) -> int:
    """The lines of a file as the store's reader splits them: a last line without a newline (torn)
    counts. Blank lines count too, so a file holding one reads as differing (then checked line by line)."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def line_counts(paths: list[str], stop: threading.Event) -> list[int]:
    """`line_count` of each file, in order; stops early (a shorter list) once `stop` is set. Run
    beside the DuckDB scan of the same files (module docstring), which releases the GIL."""
    out = []
    for p in paths:
        if stop.is_set():
            break
        out.append(line_count(p))
    return out


def skipped_lines(con, files: list[tuple[str, str, str]], responses_dir: Path,
                  counts: list[int], read: list[int] | None = None) -> tuple[int, list[str]]:
    """(lines skipped in all, one note per file that had any) for the records just read from the
    files numbered `read` (default: all) in `files`: a file whose line count (`counts`, in the order
    of `files`) equals its sound records has none; any other is read by the store's reader, which
    numbers the lines it skips (its rules are the ones `_sound_record` writes in SQL)."""
    kept = dict(con.execute("SELECT rec_file, count(*) FROM responses WHERE rec_sound GROUP BY rec_file").fetchall())
    store, total, notes = ResponseStore(responses_dir), 0, []
    for i in range(len(files)) if read is None else read:
        path, batch, worker = files[i]
        if kept.get(i, 0) == counts[i]:
            continue
        records = store.read(batch, worker)
        note = records.skipped_note()
        if note:
            total += records.n_skipped
            notes.append(note)
    return total, notes


class _LoadFailed(Exception):
    """The read of the response files beside the tasks failed: it is made again after them."""


def _timed_load(con, files: list[tuple[str, str, str]]) -> float:
    """`_load_records` (on its own connection, on a thread); its seconds. Any failure is `_LoadFailed`."""
    start = time.perf_counter()
    try:
        _load_records(con, files)
    except Exception as exc:
        raise _LoadFailed() from exc
    return round(time.perf_counter() - start, 3)


def _load_records(con, files: list[tuple[str, str, str]], numbers: list[int] | None = None) -> None:
    """`LOAD_RECORDS` over `files` (each row's `rec_file` is its file's place in `files`, or its entry in
    `numbers`); a line longer than `FIRST_OBJECT_BYTES` (which read_json fails on rather than skipping)
    is read on a second pass whose limit is the largest file's size."""
    paths = [f for f, _, _ in files]
    params = {"files": paths, "batches": [b for _, b, _ in files], "workers": [w for _, _, w in files],
              "numbers": list(range(len(files))) if numbers is None else numbers}
    try:
        con.execute(LOAD_RECORDS, {**params, "max_bytes": FIRST_OBJECT_BYTES})
        return
    except duckdb.InvalidInputException as exc:
        if "maximum_object_size" not in str(exc):
            raise
    largest = max(os.path.getsize(p) for p in paths) + 1
    try:
        con.execute(LOAD_RECORDS, {**params, "max_bytes": min(largest, MAX_OBJECT_BYTES)})
    except duckdb.InvalidInputException as exc:
        if "maximum_object_size" not in str(exc):
            raise
        raise RewardMatrixError(f"a line of a response file is longer than {MAX_OBJECT_BYTES:,} bytes "
                                f"({str(exc).splitlines()[0]}): no call answers that much; cut that line out of "
                                f"the file (its cell is then called again) and rebuild the matrix") from None


def build_collection(benchgen_dir: Path, responses_dir: Path, config: WorkersConfig, db_path: Path,
                     weights_from: str = "the worker config", timings: dict | None = None,
                     log: Callable[[str], None] | None = None, refused: list | None = None) -> dict:
    """The collected matrix, built in bulk. Returns the summary `build` returns; `timings`, when
    given, receives the seconds of each phase. `refused` (a list): bad batch files (a bad line, or a
    task id another batch holds) are left out and listed there instead of failing the build
    (`bulk_tasks.read_batches`, which reads them as `load_all_batches` does). The summary's `skipped_lines`
    counts the response-file lines that were not records of their partition, and `skipped_where`
    names them (file, line numbers, torn or damaged; empty when none were); `log` gets each note."""
    t = timings if timings is not None else {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        t[name] = round(now - mark, 3)
        mark = now
        if log:
            log(f"{name}: {t[name]:.2f}s")

    workers = [(w.id, w.kind, getattr(w, "model", None)) for w in config.workers]
    wide_columns(workers)
    n_skipped, notes = 0, []
    with building(db_path) as con:
        # a bounded build: past this DuckDB spills to disk (beside the database) instead of growing
        limit = settings().matrix_memory_limit
        try:
            con.execute("SET memory_limit = ?", [limit])
        except duckdb.Error as exc:
            raise RewardMatrixError(f"FUGU_MATRIX_MEMORY_LIMIT={limit!r} is not a memory size DuckDB takes "
                                    f"({str(exc).splitlines()[0]}); give one like 3GB or 512MB, or unset it") from None
        insert_workers(con, workers)
        # The response files of every batch that has a batch file are read (on a second connection, on a
        # thread) while the batch files are read and validated here: the two are independent until the
        # batches kept are known. The files of a batch refused then are deleted again; if that read
        # fails, the files of the batches kept are read again once the tasks are in, as before.
        found = sorted({b for b, _ in scan_batch_files(benchgen_dir)[0]})
        files = partition_files(responses_dir, found, [w for w, _, _ in workers])
        for column, kind in BOOKKEEPING.items() if files else ():  # the names and types are this module's own
            con.execute(f"ALTER TABLE responses ADD COLUMN {column} {kind}")
        loader = con.cursor()
        for c in (con, loader):
            c.execute("SET enable_progress_bar = false")  # long scans would print bars into the run's stdout
            c.execute("SET preserve_insertion_order = true")  # the default, relied on: a file's line order is the rowid
        stop = threading.Event()  # the files' lines are counted (a byte scan) on a thread too
        failed = False
        try:
            with ThreadPoolExecutor(2) as pool:
                counting = pool.submit(line_counts, [f for f, _, _ in files], stop)
                loading = pool.submit(_timed_load, loader, files) if files else None
                try:
                    # validated as the task reader validates: a bad line (or a task id another batch holds) fails its batch
                    read_batches(con, benchgen_dir, ResponseStore(responses_dir).collected_batches(), refused)
                    lap("read, validate and insert tasks")
                    kept = {b for (b,) in con.execute(BATCHES_KEPT).fetchall()}
                    read = [i for i, (_, b, _) in enumerate(files) if b in kept]
                    if loading is not None:
                        try:
                            t["read_json over the response files"] = loading.result()
                        except _LoadFailed:
                            failed = True
                except BaseException:
                    stop.set()
                    loader.interrupt()
                    raise
        finally:
            loader.close()
        dropped = sorted(set(range(len(files))) - set(read))
        if failed and read:  # read again, only the files of the batches kept: its error is raised as before
            _load_records(con, [files[i] for i in read], read)
        elif dropped and not failed:  # the files of batches refused
            con.execute("DELETE FROM responses WHERE rec_file IN (SELECT unnest(?))", [dropped])
        if files:
            lap("read_json over the response files, left to wait for")
        if read:
            counts = counting.result()
            n_skipped, notes = skipped_lines(con, files, responses_dir, counts, read)
            for note in notes:
                if log:
                    log(note)
            lap("count skipped lines")
            con.execute(DROP_UNSOUND)
            if repeated_cells(con):
                con.execute(DROP_EARLIER)
            if con.execute(UNMATCHED).fetchall()[0][0]:
                con.execute(DROP_UNMATCHED)
        if files:
            for column in BOOKKEEPING:
                con.execute(f"ALTER TABLE responses DROP COLUMN {column}")
            # the bookkeeping's blocks (already on disk: a large insert writes as it goes) are freed here, so that
            # the tables still to come reuse them instead of growing the file (35 MiB against 48 at 100k x 5)
            con.execute("CHECKPOINT")
        if read:
            lap("latest record per cell, prompt-hash check")
            con.execute(INSERT_REWARDS, utility_parameters(config.reward))
            lap("utility and rewards")
        summary = finish(con, workers, "collection", config.reward,
                         f"computed from each cell's quality, cost and latency; weights: {weights_from}")
        lap("reward_wide, data_version, meta")
    lap("checkpoint and rename")
    summary["files_read"] = len(read)
    summary["skipped_lines"] = n_skipped
    summary["skipped_where"] = "; ".join(notes)
    return summary


__all__ = ["RESPONSE_COLUMNS", "build_collection", "utility_parameters"]
