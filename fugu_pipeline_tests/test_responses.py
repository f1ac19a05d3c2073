"""Response collection: once per cell, durable at once, resumable, crash-safe."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fugu_pipeline.collect.partition import collect_partition_sync
from fugu_pipeline.collect.store import PartitionBusyError, ResponseStore
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline_tests.conftest import REPO

SAMPLE = REPO / "data" / "benchgen" / "sample.jsonl"


def config(**mock) -> WorkersConfig:
    return WorkersConfig.model_validate({
        "judge": {"id": "judge", "kind": "mock"},
        "workers": [{"id": "w", "kind": "mock", "max_concurrency": 4, "mock": {"strengths": {"math": 0.9}, **mock}}],
    })


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_rerun_calls_only_missing_and_failed_cells(tmp_path):
    tasks = load_tasks(SAMPLE)[:60]
    store = ResponseStore(tmp_path)
    first = collect_partition_sync(tasks, "b", "w", config(fail_rate=0.3), store)
    assert first.n_called == 60 and first.n_failed > 0 and first.n_ok + first.n_failed == 60
    second = collect_partition_sync(tasks, "b", "w", config(), store)
    assert second.n_called == first.n_failed and second.n_already_done == first.n_ok
    recs = store.read("b", "w")
    assert len(recs) == 60 and all(r.status == "ok" for r in recs.values())
    ok_lines = [r for r in lines(store.path("b", "w")) if r["status"] == "ok"]
    assert len(ok_lines) == 60  # no cell answered twice
    third = collect_partition_sync(tasks, "b", "w", config(), store)
    assert third.n_called == 0


def test_limit_and_changed_prompt(tmp_path):
    tasks = load_tasks(SAMPLE)[:10]
    store = ResponseStore(tmp_path)
    assert collect_partition_sync(tasks, "b", "w", config(), store, limit=3).n_called == 3
    assert collect_partition_sync(tasks, "b", "w", config(), store).n_called == 7
    changed = [tasks[0].model_copy(update={"prompt": tasks[0].prompt + " (edited)"})] + tasks[1:]
    assert collect_partition_sync(changed, "b", "w", config(), store).n_called == 1


def test_model_fingerprint_recollects_old_cells(tmp_path):
    tasks = load_tasks(SAMPLE)[:5]
    store = ResponseStore(tmp_path)
    collect_partition_sync(tasks, "b", "w", config(), store, model_fingerprint="fp1")
    assert collect_partition_sync(tasks, "b", "w", config(), store, model_fingerprint="fp1").n_called == 0
    assert collect_partition_sync(tasks, "b", "w", config(), store, model_fingerprint="fp2").n_called == 5


def test_budget_guard_stops_before_passing_the_budget(tmp_path):
    tasks = load_tasks(SAMPLE)[:50]
    store = ResponseStore(tmp_path)
    stats = collect_partition_sync(tasks, "b", "w", config(cost_usd=0.01), store, max_usd=0.1)
    assert stats.stopped and "budget guard" in stats.stopped
    assert stats.cost_usd <= 0.1 + 1e-9
    assert 0 < stats.n_ok < 50


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    tasks = load_tasks(SAMPLE)[:4]
    store = ResponseStore(tmp_path)
    collect_partition_sync(tasks[:3], "b", "w", config(), store)
    path = store.path("b", "w")
    with path.open("ab") as fh:
        fh.write(b'{"task_id": "math-0001", "status": "o')  # a torn write
    assert len(store.read("b", "w")) == 3
    stats = collect_partition_sync(tasks, "b", "w", config(), store)
    assert stats.n_called == 1
    ids = [json.loads(x)["task_id"] for x in path.read_text().splitlines()]  # every line parses
    assert sorted(ids) == sorted(t.task_id for t in tasks)
    assert len(store.read("b", "w")) == 4


def test_second_concurrent_run_of_a_partition_is_refused(tmp_path):
    store = ResponseStore(tmp_path)
    with store.open_writer("b", "w"):
        with pytest.raises(PartitionBusyError, match="another run"):
            store.open_writer("b", "w")


CHILD = textwrap.dedent("""
    import sys
    from fugu_pipeline.collect.partition import collect_partition_sync
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.tasks.loading import load_tasks
    from fugu_pipeline.workers.config import WorkersConfig
    cfg = WorkersConfig.model_validate({"judge": {"id": "j", "kind": "mock"}, "workers": [
        {"id": "w", "kind": "mock", "max_concurrency": 4, "mock": {"sleep_s": float(sys.argv[3])}}]})
    s = collect_partition_sync(load_tasks(sys.argv[1]), "b", "w", cfg, ResponseStore(sys.argv[2]))
    print(s.n_called, s.n_already_done)
""")


def test_sigkill_mid_run_loses_nothing_finished_and_duplicates_nothing(tmp_path):
    store = ResponseStore(tmp_path / "responses")
    path = store.path("b", "w")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(SAMPLE), str(store.root), "0.02"], cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= 40:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = [json.loads(x) for x in path.read_bytes().split(b"\n") if x.strip()]
    assert 40 <= len(finished) < 300, "the kill must land mid-run"
    out = subprocess.run([sys.executable, "-c", CHILD, str(SAMPLE), str(store.root), "0"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    called, already = map(int, out.stdout.split())
    assert already >= len(finished) and called == 300 - already
    after = lines(path)
    ids = [r["task_id"] for r in after]
    assert len(ids) == len(set(ids)) == 300  # no duplicate, nothing missing
    assert after[: len(finished)] == finished  # finished cells kept byte for byte
