"""A user holding a read-write DuckDB connection to the reward matrix (what the `duckdb` command
line opens by default) in a second, real process: the checks and the steps that read the matrix
say so in one line and go on from a snapshot copy."""

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.matrix import read as matrix_read
from fugu_pipeline.matrix.read import read_arrays
from fugu_pipeline_tests.conftest import REPO, write_jsonl

HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])  # read-write, as `duckdb data/reward_matrix.duckdb` opens it
con.execute("SELECT count(*) FROM rewards").fetchone()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def built_project(tmp_path_factory):
    """A project with a 30-task batch and a built matrix (the main job, as a user runs it), built
    once for the file; each test works on its own copy (`small_project`)."""
    project = tmp_path_factory.mktemp("built")
    (project / "configs").mkdir()
    shutil.copy(REPO / "configs" / "workers.mock.yaml", project / "configs" / "workers.mock.yaml")
    shutil.copy(REPO / "dagster.yaml", project / "dagster.yaml")
    rows = (REPO / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:30]
    write_jsonl(project / "data" / "benchgen" / "sample.jsonl", rows)
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # the project's own instance
    out = subprocess.run([str(REPO / ".venv" / "bin" / "fugu-lite"), "pipeline", "--encoder", "tiny", "--stop-after", "reward_matrix",
                          "--project-dir", str(project)], cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return project


@pytest.fixture
def small_project(built_project, tmp_path):
    """This test's copy of the built project (the tests lock, kill and append to it)."""
    return Path(shutil.copytree(built_project, tmp_path / "project"))


@pytest.fixture
def holder(small_project):
    db = small_project / "data" / "reward_matrix.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_checks_and_reading_steps_go_on_while_a_user_holds_the_matrix(small_project, holder, caplog, monkeypatch):
    monkeypatch.setenv("FUGU_DUCKDB_LOCK_WAIT_S", "1")
    defs = build_defs(str(small_project), "configs/workers.mock.yaml", "tiny")
    job = defs.resolve_implicit_global_asset_job_def()
    checks = [dg.AssetCheckKey(dg.AssetKey("reward_matrix"), n) for n in ("cells_complete", "worker_order_fixed", "no_nan", "learning_signal")]
    with dg.instance_for_test() as instance:
        res = job.get_subset(asset_selection=set(), asset_check_selection=set(checks)).execute_in_process(instance=instance)
        evals = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
                 for e in res.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
        assert evals == {"cells_complete": True, "worker_order_fixed": True, "no_nan": True, "learning_signal": True}
        # the matrix was built by the project's own run, not on this test instance: say so, as an
        # outside materialization, so task_embeddings finds its input materialized
        instance.report_runless_asset_event(dg.AssetMaterialization(dg.AssetKey("reward_matrix")))
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("task_embeddings")])
        assert res.get_asset_materialization_events()[0].materialization.metadata["n_prompts"].value == 30
    said = [r.getMessage() for r in caplog.records if r.name.startswith("fugu_pipeline")]
    assert said and all("is locked by a read-write connection" in m and f"PID {holder.pid}" in m for m in said), said
    assert all(len(m.splitlines()) == 1 and "duckdb -readonly" in m for m in said)
    assert holder.poll() is None  # the user's session was left alone


@pytest.mark.slow
def test_a_lock_released_within_the_wait_is_simply_waited_for(small_project, holder, monkeypatch):
    monkeypatch.setenv("FUGU_DUCKDB_LOCK_WAIT_S", "30")
    monkeypatch.setattr(matrix_read, "_open_snapshot", lambda *a: pytest.fail("read a snapshot copy instead of waiting"))
    db = small_project / "data" / "reward_matrix.duckdb"
    threading.Timer(1.0, holder.kill).start()  # the user closes the session a second later
    assert len(read_arrays(db).task_ids) == 30
    assert holder.poll() is not None  # it returned only once the holder was gone: it met the lock and waited


@pytest.mark.slow
def test_the_main_job_says_a_failed_step_in_one_line_and_each_warning_in_one(small_project):
    # It printed Dagster's step-failure event and the exception, two stacks of ~60 lines, for an
    # error the asset had already put in one line.
    workers = small_project / "configs" / "workers.mock.yaml"  # a changed reward weight: the matrix is rebuilt
    workers.write_text(workers.read_text().replace("  cost_weight: 0.1\n", "  cost_weight: 0.2\n"))
    env = {**os.environ, "FUGU_MATRIX_MEMORY_LIMIT": "lots"}
    out = subprocess.run([str(REPO / ".venv" / "bin" / "fugu-lite"), "pipeline", "--encoder", "tiny", "--project-dir",
                          str(small_project)], cwd=small_project, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert "Traceback" not in out.stderr and "Stack Trace" not in out.stderr, out.stderr[-3000:]
    assert err[-1].startswith("error: reward_matrix failed: FUGU_MATRIX_MEMORY_LIMIT='lots' is not a memory size")
    assert err[-1].endswith("run `fugu-lite pipeline` again: it goes on from here")
    # (the responses partitions are fresh, so they are not read again: the appended line is not warned about here)
    assert "responses[sample|code-expert]" in out.stdout and "reward_matrix " not in out.stdout
