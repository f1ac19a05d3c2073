"""The main assets from the UI: `main_job` is what `fugu-lite pipeline` runs once the batches are
collected, takes no partition (the graph's "Materialize all" opens a partition dialog for the
collection's assets, with none selected), and the Dagster UI page says which job to launch."""

from __future__ import annotations

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.runner import DOWNSTREAM, ROLES_STEPS
from fugu_pipeline_tests.conftest import REPO


def test_main_job_is_the_pipeline_after_collection_and_takes_no_partition(project):
    defs = build_defs(str(project), "configs/workers.mock.yaml", "tiny")
    job = defs.resolve_job_def("main_job")
    assert job.partitions_def is None
    assert sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys) == sorted(["reward_matrix", *DOWNSTREAM])
    graph = defs.resolve_asset_graph()
    # (the settings assets, config_*, are observed, never materialized)
    left = {k.to_user_string() for k in graph.materializable_asset_keys} - {"reward_matrix", *DOWNSTREAM}
    partitioned = {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).partitions_def is not None}
    # the rest: collection (partitioned, the batch sensor runs it), the live catalog, the coordinator (--roles)
    assert left == partitioned | {"openrouter_catalog", *ROLES_STEPS} and partitioned == {"tasks", "responses"}


def test_the_ui_page_says_which_job_materializes_the_main_assets():
    page = (REPO / "docs" / "dagster-ui.md").read_text()
    section = page.split("## Materialize the main assets from the UI", 1)[1].split("\n## ", 1)[0]
    assert "main_job" in section and "Launch" in section and "benchgen_batch_sensor" in section
