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

from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace

import duckdb

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

# The task fields, in the order `json_extract` returns them.
FIELDS = ("task_id", "prompt", "domain", "reference_answer", "grader", "split", "tags")
# The graders whose fields SQL checks, with each field's JSON test ({} is the field's JSON value).
# Any other grader type, or another field, sends the line to the Python reader: sound, only slower.
GRADER_FIELDS = {
    "exact": {"case_sensitive": "json_type({}) = 'BOOLEAN'", "strip": "json_type({}) = 'BOOLEAN'"},
    "contains": {"case_sensitive": "json_type({}) = 'BOOLEAN'"},
    "numeric": {"tolerance": "(json_type({}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') AND isfinite(TRY_CAST({} AS DOUBLE)) "
                             "AND TRY_CAST({} AS DOUBLE) >= 0)",
                "relative": "json_type({}) = 'BOOLEAN'"},
    "llm_judge": {"rubric": "(json_type({}) = 'VARCHAR' AND length({} ->> '$') >= 1)",
                  "scale": "(json_type({}) IN ('BIGINT', 'UBIGINT') AND TRY_CAST({} AS HUGEINT) >= 1)"},
}
REQUIRED_GRADER_FIELDS = {"llm_judge": ("rubric",)}
_GRADER_KEYS = ["type", *sorted({k for f in GRADER_FIELDS.values() for k in f})]
# Python's str.strip() removes these ASCII characters (and more outside ASCII); JSON whitespace is fewer.
_STRIP = r"[\t\n\v\f\r \x1c-\x1f]"


def _grader_ok() -> str:
    """The SQL test of a grader object SQL vouches for: a known type, its known fields only, each
    once and of its JSON type."""
    tests = []
    for kind, fields in GRADER_FIELDS.items():
        allowed = ", ".join(f"'{k}'" for k in ("type", *fields))
        checks = [f"(g[{1 + _GRADER_KEYS.index(k)}] IS NULL OR {t.format(*[f'g[{1 + _GRADER_KEYS.index(k)}]'] * t.count('{}'))})"
                  for k, t in fields.items()]
        checks += [f"g[{1 + _GRADER_KEYS.index(k)}] IS NOT NULL" for k in REQUIRED_GRADER_FIELDS.get(kind, ())]
        tests.append(f"(gtype = '{kind}' AND list_has_all([{allowed}], gkeys) AND " + " AND ".join(checks) + ")")
    return ("(json_type(j[5]) = 'OBJECT' AND len(gkeys) = len(list_distinct(gkeys)) AND json_type(g[1]) = 'VARCHAR' AND ("
            + " OR ".join(tests) + "))")


# Every line of every batch file: (file, line number, text). Blank lines (ASCII whitespace only)
# are left out, as the Python reader skips them.
LINES = (
    "CREATE TEMP TABLE batch_lines AS SELECT file_no, line_no, line FROM ("
    " SELECT f.file_no, unnest(r.lines) AS line, unnest(range(1, len(r.lines) + 1)) AS line_no"
    " FROM (SELECT filename, string_split(CASE WHEN starts_with(content, chr(65279)) THEN substr(content, 2) "
    "       ELSE content END, chr(10)) AS lines FROM read_text(?)) r JOIN batch_files f USING (filename))"
    f" WHERE NOT regexp_full_match(line, '{_STRIP}*')"
)
# Lines DuckDB's parser may read otherwise than Python's json.loads (a trailing comma, a raw control
# character, a NUL or lone-surrogate escape) never take the SQL path.
_PARSABLE = ("json_valid(line) AND NOT regexp_matches(line, ',[ \\t\\r\\n]*[\\]}]') "
             "AND NOT regexp_matches(line, '[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f]') "
             "AND NOT regexp_matches(line, '\\\\u(0000|[dD][89abAB])')")
PARSE = (
    "CREATE TEMP TABLE batch_parsed AS SELECT file_no, line_no, j, keys, g, gkeys, g[1] ->> '$' AS gtype FROM ("
    " SELECT file_no, line_no, j, keys,"
    f"  CASE WHEN json_type(j[5]) = 'OBJECT' THEN json_extract(j[5], {['$.' + k for k in _GRADER_KEYS]!r}) END AS g,"
    "   CASE WHEN json_type(j[5]) = 'OBJECT' THEN json_keys(j[5]) END AS gkeys"
    " FROM (SELECT file_no, line_no,"
    f"  CASE WHEN ok THEN json_extract(line, {['$.' + k for k in FIELDS]!r}) END AS j,"
    "   CASE WHEN ok THEN json_keys(line) END AS keys"
    f"  FROM (SELECT file_no, line_no, line, {_PARSABLE} AND json_type(line) = 'OBJECT' AS ok FROM batch_lines)))"
)
_FAST = (
    f"keys IS NOT NULL AND len(keys) = len(list_distinct(keys)) AND list_has_all({list(FIELDS)!r}, keys)"
    " AND json_type(j[1]) = 'VARCHAR' AND length(j[1] ->> '$') BETWEEN 1 AND 256"
    " AND json_type(j[2]) = 'VARCHAR' AND length(j[2] ->> '$') >= 1"
    " AND (j[3] IS NULL OR json_type(j[3]) = 'VARCHAR')"
    " AND (j[4] IS NULL OR json_type(j[4]) IN ('VARCHAR', 'NULL'))"
    " AND (j[6] IS NULL OR (json_type(j[6]) = 'VARCHAR' AND j[6] ->> '$' IN ('train', 'val', 'test')))"
    " AND (j[7] IS NULL OR (json_type(j[7]) = 'ARRAY'"
    "      AND list_has_all(['VARCHAR'], json_type(j[7], '$[*]'))))"
    " AND " + _grader_ok()
)
# The rows SQL vouches for, typed; `ref` is the reference answer (NULL when absent or null).
ROWS = (
    "CREATE TEMP TABLE batch_rows AS SELECT file_no, line_no, j[1] ->> '$' AS task_id, j[2] ->> '$' AS prompt,"
    " coalesce(j[3] ->> '$', 'general') AS domain, CASE WHEN json_type(j[4]) = 'VARCHAR' THEN j[4] ->> '$' END AS ref,"
    " gtype AS grader_type, coalesce(j[6] ->> '$', 'train') AS split,"
    " coalesce(json_extract_string(j[7], '$[*]'), []::VARCHAR[]) AS tags"
    f" FROM batch_parsed WHERE {_FAST}"
)
# A row whose reference SQL shows cannot be in its prompt: no reference, or ASCII prompt and
# reference (lower() agrees with Python's there) with nothing to strip at the reference's ends, and
# the prompt not containing it. Exact and contains also need a reference that is not blank.
_PROVED = (
    "(ref IS NULL OR ref = '' OR (NOT regexp_matches(prompt, '[^\\x00-\\x7f]') AND NOT regexp_matches(ref, '[^\\x00-\\x7f]')"
    f" AND NOT regexp_matches(ref, '^{_STRIP}|{_STRIP}$') AND NOT contains(lower(prompt), lower(ref))))"
    " AND (grader_type NOT IN ('exact', 'contains') OR regexp_matches(coalesce(ref, ''), '[!-~]'))"
)
TO_CHECK = f"SELECT file_no, line_no, grader_type, ref, prompt FROM batch_rows WHERE NOT ({_PROVED})"
NUMERIC_REFS = "SELECT DISTINCT ref FROM batch_rows WHERE grader_type = 'numeric'"
OTHER_LINES = ("SELECT l.file_no, l.line_no, l.line FROM batch_lines l ANTI JOIN batch_rows r USING (file_no, line_no) "
               "ORDER BY l.file_no, l.line_no")
DUPLICATES = "SELECT DISTINCT file_no FROM batch_rows GROUP BY file_no, task_id HAVING count(*) > 1"
SHARED_IDS = ("SELECT r.file_no, r.task_id, r.line_no FROM batch_rows r JOIN (SELECT task_id FROM batch_rows "
              "GROUP BY task_id HAVING count(DISTINCT file_no) > 1) USING (task_id) ORDER BY r.file_no, r.line_no")
ADD_ROWS = "INSERT INTO batch_rows SELECT * FROM added"
DROP_FILES = "DELETE FROM batch_rows WHERE file_no IN (SELECT unnest(?))"
EMPTY_ROWS = ("CREATE TEMP TABLE batch_rows (file_no INTEGER, line_no BIGINT, task_id VARCHAR, prompt VARCHAR, "
              "domain VARCHAR, ref VARCHAR, grader_type VARCHAR, split VARCHAR, tags VARCHAR[])")
# The accepted tasks, as `tasks` holds them.
INSERT_TASKS = ("INSERT INTO tasks SELECT r.task_id, f.batch, r.prompt, sha256(r.prompt), r.domain, r.split, "
                "r.grader_type, r.tags FROM batch_rows r JOIN batch_files f USING (file_no)")
_CONSISTENT = Task._consistent  # the Task validator itself, run on a row's fields (module docstring)


def _consistency_problem(grader_type: str, ref: str | None, prompt: str) -> str | None:
    try:
        _CONSISTENT(SimpleNamespace(grader=SimpleNamespace(type=grader_type, pattern=None), reference_answer=ref,
                                    prompt=prompt))
    except ValueError as exc:
        return str(exc)
    return None


ROW_COLUMNS = ("file_no", "line_no", "task_id", "prompt", "domain", "ref", "grader_type", "split", "tags")


def _columns() -> dict[str, list]:
    return {c: [] for c in ROW_COLUMNS}


def _add(columns: dict[str, list], file_no: int, line_no: int, t: Task) -> None:
    for c, v in zip(ROW_COLUMNS, (file_no, line_no, t.task_id, t.prompt, t.domain, t.reference_answer, t.grader.type,
                                  t.split, list(t.tags))):
        columns[c].append(v)


def _insert_rows(con: duckdb.DuckDBPyConnection, columns: dict[str, list]) -> None:
    """Rows the Python reader read, into `batch_rows` (through Arrow: one statement)."""
    import pyarrow as pa

    if columns["file_no"]:
        python_rows = pa.table(columns)  # noqa: F841  (DuckDB reads the local by name)
        con.execute("INSERT INTO batch_rows SELECT * FROM python_rows")


def _read_lines(con: duckdb.DuckDBPyConnection, files: dict[int, tuple[str, Path]]) -> set[int]:
    """`LINES` over the files; a file DuckDB cannot read (not UTF-8, gone) is left to the Python
    reader, whose error names it. Returns those files."""
    unread: set[int] = set()
    while True:
        paths = [str(p) for n, (_, p) in files.items() if n not in unread]
        try:
            con.execute(LINES, [paths])
            return unread
        except duckdb.Error:
            con.execute("DROP TABLE IF EXISTS batch_lines")
            bad = set()
            for n, (_, p) in files.items():
                if n in unread:
                    continue
                try:
                    con.execute("SELECT count(*) FROM read_text(?)", [str(p)]).fetchone()
                except duckdb.Error:
                    bad.add(n)
            if not bad:
                raise
            unread |= bad


def read_batches(con: duckdb.DuckDBPyConnection, benchgen_dir: Path, settled: Collection[str] = (),
                 refused: list[TaskFileError] | None = None) -> int:
    """Every task of every batch file of `benchgen_dir` into the temp table `batch_rows` (and the
    files into `batch_files`), task ids unique across batches, as `load_all_batches(benchgen_dir,
    refused, settled)` reads them (see the module docstring). A bad batch raises `TaskFileError`,
    or, with `refused`, is appended there and left out. Returns the number of tasks kept."""
    found = scan_batch_files(benchgen_dir)[0]
    files = {n: (b, p) for n, (b, p) in enumerate(found)}
    con.execute("CREATE TEMP TABLE batch_files AS SELECT unnest(?) AS file_no, unnest(?) AS batch, unnest(?) AS filename",
                [list(files), [b for b, _ in files.values()], [str(p) for _, p in files.values()]])
    if not files:
        con.execute(EMPTY_ROWS)
        return 0
    bad = _read_lines(con, files)
    con.execute(PARSE)
    con.execute(ROWS)
    con.execute("DROP TABLE batch_parsed")
    # the lines SQL does not vouch for: the Python reader's own parse
    added = _columns()
    for n, line_no, line in con.execute(OTHER_LINES).fetchall():
        if n in bad:
            continue
        got = parse_task_line(line)
        if isinstance(got, list):
            bad.add(n)
        elif got is not None:  # None: a line only Python reads as blank (Unicode spaces)
            _add(added, n, line_no, got)
    con.execute("DROP TABLE batch_lines")
    # the checks across fields, by the validator itself (a numeric reference once per value)
    numeric_bad = {r for (r,) in con.execute(NUMERIC_REFS).fetchall() if _consistency_problem("numeric", r, "")}
    for n, _, grader_type, ref, prompt in con.execute(TO_CHECK).fetchall():
        if n not in bad and (_consistency_problem(grader_type, ref, prompt) or (grader_type == "numeric" and ref in numeric_bad)):
            bad.add(n)
    if numeric_bad:
        bad |= {n for (n,) in con.execute("SELECT DISTINCT file_no FROM batch_rows WHERE grader_type = 'numeric' "
                                          "AND ref IN (SELECT unnest(?))", [sorted(numeric_bad)]).fetchall()}
    _insert_rows(con, added)
    bad |= {n for (n,) in con.execute(DUPLICATES).fetchall()}
    bad |= set(files) - {n for (n,) in con.execute("SELECT DISTINCT file_no FROM batch_rows").fetchall()}
    errors: dict[int, TaskFileError] = {}
    again: dict[str, list] = _columns()
    for n in sorted(bad):  # the Python reader names every problem, as it always did
        try:
            for line_no, task in read_batch(files[n][1]):  # not expected: the file is sound after all, and
                _add(again, n, line_no, task)              # Python's reading of it is the one kept
        except TaskFileError as exc:
            errors[n] = exc
    con.execute(DROP_FILES, [sorted(bad)])
    _insert_rows(con, again)
    errors.update(_clashes(con, files, settled))
    con.execute(DROP_FILES, [sorted(errors)])
    for n in sorted(errors):
        if refused is None:
            raise errors[n]
        refused.append(errors[n])
    return con.execute("SELECT count(*) FROM batch_rows").fetchone()[0]


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
        read_batches(con, benchgen_dir, settled, refused)
    return refused


__all__ = ["INSERT_TASKS", "read_batches", "refused_batches"]
