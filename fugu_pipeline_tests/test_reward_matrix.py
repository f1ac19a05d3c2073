"""The DuckDB reward matrix: from collection, from an import, atomic rebuilds, health."""

import json

import duckdb
import numpy as np
import pytest

from fugu_pipeline.collect.partition import collect_partition_sync
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.matrix.build import build, from_collection, from_import
from fugu_pipeline.matrix.import_format import read_reward_jsonl
from fugu_pipeline.matrix.read import little_to_learn, read_arrays, signal_health
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.loading import TaskFileError, load_all_batches, load_tasks
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline_tests.conftest import write_jsonl


def collect_all(project):
    cfg = load_workers_config(project / "configs" / "workers.mock.yaml")
    tasks = load_tasks(project / "data" / "benchgen" / "sample.jsonl")
    store = ResponseStore(project / "data" / "responses")
    for w in cfg.worker_ids:
        collect_partition_sync(tasks, "sample", w, cfg, store)
    return cfg, tasks, store


def test_build_from_collection(project):
    cfg, tasks, store = collect_all(project)
    db = project / "data" / "reward_matrix.duckdb"
    summary = build(from_collection(project / "data" / "benchgen", store, cfg), db)
    assert summary["cells_filled"] == summary["cells_expected"] == len(tasks) * 3
    con = duckdb.connect(str(db), read_only=True)
    wide = con.execute("SELECT * FROM reward_wide").fetchall()
    cols = [d[0] for d in con.description]
    assert cols == ["task_id", "split", "domain", "math-expert", "code-expert", "general-expert"]
    assert len(wide) == len(tasks)
    # utility recomputed from the stored cells with the configured weights
    q, c, lat, u = con.execute("SELECT quality, cost_usd, latency_s, utility FROM rewards LIMIT 1").fetchone()
    assert u == pytest.approx(cfg.reward.utility(q, c, lat))
    con.close()
    a = read_arrays(db)
    assert a.utility.shape == (len(tasks), 3) and a.n_incomplete == 0
    # each expert is best on its own domain: the mock pool has signal
    dom = np.array(a.domains)
    for i, d in enumerate(["math", "code", "general"]):
        assert a.quality[dom == d].mean(axis=0).argmax() == i
    health = signal_health(a.utility)
    assert health["oracle_minus_best_fixed"] > 0.1 and little_to_learn(health) is None


def test_rebuild_is_atomic_and_versioned(project):
    cfg, tasks, store = collect_all(project)
    db = project / "data" / "reward_matrix.duckdb"
    v1 = build(from_collection(project / "data" / "benchgen", store, cfg), db)["data_version"]
    reader = duckdb.connect(str(db), read_only=True)  # a reader holding the old file
    cfg.reward.cost_weight = 0.5
    v2 = build(from_collection(project / "data" / "benchgen", store, cfg), db)["data_version"]
    assert v1 != v2
    assert reader.execute("SELECT count(*) FROM rewards").fetchone()[0] == len(tasks) * 3
    reader.close()
    assert not list(db.parent.glob("*.tmp-*"))


def test_missing_cells_are_counted(project):
    cfg, tasks, store = collect_all(project)
    extra = load_tasks(project / "data" / "benchgen" / "sample.jsonl")[:1]
    write_jsonl(project / "data" / "benchgen" / "b2.jsonl", [extra[0].model_copy(update={"task_id": "new-1"}).model_dump()])
    db = project / "data" / "reward_matrix.duckdb"
    build(from_collection(project / "data" / "benchgen", store, cfg), db)
    assert read_arrays(db).n_incomplete == 1
    full = read_arrays(db, complete_only=False)
    assert np.isnan(full.utility).sum() == 3


def test_duplicate_task_id_across_batches(project):
    src = (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:1]
    (project / "data" / "benchgen" / "z.jsonl").write_text(src[0] + "\n")
    with pytest.raises(TaskFileError, match="also in batch 'sample'"):
        load_all_batches(project / "data" / "benchgen")


def test_import_quality_recomputes_utility_and_rewards_pass_through(tmp_path):
    rows = [
        {"task_id": "t1", "prompt": "p1", "split": "train", "worker_ids": ["a", "b"], "quality": [1, 0], "cost_usd": [0.01, 0.0]},
        {"task_id": "t2", "prompt": "p2", "split": "test", "worker_ids": ["a", "b"], "quality": [0, 1], "cost_usd": [0.0, 0.0]},
    ]
    u = UtilityConfig(cost_weight=0.1, cost_scale_usd=0.01)
    db = tmp_path / "m.duckdb"
    build(from_import(write_jsonl(tmp_path / "q.jsonl", rows), u), db)
    a = read_arrays(db)
    assert a.worker_ids == ["a", "b"]
    assert a.utility.tolist() == [[1 - 0.1, 0.0], [0.0, 1.0]]
    rows2 = [{"task_id": "t1", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [0.8, 0.1]}]
    build(from_import(write_jsonl(tmp_path / "r.jsonl", rows2), u), db)
    assert read_arrays(db).utility.tolist() == [[0.8, 0.1]]


@pytest.mark.parametrize("row, expected", [
    ({"task_id": "t2", "prompt": "p", "worker_ids": ["b", "a"], "rewards": [1, 0]}, "differ from the first row"),
    ({"task_id": "t2", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [1]}, "'rewards' has 1 values for 2 worker_ids"),
    ({"task_id": "t2", "prompt": "p", "worker_ids": ["a", "b"]}, "needs 'rewards' or 'quality'"),
    ({"task_id": "t1", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [1, 0]}, "duplicate task_id 't1'"),
    ('{"task_id": "t2", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [NaN, 0]}', "NaN"),
    ({"task_id": "t2", "prompt": "p", "worker_ids": ["a", "b"], "quality": [2, 0]}, "[0, 1]"),
])
def test_import_errors_name_file_and_line(tmp_path, row, expected):
    first = {"task_id": "t1", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [0.5, 0.5]}
    path = write_jsonl(tmp_path / "bad.jsonl", [first, row if isinstance(row, str) else json.dumps(row)])
    with pytest.raises(TaskFileError) as err:
        read_reward_jsonl(path)
    assert f"{path}:2:" in str(err.value) and expected in str(err.value)


def test_signal_health_flags_ties():
    ties = np.ones((20, 3))
    h = signal_health(ties)
    assert h["all_tie_share"] == 1.0 and h["unique_winner_share"] == 0.0
    assert "tie" in little_to_learn(h)


def test_a_trainers_read_opens_the_matrix_once_and_gives_what_the_three_reads_give(project, monkeypatch):
    """The rows, the utility weights and their source come through one connection: every open of
    the file costs tens of milliseconds of CPU, and each training and report step of the main job
    reads all three (three opens each, before)."""
    from fugu_pipeline.matrix import read

    cfg, tasks, store = collect_all(project)
    db = project / "data" / "reward_matrix.duckdb"
    build(from_collection(project / "data" / "benchgen", store, cfg), db)
    opened = []
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: opened.append(a) or connect(*a, **k))
    arrays, utility, source = read.read_training_inputs(db)
    assert len(opened) == 1
    alone = read.read_arrays(db)
    assert arrays.task_ids == alone.task_ids and np.array_equal(arrays.utility, alone.utility)
    assert arrays.data_version == alone.data_version and arrays.tags == alone.tags
    assert utility == read.read_utility_config(db) == cfg.reward and source == read.read_utility_source(db)
