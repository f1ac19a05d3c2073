"""The Postgres instance variant (deploy/postgres/dagster.yaml) against a real PostgreSQL on
loopback: the main job and a backfill of `responses` partitions at once, the database restarted
under the backfill, then the database down. Runs with FUGU_SERVICE_TESTS=1 (.ci/run)."""

from __future__ import annotations

import subprocess
import time

import dagster as dg
import duckdb
import pytest

from fugu_pipeline_tests.scale_project import (
    WORKER_IDS,
    Child,
    make_project,
    project_env,
    run_statuses,
    save_figures,
    start_daemon,
)
from fugu_pipeline_tests.waiting import wait_until
from fugu_pipeline_tests.services import REPO, VENV_BIN, Service, cell_counts, installed, require_service_tests, split_sample

DEPLOY = REPO / "deploy" / "postgres" / "dagster.yaml"


@pytest.fixture(scope="module")
def postgres():
    require_service_tests("PostgreSQL instance storage")
    reason = installed("postgres")
    if reason:
        pytest.skip(reason)
    svc = Service("postgres").start()
    yield svc
    svc.cleanup()


def _responses_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return [r for r in instance.get_runs() if r.job_name == "collect_responses"]


def _failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    for rec in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
        return (rec.dagster_event.message or rec.user_message or "")[:300]
    return ""


def _matrix_cells(project) -> int:
    path = project / "data" / "reward_matrix.duckdb"
    if not path.exists():
        return 0
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM rewards").fetchone()[0]
    finally:
        con.close()


@pytest.mark.slow
def test_main_job_and_backfill_share_postgres_through_a_restart(postgres, tmp_path, monkeypatch):
    for k, v in postgres.pg_env().items():
        monkeypatch.setenv(k, v)
    machine_a = make_project(tmp_path / "machine-a", DEPLOY)  # runs the main job
    deployment = make_project(tmp_path / "deployment", DEPLOY, sleep_s=0.5)  # the daemon's backfill
    split_sample(machine_a, {"main": 60})
    expected = split_sample(deployment, {"b1": 40}, start=60)
    instance = dg.DagsterInstance.from_config(str(deployment))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"

    t0 = time.monotonic()
    # the batch sensor turns the four new files into partitions and requests tasks + responses for
    # each (a backfill over the batches); the queued run coordinator runs at most 4 at once
    daemon = start_daemon(deployment, project_env(deployment))
    main = Child([str(VENV_BIN / "fugu-lite"), "pipeline", "--project-dir", str(machine_a), "--workers",
                  "configs/workers.slow.yaml", "--encoder", "tiny", "--stop-after", "reward_matrix"],
                 machine_a, project_env(machine_a), tmp_path / "main-job.log")
    try:
        rc = main.proc.wait(300)
        main_s = time.monotonic() - t0
        assert rc == 0, main.log.read_text()[-3000:]
        max_running = 0

        def in_flight():
            nonlocal max_running
            runs = _responses_runs(instance)
            running = sum(r.status == dg.DagsterRunStatus.STARTED for r in runs)
            max_running = max(max_running, sum(r.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING) for r in runs))
            return running >= 1

        wait_until(in_flight, "a responses run in flight", every=1)
        before = run_statuses(instance)
        restart_s = postgres.restart(down_s=8)  # down 8 s: longer than dagster-postgres's own reconnect retries
        after_restart = time.monotonic() - t0

        def backfill_done():
            runs = _responses_runs(instance)
            done = {r.tags.get("dagster/partition") for r in runs if r.status == dg.DagsterRunStatus.SUCCESS}
            active = [r for r in instance.get_runs() if not r.is_finished]
            return len(done) == len(expected) * len(WORKER_IDS) and not active and _matrix_cells(deployment) == 40 * 3

        wait_until(backfill_done, "every responses partition done and the matrix complete", every=2)
        total_s = time.monotonic() - t0
    finally:
        main.stop()
        daemon.stop()

    counts = cell_counts(deployment / "data" / "responses", expected, WORKER_IDS)
    main_counts = cell_counts(machine_a / "data" / "responses", {"main": [f"main-{i:05d}" for i in range(60)]}, WORKER_IDS)
    runs = _responses_runs(instance)
    failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
    retries = [r for r in runs if r.tags.get("dagster/retry_number")]
    daemon_log = (deployment / "daemon.log").read_text(errors="replace")
    figures = {
        "partitions": len(expected) * len(WORKER_IDS), "tasks_per_partition": 40, "main_job_cells": main_counts["present"],
        "main_job_s": round(main_s, 1), "total_s": round(total_s, 1), "restart_at_s": round(after_restart, 1),
        "restart_took_s": round(restart_s, 1), "runs_before_restart": before, "runs_after": run_statuses(instance),
        "max_partitions_in_flight": max_running, "failed_runs": len(failed), "retried_runs": len(retries),
        "failure_messages": sorted({_failure(instance, r) for r in failed}),
        "reconnect_warnings_in_daemon_log": daemon_log.count("Retrying failed database connection"),
        "cells": counts, "matrix_cells": _matrix_cells(deployment),
    }
    print("postgres scale-out:", figures)
    save_figures("postgres_backfill", figures)
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    assert main_counts["lost"] == 0 and main_counts["duplicated"] == 0, main_counts
    assert figures["matrix_cells"] == counts["expected"]
    assert max_running <= 4  # the queued run coordinator's limit

    # the database down: the main job stops at once with one line naming the service and its settings
    postgres.stop()
    try:
        out = subprocess.run([str(VENV_BIN / "fugu-lite"), "pipeline", "--project-dir", str(machine_a), "--workers",
                              "configs/workers.slow.yaml", "--encoder", "tiny", "--stop-after", "reward_matrix"],
                             capture_output=True, text=True, timeout=120, env=project_env(machine_a), cwd=machine_a)
    finally:
        postgres.start()
    print("database down:", out.stderr.strip().splitlines()[-1])
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert f"PostgreSQL at 127.0.0.1:{postgres.port}" in last and "DAGSTER_PG_HOST" in last and "unreachable" in last
