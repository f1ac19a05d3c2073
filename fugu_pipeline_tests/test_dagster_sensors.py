"""Every sensor through `SensorDefinition.evaluate_tick` with the definitions' own resources on a
real instance (the daemon's path), the BenchGen batch sensor's backfills, badly named files, and
the catalog-change sensor against a loopback stub catalog (FUGU_OPENROUTER_BASE_URL)."""

import json
import secrets
import subprocess
import sys

import dagster as dg
import pytest

from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.catalog import FINGERPRINT_TAG
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.catalog import load_latest
from fugu_pipeline_tests.conftest import task_row, write_jsonl
from fugu_pipeline_tests.daemon_path import launch, tick

HOOK = """
import sys, tempfile
import dagster as dg
from fugu_pipeline.definitions import defs
repo = defs.get_repository_def()
with dg.instance_for_test(temp_dir=tempfile.mkdtemp()) as inst:
    for s in repo.sensor_defs:
        with dg.build_sensor_context(instance=inst, repository_def=repo, resources=repo.get_top_level_resources()) as ctx:
            r = s.evaluate_tick(ctx)
            print(s.name, len(r.run_requests), flush=True)
"""


def test_every_sensor_of_the_code_location_ticks(project):
    """What the pre-stop hook runs, in a fresh interpreter on the code location `dagster dev`
    loads, over a project holding a batch file (so the batch sensor really requests runs)."""
    env = {"PATH": "/usr/bin:/bin", "FUGU_PROJECT_DIR": str(project), "FUGU_ENCODER": "tiny", "HOME": str(project)}
    out = subprocess.run([sys.executable, "-c", HOOK], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ticks = dict(line.split() for line in out.stdout.splitlines())
    assert ticks == {"benchgen_batch_sensor": "4", "catalog_change_sensor": "0", "reward_matrix_automation": "0",
                     "catalog_update_sensor": "0",  # no catalog materialized yet: nothing to re-collect
                     "settings_sensor": "0"}  # it records observations, never a run


def test_every_sensor_has_a_target_and_a_description(project):
    repo = build_defs(str(project), "configs/workers.mock.yaml").get_repository_def()
    for s in repo.sensor_defs:
        if s.name != "settings_sensor":  # it only records the settings' observations, and requests no run
            assert s.targets or s.asset_selection is not None, f"{s.name} has no target: the daemon would refuse its run requests"
        assert s.description, s.name
    status = {s.name: s.default_status for s in repo.sensor_defs}
    assert status == {"benchgen_batch_sensor": dg.DefaultSensorStatus.RUNNING,
                      "catalog_change_sensor": dg.DefaultSensorStatus.STOPPED,  # it spends money
                      "reward_matrix_automation": dg.DefaultSensorStatus.RUNNING,
                      "catalog_update_sensor": dg.DefaultSensorStatus.RUNNING,  # inert until the catalog is refreshed
                      "settings_sensor": dg.DefaultSensorStatus.RUNNING}  # observes only: costs nothing


def test_badly_named_batch_file_is_refused_and_the_rest_run(project, capfd):
    bad = write_jsonl(project / "data" / "benchgen" / "bad name!.jsonl", [task_row(5000)])
    # one mock worker: what is checked is the sensor's refusal and its skip message, not the runs
    (project / "configs" / "one.yaml").write_text(json.dumps({"workers": [{"id": "a", "kind": "mock"}]}))
    defs = build_defs(str(project), "configs/one.yaml")
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, "benchgen_batch_sensor")
        assert {str(r.partition_key).split("|")[0] for r in result.run_requests} == {"sample"}
        assert instance.get_dynamic_partitions("task_batches") == ["sample"]
        warned = [line for line in capfd.readouterr().err.splitlines() if bad.name in line]  # the tick's log
        assert len(warned) == 1 and "WARNING" in warned[0] and "refused" in warned[0], warned
        assert "must start with a letter or digit" in warned[0] and warned[0].endswith("rename the file")
        launch(defs, instance, result.run_requests)
        again = tick(defs, instance, "benchgen_batch_sensor", result.cursor)
        assert not again.run_requests and bad.name in again.skip_message


# --------------------------------------------------------------------------- catalog re-collection


@pytest.fixture
def catalog_project(project, monkeypatch):
    """A project whose worker `or-a` is an openrouter worker behind a loopback stub, which also
    serves the catalog: FUGU_OPENROUTER_BASE_URL points the catalog resource at it."""
    with StubLLMServer() as stub:
        stub.add_model("test/model-a", prompt=1e-6, completion=2e-6)
        rows = [task_row(i) for i in range(8)]
        for r in rows:
            stub.set_answer(r["prompt"], f"The answer is {r['reference_answer']}")
        (project / "data" / "benchgen" / "sample.jsonl").unlink()
        write_jsonl(project / "data" / "benchgen" / "b1.jsonl", rows)
        (project / "configs" / "w.yaml").write_text(json.dumps({"workers": [
            {"id": "or-a", "kind": "openrouter", "model": "test/model-a", "base_url": stub.openrouter_url},
            {"id": "m", "kind": "mock"}]}))
        monkeypatch.setenv("FUGU_OPENROUTER_BASE_URL", stub.openrouter_url)
        monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + secrets.token_hex(20))  # a fake key, built now
        yield project, stub


@pytest.mark.slow
def test_a_price_change_recollects_the_cells_of_an_offline_run_once(catalog_project):
    project, stub = catalog_project
    defs = build_defs(str(project), "configs/w.yaml")
    store = ResponseStore(project / "data" / "responses")
    with dg.instance_for_test() as instance:
        launch(defs, instance, tick(defs, instance, "benchgen_batch_sensor").run_requests)
        assert {r.model_fingerprint for r in store.read("b1", "or-a").values()} == {None}  # no catalog yet
        calls = len(stub.chat_requests())
        assert calls == 8

        first = tick(defs, instance, "catalog_change_sensor")  # the baseline: nothing changed yet
        assert not first.run_requests and first.cursor
        assert not tick(defs, instance, "catalog_change_sensor", first.cursor).run_requests

        stub.set_price("test/model-a", prompt=5e-6)
        changed = tick(defs, instance, "catalog_change_sensor", first.cursor)
        assert len(changed.run_requests) == 1  # one worker, one batch: one re-collection
        req = changed.run_requests[0]
        new_fp = load_latest(project / "data" / "catalog").fingerprint("test/model-a")
        assert req.partition_key.keys_by_dimension == {"batch": "b1", "worker": "or-a"} and req.tags[FINGERPRINT_TAG] == new_fp
        meta = launch(defs, instance, changed.run_requests)[str(req.partition_key)]
        assert meta["called"] == 8 and len(stub.chat_requests()) == calls + 8  # every cell without a fingerprint
        assert {r.model_fingerprint for r in store.read("b1", "or-a").values()} == {new_fp}

        assert not tick(defs, instance, "catalog_change_sensor", changed.cursor).run_requests  # unchanged: nothing
        assert launch(defs, instance, changed.run_requests)[str(req.partition_key)]["called"] == 0  # and a replay calls nothing
