"""End to end under the real daemon: `dagster dev` on a temporary DAGSTER_HOME, started the way
the README says, with a project holding one batch. Dropping a second batch file must, with no
other action, add its partition, collect its responses and rebuild `reward_matrix` with the new
tasks (the batch sensor, the runs it requests, and the matrix's automation sensor). Prints how
many seconds that took."""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fugu_pipeline.matrix.read import RewardMatrixError, read_arrays
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl

DAGSTER = REPO / ".venv" / "bin" / "dagster"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matrix_tasks(db: Path) -> set[str]:
    try:
        return set(read_arrays(db, complete_only=False).task_ids)
    except (RewardMatrixError, OSError):
        return set()


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        assert proc.poll() is None, f"dagster dev exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
        time.sleep(1.0)
    pytest.fail(f"{what}: not within {timeout_s:.0f}s\n{log.read_text()[-6000:]}")


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
    env.update(DAGSTER_HOME=str(home), FUGU_ENCODER="tiny",
               FUGU_BATCH_SENSOR_INTERVAL_S="5", FUGU_AUTOMATION_INTERVAL_S="5")  # the README's default is 30 s each
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(free_port())],
                                cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        first = {f"t{i}" for i in range(12)}
        t = wait_for(lambda: first <= matrix_tasks(db), 480, "the first batch in reward_matrix", proc, log)
        print(f"\nfirst batch (daemon start included) -> matrix: {t:.1f}s")

        write_jsonl(project / "data" / "benchgen" / "b2.jsonl", [task_row(100 + i, split="test") for i in range(6)])
        second = first | {f"t{100 + i}" for i in range(6)}
        t = wait_for(lambda: matrix_tasks(db) == second, 300, "the dropped batch in reward_matrix", proc, log)
        print(f"batch file dropped -> reward_matrix holds its tasks: {t:.1f}s")
        arrays = read_arrays(db)
        assert len(arrays.task_ids) == len(second) and arrays.worker_ids == ["math-expert", "code-expert", "general-expert"]
        assert "Sensor evaluation function returned a RunRequest" not in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
