"""End to end under the real daemon: `dagster dev` on a temporary DAGSTER_HOME, started the way
the docs say, with the shipped settings (no interval changed), over a project holding one batch.
Dropping a second batch file and a file with a bad line must, with no other action, add their
partitions, collect the good batch, fail the bad one's load (once, in one line in the terminal),
and rebuild `reward_matrix` once with the new tasks and the refused file listed. Prints how many
seconds the drop took to reach the matrix, and how long `dagster dev` took to stop on Ctrl-C."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest

from fugu_pipeline.matrix.read import RewardMatrixError, read_arrays
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl
from fugu_pipeline_tests.scale_project import default_signals
from fugu_pipeline_tests.waiting import wait_until

DAGSTER = REPO / ".venv" / "bin" / "dagster"
BAD_LINE = '{"task_id": "x3", "prompt": \n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matrix_tasks(db: Path) -> set[str]:
    try:
        return set(read_arrays(db, complete_only=False).task_ids)
    except (RewardMatrixError, OSError):
        return set()


def wait_for(predicate, what: str, proc: subprocess.Popen, log: Path) -> float:
    """Seconds until `predicate` holds (printed as a figure, never a verdict); dagster dev exiting ends it."""
    t0 = time.monotonic()

    def alive() -> str | None:
        return None if proc.poll() is None else f"dagster dev exited ({proc.returncode}):\n{log.read_text()[-4000:]}"

    wait_until(predicate, what, every=0.5, alive=alive)
    return time.monotonic() - t0


def group_alive(pgid: int) -> list[str]:
    """The processes of a process group that still run (a zombie is done: in a container nothing
    may reap an orphan, and the signal probe `killpg(pgid, 0)` counts it as alive)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(text.split(" ", 1)[0] + " " + text[text.index("(") + 1:text.rindex(")")])
    return alive


def stop(proc: subprocess.Popen, timeout_s: float = 60) -> float:
    """Ctrl-C: SIGINT to the whole process group, as a terminal sends it; seconds until every
    process of the group is gone (SIGKILL after `timeout_s`, naming what was left)."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    while time.monotonic() - t0 < timeout_s:
        proc.poll()
        if not group_alive(proc.pid):
            proc.wait()
            return time.monotonic() - t0
        time.sleep(0.2)
    print(f"still running {timeout_s:.0f}s after SIGINT: {group_alive(proc.pid)}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return float("inf")


@pytest.mark.slow
def test_dropping_a_batch_file_updates_the_matrix_under_dagster_dev(tmp_path):
    project, home = tmp_path / "project", tmp_path / "home"
    (project / "configs").mkdir(parents=True)
    home.mkdir()
    shutil.copy(REPO / "configs" / "workers.mock.yaml", project / "configs")
    shutil.copy(REPO / "workspace.yaml", project)
    shutil.copy(REPO / "dagster.yaml", home)
    write_jsonl(project / "data" / "benchgen" / "b1.jsonl", [task_row(i) for i in range(12)])
    db = project / "data" / "reward_matrix.duckdb"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FUGU_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), FUGU_ENCODER="tiny", PYTHONUNBUFFERED="1")  # the shipped intervals
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(free_port())],
                                cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=default_signals)
    stopped_in = None
    try:
        first = {f"t{i}" for i in range(12)}
        t = wait_for(lambda: first <= matrix_tasks(db), "the first batch in reward_matrix", proc, log)
        print(f"\nfirst batch (daemon start included) -> matrix: {t:.1f}s")

        mark = len(log.read_text())
        with dg.DagsterInstance.from_config(str(home)) as instance:
            builds_before = len(matrix_runs(instance))
        write_jsonl(project / "data" / "benchgen" / "b2.jsonl", [task_row(100 + i, split="test") for i in range(6)])
        (project / "data" / "benchgen" / "badline.jsonl").write_text(
            "\n".join(json.dumps(task_row(200 + i)) for i in range(2)) + "\n" + BAD_LINE)
        second = first | {f"t{100 + i}" for i in range(6)}
        t = wait_for(lambda: matrix_tasks(db) == second, "the dropped batch in reward_matrix", proc, log)
        print(f"batch file dropped -> reward_matrix holds its tasks: {t:.1f}s (shipped intervals)")
        arrays = read_arrays(db)
        assert len(arrays.task_ids) == len(second) and arrays.worker_ids == ["math-expert", "code-expert", "general-expert"]

        with dg.DagsterInstance.from_config(str(home)) as instance:
            wait_for(lambda: all(r.is_finished for r in matrix_runs(instance)), "the matrix run finishing", proc, log)
            ended = max(instance.get_run_record_by_id(r.run_id).end_time or 0.0 for r in matrix_runs(instance))
            # the sensors that start runs here evaluated twice since that run ended: a second build would be
            # requested by now; the other two (settings_sensor observes, catalog_update_sensor waits for a
            # catalog this project never fetches) requested no run on any tick
            wait_for(lambda: ticked_since(instance, ended, 2, RUN_STARTERS), "two sensor ticks after the matrix run", proc, log)
            assert len(matrix_runs(instance)) == builds_before + 1, "the drop built the matrix more than once"
            quiet = {name: runs for name, runs in requested_runs(instance).items() if name not in RUN_STARTERS}
            assert set(quiet) == {"settings_sensor", "catalog_update_sensor"} and not any(quiet.values()), quiet
            meta = instance.get_latest_materialization_event(dg.AssetKey("reward_matrix")).asset_materialization.metadata
            assert list(meta["refused_batch_files"].value) == ["badline.jsonl"]
            failed = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
            assert [r.tags.get("dagster/partition") for r in failed] == ["badline"]  # its load only, no worker called
        terminal = log.read_text()[mark:]
        said = [line for line in terminal.splitlines() if "malformed JSON" in line and "left out of the matrix" not in line]
        assert len(said) == 1 and "RUN_FAILURE" in said[0] and "fix: correct line 3" in said[0], said  # once, one line
        assert "Stack Trace" not in terminal and "Sensor evaluation function returned a RunRequest" not in terminal
    finally:
        stopped_in = stop(proc)
        print(f"dagster dev stopped on Ctrl-C (SIGINT to its process group) in {stopped_in:.1f}s")


RUN_STARTERS = {"benchgen_batch_sensor", "reward_matrix_automation"}  # what a dropped file wakes (10 s and 5 s)


def running_sensors(instance: dg.DagsterInstance) -> list:
    """The instigator states of the running sensors (the automation condition sensor among them)."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

    running = (InstigatorStatus.RUNNING, InstigatorStatus.DECLARED_IN_CODE, InstigatorStatus.AUTOMATICALLY_RUNNING)
    return [s for kind in (InstigatorType.SENSOR, InstigatorType.AUTO_MATERIALIZE)
            for s in instance.all_instigator_state(instigator_type=kind) if s.status in running]


def ticked_since(instance: dg.DagsterInstance, since: float, n: int, names: set[str]) -> bool:
    """Whether each running sensor named in `names` has ended `n` ticks after `since` (a POSIX
    time): what the daemon decided, read from the instance, not a wait."""
    from dagster._core.scheduler.instigation import TickStatus

    ended = [TickStatus.SKIPPED, TickStatus.SUCCESS, TickStatus.FAILURE]
    states = [s for s in running_sensors(instance) if s.instigator_name in names]
    return len(states) == len(names) and all(
        len(instance.get_ticks(s.instigator_origin_id, s.selector_id, after=since, statuses=ended)) >= n for s in states)


def requested_runs(instance: dg.DagsterInstance) -> dict[str, list[str]]:
    """{running sensor: the runs its ticks so far requested}."""
    return {s.instigator_name: [r for t in instance.get_ticks(s.instigator_origin_id, s.selector_id) for r in t.run_ids]
            for s in running_sensors(instance)}


def matrix_runs(instance: dg.DagsterInstance) -> list:
    return [r for r in instance.get_runs() if r.job_name == "build_reward_matrix"
            or dg.AssetKey("reward_matrix") in (r.asset_selection or set())]
