"""A task id names one task across all batch files: a batch that reuses an id another batch holds is
refused alone (both files and lines named), the other batches stay in the matrix, and which batch
keeps the id never depends on file names (collected batches first, then the older file)."""

import os
import shutil
import subprocess
import time

import dagster as dg
import duckdb
import pytest
import yaml

from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.matrix.bulk import build_collection
from fugu_pipeline.matrix.bulk_tasks import TASKS_TABLE, read_batches, refused_batches
from fugu_pipeline.matrix.read import read_arrays
from fugu_pipeline.tasks.loading import TaskFileError, load_all_batches
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl
from fugu_pipeline_tests.daemon_path import tick

GOOD = [task_row(i, task_id=f"math-{i:04d}") for i in range(30)]
DUPE = [task_row(0, task_id="math-0000", prompt="What is 7 * 6?", reference_answer="42"),
        task_row(1, task_id="extra-0001", prompt="What is 9 - 2?", reference_answer="7")]


def age(path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


@pytest.fixture
def two_batches(project):
    """good.jsonl (30 tasks, written first) and dupe_ids.jsonl (2 rows, one reusing math-0000 with
    another prompt), added later; 'dupe_ids' sorts before 'good'."""
    (project / "data" / "benchgen" / "sample.jsonl").unlink()
    good = write_jsonl(project / "data" / "benchgen" / "good.jsonl", GOOD)
    dupe = write_jsonl(project / "data" / "benchgen" / "dupe_ids.jsonl", DUPE)
    age(good, 600)
    age(dupe, 60)
    return project, good, dupe


def launch_all(defs, instance, requests) -> dict[str, object]:
    """Each run request to its end, as the daemon launches them; the result by partition key."""
    out = {}
    for req in requests:
        job = defs.resolve_job_def(req.job_name)
        out[str(req.partition_key)] = job.execute_in_process(instance=instance, partition_key=req.partition_key,
                                                             tags=dict(req.tags), raise_on_error=False)
    return out


def failure(result) -> str:
    return result.get_step_failure_events()[0].step_failure_data.error.message


@pytest.mark.slow
def test_a_batch_reusing_a_task_id_is_refused_alone_through_the_sensor(two_batches):
    project, good, dupe = two_batches
    # two of the three mock workers: every responses run of the conflicting batch fails, every other
    # one succeeds, at two thirds of the runs
    cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
    cfg["workers"] = cfg["workers"][:2]
    (project / "configs" / "workers.two.yaml").write_text(yaml.safe_dump(cfg))
    defs = build_defs(str(project), "configs/workers.two.yaml")
    workers = load_workers_config(project / "configs" / "workers.two.yaml").worker_ids
    assert len(workers) == 2
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, "benchgen_batch_sensor")
        runs = launch_all(defs, instance, result.run_requests)
        # the conflicting batch: its tasks run and every responses run fail, naming both files and lines,
        # and no worker is called for it
        for key, res in runs.items():
            if key.startswith("dupe_ids"):
                assert not res.success, key
                msg = failure(res)
                assert f"{dupe.name}:1: task_id 'math-0000' is also in batch 'good' (good.jsonl:1) with another prompt" in msg, msg
            else:
                assert res.success, (key, failure(res))
        assert not (project / "data" / "responses" / "dupe_ids").exists()
        called = sum(int(r.get_asset_materialization_events()[-1].materialization.metadata["called"].value)
                     for k, r in runs.items() if "|" in k and k.startswith("good"))
        assert called == 30 * len(workers)

        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")])
        meta = res.get_asset_materialization_events()[-1].materialization.metadata
        assert meta["tasks"].value == 30 and meta["cells_filled"].value == 30 * len(workers)
        refused = meta["refused_batch_files"].value
        assert list(refused) == ["dupe_ids.jsonl"] and "also in batch 'good' (good.jsonl:1)" in refused["dupe_ids.jsonl"]

        # a second tick after the id is fixed: the batch is collected and joins the matrix
        write_jsonl(dupe, [{**DUPE[0], "task_id": "extra-0000"}, DUPE[1]])
        again = tick(defs, instance, "benchgen_batch_sensor", result.cursor)
        assert all(r.success for r in launch_all(defs, instance, again.run_requests).values())
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")])
        meta = res.get_asset_materialization_events()[-1].materialization.metadata
        assert meta["tasks"].value == 32 and meta["refused_batch_files"].value == {}


@pytest.mark.parametrize("names", [("a", "z"), ("z", "a")])
def test_the_older_batch_keeps_the_id_whatever_the_names(project, names):
    (project / "data" / "benchgen" / "sample.jsonl").unlink()
    first, second = (project / "data" / "benchgen" / f"{n}.jsonl" for n in names)
    write_jsonl(first, GOOD)
    write_jsonl(second, DUPE)
    age(first, 600)
    for reader in ("python", "bulk"):
        refused: list[TaskFileError] = []
        if reader == "python":
            kept = {b for b, _ in load_all_batches(project / "data" / "benchgen", refused)}
        else:
            with duckdb.connect() as con:
                con.execute(TASKS_TABLE)
                read_batches(con, project / "data" / "benchgen", (), refused)
                kept = {b for (b,) in con.execute("SELECT DISTINCT batch FROM tasks").fetchall()}
        assert kept == {names[0]} and [e.path for e in refused] == [second], reader
        assert f"{second}:1: task_id 'math-0000' is also in batch {names[0]!r} ({names[0]}.jsonl:1)" in str(refused[0])


def test_a_collected_batch_keeps_its_ids_even_when_its_file_is_newer(two_batches):
    """Editing a batch that was already collected (its file becomes the newer one) never hands its
    ids to a batch that came later: the collected one is settled."""
    project, good, dupe = two_batches
    age(good, 0)  # good.jsonl edited just now, after dupe_ids.jsonl arrived
    assert [e.path for e in refused_batches(project / "data" / "benchgen")] == [good]  # neither collected: older wins
    cfg = load_workers_config(project / "configs" / "workers.mock.yaml")
    from fugu_pipeline.collect.partition import collect_partition_sync
    from fugu_pipeline.tasks.loading import load_tasks

    store = ResponseStore(project / "data" / "responses")
    collect_partition_sync(load_tasks(good), "good", cfg.worker_ids[0], cfg, store)
    assert store.collected_batches() == {"good"}
    assert [e.path for e in refused_batches(project / "data" / "benchgen", store.collected_batches())] == [dupe]
    refused: list = []
    summary = build_collection(project / "data" / "benchgen", project / "data" / "responses", cfg,
                               project / "data" / "m.duckdb", refused=refused)
    assert summary["tasks"] == 30 and [e.path for e in refused] == [dupe]


def test_a_copied_batch_is_refused_as_a_copy_and_named_line_by_line(project):
    src = project / "data" / "benchgen" / "sample.jsonl"
    copy = project / "data" / "benchgen" / "sample-copy.jsonl"
    age(src, 600)
    shutil.copyfile(src, copy)  # the same content under another name: every task twice
    refused: list[TaskFileError] = []
    kept = load_all_batches(project / "data" / "benchgen", refused)
    assert {b for b, _ in kept} == {"sample"} and [e.path for e in refused] == [copy]
    msg = str(refused[0])
    assert f"{copy}:1: task_id " in msg and "is also in batch 'sample' (sample.jsonl:1), the same task" in msg
    assert "remove this line (or this file, if it copies sample.jsonl)" in msg
    assert f"and {len(kept) - 20} more" in msg  # every line is a clash; the first 20 are shown
    bulk: list[TaskFileError] = []
    with duckdb.connect() as con:
        con.execute(TASKS_TABLE)
        read_batches(con, project / "data" / "benchgen", (), bulk)
    assert [str(e) for e in bulk] == [msg]


def test_a_task_that_differs_only_in_its_answer_says_so(project):
    src = project / "data" / "benchgen" / "sample.jsonl"
    age(src, 600)
    first = src.read_text().splitlines()[0]
    import json

    row = json.loads(first)
    row["split"] = "test" if row.get("split") != "test" else "train"
    write_jsonl(project / "data" / "benchgen" / "other.jsonl", [row])
    refused: list[TaskFileError] = []
    load_all_batches(project / "data" / "benchgen", refused)
    assert "(sample.jsonl:1) with split; task ids must be unique across batches" in str(refused[0])


@pytest.mark.slow
def test_fugu_lite_pipeline_refuses_the_conflicting_batch_before_any_call(two_batches):
    project, good, dupe = two_batches
    shutil.copy(REPO / "dagster.yaml", project / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "FUGU_ENCODER", "FUGU_PROJECT_DIR")}
    out = subprocess.run([str(REPO / ".venv" / "bin" / "fugu-lite"), "pipeline", "--stop-after", "reward_matrix"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "dupe_ids.jsonl:1: task_id 'math-0000' is also in batch 'good' (good.jsonl:1) with another prompt" in text, text
    assert not (project / "data" / "responses" / "dupe_ids").exists()  # nothing was called for it
    db = project / "data" / "reward_matrix.duckdb"
    if db.exists():  # where the run goes on past a refused batch, the matrix holds every other batch
        assert sorted(read_arrays(db, complete_only=False).task_ids) == sorted(t["task_id"] for t in GOOD)
