"""dagster-celery with a real Redis broker on loopback and two Celery workers: the `responses`
partitions of two batches, launched together, run on both workers; no cell lost or duplicated,
the matrix complete; the broker down fails a run in one line naming it. FUGU_SERVICE_TESTS=1."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
import os
import time

import dagster as dg
import pytest

from fugu_pipeline_tests.scale_project import WORKER_IDS, Child, make_project, project_env, save_figures
from fugu_pipeline_tests.waiting import wait_until
from fugu_pipeline_tests.services import REPO, VENV_BIN, Service, cell_counts, installed, require_service_tests, split_sample


@pytest.fixture(scope="module")
def redis():
    require_service_tests("Celery executor with a Redis broker")
    reason = installed("redis")
    if reason:
        pytest.skip(reason)
    pytest.importorskip("dagster_celery", reason="dagster-celery is not installed (pip install -e '.[scale]')")
    svc = Service("redis").start()
    yield svc
    svc.cleanup()


def _run_partition(args: tuple[str, str, str]) -> tuple[str, str, str]:
    """One `collect_responses_celery` run (in a spawned process: the run's coordinator). Spawned, not
    forked: a fork of the multi-threaded pytest process can inherit a lock some other thread held
    and wait on it for ever (seen once the broker-down run followed the batch)."""
    home, batch, worker = args
    from fugu_pipeline.defs.partitions import batch_x_worker
    from fugu_pipeline.definitions import collect_responses_celery

    instance = dg.DagsterInstance.from_config(home)
    key = dg.MultiPartitionKey({"batch": batch, "worker": worker})
    try:
        result = dg.execute_job(dg.reconstructable(collect_responses_celery), instance=instance,
                                tags=batch_x_worker.get_tags_for_partition_key(key), raise_on_error=False)
    except dg.Failure as exc:  # the executor refused to start: what the run's launcher sees
        run = instance.get_runs(limit=1)[0]
        return run.run_id, run.status.value, exc.description or str(exc)
    return result.run_id, "SUCCESS" if result.success else "FAILURE", ""


def _in_spawned_processes(jobs: list[tuple[str, str, str]], timeout_s: float) -> list[tuple[str, str, str]]:
    """`_run_partition` of each job, each in its own spawned process, within `timeout_s`.
    concurrent.futures, not multiprocessing.Pool: Pool's terminate on leaving `with` races its own
    maintenance thread, which can start a replacement worker that terminate then joins for ever
    (a CI run hung here after every run had succeeded)."""
    ex = ProcessPoolExecutor(max_workers=len(jobs), mp_context=multiprocessing.get_context("spawn"))
    try:
        return list(ex.map(_run_partition, jobs, timeout=timeout_s))
    except BaseException:
        for proc in list(getattr(ex, "_processes", {}).values()):  # a hung run must not hang the test too
            proc.kill()
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _celery_worker_of(instance: dg.DagsterInstance, run_id: str) -> str | None:
    for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        data = rec.dagster_event.engine_event_data
        if data and "Celery worker" in data.metadata:
            return data.metadata["Celery worker"].value
    return None


def _host() -> str:
    import socket

    return socket.gethostname()


def _failure(instance: dg.DagsterInstance, run_id: str) -> str:
    texts = [rec.dagster_event.message or "" for rec in instance.all_logs(run_id)
             if rec.dagster_event and rec.dagster_event.event_type_value in ("RUN_FAILURE", "ENGINE_EVENT")]
    return " | ".join(t for t in texts if "broker" in t.lower())


@pytest.mark.slow
def test_celery_workers_share_a_batch(redis, tmp_path, monkeypatch):
    # each step calls 40 tasks at 4 at a time: 1.0 s a call makes a step last ~10 s, longer than the
    # spread of the six runs' starts on a loaded machine, so the second worker always gets work
    # (steps long enough to overlap when the runs submit together)
    project = make_project(tmp_path / "project", REPO / "dagster.yaml", sleep_s=1.0)
    expected = split_sample(project, {"c1": 40, "c2": 40})
    env = project_env(project, {"FUGU_CELERY_BROKER": redis.url})
    for k in ("DAGSTER_HOME", "FUGU_PROJECT_DIR", "FUGU_WORKERS_CONFIG", "FUGU_ENCODER", "FUGU_CELERY_BROKER"):
        monkeypatch.setenv(k, env[k])
    instance = dg.DagsterInstance.from_config(str(project))
    instance.add_dynamic_partitions("task_batches", list(expected))
    instance.add_dynamic_partitions("workers", WORKER_IDS)
    # the `worker_calls` pool's limit, as `fugu-lite pipeline` sets it (a deployment: `dagster instance
    # concurrency set worker_calls 8`); without it dagster.yaml's default of 1 runs one step at a time
    from fugu_pipeline.defs.partitions import ensure_worker_calls_limit

    ensure_worker_calls_limit(instance)

    workers = [Child([str(VENV_BIN / "celery"), "-A", "fugu_pipeline.defs.celery_app", "worker", "-n", f"fugu{i}@%h",
                      "--pool", "solo", "-Q", "dagster", "--prefetch-multiplier=1", "--without-gossip",
                      "--without-mingle", "-l", "INFO"], project, env, tmp_path / f"celery-{i}.log") for i in (1, 2)]
    try:
        wait_until(lambda: all("ready" in w.log.read_text(errors="replace") for w in workers), "both Celery workers ready", every=1)
        t0 = time.monotonic()
        jobs = [(str(project), b, w) for b in expected for w in WORKER_IDS]
        results = _in_spawned_processes(jobs, timeout_s=600)
        seconds = time.monotonic() - t0
        by_worker: dict[str, int] = {}
        for run_id, _, _ in results:
            name = _celery_worker_of(instance, run_id) or "?"
            by_worker[name] = by_worker.get(name, 0) + 1

        # the broker down: the run fails at once, naming the broker and the variable
        redis.stop()
        t1 = time.monotonic()
        [(down_run, down_status, down_message)] = _in_spawned_processes([(str(project), "c1", WORKER_IDS[0])], timeout_s=300)
        down_s = time.monotonic() - t1
        redis.start()
    finally:
        for w in workers:
            w.stop()

    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.matrix.build import build, from_collection
    from fugu_pipeline.matrix.read import read_arrays
    from fugu_pipeline.workers.config import load_workers_config

    config = load_workers_config(project / "configs" / "workers.slow.yaml")
    build(from_collection(project / "data" / "benchgen", ResponseStore(project / "data" / "responses"), config),
          project / "data" / "reward_matrix.duckdb")
    arrays = read_arrays(project / "data" / "reward_matrix.duckdb", complete_only=False)
    counts = cell_counts(project / "data" / "responses", expected, WORKER_IDS)
    down_message = down_message or _failure(instance, down_run)
    figures = {"partitions": len(jobs), "tasks_per_partition": 40, "seconds": round(seconds, 1),
               "statuses": sorted(s for _, s, _ in results), "runs_per_celery_worker": by_worker, "cells": counts,
               "matrix_rows_complete": int((~__import__("numpy").isnan(arrays.utility).any(axis=1)).sum()),
               "broker_down": {"status": down_status, "seconds": round(down_s, 1), "message": down_message[:400]}}
    print("celery scale-out:", figures)
    save_figures("celery_batch", figures)
    assert all(s == "SUCCESS" for _, s, _ in results), results
    assert counts["lost"] == 0 and counts["duplicated"] == 0, counts
    assert figures["matrix_rows_complete"] == 80
    # every step ran on a Celery worker, and both took steps: six steps of ~10 s are in the queue
    # together, and a solo worker holds at most one running and one reserved
    hosts = {f"fugu1@{_host()}", f"fugu2@{_host()}"}
    assert sum(n for w, n in by_worker.items() if w in hosts) == len(jobs), by_worker
    assert set(by_worker) == hosts, by_worker
    assert down_status in ("FAILURE", "NOT_STARTED")  # refused before its first step
    assert f"Celery broker at {redis.url}" in down_message and "FUGU_CELERY_BROKER" in down_message, down_message
    assert os.environ["FUGU_CELERY_BROKER"] == redis.url
