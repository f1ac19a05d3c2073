"""The reward matrix's automation, evaluated by its automation sensor's `evaluate_tick` on a real
instance (the daemon's path), with the runs it requests launched in between."""

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.automation import BUILD_JOB
from fugu_pipeline.defs.versions import RESPONSES_VERSION, responses_version
from fugu_pipeline.defs.catalog import FINGERPRINT_TAG
from fugu_pipeline.defs.versions import latest_data_versions
from fugu_pipeline_tests.conftest import new_project
from fugu_pipeline_tests.daemon_path import launch, tick

MATRIX = dg.AssetKey("reward_matrix")


def requested(result) -> list:
    return [r for r in result.run_requests if r.job_name == BUILD_JOB or MATRIX in (r.asset_selection or [])]


def recollect(defs, instance, worker: str, fingerprint: str) -> dict:
    """A re-collection of one responses partition, as the catalog sensor requests it (its new
    fingerprint makes every cell stale, so the file really changes)."""
    key = dg.MultiPartitionKey({"batch": "sample", "worker": worker})
    req = dg.RunRequest(partition_key=key, asset_selection=[dg.AssetKey("responses")], tags={FINGERPRINT_TAG: fingerprint})
    return launch(defs, instance, [req])[str(key)]


def stale(defs, instance) -> StaleStatus:
    """What the UI shows as "Unsynced" (STALE) or not (FRESH), from Dagster's own resolver."""
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(), LoadingContextForTest(instance))
    return resolver.get_status(MATRIX)


class Built(NamedTuple):
    """The shipped project collected and its matrix built through the daemon's path."""

    project: Path
    home: Path  # the instance's folder (DAGSTER_HOME): reopen it with `instance_for_test(temp_dir=...)`
    requesting: str | None  # the automation's cursor from the tick that requested the build
    settled: str | None  # ... and from the tick after the build (which requested nothing)
    build: dict  # the build's materialization metadata


@pytest.fixture(scope="module")
def built_once(tmp_path_factory) -> tuple[Built, Path]:
    """The first collection and build, done once for the tests that start from them (4 runs and a
    build each, the file's main cost): the project and the instance's folder are saved as they end."""
    root = tmp_path_factory.mktemp("built")
    project, home = new_project(root / "project"), root / "home"
    home.mkdir()
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        auto = tick(defs, instance, "reward_matrix_automation")
        assert not requested(auto)  # nothing collected yet: nothing to build
        launch(defs, instance, tick(defs, instance, "benchgen_batch_sensor").run_requests)
        auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert len(requested(auto)) == 1  # every partition done: the first build
        build = launch(defs, instance, requested(auto))
        settled = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert not requested(settled) and stale(defs, instance) == StaleStatus.FRESH
    saved = root / "saved"
    shutil.copytree(project, saved / "project", symlinks=True)
    shutil.copytree(home, saved / "home", symlinks=True)
    return Built(project, home, auto.cursor, settled.cursor, next(iter(build.values()))), saved


@pytest.fixture
def first_build(built_once) -> Built:
    """`built_once` for one test: its project and instance folders put back as they were saved, at
    the same paths (so the paths the instance recorded stay true); nothing one test changes is seen
    by the next (the file's tests run in one process, one after another)."""
    done, saved = built_once
    for folder in (done.project, done.home):
        shutil.rmtree(folder)
        shutil.copytree(saved / folder.name, folder, symlinks=True)
    return done


@pytest.mark.slow
def test_recollections_landing_with_a_matrix_build_are_not_lost(first_build):
    defs = build_defs(str(first_build.project), "configs/workers.mock.yaml")
    with dg.instance_for_test(temp_dir=str(first_build.home)) as instance:
        auto = tick(defs, instance, "reward_matrix_automation", first_build.settled)
        assert not requested(auto) and stale(defs, instance) == StaleStatus.FRESH

        # Between two ticks: a build, then two re-collections right after it. With eager() alone the
        # matrix's own update resets the trigger on the next tick and it stays Unsynced.
        before = dict(latest_data_versions(instance, dg.AssetKey("responses")))
        assert recollect(defs, instance, "math-expert", "fp-1")["called"] == 300
        assert recollect(defs, instance, "code-expert", "fp-1")["called"] == 300
        after = latest_data_versions(instance, dg.AssetKey("responses"))
        assert [k for k in after if after[k] != before[k]] == ["sample|code-expert", "sample|math-expert"]
        launch(defs, instance, [dg.RunRequest(asset_selection=[MATRIX])])  # the build that lands on the same tick
        recollect(defs, instance, "math-expert", "fp-2")  # ... and a third re-collection after it
        assert stale(defs, instance) == StaleStatus.STALE

        auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert len(requested(auto)) == 1, auto.skip_message
        launch(defs, instance, requested(auto))
        mat = instance.get_latest_materialization_event(MATRIX).asset_materialization
        assert mat.metadata[RESPONSES_VERSION].value == responses_version(instance)
        assert stale(defs, instance) == StaleStatus.FRESH

        for _ in range(2):  # and no loop: nothing changed since
            auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
            assert not requested(auto)

        assert recollect(defs, instance, "general-expert", "fp-0")["called"] == 300
        assert recollect(defs, instance, "general-expert", "fp-0")["called"] == 0  # nothing new: same data version
        auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert len(requested(auto)) == 1


@pytest.mark.slow
def test_a_retired_worker_or_a_bad_batch_does_not_stop_the_matrix_following(first_build):
    """A worker removed from the config keeps its partition but is never collected on a later batch,
    and a batch file with a bad line fails its collection: neither may keep the matrix from
    following the batches that were collected (it waited on every missing partition forever)."""
    import yaml

    project = first_build.project
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test(temp_dir=str(first_build.home)) as instance:
        auto = tick(defs, instance, "reward_matrix_automation", first_build.settled)
        assert not requested(auto)
        cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
        retired = cfg["workers"].pop()["id"]
        (project / "configs" / "workers.two.yaml").write_text(yaml.safe_dump(cfg))
        defs = build_defs(str(project), "configs/workers.two.yaml")
        batch = [json.loads(x) for x in (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:6]]
        (project / "data" / "benchgen" / "extra.jsonl").write_text(
            "".join(json.dumps({**t, "task_id": "extra-" + t["task_id"]}) + "\n" for t in batch))
        (project / "data" / "benchgen" / "broken.jsonl").write_text('{"task_id": "b1", "prompt": "p"\n')
        runs = tick(defs, instance, "benchgen_batch_sensor").run_requests
        launch_failing = [r for r in runs if "broken" in str(r.partition_key)]
        launch(defs, instance, [r for r in runs if r not in launch_failing])
        for r in launch_failing:  # fails, as the daemon's run would
            job = defs.resolve_implicit_global_asset_job_def() if r.asset_selection else defs.resolve_job_def(r.job_name)
            kw = {"asset_selection": list(r.asset_selection)} if r.asset_selection else {}
            assert not job.execute_in_process(instance=instance, partition_key=r.partition_key, raise_on_error=False, **kw).success
        auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert len(requested(auto)) == 1, auto.skip_message
        meta = launch(defs, instance, requested(auto))
        built = next(iter(meta.values()))
        assert retired not in built["worker_ids"] and list(built["refused_batch_files"]) == ["broken.jsonl"]
        assert built["complete_rows"] == 306  # the sample's 300 tasks and the extra batch's 6


@pytest.mark.slow
def test_an_imported_matrix_is_not_replaced_when_the_collection_changes(first_build):
    """A matrix materialized from imported routing data holds other prompts and workers than the
    collection; a later re-collection must not rebuild it from the responses (it did, and the
    imported matrix was gone). Building from the collection by hand resumes the automation."""
    rows = [{"task_id": f"r{i}", "prompt": f"question {i}?", "domain": "qa", "worker_ids": ["org/a", "org/b"],
             "quality": [i % 2, 1 - i % 2], "split": ("train", "val", "test")[i % 3]} for i in range(30)]
    project = first_build.project  # collected, and the collection's matrix built
    (project / "data" / "routing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    imported = {"ops": {"reward_matrix": {"config": {"import_path": "data/routing.jsonl"}}}}
    with dg.instance_for_test(temp_dir=str(first_build.home)) as instance:
        cursor = first_build.requesting  # the cursor of the tick that requested the collection's build
        job = defs.resolve_implicit_global_asset_job_def()
        assert job.execute_in_process(instance=instance, asset_selection=[MATRIX], run_config=imported).success
        assert instance.get_latest_materialization_event(MATRIX).asset_materialization.metadata["complete_rows"].value == 30

        assert recollect(defs, instance, "math-expert", "fp-1")["called"] == 300
        for _ in range(2):
            auto = tick(defs, instance, "reward_matrix_automation", cursor)
            assert not requested(auto), "the automation replaced an imported matrix"
            cursor = auto.cursor

        launch(defs, instance, [dg.RunRequest(asset_selection=[MATRIX])])  # by hand, from the collection
        assert recollect(defs, instance, "code-expert", "fp-1")["called"] == 300
        auto = tick(defs, instance, "reward_matrix_automation", auto.cursor)
        assert len(requested(auto)) == 1, auto.skip_message


BAD_LINE = '{"task_id": "x3", "prompt": \n'


def follow(defs, instance, cursor=None, ticks: int = 3) -> list[dict]:
    """Tick the matrix's automation and launch what it requests, until it requests nothing."""
    built = []
    for _ in range(ticks):
        auto = tick(defs, instance, "reward_matrix_automation", cursor)
        if not requested(auto):
            break
        built.extend(launch(defs, instance, requested(auto)).values())
    return built


@pytest.mark.slow
def test_a_refused_batch_reaches_the_matrix_without_a_manual_rebuild(first_build):
    """A batch file with a bad line, dropped after the first build, fails its load and nothing else:
    no responses partition changes. The matrix was never rebuilt (Dagster's `eager()` waits for an
    updated dependency), so `refused_batch_files` stayed empty until someone rebuilt it by hand.
    Now a failed collection run is a collection run that ended: the matrix is rebuilt once and
    names the file and its line."""
    project = first_build.project
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test(temp_dir=str(first_build.home)) as instance:
        assert first_build.build["refused_batch_files"] == {}  # the first build
        assert follow(defs, instance) == []  # and from no cursor too: nothing more to build

        good = (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:2]
        (project / "data" / "benchgen" / "badline.jsonl").write_text("\n".join(good) + "\n" + BAD_LINE)
        runs = tick(defs, instance, "benchgen_batch_sensor", None).run_requests
        launch(defs, instance, [r for r in runs if "badline" in str(r.partition_key)], may_fail=True)
        built = follow(defs, instance)  # no manual rebuild: the automation's own ticks
        assert len(built) == 1, "the matrix was not rebuilt after the refused batch"
        refused = built[0]["refused_batch_files"]
        assert list(refused) == ["badline.jsonl"] and refused["badline.jsonl"].startswith("badline.jsonl:3: malformed JSON")
        assert built[0]["complete_rows"] == 300  # the sample's tasks stay
        assert follow(defs, instance) == []  # once


def fewer_workers(project: Path, n: int) -> str:
    """The shipped mock config cut to its first `n` workers (configs/workers.<n>.yaml): for the tests
    where the number of collection runs is not what is checked, fewer runs to launch."""
    import yaml

    cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
    cfg["workers"] = cfg["workers"][:n]
    (project / "configs" / f"workers.{n}.yaml").write_text(yaml.safe_dump(cfg))
    return f"configs/workers.{n}.yaml"


@pytest.mark.slow
def test_the_matrix_waits_for_the_whole_collection_wave(project):
    """One build per wave of collection runs: while one of a batch's runs is still queued or running
    the automation waits, and a build running when a re-collection ends is followed by another."""
    defs = build_defs(str(project), fewer_workers(project, 2))  # a wave: the load and two workers' runs
    with dg.instance_for_test() as instance:
        runs = tick(defs, instance, "benchgen_batch_sensor").run_requests
        launch(defs, instance, runs[:-1])
        job = defs.resolve_job_def(runs[-1].job_name)  # the last worker's run: created, not finished
        queued = instance.create_run_for_job(job, tags=dict(runs[-1].tags),
                                             status=dg.DagsterRunStatus.NOT_STARTED)
        auto = tick(defs, instance, "reward_matrix_automation")
        assert not requested(auto) and "waiting for 1 collection run" in auto.skip_message, auto.skip_message
        instance.delete_run(queued.run_id)
        launch(defs, instance, runs[-1:])
        assert len(follow(defs, instance)) == 1
        auto = tick(defs, instance, "reward_matrix_automation")
        assert not requested(auto) and auto.skip_message.startswith("up to date"), auto.skip_message


def test_the_main_jobs_collection_is_waited_for_but_not_followed(project):
    """`fugu-lite pipeline` on the same instance builds the matrix itself right after collecting: the
    automation must not request a second build in between."""
    from fugu_pipeline.defs.partitions import MAIN_JOB_TAGS

    defs = build_defs(str(project), fewer_workers(project, 1))
    with dg.instance_for_test() as instance:
        runs = tick(defs, instance, "benchgen_batch_sensor").run_requests
        launch(defs, instance, [r.with_replaced_attrs(tags={**r.tags, **MAIN_JOB_TAGS}) for r in runs])
        auto = tick(defs, instance, "reward_matrix_automation")
        assert not requested(auto) and auto.skip_message.startswith("up to date"), auto.skip_message
