"""Runs whose process died: told apart from running ones, marked failed, their pool slots freed.

Dagster's default run launcher starts each run in a process on this machine but cannot say
whether that process still lives, so run monitoring (on in dagster.yaml) could only time runs
out. `LocalRunLauncher` is that launcher plus a health check: the run's process id is in its
first process event, and a process that is gone (killed, out of memory, machine restarted) makes
the daemon mark the run failed; `free_slots_after_run_end_seconds` then frees the pool slots it
held (a killed `reward_matrix` run would otherwise hold `duckdb_writer` forever).
`fail_dead_runs` does the same for the main job (`fugu-lite pipeline`), which runs without the
daemon.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus  # the health-check API

_LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}


def run_process(instance: dg.DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """(pid, timestamp) of the run's first process event: the process that runs it."""
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        data = record.dagster_event.engine_event_data if record.dagster_event else None
        pid = data.metadata.get("pid") if data else None
        if pid is not None:
            return int(pid.value), record.timestamp
    return None


def process_alive(pid: int, started_by: float | None = None) -> bool:
    """Is `pid` a live process (not a zombie) that started no later than `started_by`?"""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():  # Linux: state and start time, so a reused pid does not count
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        if fields[0] in ("Z", "X"):
            return False
        if started_by is not None:
            boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
            started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
            return started <= started_by + 2.0
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_health(instance: dg.DagsterInstance, run: dg.DagsterRun) -> CheckRunHealthResult:
    """RUNNING unless the run's process on this machine is gone (then FAILED)."""
    if run.tags.get("dagster/grpc_info"):
        import json

        host = json.loads(run.tags["dagster/grpc_info"]).get("host")
        if host not in _LOCAL_HOSTS:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"runs on {host}: not checked", transient=True)
    proc = run_process(instance, run.run_id)
    if proc is None:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "no process event yet (the start timeout covers it)")
    pid, at = proc
    if process_alive(pid, started_by=at):
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"pid {pid} alive")
    return CheckRunHealthResult(
        WorkerStatus.FAILED, f"the run's process (pid {pid}) is gone: it was killed or its machine restarted")


class LocalRunLauncher(dg.DefaultRunLauncher):
    """Dagster's default run launcher, plus a health check of each run's process."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        result = run_health(self._instance, run)
        # UNKNOWN (a remote code server) must not fail a run: the daemon fails anything not RUNNING
        return CheckRunHealthResult(WorkerStatus.RUNNING, result.msg) if result.status == WorkerStatus.UNKNOWN else result


def fail_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark started runs whose process is gone as failed and free the pool slots they hold.
    Returns their run ids."""
    dead = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        health = run_health(instance, run)
        if health.status == WorkerStatus.FAILED:
            instance.report_run_failed(run, f"{health.msg}; marked failed")
            dead.append(run.run_id)
    for run_id in instance.event_log_storage.get_concurrency_run_ids():
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return dead
