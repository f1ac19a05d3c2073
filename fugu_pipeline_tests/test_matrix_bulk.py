"""The bulk build (DuckDB read_json over the partition files) against the row-by-row build: the
same tables, row for row, and the same data_version, on the sample data and on files carrying
every case the store's reader handles (a re-collected cell, a failed then answered cell, a stale
prompt hash, a damaged line, a torn last line, a file of an unconfigured worker)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.matrix.build import build, from_collection
from fugu_pipeline.matrix.bulk import build_collection
from fugu_pipeline_tests.test_reward_matrix import collect_all

TABLES = {
    "tasks": "SELECT * FROM tasks ORDER BY task_id",
    "workers": "SELECT * FROM workers ORDER BY position",
    "responses": "SELECT * FROM responses ORDER BY task_id, worker_id",
    "rewards": "SELECT * FROM rewards ORDER BY task_id, position",
    "reward_wide": "SELECT * FROM reward_wide",
    "meta": "SELECT * FROM meta ORDER BY key",
}


def _dump(db: Path) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for name, sql in TABLES.items():
            rows = con.execute(sql).fetchall()
            out[name] = ([d[0] for d in con.description], rows)
        return out
    finally:
        con.close()


def _both(project: Path, cfg, summary: dict | None = None) -> tuple[dict, dict]:
    store = ResponseStore(project / "data" / "responses")
    row_db, bulk_db = project / "data" / "rows.duckdb", project / "data" / "bulk.duckdb"
    build(from_collection(project / "data" / "benchgen", store, cfg), row_db)
    got = build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, bulk_db)
    if summary is not None:
        summary.update(got)
    return _dump(row_db), _dump(bulk_db)


def test_bulk_build_equals_the_row_build_on_the_sample(project):
    cfg, tasks, _ = collect_all(project)
    summary: dict = {}
    rows, bulk = _both(project, cfg, summary)
    assert (summary["skipped_lines"], summary["skipped_where"]) == (0, "")
    for name in TABLES:
        assert rows[name] == bulk[name], name
    meta = dict(bulk["meta"][1])
    assert meta["data_version"] == dict(rows["meta"][1])["data_version"]
    assert len(bulk["rewards"][1]) == len(tasks) * 3


def test_bulk_build_keeps_the_readers_rules_on_damaged_files(project):
    cfg, tasks, _ = collect_all(project)
    rdir = project / "data" / "responses" / "sample"
    math = rdir / "math-expert.jsonl"
    lines = math.read_text().splitlines()
    first, second, third = (json.loads(x) for x in lines[:3])
    # a cell collected again: the later line wins (a different answer and quality)
    again = dict(first, answer="changed", quality=0.0 if first["quality"] else 1.0)
    # a failed cell answered later; a stale prompt hash (the task was reworded since): not used
    failed = dict(second, status="failed", quality=None, error="boom")
    stale = dict(third, prompt_hash="0" * 64)
    body = [json.dumps(failed), *lines, json.dumps(again), "not json at all", json.dumps({"task_id": "x"}),
            json.dumps(stale)]
    math.write_text("\n".join(body) + "\n" + '{"task_id": "' + first["task_id"] + '", "worker_id": "math')  # torn
    (rdir / "retired-worker.jsonl").write_text(lines[0] + "\n")  # not in the config: never read
    recs = ResponseStore(project / "data" / "responses").read("sample", "math-expert")
    assert recs.n_skipped == 3 and recs.torn_last_line
    summary: dict = {}
    rows, bulk = _both(project, cfg, summary)
    # counted and numbered as the collection run numbers them (a note made a stop ago said the bulk
    # build skipped them silently)
    n = len(body)
    assert summary["skipped_lines"] == 3 and summary["skipped_where"] == recs.skipped_note()
    assert f"line {n - 2}, {n - 1}, {n + 1}" in summary["skipped_where"] and "torn last line" in summary["skipped_where"]
    for name in TABLES:
        assert rows[name] == bulk[name], name
    assert len(bulk["rewards"][1]) == len(tasks) * 3 - 1  # the stale cell is missing, as in the row build
    latest = {r[0]: r for r in bulk["responses"][1] if r[1] == "math-expert"}
    assert latest[first["task_id"]][4] == "changed"  # the later line won


@pytest.mark.parametrize("n_workers", [1, 3])
def test_bulk_build_with_no_responses_yet(project, n_workers):
    from fugu_pipeline.workers.config import load_workers_config

    cfg = load_workers_config(project / "configs" / "workers.mock.yaml")
    cfg.workers = cfg.workers[:n_workers]
    rows, bulk = _both(project, cfg)
    for name in TABLES:
        assert rows[name] == bulk[name], name


def test_blank_lines_are_not_counted_as_skipped(project):
    cfg, _, _ = collect_all(project)
    math = project / "data" / "responses" / "sample" / "math-expert.jsonl"
    lines = math.read_text().splitlines()
    math.write_text("\n".join([lines[0], "", "   ", *lines[1:]]) + "\n\n")
    summary: dict = {}
    rows, bulk = _both(project, cfg, summary)
    assert (summary["skipped_lines"], summary["skipped_where"]) == (0, "")
    assert rows == bulk


def test_latest_line_wins_when_the_scan_runs_in_parallel(project):
    """The bulk build takes a file's line order from the order of its insert (no line numbers): a
    cell collected many times, in files long enough for DuckDB to read in parallel (several files,
    several vectors each), keeps its last line, as the store's reader keeps it."""
    cfg, tasks, _ = collect_all(project)
    rdir = project / "data" / "responses" / "sample"
    expected = {}
    for w in cfg.worker_ids:
        path = rdir / f"{w}.jsonl"
        base = [json.loads(x) for x in path.read_text().splitlines()]
        rounds = max(2, 6000 // len(base))  # every cell written `rounds` times, rounds interleaved
        with path.open("a") as fh:
            for k in range(rounds):
                for i, rec in enumerate(base):
                    fh.write(json.dumps(dict(rec, answer=f"round {k} of {(i * 7 + k) % 11}")) + "\n")
        store_recs = ResponseStore(project / "data" / "responses").read("sample", w)
        assert store_recs.n_skipped == 0
        expected[w] = {t: r.answer for t, r in store_recs.items()}
    db = project / "data" / "bulk.duckdb"
    build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, db)
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT worker_id, task_id, answer FROM responses").fetchall()
    assert len(got) == sum(len(v) for v in expected.values())
    assert {(w, t): a for w, t, a in got} == {(w, t): a for w, v in expected.items() for t, a in v.items()}


def test_repeated_cells_are_found_by_file_and_task():
    """The check that lets the build skip the latest-line search: a task twice in one file is a
    repeated cell; the same task in two files (two workers) is not."""
    from fugu_pipeline.matrix.bulk import repeated_cells

    con = duckdb.connect()
    con.execute("CREATE TABLE responses (rec_file INTEGER, task_id VARCHAR)")
    assert not repeated_cells(con)  # no lines at all
    con.execute("INSERT INTO responses SELECT i % 7, 't' || (i // 7) FROM range(70000) r(i)")
    assert not repeated_cells(con)
    con.execute("INSERT INTO responses VALUES (3, 't5000')")
    assert repeated_cells(con)


def _with_a_refused_batch(project: Path) -> tuple[Path, Path]:
    """A second batch whose file has a bad line (so it is refused) and whose response files exist and
    are damaged: its files are read beside the tasks, then must leave no trace."""
    bench, rdir = project / "data" / "benchgen", project / "data" / "responses"
    lines = (bench / "sample.jsonl").read_text().splitlines()
    bad = bench / "zz_bad.jsonl"
    bad.write_text("\n".join(json.dumps(dict(json.loads(x), task_id="zz-" + json.loads(x)["task_id"])) for x in lines)
                   + "\n{not json\n")
    (rdir / "zz_bad").mkdir()
    for f in (rdir / "sample").glob("*.jsonl"):
        recs = [dict(json.loads(x), batch="zz_bad", task_id="zz-" + json.loads(x)["task_id"]) for x in f.read_text().splitlines()]
        (rdir / "zz_bad" / f.name).write_text("\n".join(json.dumps(r) for r in recs) + "\nnot a record\n")
    return bad, rdir / "zz_bad"


def test_a_refused_batch_leaves_no_trace_though_its_responses_are_read_beside_the_tasks(project):
    """The response files of every batch with a batch file are read while the batch files are
    validated; those of a batch refused then are dropped: the matrix, its version and the summary
    (files read, skipped lines) are those of the project without that batch."""
    cfg, tasks, _ = collect_all(project)
    clean = project / "data" / "clean.duckdb"
    expected = build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, clean)
    bad, bad_responses = _with_a_refused_batch(project)
    refused: list = []
    db = project / "data" / "bulk.duckdb"
    got = build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, db, refused=refused)
    assert [e.path for e in refused] == [bad]
    assert got == expected and got["files_read"] == 3 and got["skipped_where"] == ""
    assert _dump(db) == _dump(clean)


def test_a_bad_batch_fails_the_build_while_the_responses_are_being_read(project):
    """Without `refused`, a bad batch file fails the build as before: the read on the other
    connection is stopped, and no matrix (nor a half-built file) is left."""
    from fugu_pipeline.tasks.loading import TaskFileError

    cfg, _, _ = collect_all(project)
    _with_a_refused_batch(project)
    db = project / "data" / "bulk.duckdb"
    with pytest.raises(TaskFileError, match="zz_bad.jsonl"):
        build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, db)
    assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith("bulk")) == []


def test_a_failed_read_beside_the_tasks_is_made_again_after_them(project, monkeypatch):
    """If the read beside the tasks fails, the files of the batches kept are read again once the
    tasks are in (where an error of that read is raised as before): the same matrix."""
    import fugu_pipeline.matrix.bulk as bulk

    cfg, _, _ = collect_all(project)
    _with_a_refused_batch(project)
    clean = project / "data" / "clean.duckdb"
    expected = build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, clean, refused=[])

    def fails(con, files):
        raise bulk._LoadFailed()

    monkeypatch.setattr(bulk, "_timed_load", fails)
    db = project / "data" / "bulk.duckdb"
    assert build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg, db, refused=[]) == expected
    assert _dump(db) == _dump(clean)
