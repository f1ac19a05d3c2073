import pytest
"""The data path as Dagster assets: sensor-driven batches, resumable partitions, checks."""

import json
import subprocess
import sys

import dagster as dg

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.partitions import task_batches
from fugu_pipeline_tests.conftest import REPO, task_row, write_jsonl
from fugu_pipeline_tests.daemon_path import launch, tick


def test_definitions_load_without_torch():
    code = ("import sys; from fugu_pipeline.definitions import defs; defs.resolve_asset_graph(); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def run_requests(instance, defs, requests):
    return launch(defs, instance, requests)


def build_matrix(instance, defs):
    res = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance, asset_selection=[dg.AssetKey("reward_matrix")])
    checks = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
              for e in res.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    return res.get_asset_materialization_events()[-1].materialization.metadata, checks


@pytest.mark.slow
def test_new_batch_file_is_picked_up_without_recalling_old_cells(project):
    import yaml

    cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
    cfg["workers"] = cfg["workers"][:2]  # two of the mock workers: every figure below holds per worker
    (project / "configs" / "workers.two.yaml").write_text(yaml.safe_dump(cfg))
    defs = build_defs(str(project), "configs/workers.two.yaml")
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, "benchgen_batch_sensor")
        assert instance.get_dynamic_partitions(task_batches.name) == ["sample"]
        assert len(result.run_requests) == 1 + 2  # tasks + one responses run per worker
        metas = run_requests(instance, defs, result.run_requests)
        assert sum(m.get("called", 0) for m in metas.values()) == 300 * 2
        meta, checks = build_matrix(instance, defs)
        assert meta["cells_filled"].value == 300 * 2 and all(checks.values()), checks

        skip = tick(defs, instance, "benchgen_batch_sensor", result.cursor)
        assert not skip.run_requests and "no new or changed batch files" in skip.skip_message
        assert tick(defs, instance, "benchgen_batch_sensor").run_requests == []  # a lost cursor: the instance knows

        new = [task_row(1000 + i, split="test") for i in range(10)]
        write_jsonl(project / "data" / "benchgen" / "batch-2.jsonl", new)
        before = {p: p.read_bytes() for p in (project / "data" / "responses" / "sample").glob("*.jsonl")}
        result = tick(defs, instance, "benchgen_batch_sensor", skip.cursor)
        assert sorted(instance.get_dynamic_partitions(task_batches.name)) == ["batch-2", "sample"]
        keys = {str(r.partition_key) for r in result.run_requests}
        assert all("batch-2" in k for k in keys) and len(keys) == 1 + 2
        metas = run_requests(instance, defs, result.run_requests)
        assert sum(m.get("called", 0) for m in metas.values()) == 10 * 2  # only the new cells
        after = {p: p.read_bytes() for p in (project / "data" / "responses" / "sample").glob("*.jsonl")}
        assert before == after  # no cell of the first batch was called again
        meta, checks = build_matrix(instance, defs)
        assert meta["cells_filled"].value == 310 * 2 and meta["tasks"].value == 310


def test_rematerializing_a_partition_calls_nothing(project):
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("task_batches", ["sample"])
        instance.add_dynamic_partitions("workers", ["math-expert"])
        key = dg.MultiPartitionKey({"batch": "sample", "worker": "math-expert"})
        req = [dg.RunRequest(partition_key=key, asset_selection=[dg.AssetKey("responses")])]
        assert run_requests(instance, defs, req)[str(key)]["called"] == 300
        assert run_requests(instance, defs, req)[str(key)]["called"] == 0


def test_bad_batch_fails_and_writes_nothing(project):
    bad = project / "data" / "benchgen" / "broken.jsonl"
    write_jsonl(bad, [task_row(1), '{"task_id": "t2", "prompt": ', task_row(3)])
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("task_batches", ["broken"])
        instance.add_dynamic_partitions("workers", ["math-expert"])
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("tasks")], partition_key="broken", raise_on_error=False)
        assert not res.success
        failure = res.get_step_failure_events()[0].step_failure_data
        assert "broken.jsonl:2: malformed JSON" in failure.error.message  # one line; the file in full is metadata
        assert failure.user_failure_data.metadata["file"].value == str(bad)
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("responses")],
                                     partition_key=dg.MultiPartitionKey({"batch": "broken", "worker": "math-expert"}), raise_on_error=False)
        assert not res.success
        assert not (project / "data" / "responses" / "broken").exists()


def test_learning_signal_warns_when_all_workers_tie(project, tmp_path):
    rows = [{"task_id": f"t{i}", "prompt": f"p{i}", "worker_ids": ["a", "b"], "rewards": [0.5, 0.5]} for i in range(20)]
    path = write_jsonl(tmp_path / "ties.jsonl", rows)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")],
            run_config={"ops": {"reward_matrix": {"config": {"import_path": str(path)}}}},
        )
        evals = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data
                 for e in res.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
        assert not evals["learning_signal"].passed
        assert evals["learning_signal"].severity == dg.AssetCheckSeverity.WARN
        assert evals["worker_order_fixed"].passed and evals["no_nan"].passed
        assert json.loads(json.dumps(evals["learning_signal"].metadata["all_tie_share"].value)) == 1.0


def test_workspace_and_instance_files_are_valid(tmp_path, monkeypatch):
    import importlib
    import shutil

    import yaml

    # the workspace names a module and attribute that load as the project's Definitions
    target = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"][0]["python_module"]
    assert (REPO / target["working_directory"] / "fugu_pipeline").is_dir()
    defs = getattr(importlib.import_module(target["module_name"]), target.get("attribute", "defs"))
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"tasks", "responses", "reward_matrix", "promoted_router"} <= keys
    # Dagster itself reads dagster.yaml: pools default to one slot, and state persists across restarts
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    instance.add_dynamic_partitions("task_batches", ["kept"])
    instance.dispose()
    again = dg.DagsterInstance.from_config(str(tmp_path))
    assert again.is_persistent and again.get_dynamic_partitions("task_batches") == ["kept"]
    again.dispose()
    assert (tmp_path / "history" / "runs.db").exists()  # under DAGSTER_HOME (dagster.yaml sets no path)


@pytest.mark.slow
def test_reward_matrix_is_requested_when_no_collection_is_in_progress(project):
    """The sensor's collection runs are queued together, so the matrix waits for all of them. Done
    one at a time by hand, with nothing in progress, each finished partition may request a build:
    a partial matrix fails the blocking `cells_complete` check, so nothing trains on it. A missing
    partition that nobody collects (a retired worker's, a bad file's) does not block the matrix
    (`test_dagster_automation.py`)."""
    from fugu_pipeline.defs.automation import BUILD_JOB
    from fugu_pipeline_tests.daemon_path import tick

    defs = build_defs(str(project), "configs/workers.mock.yaml")
    job = defs.resolve_implicit_global_asset_job_def()
    workers_ = ["math-expert", "code-expert", "general-expert"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("task_batches", ["sample"])
        instance.add_dynamic_partitions("workers", workers_)
        assert not tick(defs, instance, "reward_matrix_automation").run_requests
        job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("tasks")], partition_key="sample")
        auto = tick(defs, instance, "reward_matrix_automation")  # a load alone: no responses to build from
        assert not auto.run_requests and "no responses" in auto.skip_message, auto.skip_message
        for w in workers_:
            job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("responses")],
                                   partition_key=dg.MultiPartitionKey({"batch": "sample", "worker": w}))
            auto = tick(defs, instance, "reward_matrix_automation")
            assert [r.job_name for r in auto.run_requests] == [BUILD_JOB]
    sensors = {s.name: s.default_status for s in defs.get_repository_def().sensor_defs}
    assert sensors["reward_matrix_automation"] == dg.DefaultSensorStatus.RUNNING


@pytest.mark.slow
def test_reward_matrix_imports_a_long_table_with_a_file_per_split(project):
    """The asset reads other people's routing data through the same importers as `fugu-lite import`:
    EmbedLLM-like files (one row per call, train.csv and test.csv), options named as the flags,
    relative paths from the project folder; a bad option or cell fails the run, names the option or
    the file's row, and leaves the matrix that was there."""
    from fugu_pipeline.matrix.read import read_arrays
    from fugu_pipeline_tests.test_import_long import embedllm_like

    models = ["meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1"]
    embedllm_like(range(0, 30), models).write_csv(project / "train.csv")
    embedllm_like(range(30, 40), models).write_csv(project / "test.csv")
    options = {"worker_column": "model_name", "score_column": "label", "id_column": "prompt_id",
               "domain_column": "category", "test_file": "test.csv"}
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    job = defs.resolve_implicit_global_asset_job_def()

    def run(**config):
        return job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("reward_matrix")], raise_on_error=False,
                                      run_config={"ops": {"reward_matrix": {"config": config}}})

    with dg.instance_for_test() as instance:
        res = run(import_path="train.csv", import_kind="long", import_options=options)
        assert res.success
        meta = res.get_asset_materialization_events()[-1].materialization.metadata
        assert meta["import"].value["splits_from"] == "train: train.csv, test: test.csv"
        assert meta["worker_ids"].value == sorted(models) and meta["complete_rows"].value == 40
        db = project / "data" / "reward_matrix.duckdb"
        before = db.read_bytes()
        arrays = read_arrays(db)
        assert sorted(set(arrays.splits.tolist())) == ["test", "train"] and len(arrays.task_ids) == 40
        for config, needle in (
            ({"import_options": {**options, "worker_column": "llm"}}, "no column 'llm'"),
            ({"import_options": {**options, "duplicates": "sometimes"}}, "import_options.duplicates: Input should be 'refuse' or 'mean'"),
            ({"import_options": {**options, "colour": "red"}}, "import_options.colour: Extra inputs are not permitted"),
            ({"import_kind": "pickle"}, "import_kind 'pickle': use one of"),
            ({"import_kind": "jsonl", "import_options": {}, "import_path": "nope.jsonl"}, "import_path 'nope.jsonl': not found"),
            ({"import_kind": "jsonl", "import_options": {}, "import_path": "data"}, "import_path 'data': not the file"),
        ):
            res = run(**{"import_path": "train.csv", "import_kind": "long", "import_options": options, **config})
            assert not res.success
            assert needle in res.get_step_failure_events()[0].step_failure_data.error.message, config
        assert db.read_bytes() == before
        # a reward-matrix JSONL, with only some of its workers kept (one comma-separated string, as YAML gives it)
        (project / "three.jsonl").write_text("".join(json.dumps(
            {"task_id": f"t{i}", "prompt": f"What is {i} + 1?", "split": ("train", "test")[i % 2],
             "worker_ids": ["a", "b", "c"], "quality": [1.0, float(i % 2), 0.0]}) + "\n" for i in range(8)))
        res = run(import_path="three.jsonl", import_kind="jsonl", import_options={"workers": "c, a"})
        assert res.success
        meta = res.get_asset_materialization_events()[-1].materialization.metadata
        assert meta["worker_ids"].value == ["a", "c"] and meta["import"].value["workers_left_out"] == ["b"]
        kept = db.read_bytes()
        res = run(import_path="three.jsonl", import_kind="jsonl", import_options={"workers": ["a", "z"]})
        assert not res.success and db.read_bytes() == kept
        assert "worker 'z' is not among the file's workers (a, b, c)" in res.get_step_failure_events()[0].step_failure_data.error.message


def test_a_bad_batch_file_is_left_out_of_the_matrix_not_the_end_of_it(project):
    """One batch file with a bad line no longer fails the whole matrix: it is left out, and the
    materialization names it with its first problem (as a badly named file always was)."""
    (project / "data" / "benchgen" / "broken.jsonl").write_text(
        '{"task_id": "b1", "prompt": "p", "reference_answer": "1", "grader": {"type": "telepathy"}}\n', encoding="utf-8")
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("reward_matrix")], raise_on_error=False)
        mats = res.get_asset_materialization_events()
        assert mats, "the matrix was not built"
        refused = mats[-1].materialization.metadata["refused_batch_files"].value
        assert list(refused) == ["broken.jsonl"] and "unknown grader type 'telepathy'" in refused["broken.jsonl"]
