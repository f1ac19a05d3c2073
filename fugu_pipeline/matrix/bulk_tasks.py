"""The batch files read in bulk for the reward matrix: one DuckDB scan of every line of every file,
checked in SQL, and the Python reader (`tasks/loading.py`) only where SQL cannot vouch for a line.

What it gives is what `load_all_batches` gives, task for task: the same tasks, the same refused
batches with the same messages. How:
- `read_text` reads each file whole (a UTF-8 BOM read past), split at "\\n" as the Python reader
  splits it, so line numbers agree; blank lines are skipped alike;
- each line is parsed once (`json_extract` of the task's fields) and accepted in SQL only when its
  shape is one `Task` takes as it is: known keys, each once, each of its JSON type (a string where a
  string belongs, a boolean, a finite number in range, a tags array of strings), a grader of a type
  whose fields SQL checks (exact, contains, numeric, llm_judge), and nothing the two JSON parsers
  read differently (DuckDB takes a trailing comma, `nan`, a NUL escape; Python does not, or reads
  it otherwise). Any other line goes to `parse_task_line`, the Python reader's own;
- the checks across fields (`Task._consistent`: a reference where the grader needs one, a numeric
  reference that parses, no answer in the prompt) run in Python, by the validator itself: the
  numeric references once per distinct value, the answer-in-prompt check only on the rows where
  SQL cannot rule it out (an ASCII prompt that does not contain the ASCII reference cannot hold it);
- a file with any problem (a bad line, a duplicate id, no task) is read again by `read_batch`,
  whose error names every line, exactly as before; task ids shared across files are settled by
  `loading.find_clashes` (collected batches first, then the older file).

Every table and column named in SQL here is this module's own; file names and batch names go in
as bound parameters.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace

import duckdb

from fugu_pipeline.matrix.build import SCHEMA
from fugu_pipeline.tasks.loading import (
    BatchIds,
    TaskFileError,
    clash_error,
    find_clashes,
    parse_task_line,
    read_batch,
    read_text,
    scan_batch_files,
    split_lines,
)
from fugu_pipeline.tasks.schema import Task

FIELDS = ("task_id", "prompt", "domain", "reference_answer", "grader", "split", "tags")
TASKS_TABLE = next(s for s in SCHEMA.split(";") if "CREATE TABLE tasks" in s)  # the matrix's, for a check alone
# The graders whose fields SQL checks, with each field's test on its JSON text `{}` (as DuckDB writes
# it back: a string starts with a quote, a number with a digit or a minus; `true`, `false`, `null`).
# Any other grader type, or another field, sends the line to the Python reader: sound, only slower.
_BOOL = "{} IN ('true', 'false')"
GRADER_FIELDS = {
    "exact": {"case_sensitive": _BOOL, "strip": _BOOL, "math": _BOOL},
    "contains": {"case_sensitive": _BOOL},
    "numeric": {"tolerance": "(json_type({}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') AND isfinite(TRY_CAST({} AS DOUBLE)) "
                             "AND TRY_CAST({} AS DOUBLE) >= 0)",
                "relative": _BOOL, "math": _BOOL},
    "llm_judge": {"rubric": "(left({}, 1) = '\"' AND {} <> '\"\"')",
                  "scale": "(json_type({}) IN ('BIGINT', 'UBIGINT') AND TRY_CAST({} AS HUGEINT) >= 1)"},
}
REQUIRED_GRADER_FIELDS = {"llm_judge": ("rubric",)}
_GRADER_KEYS = ["type", *sorted({k for f in GRADER_FIELDS.values() for k in f})]
# What the build reads of a task line: each field's JSON text, the grader's fields one by one. Also the
# read spec of benchmarks/bench_matrix.py's typed floor (a bare read_json of the same fields).
FIELD_TYPES: dict[str, str | dict[str, str]] = {k: {g: "JSON" for g in _GRADER_KEYS} if k == "grader" else "JSON"
                                                for k in FIELDS}
_SPEC = json.dumps(FIELD_TYPES)
# Python's str.strip() removes these ASCII characters (and more outside ASCII); JSON whitespace is fewer.
_STRIP = r"[\t\n\v\f\r \x1c-\x1f]"


def _string(x: str) -> str:
    return f"left({x}, 1) = '\"'"


def _present(fields) -> str:
    """How many of these struct fields are present (`json_transform` gives NULL for a key that is
    missing, and for a JSON null)."""
    return " + ".join(f"({f} IS NOT NULL)::INTEGER" for f in fields)


def _grader_ok() -> str:
    """The SQL test of a grader SQL vouches for: an object of a known type, with known fields only,
    each once and of its JSON type. `gkeys` are its keys, repeats included: as many as its fields
    present, so none is unknown, repeated or null."""
    tests = []
    for kind, fields in GRADER_FIELDS.items():
        checks = [f"(f.grader.{k} IS NULL OR {test.replace('{}', f'f.grader.{k}')})" for k, test in fields.items()]
        checks += [f"f.grader.{k} IS NOT NULL" for k in REQUIRED_GRADER_FIELDS.get(kind, ())]
        checks += [f"f.grader.{k} IS NULL" for k in _GRADER_KEYS if k != "type" and k not in fields]
        tests.append(f"(f.grader.type = '\"{kind}\"' AND " + " AND ".join(checks) + ")")
    return (f"len(gkeys) = {_present(f'f.grader.{k}' for k in _GRADER_KEYS)} AND ("
            + " OR ".join(tests) + ")")


# Lines DuckDB's parser reads otherwise than Python's json.loads never take the SQL path: DuckDB
# takes a trailing comma ('{"a": 1,}'), Python does not. (Both refuse a raw control character in a
# string, a lone surrogate escape, a leading zero, single quotes: a test holds them side by side.)
_TRAILING_COMMA = r"regexp_matches(line, ',[ \t\r\n]*[\]}]')"
# `keys` are the line's keys, repeats included: as many as its known fields present (a null
# reference_answer counts once more), so none is unknown, repeated, or null where null is refused.
_FAST = (
    f"(len(keys) = {_present(f'f.{k}' for k in FIELDS)}"
    f"  OR (len(keys) = 1 + {_present(f'f.{k}' for k in FIELDS)} AND f.reference_answer IS NULL"
    "      AND list_contains(keys, 'reference_answer')))"
    f" AND {_string('f.task_id')} AND length(f.task_id ->> '$') BETWEEN 1 AND 256"
    f" AND {_string('f.prompt')} AND f.prompt <> '\"\"'"
    f" AND (f.domain IS NULL OR {_string('f.domain')})"
    f" AND (f.reference_answer IS NULL OR {_string('f.reference_answer')})"
    f" AND (f.split IS NULL OR f.split IN ('\"train\"', '\"val\"', '\"test\"'))"
    f" AND (f.tags IS NULL OR (left(f.tags, 1) = '[' AND list_has_all(['VARCHAR'], json_type(f.tags, '$[*]'))))"
    " AND " + _grader_ok()
)
# While the tasks are read, `tasks` also holds, for every non-blank line: its file, line number,
# whether SQL vouches for it, and its reference answer. The checks below read them; the files SQL
# does not vouch for, or that a check refuses, are deleted (and read by the Python reader), and the
# columns are dropped: the table is written once, never copied.
BOOKKEEPING = {"rec_file": "INTEGER", "rec_line": "BIGINT", "rec_fast": "BOOLEAN", "rec_ref": "VARCHAR"}
TASK_COLUMNS = ("task_id", "batch", "prompt", "prompt_hash", "domain", "split", "grader_type", "tags")
# Every non-blank line of every batch file (blank: ASCII whitespace only, which the Python reader
# skips too), with `rec_fast` when SQL vouches for it, and then its fields. Each line is parsed once
# per JSON function (valid?, its fields as JSON texts in a struct, its keys, its grader's keys); each
# step is a materialized CTE, so no later test evaluates a function again.
ROWS = (
    "INSERT INTO tasks (" + ", ".join([*TASK_COLUMNS, *BOOKKEEPING]) + ") WITH"
    " lines AS MATERIALIZED (SELECT file_no, line_no, line,"
    "  left(ltrim(line, chr(32) || chr(9) || chr(13)), 1) = '{' AND json_valid(line) AS valid FROM ("
    "  SELECT f.file_no, unnest(r.lines) AS line, unnest(range(1, len(r.lines) + 1)) AS line_no"
    "  FROM (SELECT filename, string_split(CASE WHEN starts_with(content, chr(65279)) THEN substr(content, 2) "
    "        ELSE content END, chr(10)) AS lines FROM read_text(?)) r JOIN batch_files f USING (filename))"
    f"  WHERE NOT regexp_full_match(line, '{_STRIP}*')),"
    f" parsed AS MATERIALIZED (SELECT file_no, line_no, valid AND NOT {_TRAILING_COMMA} AS ok,"
    "  CASE WHEN valid THEN json_transform(line, '" + _SPEC + "') END AS f,"
    "  CASE WHEN valid THEN json_keys(line) END AS keys, CASE WHEN valid THEN json_keys(line, '$.grader') END AS gkeys"
    "  FROM lines),"
    " fields AS MATERIALIZED (SELECT file_no, line_no, f.task_id ->> '$' AS task_id, f.prompt ->> '$' AS prompt,"
    "  coalesce(f.domain ->> '$', 'general') AS domain, f.grader.type ->> '$' AS grader_type,"
    "  coalesce(f.split ->> '$', 'train') AS split, coalesce(json_extract_string(f.tags, '$[*]'), []::VARCHAR[]) AS tags,"
    f"  coalesce(ok AND {_FAST}, false) AS fast, f.reference_answer ->> '$' AS ref FROM parsed)"
    " SELECT task_id, b.batch, prompt, sha256(prompt), domain, split, grader_type, tags, file_no, line_no, fast, ref"
    " FROM fields JOIN batch_files b USING (file_no)"
)
# Files SQL does not vouch for line by line, read by the Python reader: exact, only slower.
SLOW_FILES = "SELECT rec_file FROM tasks GROUP BY rec_file HAVING NOT bool_and(rec_fast)"
# The rows whose answer SQL cannot show to be out of their prompt; the others are checked in Python by
# the validator itself. `Task` refuses a prompt holding its reference (6+ characters), or holding
# "answer", spaces, "is", ":" or "=", spaces, then the reference (`_leaks`). SQL shows neither can
# fire for an ASCII prompt and reference (lower() agrees with Python's there) with nothing to strip
# at the reference's ends, when the lowercased prompt does not contain the reference at all; or is
# too short a reference and no "answer" phrase before it: where every run of whitespace in the prompt
# is one space, each spelling of the phrase is one of twelve strings.
_PHRASES = " OR ".join(f"contains(lp, 'answer{a}{op}{b}' || lr)" for a in ("", " ") for op in ("is", ":", "=") for b in ("", " "))
UNPROVED = (
    "WITH r AS MATERIALIZED (SELECT rec_file, rec_ref AS ref, prompt, lower(prompt) AS lp, lower(rec_ref) AS lr,"
    f"  strlen(prompt) = length(prompt) AND strlen(rec_ref) = length(rec_ref) AND NOT regexp_matches(rec_ref, '^{_STRIP}|{_STRIP}$')"
    "  AS ascii FROM tasks WHERE rec_ref IS NOT NULL AND rec_ref <> ''),"
    " c AS MATERIALIZED (SELECT *, contains(lp, lr) AS has FROM r)"
    " SELECT rec_file, ref, prompt FROM c WHERE NOT ascii OR (has AND (length(ref) >= 6 OR (contains(lp, 'answer') AND ("
    f"  regexp_matches(lp, '[\\t\\n\\v\\f\\r\\x1c-\\x1f]|  ') OR {_PHRASES}))))"
)
REFS = "SELECT DISTINCT grader_type, rec_ref FROM tasks WHERE grader_type IN ('exact', 'contains', 'numeric')"
FILES_WITH_REFS = ("SELECT DISTINCT rec_file FROM tasks r JOIN (SELECT unnest(?) AS grader_type, unnest(?) AS ref) b "
                   "ON r.grader_type = b.grader_type AND r.rec_ref IS NOT DISTINCT FROM b.ref")
DUPLICATES = "SELECT DISTINCT rec_file FROM tasks GROUP BY rec_file, task_id HAVING count(*) > 1"
SHARED_IDS = ("SELECT r.rec_file, r.task_id, r.rec_line FROM tasks r JOIN (SELECT task_id FROM tasks "
              "GROUP BY task_id HAVING count(DISTINCT rec_file) > 1) USING (task_id) ORDER BY r.rec_file, r.rec_line")
DROP_FILES = "DELETE FROM tasks WHERE rec_file IN (SELECT unnest(?))"
_CONSISTENT = Task._consistent  # the Task validator itself, run on a row's fields (module docstring)


def _consistency_problem(grader_type: str, ref: str | None, prompt: str) -> str | None:
    try:
        _CONSISTENT(SimpleNamespace(grader=SimpleNamespace(type=grader_type, pattern=None), reference_answer=ref,
                                    prompt=prompt))
    except ValueError as exc:
        return str(exc)
    return None


def _read_rows(con: duckdb.DuckDBPyConnection, files: dict[int, tuple[str, Path]]) -> set[int]:
    """`ROWS` over the files; a file DuckDB cannot read (not UTF-8, gone) is left to the Python
    reader, whose error names it. Returns those files."""
    unread: set[int] = set()
    while True:
        try:
            con.execute(ROWS, [[str(p) for n, (_, p) in files.items() if n not in unread]])
            return unread
        except duckdb.Error:
            bad = set()
            for n, (_, p) in files.items():
                try:
                    if n not in unread:
                        con.execute("SELECT sum(strlen(content)) FROM read_text(?)", [str(p)]).fetchall()
                except duckdb.Error:
                    bad.add(n)
            if not bad:
                raise
            unread |= bad


def _python_rows(con: duckdb.DuckDBPyConnection, files: dict[int, tuple[str, Path]], tasks: list[tuple[int, int, Task]]) -> None:
    """Tasks the Python reader read, into `tasks` (through Arrow: one statement)."""
    import pyarrow as pa

    if not tasks:
        return
    python_rows = pa.table({  # noqa: F841  (DuckDB reads the local by name)
        "task_id": [t.task_id for _, _, t in tasks], "batch": [files[n][0] for n, _, _ in tasks],
        "prompt": [t.prompt for _, _, t in tasks], "prompt_hash": [t.prompt_hash for _, _, t in tasks],
        "domain": [t.domain for _, _, t in tasks], "split": [t.split for _, _, t in tasks],
        "grader_type": [t.grader.type for _, _, t in tasks], "tags": [list(t.tags) for _, _, t in tasks],
        "rec_file": [n for n, _, _ in tasks], "rec_line": [line for _, line, _ in tasks], "rec_fast": [True] * len(tasks),
        "rec_ref": [t.reference_answer for _, _, t in tasks]})
    con.execute("INSERT INTO tasks (" + ", ".join([*TASK_COLUMNS, *BOOKKEEPING]) + ") SELECT * FROM python_rows")


def read_batches(con: duckdb.DuckDBPyConnection, benchgen_dir: Path, settled: Collection[str] = (),
                 refused: list[TaskFileError] | None = None) -> int:
    """Every task of every batch file of `benchgen_dir` into the reward matrix's (empty) `tasks`
    table, task ids unique across batches, as `load_all_batches(benchgen_dir, refused, settled)`
    reads them (see the module docstring). A bad batch raises `TaskFileError`, or, with `refused`,
    is appended there and left out. Returns the number of tasks kept."""
    found = scan_batch_files(benchgen_dir)[0]
    files = {n: (b, p) for n, (b, p) in enumerate(found)}
    if not files:
        return 0
    con.execute("CREATE TEMP TABLE batch_files AS SELECT unnest(?) AS file_no, unnest(?) AS batch, unnest(?) AS filename",
                [list(files), [b for b, _ in files.values()], [str(p) for _, p in files.values()]])
    for column, kind in BOOKKEEPING.items():  # the names and types are this module's own
        con.execute(f"ALTER TABLE tasks ADD COLUMN {column} {kind}")
    slow = _read_rows(con, files)
    slow |= {n for (n,) in con.execute(SLOW_FILES).fetchall()}
    slow |= set(files) - {n for (n,) in con.execute("SELECT DISTINCT rec_file FROM tasks").fetchall()}  # no task
    con.execute(DROP_FILES, [sorted(slow)])
    # the checks across fields, by the validator itself: each (grader, reference) once (a reference the
    # grader needs, a number that parses), with the prompt only where SQL cannot rule the answer out of it
    bad_refs = [(g, r) for g, r in con.execute(REFS).fetchall() if _consistency_problem(g, r, "")]
    if bad_refs:
        slow |= {n for (n,) in con.execute(FILES_WITH_REFS, [[g for g, _ in bad_refs], [r for _, r in bad_refs]]).fetchall()}
    for n, ref, prompt in con.execute(UNPROVED).fetchall():
        # the answer-in-prompt test alone: the validator's branch that every grader SQL vouches for shares,
        # and the only one of an llm_judge grader (the reference checks ran above, once per value)
        if n not in slow and _consistency_problem("llm_judge", ref, prompt):
            slow.add(n)
    slow |= {n for (n,) in con.execute(DUPLICATES).fetchall()}
    con.execute(DROP_FILES, [sorted(slow)])
    # the files SQL did not vouch for, whole: the Python reader takes them, or names every problem
    errors: dict[int, TaskFileError] = {}
    tasks: list[tuple[int, int, Task]] = []
    for n in sorted(slow):
        try:
            tasks += [(n, line, t) for line, t in read_batch(files[n][1])]
        except TaskFileError as exc:
            errors[n] = exc
    _python_rows(con, files, tasks)
    errors.update(_clashes(con, files, settled))
    con.execute(DROP_FILES, [sorted(errors)])
    for column in BOOKKEEPING:
        con.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
    con.execute("DROP TABLE batch_files")
    for n in sorted(errors):
        if refused is None:
            raise errors[n]
        refused.append(errors[n])
    return con.execute("SELECT count(*) FROM tasks").fetchall()[0][0]


def _clashes(con: duckdb.DuckDBPyConnection, files: dict[int, tuple[str, Path]], settled: Collection[str]) -> dict[int, TaskFileError]:
    """The files refused for a task id another file holds (`loading.find_clashes`)."""
    shared: dict[int, BatchIds] = {}
    for n, tid, line in con.execute(SHARED_IDS).fetchall():
        shared.setdefault(n, BatchIds(files[n][0], files[n][1])).ids.append((tid, line))
    if not shared:
        return {}
    refused = find_clashes(shared.values(), settled)
    number = {b: n for n, (b, _) in files.items()}
    lines: dict[Path, list[str]] = {}

    def task_at(path: Path, line: int) -> Task | None:
        if path not in lines:
            lines[path] = split_lines(read_text(path))
        got = parse_task_line(lines[path][line - 1]) if 0 < line <= len(lines[path]) else None
        return got if isinstance(got, Task) else None

    return {number[b]: clash_error(files[number[b]][1], clashes, task_at) for b, clashes in refused.items()}


def refused_batches(benchgen_dir: Path, settled: Collection[str] = ()) -> list[TaskFileError]:
    """The batch files the matrix build leaves out (bad lines, or task ids another batch holds),
    read as the build reads them: what a partition run checks before it calls anyone."""
    refused: list[TaskFileError] = []
    with duckdb.connect() as con:
        con.execute("SET enable_progress_bar = false")
        con.execute(TASKS_TABLE)
        read_batches(con, benchgen_dir, settled, refused)
    return refused


__all__ = ["read_batches", "refused_batches"]
