"""The matrix's data version is the sha256 of the canonical JSON of its graded cells. DuckDB now
writes that text in bulk; it must be the text `canonical_json` writes, byte for byte, whatever the
ids and the utilities hold, or every matrix would change version (and look stale) for nothing."""

import hashlib

import duckdb
import pytest

from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.matrix.build import DATA_VERSION_ROWS, SCHEMA, data_version

UTILITIES = [0.1, -0.0, 0.0, 1e-05, 1.5e-05, 0.0001, 123456.789, 1 / 3, 2.5e-10, 1e16, 1.5e16, -2.718281828459,
             0.30000000000000004, 7.0, -1.0, 99999999.999999999]


def reference(con: duckdb.DuckDBPyConnection) -> str:
    """The definition: canonical_json of every row, in one piece."""
    rows = con.execute(DATA_VERSION_ROWS).fetchall()
    return hashlib.sha256(canonical_json(rows).encode("utf-8")).hexdigest()[:16]


def matrix(task_ids: list[str], workers=("w-a", "w_b", "w.c")) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(SCHEMA)
    con.executemany("INSERT INTO workers VALUES (?, ?, 'mock', NULL)", [(i, w) for i, w in enumerate(workers)])
    for k, tid in enumerate(task_ids):
        con.execute("INSERT INTO tasks VALUES (?, 'b', 'p', ?, 'math', ?, 'exact', [])",
                    [tid, hashlib.sha256(tid.encode()).hexdigest(), ("train", "val", "test")[k % 3]])
        for i, w in enumerate(workers):
            u = UTILITIES[(k * len(workers) + i) % len(UTILITIES)]
            con.execute("INSERT INTO rewards VALUES (?, ?, ?, 1.0, 0.0, 0.0, ?)", [tid, w, i, u])
    return con


@pytest.mark.parametrize("chunk_rows", [1, 4, 200_000])
def test_plain_ids_give_the_canonical_text_in_bulk(chunk_rows):
    con = matrix([f"t{i:03d}" for i in range(40)] + ["é-ünï", "💡 idea", "a b", "z/9"])
    assert data_version(con, chunk_rows) == reference(con)


@pytest.mark.parametrize("odd", ['quo"te', "back\\slash", "tab\there", "line\nbreak", "nul\x00x", "esc\x1b[31m"])
def test_ids_that_need_escaping_give_the_same_version(odd):
    con = matrix(["t1", odd, "t3"])
    assert data_version(con, 2) == reference(con)


def test_an_empty_matrix_has_the_version_of_no_rows():
    con = matrix([])
    assert data_version(con) == reference(con) == hashlib.sha256(b"[]").hexdigest()[:16]


def test_known_matrices_keep_their_versions():
    """Pinned: the versions the row-by-row code gave these matrices before the text was written in bulk."""
    assert data_version(matrix([f"t{i}" for i in range(5)])) == "469b126daa9733c1"
    assert data_version(matrix(["t1", 'quo"te', "t3"])) == "dc39b6a5c6402c76"
