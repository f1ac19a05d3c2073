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
    recs = store.read("b", "w")
    assert len(recs) == 3 and recs.skipped_lines == [4] and recs.torn_last_line
    assert "skipped 1 unreadable line(s) (line 4)" in recs.skipped_note() and "torn last line" in recs.skipped_note()
    stats = collect_partition_sync(tasks, "b", "w", config(), store)
    assert stats.n_called == 1 and "cut a torn last line" in stats.skipped_note
    ids = [json.loads(x)["task_id"] for x in path.read_text().splitlines()]  # every line parses
    assert sorted(ids) == sorted(t.task_id for t in tasks)
    assert len(store.read("b", "w")) == 4


def damage_line(path: Path, lineno: int) -> None:
    rows = path.read_bytes().split(b"\n")
    rows[lineno - 1] = b'{"task_id": "x", "garbage'  # e.g. a disk error or a bad hand edit
    path.write_bytes(b"\n".join(rows))


def test_a_damaged_line_is_counted_and_reported_where_it_is(tmp_path):
    tasks = load_tasks(SAMPLE)[:6]
    store = ResponseStore(tmp_path)
    collect_partition_sync(tasks, "b", "w", config(), store)
    damage_line(store.path("b", "w"), 2)
    recs = store.read("b", "w")
    assert len(recs) == 5 and recs.skipped_lines == [2] and not recs.torn_last_line
    assert f"{store.path('b', 'w')}: skipped 1 unreadable line(s) (line 2): 1 damaged" in recs.skipped_note()
    stats = collect_partition_sync(tasks, "b", "w", config(), store)
    assert stats.n_called == 1 and stats.skipped_lines == [2] and "line 2" in stats.skipped_note


def test_generate_and_the_responses_asset_report_skipped_lines(project, tmp_path, capsys, monkeypatch):
    import dagster as dg

    from fugu_pipeline.cli import main
    from fugu_pipeline.defs.assemble import build_defs

    monkeypatch.chdir(project)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:9]))
    args = ["generate", "--workers", "configs/workers.mock.yaml", "--tasks", str(tasks), "--output", "r.jsonl"]
    assert main(args) == 0
    damage_line(project / "r.jsonl.responses" / "cli" / "code-expert.jsonl", 3)
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "code-expert: " in out and "code-expert.jsonl: skipped 1 unreadable line(s) (line 3)" in out

    defs = build_defs(str(project), "configs/workers.mock.yaml")
    job = defs.resolve_implicit_global_asset_job_def()
    key = dg.MultiPartitionKey({"batch": "sample", "worker": "math-expert"})
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("task_batches", ["sample"])
        instance.add_dynamic_partitions("workers", ["math-expert", "code-expert", "general-expert"])
        job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("responses")], partition_key=key)
        damage_line(project / "data" / "responses" / "sample" / "math-expert.jsonl", 5)
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("responses")], partition_key=key)
        meta = res.get_asset_materialization_events()[0].materialization.metadata
        assert meta["skipped_lines"].value == 1 and "(line 5)" in meta["skipped_where"].value
        assert meta["called"].value == 1


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
