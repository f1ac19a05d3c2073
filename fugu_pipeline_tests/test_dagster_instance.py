"""The instance the project's dagster.yaml describes, loaded the way users load it (from
DAGSTER_HOME, from any directory), run monitoring on a killed run, and the pools of the assets."""

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.launcher import LocalRunLauncher, fail_dead_runs
from fugu_pipeline.defs.partitions import GPU_POOL
from fugu_pipeline_tests.conftest import REPO

SLOW_RUN = """
import pathlib, sys, time
import dagster as dg

@dg.asset(pool="duckdb_writer")
def slow(context):
    pathlib.Path(sys.argv[1]).write_text(context.run_id)
    time.sleep(120)

dg.materialize([slow], instance=dg.DagsterInstance.get())
"""

RECORD_RUN = """
import dagster as dg

@dg.asset
def hello():
    return 1

instance = dg.DagsterInstance.get()
print(dg.materialize([hello], instance=instance).run_id)
print(len(instance.get_run_records()))
"""


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    shutil.copy(REPO / "dagster.yaml", h / "dagster.yaml")
    return h


def env_for(home) -> dict:
    return {**os.environ, "DAGSTER_HOME": str(home)}


def test_every_asset_that_can_load_the_encoder_runs_in_the_gpu_pool(project):
    defs = build_defs(str(project), "configs/workers.mock.yaml", "tiny")
    encoder_assets = {}
    for a in defs.resolve_asset_graph().assets_defs:
        if "encoder" in a.required_resource_keys and a.is_executable and not a.is_external:  # (config_encoder: observed)
            encoder_assets.update({k.to_user_string(): a.op.pool for k in a.keys})
    assert set(encoder_assets) == {"task_embeddings", "router_sft", "router_rl", "router_es", "router_heads", "router_cascade",
                                   "eval_report_sft", "eval_report_rl", "eval_report_es", "eval_report_heads",
                                   "eval_report_cascade", "promoted_router", "triage_head", "eval_report_triage",
                                   "router_roles", "eval_report_roles"}
    assert {k for k, pool in encoder_assets.items() if pool != GPU_POOL} == set()


def test_dagster_yaml_sets_no_path_and_turns_run_monitoring_on():
    import yaml

    text = (REPO / "dagster.yaml").read_text()
    assert "base_dir" not in text and ".dagster" not in text
    conf = yaml.safe_load(text)
    assert conf["run_monitoring"]["enabled"] is True and conf["run_monitoring"]["free_slots_after_run_end_seconds"] > 0
    assert conf["concurrency"]["pools"]["default_limit"] == 1


@pytest.mark.slow
def test_the_instance_lives_under_dagster_home_whatever_the_directory(home, tmp_path):
    elsewhere = [tmp_path / "a", tmp_path / "b" / "deeper"]
    for d in elsewhere:
        d.mkdir(parents=True)
    outs = [subprocess.run([sys.executable, "-c", RECORD_RUN], cwd=d, env=env_for(home), capture_output=True,
                           text=True, timeout=300) for d in elsewhere]
    assert all(o.returncode == 0 for o in outs), outs[-1].stderr[-2000:]
    assert [o.stdout.split()[1] for o in outs] == ["1", "2"]  # the second directory sees the first run
    assert all(list(d.iterdir()) == [] for d in elsewhere)  # nothing written where the command ran
    assert (home / "history" / "runs.db").exists() and (home / "storage").is_dir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_launcher, LocalRunLauncher) and instance.run_monitoring_enabled
        assert {o.stdout.split()[0] for o in outs} == {r.dagster_run.run_id for r in instance.get_run_records()}


def test_a_killed_run_is_marked_failed_and_its_pool_slot_freed(home, tmp_path):
    marker = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, str(marker)], cwd=tmp_path, env=env_for(home),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert marker.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "run did not start in 120 s"
        run_id = marker.read_text()
        with dg.DagsterInstance.from_config(str(home)) as instance:
            record = instance.get_run_records(dg.RunsFilter(run_ids=[run_id]))[0]
            assert record.dagster_run.status == dg.DagsterRunStatus.STARTED
            assert instance.run_launcher.check_run_worker_health(record.dagster_run).status.value == "RUNNING"
            assert instance.event_log_storage.get_concurrency_info("duckdb_writer").active_run_ids == {run_id}

            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            health = instance.run_launcher.check_run_worker_health(record.dagster_run)
            assert health.status.value == "FAILED" and "is gone" in health.msg
            monitor_started_run(instance, None, record, logging.getLogger("test"))  # the daemon's monitoring step
            run = instance.get_run_by_id(run_id)
            assert run.status == dg.DagsterRunStatus.FAILURE
            assert instance.event_log_storage.get_concurrency_info("duckdb_writer").active_run_ids == {run_id}
            fail_dead_runs(instance)  # what `fugu-lite pipeline` does first: the slot of the dead run is freed
            assert instance.event_log_storage.get_concurrency_info("duckdb_writer").active_run_ids == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
def test_the_main_job_fails_a_run_its_killed_predecessor_left_started(home, tmp_path):
    marker = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, str(marker)], cwd=tmp_path, env=env_for(home),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    code = ("from pathlib import Path; import sys; from fugu_pipeline.defs.runner import project_instance; "
            "i = project_instance(Path(sys.argv[1])); "
            "print(i.get_run_by_id(sys.argv[2]).status.value, len(i.event_log_storage.get_concurrency_info('duckdb_writer').claimed_slots))")
    out = subprocess.run([sys.executable, "-c", code, str(home), marker.read_text()], env=env_for(home),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "was left STARTED by a process that is gone" in lines[0]
    assert lines[-1] == "FAILURE 0"
