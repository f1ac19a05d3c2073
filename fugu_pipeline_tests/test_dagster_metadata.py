"""What the asset pages show: figures rounded, columns described, files as path values, and the
assets that call live services marked on the graph (a kind and a tag)."""

import math

import dagster as dg
import numpy as np
import pytest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.defs.data import REWARDS_SCHEMA
from fugu_pipeline_tests.daemon_path import launch, tick

LIVE = {"openrouter_catalog": "openrouter-api", "responses": "live-workers", "eval_report_sft": "live-workers",
        "eval_report_rl": "live-workers", "eval_report_es": "live-workers", "eval_report_heads": "live-workers",
        "promoted_router": "live-workers", "router_roles": "live-workers", "eval_report_roles": "live-workers"}


def legible(value: float) -> bool:
    """Four decimals at most; under 0.001, three significant digits at most."""
    if not math.isfinite(value) or value == 0:
        return True
    return value == round(value, 4) if abs(value) >= 1e-3 else value == float(f"{value:.3g}")


def test_floats_are_rounded_for_reading():
    from fugu_pipeline.defs.metadata import rounded, tidy

    assert rounded(0.13910373200000015) == 0.1391 and rounded(0.000234567) == 0.000235 and rounded(-2.5) == -2.5
    meta = tidy({"a": 0.13910373200000015, "b": dg.MetadataValue.float(0.987654321), "c": np.float32(0.5123456),
                 "n": 3, "ok": True, "t": "text", "nan": float("nan")})
    assert meta["a"] == 0.1391 and meta["b"].value == 0.9877 and meta["c"] == 0.5123
    assert meta["n"] == 3 and meta["ok"] is True and meta["t"] == "text" and math.isnan(meta["nan"])


@pytest.mark.slow
def test_the_collected_data_shows_rounded_figures_and_described_columns(project):
    """Through the daemon's path (the batch sensor, its runs, the matrix's automation), then the
    embeddings: every float shown is rounded, every column of the rewards table described, and the
    embedding cache is a path (it was plain text)."""
    import yaml

    cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
    # two of the three mock workers: their responses partitions show the same figures, and the matrix
    # still compares workers (ties, best worker)
    cfg["workers"] = cfg["workers"][:2]
    (project / "configs" / "workers.two.yaml").write_text(yaml.safe_dump(cfg))
    defs = build_defs(str(project), "configs/workers.two.yaml", encoder="tiny")
    assert all(c.description for c in REWARDS_SCHEMA.columns), [c.name for c in REWARDS_SCHEMA.columns if not c.description]
    with dg.instance_for_test() as instance:
        metas = list(launch(defs, instance, tick(defs, instance, "benchgen_batch_sensor").run_requests).values())
        auto = tick(defs, instance, "reward_matrix_automation")
        metas += launch(defs, instance, auto.run_requests).values()
        job = defs.resolve_implicit_global_asset_job_def()
        res = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("task_embeddings")])
        emb = res.get_asset_materialization_events()[-1].materialization.metadata
        assert isinstance(emb["cache_dir"], dg.PathMetadataValue)
        metas.append({k: v.value for k, v in emb.items()})
    assert len(metas) == 5  # tasks, two responses partitions, the matrix, the embeddings
    floats = {(i, k): v for i, m in enumerate(metas) for k, v in m.items() if isinstance(v, float)}
    assert floats and all(legible(v) for v in floats.values()), {k: v for k, v in floats.items() if not legible(v)}


def test_assets_that_call_live_services_say_so_on_the_graph(project):
    graph = build_defs(str(project), "configs/workers.mock.yaml").resolve_asset_graph()
    marked = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if "live-calls" in node.kinds:
            marked[key.to_user_string()] = node.tags.get("fugu/calls")
            assert node.description.startswith("Calls ") or "calls the configured workers" in node.description, key
    assert marked == LIVE
