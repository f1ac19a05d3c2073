"""The response store and the reward matrix against damaged, hostile and degenerate input.

A tiny project (3 tasks, the 3 mock workers) whose response files are written by hand, so each
case is one line of damage and the whole file runs in a few seconds. Every case builds the matrix
both ways (row by row through `ResponseStore.read`, and in bulk through DuckDB's `read_json`):
they must agree, and neither may hold a value the store's reader refuses."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from fugu_pipeline.collect.records import CallRecord
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.matrix.build import build, from_collection
from fugu_pipeline.matrix.bulk import build_collection
from fugu_pipeline.matrix.read import RewardMatrixError, read_arrays
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl

WORKERS = ("math-expert", "code-expert", "general-expert")


@pytest.fixture()
def tiny(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "workers.mock.yaml", tmp_path / "configs" / "workers.mock.yaml")
    write_jsonl(tmp_path / "data" / "benchgen" / "b.jsonl", [task_row(i) for i in range(3)])
    cfg = load_workers_config(tmp_path / "configs" / "workers.mock.yaml")
    tasks = load_tasks(tmp_path / "data" / "benchgen" / "b.jsonl")
    store = ResponseStore(tmp_path / "data" / "responses")
    for k, w in enumerate(WORKERS):
        lines = [_record(t, w, quality=float((i + k) % 2), cost_usd=0.001 * (k + 1), latency_s=1.0 + k)
                 for i, t in enumerate(tasks)]
        _write(store.path("b", w), lines)
    return tmp_path, cfg, tasks, store


def _record(task, worker: str, **over) -> str:
    fields = {"task_id": task.task_id, "worker_id": worker, "batch": "b", "prompt_hash": task.prompt_hash,
              "status": "ok", "answer": "1", "quality": 1.0, "cost_source": "mock", **over}
    rec = CallRecord(**fields)
    return rec.model_dump_json()


def _write(path: Path, lines: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))


def _rewards(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT task_id, worker_id, quality, cost_usd, latency_s, utility FROM rewards "
                           "ORDER BY task_id, position").fetchall()
    finally:
        con.close()


def _both(root: Path, cfg, store, summary: dict | None = None) -> tuple[list, list]:
    """The rewards of the row build and of the bulk build, which must be equal (with the same
    data_version). `summary` receives the bulk build's."""
    row_db, bulk_db = root / "data" / "rows.duckdb", root / "data" / "bulk.duckdb"
    a = build(from_collection(root / "data" / "benchgen", store, cfg), row_db)
    b = build_collection(root / "data" / "benchgen", root / "data" / "responses", cfg, bulk_db)
    if summary is not None:
        summary.update(b)
    rows, bulk = _rewards(row_db), _rewards(bulk_db)
    assert rows == bulk
    assert a["data_version"] == b["data_version"]
    return rows, bulk


def _replace_first(store, worker: str, text: str | bytes) -> Path:
    """Append `text` as a later record of the first task of `worker`'s file (a later line wins)."""
    p = store.path("b", worker)
    with p.open("ab") as fh:
        fh.write((text if isinstance(text, bytes) else text.encode()) + b"\n")
    return p


def _first(store, worker="math-expert") -> dict:
    return json.loads(store.path("b", worker).read_text().splitlines()[0])


# --------------------------------------------------------------------------- call records


BAD_VALUES = [
    ("quality", "NaN"), ("quality", "Infinity"), ("quality", "7.0"), ("quality", "-1"),
    ("cost_usd", "NaN"), ("cost_usd", "-5.0"), ("cost_usd", "1e308"), ("judge_cost_usd", "-0.5"),
    ("latency_s", "Infinity"), ("latency_s", "-3"), ("ttft_s", "NaN"),
    ("attempts", "1000000000000"), ("prompt_tokens", "-1"), ("completion_tokens", "99999999999"),
    ("finished_at", "NaN"),
    # the wrong JSON type: the reader refuses these, so the bulk build must too
    ("prompt_tokens", "1.5"), ("finished_at", '"yesterday"'), ("quality", '"0.5"'), ("answer", "42"),
]


def _bad_line(store, field: str, raw: str) -> str:
    """The first task's record of math-expert, its quality flipped, with `field` set to `raw`."""
    rec = dict(_first(store), quality=0.0 if _first(store)["quality"] else 1.0)
    line = json.dumps(rec)
    line = line[:-1] + f', "{field}": {raw}' + "}" if field not in rec else \
        line.replace(f'"{field}": {json.dumps(rec[field])}', f'"{field}": {raw}')
    assert raw in line
    return line


@pytest.mark.parametrize(("field", "raw"), BAD_VALUES, ids=[f"{f}={r}" for f, r in BAD_VALUES])
def test_the_store_reads_a_record_with_an_impossible_value_as_damage(tiny, field, raw):
    root, cfg, tasks, store = tiny
    p = _replace_first(store, "math-expert", _bad_line(store, field, raw))
    recs = store.read("b", "math-expert")
    assert recs.skipped_lines == [4], f"{field}={raw} was read as a record"
    assert str(p) in recs.skipped_note()
    assert recs[tasks[0].task_id].quality == _first(store)["quality"]  # the earlier, sound record stands


def test_both_builds_skip_every_impossible_value_alike(tiny):
    """Every bad line of BAD_VALUES after the sound record of one cell (each with the quality
    flipped): a line either build took would change that cell, or make the builds differ. Before,
    NaN and negative figures reached `rewards`, and the bulk build took the wrong JSON types."""
    root, cfg, tasks, store = tiny
    for field, raw in BAD_VALUES:
        _replace_first(store, "math-expert", _bad_line(store, field, raw))
    assert store.read("b", "math-expert").n_skipped == len(BAD_VALUES)
    rows, _ = _both(root, cfg, store)
    mine = [r for r in rows if r[0] == tasks[0].task_id and r[1] == "math-expert"]
    assert mine and mine[0][2] == _first(store)["quality"]
    for r in rows:
        assert all(math.isfinite(v) for v in r[2:]) and r[3] >= 0 and r[4] >= 0 and 0 <= r[2] <= 1


def test_a_record_naming_a_key_twice_reads_the_same_in_both_builds(tiny):
    """A line with "quality" twice: the store took the last value, the bulk build's read_json the
    first, so the collection and the matrix disagreed on the cell. Both take the first now."""
    root, cfg, tasks, store = tiny
    first = _first(store)
    flipped = 0.0 if first["quality"] else 1.0
    line = json.dumps(dict(first, quality=flipped))
    _replace_first(store, "math-expert", line[:-1] + f', "quality": {first["quality"]}' + "}")
    bad = json.dumps(dict(_first(store, "math-expert"), task_id=tasks[1].task_id, quality="high"))
    _replace_first(store, "math-expert", bad[:-1] + ', "quality": 1.0}')  # the first value is not a number: damage
    third = json.loads(store.path("b", "math-expert").read_text().splitlines()[2])
    assert third["task_id"] == tasks[2].task_id
    good_first = json.dumps(dict(third, quality=1.0))
    _replace_first(store, "math-expert", good_first[:-1] + ', "quality": "high"}')  # the first value holds
    # answers that look like keys are not damage: an escaped quote, a value starting with a colon
    _replace_first(store, "code-expert", json.dumps(dict(_first(store, "code-expert"), answer='x": 1, "quality":')))
    _replace_first(store, "general-expert", json.dumps(dict(_first(store, "general-expert"), answer=": a colon first")))
    recs = store.read("b", "math-expert")
    assert recs[tasks[0].task_id].quality == flipped and recs.skipped_lines == [5]
    assert store.read("b", "code-expert").n_skipped == 0 and store.read("b", "general-expert").n_skipped == 0
    assert store.read("b", "general-expert")[tasks[0].task_id].answer == ": a colon first"
    summary: dict = {}
    rows, _ = _both(root, cfg, store, summary)
    assert len(rows) == 9 and summary["skipped_lines"] == 1 and "(line 5)" in summary["skipped_where"]
    assert [r[2] for r in rows if r[:2] == (tasks[0].task_id, "math-expert")] == [flipped]
    assert recs[tasks[2].task_id].quality == 1.0
    assert [r[2] for r in rows if r[:2] == (tasks[2].task_id, "math-expert")] == [1.0]


@pytest.mark.parametrize("field", ["worker_id", "batch"])
def test_a_record_of_another_partition_in_a_file_is_damage(tiny, field):
    """A line claiming another worker (or batch) than its file's: a pasted or misplaced record.
    It used to crash both builds on the primary key (worker_id) or count in one build and not in
    the other (batch)."""
    root, cfg, tasks, store = tiny
    rec = dict(_first(store), **{field: "code-expert" if field == "worker_id" else "other"})
    _replace_first(store, "math-expert", json.dumps(rec))
    recs = store.read("b", "math-expert")
    assert recs.skipped_lines == [4]
    rows, _ = _both(root, cfg, store)
    assert len(rows) == 9


def test_an_ok_record_without_quality_is_called_again(tiny):
    """status ok but no quality: no reward comes of it, and the collector took the cell as done, so
    the hole in the matrix never closed. It is damage now: skipped and its cell called again."""
    from fugu_pipeline.collect.partition import cells_to_call

    root, cfg, tasks, store = tiny
    _replace_first(store, "math-expert", json.dumps(dict(_first(store), quality=None)))
    recs = store.read("b", "math-expert")
    assert recs.skipped_lines == [4]
    rows, _ = _both(root, cfg, store)
    assert len(rows) == 9  # the earlier, graded record stands in both builds
    store.path("b", "math-expert").write_text(json.dumps(dict(_first(store), quality=None)) + "\n")
    assert [t.task_id for t in cells_to_call(tasks, store.read("b", "math-expert"), None)] == [t.task_id for t in tasks]


def test_numbers_within_range_are_kept(tiny):
    root, cfg, tasks, store = tiny
    rec = dict(_first(store), quality=0, cost_usd=0, latency_s=0, attempts=3, ttft_s=None, prompt_tokens=None)
    _replace_first(store, "math-expert", json.dumps(rec))
    assert store.read("b", "math-expert").skipped_lines == []
    rows, _ = _both(root, cfg, store)
    assert [r for r in rows if r[0] == tasks[0].task_id and r[1] == "math-expert"][0][2:5] == (0.0, 0.0, 0.0)


def test_a_record_larger_than_duckdbs_default_object_size_is_read_by_both_builds(tiny):
    """A 40 MB answer (a runaway reply, escaped): the store's reader takes it, and the bulk build
    used to fail on it with DuckDB's 'maximum_object_size ... exceeded' (the asset failed)."""
    root, cfg, tasks, store = tiny
    rec = dict(_first(store), answer="\"" * 17_000_000, quality=0.0 if _first(store)["quality"] else 1.0)
    _replace_first(store, "math-expert", json.dumps(rec))
    assert store.read("b", "math-expert").skipped_lines == []
    rows, _ = _both(root, cfg, store)
    assert [r for r in rows if r[0] == tasks[0].task_id and r[1] == "math-expert"][0][2] == rec["quality"]


def test_a_bad_matrix_memory_limit_is_one_clear_error(tiny, monkeypatch):
    root, cfg, tasks, store = tiny
    monkeypatch.setenv("FUGU_MATRIX_MEMORY_LIMIT", "lots")
    db = root / "data" / "reward_matrix.duckdb"
    with pytest.raises(RewardMatrixError, match="FUGU_MATRIX_MEMORY_LIMIT"):
        build_collection(root / "data" / "benchgen", root / "data" / "responses", cfg, db)
    assert not db.exists() and not list(db.parent.glob("*.tmp-*"))


def test_the_next_build_removes_what_a_killed_build_left(tiny):
    # A build killed mid-way (SIGKILL: no cleanup ran) used to leave its half-built database beside
    # the matrix for ever; the next build removes it, and leaves a running build's file alone.
    root, cfg, tasks, store = tiny
    db = root / "data" / "reward_matrix.duckdb"
    code = (
        "import os, signal, sys\nfrom pathlib import Path\nfrom fugu_pipeline.matrix.build import building\n"
        "with building(Path(sys.argv[1])) as con:\n"
        "    con.execute('CREATE TABLE filler AS SELECT range AS x FROM range(100000)')\n"
        "    con.execute('CHECKPOINT')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = list(db.parent.glob("reward_matrix.duckdb.tmp-*"))
    assert left, "the killed build left nothing: this test no longer tests the clean-up"
    running = db.with_name(f"{db.name}.tmp-{socket.gethostname()}-{os.getppid()}")  # a live process
    other_host = db.with_name(f"{db.name}.tmp-some-other-host-1")
    for p in (running, other_host):
        p.write_bytes(b"in progress")
    build_collection(root / "data" / "benchgen", root / "data" / "responses", cfg, db)
    assert not any(p.exists() for p in left)
    assert running.exists() and other_host.exists()
    assert sorted(p.name for p in db.parent.glob("reward_matrix.duckdb*")) == sorted(
        ["reward_matrix.duckdb", running.name, other_host.name])


# --------------------------------------------------------------------------- the DuckDB file


def _built(tiny) -> Path:
    root, cfg, tasks, store = tiny
    db = root / "data" / "reward_matrix.duckdb"
    build_collection(root / "data" / "benchgen", root / "data" / "responses", cfg, db)
    return db


@pytest.mark.parametrize("damage", ["truncated", "not duckdb", "empty"])
def test_a_damaged_matrix_file_is_one_clear_error(tiny, damage):
    db = _built(tiny)
    data = db.read_bytes()
    db.write_bytes({"truncated": data[:5000], "not duckdb": b"hello" * 1000, "empty": b""}[damage])
    with pytest.raises(RewardMatrixError) as err:
        read_arrays(db)
    msg = str(err.value)
    assert str(db) in msg and "rebuild" in msg and "\n" not in msg


@pytest.mark.parametrize("older", ["no workers table", "no tags column"])
def test_a_matrix_of_an_older_schema_is_one_clear_error(tiny, older):
    db = _built(tiny)
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE workers" if older == "no workers table" else "ALTER TABLE tasks DROP COLUMN tags")
    con.close()
    with pytest.raises(RewardMatrixError) as err:
        read_arrays(db)
    msg = str(err.value)
    assert str(db) in msg and ("workers" in msg if older == "no workers table" else "tags" in msg) and "rebuild" in msg


def test_the_cli_says_a_damaged_matrix_in_one_line(tiny, capsys, monkeypatch):
    from fugu_pipeline.cli.main import main

    db = _built(tiny)
    db.write_bytes(db.read_bytes()[:5000])
    monkeypatch.chdir(tiny[0])
    assert main(["train", "--data", str(db), "--encoder", "tiny"]) == 2
    err = capsys.readouterr().err.strip()  # progress notes first ("heads: ...", "features: ..."), then the error
    errors = [line for line in err.splitlines() if line.startswith("fugu-lite train:")]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1] and str(db) in errors[0] and "Traceback" not in err


# --------------------------------------------------------------------------- worker ids


@pytest.mark.parametrize(("a", "b"), [("math-expert", "Math-Expert"), ("math-expert", "DOMAIN"), ("math-expert", "task_id")])
def test_worker_ids_the_matrix_cannot_hold_are_refused_before_any_call(tmp_path, a, b, capsys):
    """Ids equal but for case are two partition files on Linux but one column of `reward_wide`
    (and one file on a case-insensitive disk); an id equal to a fixed column clashes with it. The
    matrix build refused them, but only after every partition had been collected and paid for."""
    from fugu_pipeline.cli.main import main
    from fugu_pipeline.workers.config import WorkerConfigError

    yaml = tmp_path / "w.yaml"
    yaml.write_text("workers:\n" + "".join(f"  - {{id: {w}, kind: mock}}\n" for w in (a, b)))
    with pytest.raises(WorkerConfigError) as err:
        load_workers_config(yaml)
    assert str(yaml) in str(err.value) and b in str(err.value)
    write_jsonl(tmp_path / "t.jsonl", [task_row(0)])
    rc = main(["generate", "--workers", str(yaml), "--tasks", str(tmp_path / "t.jsonl"), "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and b in err
    assert not (tmp_path / "o.jsonl.responses").exists()  # nothing collected


# --------------------------------------------------------------------------- degenerate matrices


def test_a_worker_with_no_graded_cell_is_named_when_no_row_is_complete(tiny):
    """Every call of one worker failed: no task has a reward for every worker. The refusal used to
    say only "no complete rows"; it names the worker to re-collect or remove."""
    from fugu_pipeline.features.routing_data import load_routing_data

    root, cfg, tasks, store = tiny
    _write(store.path("b", "general-expert"), [
        CallRecord(task_id=t.task_id, worker_id="general-expert", batch="b", prompt_hash=t.prompt_hash,
                   status="failed", error="boom").model_dump_json() for t in tasks])
    db = _built(tiny)
    with pytest.raises(RewardMatrixError) as err:
        load_routing_data(db, None, root / "cache")
    msg = str(err.value)
    assert "general-expert" in msg and "0 of 3" in msg and "3 failed" in msg and "math-expert" not in msg


def test_the_reward_matrix_asset_fails_with_the_matrix_error_alone(tiny, monkeypatch):
    """A RewardMatrixError in the build is the step's failure description (a dagster Failure), not
    an unexpected exception with the core's stack."""
    import dagster as dg

    from fugu_pipeline.defs.assemble import build_defs

    root = tiny[0]
    monkeypatch.setenv("FUGU_MATRIX_MEMORY_LIMIT", "lots")
    defs = build_defs(str(root), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")], raise_on_error=False)
    failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    assert error.cls_name == "Failure" and "FUGU_MATRIX_MEMORY_LIMIT" in error.message
