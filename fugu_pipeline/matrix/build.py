"""The reward matrix in DuckDB: the one step that writes the database.

Tables
- `tasks(task_id, batch, prompt, prompt_hash, domain, split, grader_type, tags)`
- `workers(position, worker_id, kind, model)` — the fixed worker order
- `responses(...)` — the latest call record of every collected cell
- `rewards(task_id, worker_id, position, quality, cost_usd, latency_s, utility)` — graded cells
- `reward_wide` — one row per task (ordered by task_id), one utility column per worker, in worker
  order (NULL where a cell is missing). A table, written once per build like the others.
- `meta(key, value)` — source, utility weights, data version
- `answers(task_id, worker_id, position, answer, kind)` — an imported matrix's replies (the import
  row's `answers`, with its `answer_kind`); a collected matrix's replies are the `answer` column of
  `responses`. `matrix/answers.py` reads both.

A build writes a new database file beside the old one and renames it into place, so readers
never see a half-built matrix and a crash leaves the previous matrix intact; the next build on the
same host removes the half-built file a killed build left (`.tmp-<host>-<pid>`, its process gone).

No SQL text is ever built from data. Values go in as bound parameters or Arrow tables; the
worker ids that name `reward_wide`'s columns go in as the column names of an Arrow table (the
table is assembled in Python and created with `CREATE TABLE ... AS SELECT * FROM wide`), never
pasted into a statement. They are also checked against the worker-id rule before the build
starts (`check_worker_id`; the import format refuses a bad id with its file and line first).
The only identifiers interpolated into SQL here are this module's own table and column names
(`_insert` checks them against `SCHEMA`).
"""

from __future__ import annotations

import glob
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.matrix.import_format import WIDE_FIXED, check_worker_id, check_worker_set, read_reward_jsonl
from fugu_pipeline.matrix.read import matrix_summary
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.loading import load_all_batches
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.workers.config import WorkersConfig

# No primary key on the large tables: each build writes them whole, one row per task and per cell by
# construction (task ids are unique across batches; a cell's latest record wins), and `reward_wide`
# refuses a cell written twice. An index kept up row by row made inserting 13x slower, for lookups
# no reader makes (every read is a scan or a join).
SCHEMA = """
CREATE TABLE tasks (task_id VARCHAR, batch VARCHAR, prompt VARCHAR, prompt_hash VARCHAR,
  domain VARCHAR, split VARCHAR, grader_type VARCHAR, tags VARCHAR[]);
CREATE TABLE workers (position INTEGER PRIMARY KEY, worker_id VARCHAR UNIQUE, kind VARCHAR, model VARCHAR);
CREATE TABLE responses (task_id VARCHAR, worker_id VARCHAR, batch VARCHAR, status VARCHAR,
  answer VARCHAR, quality DOUBLE, grade_detail VARCHAR, cost_usd DOUBLE, cost_source VARCHAR,
  judge_cost_usd DOUBLE, latency_s DOUBLE, ttft_s DOUBLE, prompt_tokens INTEGER,
  completion_tokens INTEGER, finish_reason VARCHAR, requested_model VARCHAR, served_model VARCHAR,
  provider VARCHAR, attempts INTEGER, error VARCHAR, model_fingerprint VARCHAR, finished_at DOUBLE);
CREATE TABLE rewards (task_id VARCHAR, worker_id VARCHAR, position INTEGER, quality DOUBLE,
  cost_usd DOUBLE, latency_s DOUBLE, utility DOUBLE);
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE answers (task_id VARCHAR, worker_id VARCHAR, position INTEGER, answer VARCHAR, kind VARCHAR,
  PRIMARY KEY (task_id, worker_id));
"""

RESPONSE_COLUMNS = [
    "task_id", "worker_id", "batch", "status", "answer", "quality", "grade_detail", "cost_usd",
    "cost_source", "judge_cost_usd", "latency_s", "ttft_s", "prompt_tokens", "completion_tokens",
    "finish_reason", "requested_model", "served_model", "provider", "attempts", "error",
    "model_fingerprint", "finished_at",
]


@dataclass
class TaskRow:
    task_id: str
    batch: str
    prompt: str
    domain: str
    split: str
    grader_type: str | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def of(cls, batch: str, t: Task) -> "TaskRow":
        return cls(t.task_id, batch, t.prompt, t.domain, t.split, t.grader.type, tuple(t.tags))


@dataclass
class Cell:
    task_id: str
    worker_id: str
    quality: float | None
    cost_usd: float
    latency_s: float
    utility: float | None = None  # None: computed from the utility weights


@dataclass
class MatrixInput:
    tasks: list[TaskRow]
    workers: list[tuple[str, str, str | None]]  # (worker_id, kind, model)
    responses: list[dict]
    cells: list[Cell]
    source: str
    utility: UtilityConfig
    utility_source: str = ""  # how the utility was made and where its weights came from, in words
    answers: list[tuple[str, str, str, str | None]] = field(default_factory=list)  # (task, worker, reply, answer kind)


# --------------------------------------------------------------------------- sources


def from_collection(benchgen_dir: Path, store: ResponseStore, config: WorkersConfig,
                    weights_from: str = "the worker config") -> MatrixInput:
    batches = load_all_batches(benchgen_dir, settled=store.collected_batches())
    workers = [(w.id, w.kind, getattr(w, "model", None)) for w in config.workers]
    responses, rewards = [], []
    by_batch: dict[str, list[Task]] = {}
    for b, t in batches:
        by_batch.setdefault(b, []).append(t)
    for b, ts in by_batch.items():
        for wid, _, _ in workers:
            recs = store.read(b, wid)
            for t in ts:
                r = recs.get(t.task_id)
                if r is None or r.prompt_hash != t.prompt_hash:
                    continue
                responses.append(r.model_dump(include=set(RESPONSE_COLUMNS)))
                if r.status == "ok" and r.quality is not None:
                    rewards.append(Cell(t.task_id, wid, r.quality, r.cost_usd + r.judge_cost_usd, r.latency_s))
    tasks = [TaskRow.of(b, t) for b, t in batches]
    return MatrixInput(tasks, workers, responses, rewards, "collection", config.reward,
                       f"computed from each cell's quality, cost and latency; weights: {weights_from}")


def from_import(path: Path, utility: UtilityConfig, weights_from: str = "the configured weights",
                rows: list | None = None, rewards_as_given: bool = False) -> MatrixInput:
    """An imported reward matrix: the reward-matrix JSONL at `path`, or `rows` an importer read from
    `path`. Where `quality` is given, utility is recomputed from the configured weights (cost and
    latency default to 0); otherwise `rewards` is the utility. How (and with which weights) is
    recorded in words; rows whose own `rewards` the weights do not reproduce are counted there,
    since the file was likely made with other weights. `rewards_as_given`: no weights were given,
    so a row's own `rewards` are its utility even where it carries quality (kept for accuracy)."""
    rows = read_reward_jsonl(path) if rows is None else rows
    batch = "import-" + path.name.split(".")[0]
    worker_ids = rows[0].worker_ids
    tasks, rewards, answers = [], [], []
    differ, worst = 0, (0.0, "")
    for r in rows:
        tasks.append(TaskRow(r.task_id, batch, r.prompt, r.domain, r.split, tags=tuple(r.tags)))
        answers += [(r.task_id, w, a, r.answer_kind) for w, a in zip(worker_ids, r.answers or ()) if a is not None]
        gap = 0.0
        for i, w in enumerate(worker_ids):
            cost = r.cost_usd[i] if r.cost_usd else 0.0
            lat = r.latency_s[i] if r.latency_s else 0.0
            if rewards_as_given and r.rewards is not None:
                rewards.append(Cell(r.task_id, w, None if r.quality is None else r.quality[i], cost, lat,
                                    utility=r.rewards[i]))
            elif r.quality is not None:
                rewards.append(Cell(r.task_id, w, r.quality[i], cost, lat))
                if r.rewards is not None:
                    gap = max(gap, abs(utility.utility(r.quality[i], cost, lat) - r.rewards[i]))
            else:
                rewards.append(Cell(r.task_id, w, None, cost, lat, utility=r.rewards[i]))
        if gap > 1e-9:
            differ += 1
            worst = max(worst, (gap, r.task_id))
    n_q = sum(r.quality is not None and not (rewards_as_given and r.rewards is not None) for r in rows)
    how = []
    if n_q:
        how.append(f"{n_q} row(s) recomputed from quality, cost_usd and latency_s (missing cost or latency counts as 0)")
    if n_q < len(rows):
        how.append(f"{len(rows) - n_q} row(s) use the file's rewards as given")
    note = "; ".join(how) + f"; weights: {weights_from}"
    if differ:
        note += (f". {differ} row(s) carry rewards these weights do not reproduce (largest difference "
                 f"{worst[0]:.4g}, task {worst[1]}): the file was made with other weights; the recomputed utility is used")
    return MatrixInput(tasks, [(w, "imported", None) for w in worker_ids], [], rewards, f"import:{path}", utility, note,
                       answers=answers)


# --------------------------------------------------------------------------- build


def build(inp: MatrixInput, db_path: Path) -> dict:
    """Write the DuckDB reward matrix atomically. Returns summary metadata."""
    wide_columns(inp.workers)  # refuse bad worker ids before any file is touched
    u = inp.utility
    with building(db_path) as con:
        _insert(con, "tasks", {
            "task_id": [t.task_id for t in inp.tasks], "batch": [t.batch for t in inp.tasks],
            "prompt": [t.prompt for t in inp.tasks], "prompt_hash": [sha256_text(t.prompt) for t in inp.tasks],
            "domain": [t.domain for t in inp.tasks], "split": [t.split for t in inp.tasks],
            "grader_type": [t.grader_type for t in inp.tasks], "tags": [list(t.tags) for t in inp.tasks],
        })
        insert_workers(con, inp.workers)
        if inp.responses:
            _insert(con, "responses", {c: [r.get(c) for r in inp.responses] for c in RESPONSE_COLUMNS})
        pos = {w: i for i, (w, _, _) in enumerate(inp.workers)}
        _insert(con, "rewards", {
            "task_id": [c.task_id for c in inp.cells], "worker_id": [c.worker_id for c in inp.cells],
            "position": [pos[c.worker_id] for c in inp.cells], "quality": [c.quality for c in inp.cells],
            "cost_usd": [c.cost_usd for c in inp.cells], "latency_s": [c.latency_s for c in inp.cells],
            "utility": [c.utility if c.utility is not None else u.utility(c.quality, c.cost_usd, c.latency_s) for c in inp.cells],
        })
        if inp.answers:
            _insert(con, "answers", {"task_id": [a[0] for a in inp.answers], "worker_id": [a[1] for a in inp.answers],
                                     "position": [pos[a[1]] for a in inp.answers], "answer": [a[2] for a in inp.answers],
                                     "kind": [a[3] for a in inp.answers]})
        return finish(con, inp.workers, inp.source, u, inp.utility_source)


_HOST = socket.gethostname().replace("/", "_")


def _remove_abandoned_builds(db_path: Path) -> list[Path]:
    """Delete the half-built databases beside `db_path` that a killed build of this host left (its
    process is gone); a build still running, or one of another host sharing the folder, is kept."""
    removed = []
    prefix = f"{db_path.name}.tmp-{_HOST}-"
    for p in db_path.parent.glob(f"{glob.escape(db_path.name)}.tmp-*"):
        pid = p.name[len(prefix):].removesuffix(".wal")
        if not p.name.startswith(prefix) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or reused by another process: left for a later build)
        except ProcessLookupError:
            pass
        except OSError:
            continue  # alive under another user
        p.unlink(missing_ok=True)
        removed.append(p)
    return removed


@contextmanager
def building(db_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A new database beside `db_path` with the schema; renamed over it when the block succeeds
    (readers see the old matrix or the new one), removed when it fails."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(db_path)
    tmp = db_path.with_name(f"{db_path.name}.tmp-{_HOST}-{os.getpid()}")
    wal = Path(str(tmp) + ".wal")
    for p in (tmp, wal):
        p.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        con.execute(SCHEMA)
        yield con
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        for p in (tmp, wal):
            p.unlink(missing_ok=True)
        raise
    con.close()
    os.replace(tmp, db_path)
    wal.unlink(missing_ok=True)


def insert_workers(con: duckdb.DuckDBPyConnection, workers: list[tuple[str, str, str | None]]) -> None:
    con.executemany("INSERT INTO workers VALUES (?, ?, ?, ?)", [(i, w, k, m) for i, (w, k, m) in enumerate(workers)])


def finish(con: duckdb.DuckDBPyConnection, workers: list[tuple[str, str, str | None]], source: str,
           u: UtilityConfig, utility_source: str) -> dict:
    """reward_wide, the data version and meta, once tasks, workers, responses and rewards are in
    (committed: the data version is computed on a second connection, on a thread, while this one
    writes reward_wide; both spend much of their time in Python and Arrow, one core each)."""
    from concurrent.futures import ThreadPoolExecutor

    reader = con.cursor()
    try:
        reader.execute("SET enable_progress_bar = false")
        with ThreadPoolExecutor(1) as pool:
            version = pool.submit(data_version, reader)
            try:
                _create_wide(con, workers)
            except BaseException:
                reader.interrupt()  # the build fails here: its version is not waited for
                raise
            digest = version.result()
    finally:
        reader.close()
    meta = {
        "source": source,
        "utility": canonical_json(u.model_dump()),
        "utility_source": utility_source,
        "worker_ids": json.dumps([w for w, _, _ in workers]),
        "data_version": digest,
    }
    con.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
    return matrix_summary(con)


TABLES = ("tasks", "workers", "responses", "rewards", "meta", "answers")


def wide_columns(workers: list[tuple[str, str, str | None]]) -> list[str]:
    """The column names of `reward_wide`: task_id, split, domain, then one per worker id. Every
    id must follow the worker-id rule; DuckDB names are case-insensitive, so ids that differ only
    in case, or that equal a fixed column, are refused too."""
    ids = check_worker_set([check_worker_id(w) for w, _, _ in workers])
    return [*WIDE_FIXED, *ids]


DISTINCT_TASKS = "SELECT count(DISTINCT task_id) FROM tasks"


def _create_wide(con: duckdb.DuckDBPyConnection, workers: list[tuple[str, str, str | None]]) -> None:
    """`reward_wide` from an Arrow table assembled here: its column names are the worker ids, so
    no id is ever part of SQL text. Filled with numpy from (row, position, utility) triples."""
    import numpy as np
    import pyarrow as pa

    names = wide_columns(workers)
    tasks = arrow_table(con.sql("SELECT task_id, split, domain FROM tasks ORDER BY task_id"))
    cells = con.execute(
        "SELECT t.rn, r.position, r.utility FROM rewards r JOIN "
        "(SELECT task_id, row_number() OVER (ORDER BY task_id) - 1 AS rn FROM tasks) t USING (task_id)"
    ).fetchnumpy()
    grid = np.zeros((tasks.num_rows, len(workers)), dtype=np.float64)
    filled = np.zeros_like(grid, dtype=bool)
    rows, cols = cells["rn"].astype(np.int64), cells["position"].astype(np.int64)
    grid[rows, cols] = np.asarray(cells["utility"], dtype=np.float64)
    filled[rows, cols] = True
    if int(filled.sum()) != len(rows) or con.execute(DISTINCT_TASKS).fetchall()[0][0] != tasks.num_rows:
        raise RuntimeError("the reward matrix holds a task, or a (task, worker) cell, twice: a bug of the build; "
                           "the previous matrix is kept")
    arrays = [tasks.column(i).combine_chunks().cast(pa.string()) for i in range(len(WIDE_FIXED))]
    arrays += [pa.array(grid[:, j], type=pa.float64(), mask=~filled[:, j]) for j in range(len(workers))]
    wide = pa.Table.from_arrays(arrays, names=names)  # noqa: F841  (DuckDB reads the local by name)
    con.execute("CREATE TABLE reward_wide AS SELECT * FROM wide")


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, list]) -> None:
    """Bulk insert through Arrow (executemany is row-at-a-time). `table` and the column names are
    this module's own (checked against the schema), never data."""
    import pyarrow as pa

    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}")
    schema = {r[0]: r[1] for r in con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                               "WHERE table_name = ? ORDER BY ordinal_position", [table]).fetchall()}
    unknown = set(columns) - set(schema)
    if unknown:
        raise ValueError(f"{table} has no column(s) {sorted(unknown)}")
    frame = pa.table(columns)  # noqa: F841  (DuckDB reads the local by name)
    cols = ", ".join(columns)
    casts = ", ".join(f"CAST({c} AS {schema[c]})" for c in columns)
    con.execute(f"INSERT INTO {table} ({cols}) SELECT {casts} FROM frame")


def arrow_table(rel: duckdb.DuckDBPyRelation):
    """A query's result (`con.sql(...)`) as one Arrow table (DuckDB 2: to_arrow_table; 1.x: arrow)."""
    return (getattr(rel, "to_arrow_table", None) or rel.arrow)()


def arrow_batches(rel: duckdb.DuckDBPyRelation, rows: int):
    """A query's result (`con.sql(...)`) as Arrow record batches of about `rows` rows, read lazily."""
    return (getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader)(rows)


DATA_VERSION_ROWS = ("SELECT r.task_id, r.worker_id, round(r.utility, 9), t.prompt_hash, t.split FROM rewards r "
                     "JOIN tasks t USING (task_id) ORDER BY r.task_id, r.position")


# The same rows as canonical JSON text: each row as `canonical_json` writes it, after a comma (a
# double as Python's repr writes it, which DuckDB's cast to text matches: checked on a sample of every
# build). Only where no id needs escaping: a quote, a backslash or a control character in a task id
# (worker ids cannot hold one) leaves the digest to Python.
# A row's text is its task's head and tail (written once per task) around its own middle (worker id
# and utility, written by DuckDB): the cells are put in order by their numbers (task number, position),
# not by sorting rows of text, and the pieces are joined by Arrow, chunk by chunk.
_U_TEXT = ("CASE WHEN isnan(u) THEN 'NaN' WHEN u = 'infinity'::DOUBLE THEN 'Infinity' WHEN u = '-infinity'::DOUBLE "
           "THEN '-Infinity' ELSE coalesce(CAST(u AS VARCHAR), 'null') END")
TASK_TEXT = ("SELECT concat(',[\"', task_id, '\",\"') AS head, concat(',\"', prompt_hash, '\",\"', split, '\"]') AS tail "
             "FROM tasks ORDER BY task_id")  # row k is the task numbered k (`rn` below)
_CELLS = ("FROM (SELECT *, round(utility, 9) AS u FROM rewards) r "
          "JOIN (SELECT task_id, prompt_hash, split, row_number() OVER (ORDER BY task_id) - 1 AS rn FROM tasks) t USING (task_id)")
# Every cell's task number, position and middle, in no order: `_ordered_texts` puts them in (task_id,
# position) order from the numbers alone, in numpy. (Sorting the rows in DuckDB, each with its text, cost
# 17 CPU seconds at 1,000,000 tasks x 20 workers; this, 15.)
DATA_VERSION_CELLS = f"SELECT t.rn, r.position, concat(r.worker_id, '\",', {_U_TEXT}) AS middle {_CELLS}"
# Some rows (any: the text of a row does not depend on its place) with their values, to hold the
# text assembled against canonical_json's.
TEXT_SAMPLE = (f"SELECT t.rn, concat(r.worker_id, '\",', {_U_TEXT}) AS middle, r.task_id, r.worker_id, u, t.prompt_hash, t.split "
               f"{_CELLS} LIMIT 2000")
NEEDS_ESCAPING = ("SELECT (SELECT count(*) FROM tasks WHERE regexp_matches(task_id || prompt_hash || split, '[\\x00-\\x1f\"\\\\]'))"
                  " + (SELECT count(*) FROM workers WHERE regexp_matches(worker_id, '[\\x00-\\x1f\"\\\\]'))")


def _row_texts(heads, tails, rn, middle):
    """The rows' texts (an Arrow string array): head and tail of task `rn` around each middle."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(heads.take(rn), middle, tails.take(rn), "")


def data_version(con: duckdb.DuckDBPyConnection, chunk_rows: int = 200_000) -> str:
    """sha256 of the canonical JSON of every graded cell (task, worker, utility to 9 places,
    prompt hash, split) in (task, position) order: the same text, byte for byte, as
    `canonical_json(all_rows)`. DuckDB and Arrow write the text (`DATA_VERSION_CELLS`, `TASK_TEXT`) and
    Python only hashes its bytes, chunk by chunk: no Python object per cell."""
    import hashlib

    fast = con.execute(NEEDS_ESCAPING).fetchall()[0][0] == 0
    if fast:
        tasks = arrow_table(con.sql(TASK_TEXT))
        heads, tails = (tasks.column(i).combine_chunks() for i in (0, 1))
        sample = arrow_table(con.sql(TEXT_SAMPLE))
        texts = _row_texts(heads, tails, sample.column(0), sample.column(1)).to_pylist()
        values = zip(*(sample.column(i).to_pylist() for i in range(2, sample.num_columns)))
        fast = all(text == "," + canonical_json([list(v)])[1:-1] for text, v in zip(texts, values))
    digest = hashlib.sha256(b"[")
    first = True
    for text in (_ordered_texts(con, heads, tails, chunk_rows) if fast else
                 (b"," + _python_text(batch) for batch in arrow_batches(con.sql(DATA_VERSION_ROWS), chunk_rows) if batch.num_rows)):
        digest.update(text[1:] if first else text)  # the first row has no comma before it
        first = False
    digest.update(b"]")
    return digest.hexdigest()[:16]


def _ordered_texts(con: duckdb.DuckDBPyConnection, heads, tails, chunk_rows: int) -> Iterator[bytes]:
    """The rows' texts (`DATA_VERSION_CELLS` between their task's head and tail), `chunk_rows` rows at a
    time, in (task number, position) order. The order is found from one 64-bit key a cell, task number x
    (largest position + 1) + position: each cell is scattered to its key's slot (no sort), or, where two
    cells share a key or the keys are sparse (positions far apart, or below 0), the keys are argsorted."""
    import numpy as np
    import pyarrow as pa

    cells = arrow_table(con.sql(DATA_VERSION_CELLS))
    if not cells.num_rows:
        return
    rn = cells.column(0).to_numpy().astype(np.int64)
    position = cells.column(1).to_numpy().astype(np.int64)
    middle = cells.column(2).cast(pa.large_string()).combine_chunks()  # large: no 2 GiB limit on the text
    del cells
    order = None
    if position.min() >= 0:
        key = rn * (int(position.max()) + 1) + position
        if int(key.max()) < 4 * len(key) + 1024:  # dense: the slots cost at most 4 times the cells
            slot = np.full(int(key.max()) + 1, -1, dtype=np.int64)
            slot[key] = np.arange(len(key))
            order = slot[slot >= 0]
            del slot
            if len(order) != len(key):  # a key twice: one cell overwrote another's slot
                order = None
        del key
    if order is None:
        order = np.lexsort((position, rn))
    del position
    for start in range(0, len(order), chunk_rows):
        take = order[start:start + chunk_rows]
        yield _text_bytes(_row_texts(heads, tails, rn[take], middle.take(take).cast(pa.string())))


def _python_text(batch) -> bytes:
    """Rows as `canonical_json` writes them, comma-separated, without the brackets."""
    rows = list(zip(*(c.to_pylist() for c in batch.columns)))
    return canonical_json(rows)[1:-1].encode("utf-8") if rows else b""


def _text_bytes(column) -> bytes:
    """The UTF-8 bytes of an Arrow text column's values, one after the other (no nulls)."""
    import numpy as np
    import pyarrow as pa

    parts = []
    for chunk in getattr(column, "chunks", [column]):
        if not len(chunk):
            continue
        if chunk.null_count:
            raise ValueError("a null in the data-version text")
        chunk = chunk.cast(pa.large_string())
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64)[chunk.offset: chunk.offset + len(chunk) + 1]
        parts.append(memoryview(chunk.buffers()[2])[offsets[0]:offsets[-1]])
    return b"".join(parts)
