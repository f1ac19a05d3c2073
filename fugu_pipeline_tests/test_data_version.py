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
def test_plain_ids_give_the_canonical_text_in_bulk(chunk_rows, monkeypatch):
    import fugu_pipeline.matrix.build as build

    con = matrix([f"t{i:03d}" for i in range(40)] + ["é-ünï", "💡 idea", "a b", "z/9"])
    expected = reference(con)
    monkeypatch.setattr(build, "_python_text", lambda batch: pytest.fail("plain ids took the Python path"))
    assert data_version(con, chunk_rows) == expected


@pytest.mark.parametrize("odd", ['quo"te', "back\\slash", "tab\there", "line\nbreak", "nul\x00x", "esc\x1b[31m"])
def test_ids_that_need_escaping_give_the_same_version(odd):
    con = matrix(["t1", odd, "t3"])
    assert data_version(con, 2) == reference(con)


@pytest.mark.parametrize("positions", [(0, 1, 2), (2, 0, 1), (0, 7, 5000), (-3, 4, 1)])
def test_cells_in_any_row_order_and_positions_give_the_canonical_order(positions):
    """The cells are put in (task, position) order from their numbers: scattered to one slot each where
    the positions are dense, sorted where they are far apart or below 0; rewards written in any order."""
    con = duckdb.connect()
    con.execute(SCHEMA)
    con.executemany("INSERT INTO workers VALUES (?, ?, 'mock', NULL)", [(p, f"w{p}") for p in positions])
    tasks = [f"t{i:03d}" for i in range(60)]
    for k, tid in enumerate(tasks):
        con.execute("INSERT INTO tasks VALUES (?, 'b', 'p', ?, 'math', 'train', 'exact', [])",
                    [tid, hashlib.sha256(tid.encode()).hexdigest()])
    cells = [(tid, f"w{p}", p, UTILITIES[(k + p) % len(UTILITIES)]) for k, tid in enumerate(tasks) for p in positions
             if (k + p) % 4]  # some cells missing
    cells.sort(key=lambda c: (c[3], c[1]))  # written in an order that is not the canonical one
    con.executemany("INSERT INTO rewards VALUES (?, ?, ?, 1.0, 0.0, 0.0, ?)", cells)
    assert data_version(con, 7) == reference(con)


def test_an_empty_matrix_has_the_version_of_no_rows():
    con = matrix([])
    assert data_version(con) == reference(con) == hashlib.sha256(b"[]").hexdigest()[:16]


def test_known_matrices_keep_their_versions():
    """Pinned: the versions the row-by-row code gave these matrices before the text was written in bulk."""
    assert data_version(matrix([f"t{i}" for i in range(5)])) == "469b126daa9733c1"
    assert data_version(matrix(["t1", 'quo"te', "t3"])) == "dc39b6a5c6402c76"


@pytest.mark.slow
def test_the_utility_sql_writes_is_the_utility_python_computes_bit_for_bit():
    """The bulk build computes each cell's utility in SQL; the row build in Python
    (`UtilityConfig.utility`). Over random cells and weights, every float must be the same bits."""
    import random

    from fugu_pipeline.matrix.bulk import INSERT_REWARDS, utility_parameters
    from fugu_pipeline.reward import UtilityConfig

    rng = random.Random(7)
    for _ in range(5):
        u = UtilityConfig(quality_weight=rng.uniform(0, 3), cost_weight=rng.uniform(0, 2), latency_weight=rng.uniform(0, 1),
                          cost_scale_usd=10 ** rng.uniform(-4, 0), latency_scale_s=rng.uniform(0.1, 30), cap=rng.uniform(0.5, 8))
        cells = [(f"t{i}", rng.choice([0.0, 1.0, rng.random()]), 10 ** rng.uniform(-9, 1) * rng.choice([0, 1]),
                  rng.uniform(0, 1) * 10 ** rng.uniform(-3, 3), 10 ** rng.uniform(-4, 3)) for i in range(3000)]
        con = duckdb.connect()
        con.execute(SCHEMA)
        con.execute("INSERT INTO workers VALUES (0, 'w', 'mock', NULL)")
        con.execute("CREATE TEMP TABLE parts AS SELECT 'f' AS filename, 'b' AS part_batch, 'w' AS part_worker")
        con.executemany("INSERT INTO responses (task_id, worker_id, batch, status, quality, cost_usd, judge_cost_usd, latency_s) "
                        "VALUES (?, 'w', 'b', 'ok', ?, ?, ?, ?)", cells)
        con.execute(INSERT_REWARDS, utility_parameters(u))
        got = dict(con.execute("SELECT task_id, utility FROM rewards").fetchall())
        for tid, q, c, j, lat in cells:
            assert got[tid].hex() == u.utility(q, c + j, lat).hex(), (tid, q, c, j, lat, u)
