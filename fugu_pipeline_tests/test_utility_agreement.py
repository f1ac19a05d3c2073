"""One meaning per setting: the command line and the assets compute the same utility from the same
worker YAML, with weights that are not the defaults, and every report says which weights it used.

Run the way users run them: `fugu-lite generate / train-sft / evaluate` on one side, `fugu-lite
pipeline` (Dagster, the project's instance) on the other, in the same project folder."""

import json
import shutil

import dagster as dg
import numpy as np
import pytest
import yaml

from fugu_pipeline.cli import main
from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.matrix.read import read_arrays, read_utility_config, read_utility_source
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline_tests.conftest import NO_CASCADE, ONE_POINT_HEADS, REPO, short_training

WEIGHTS = {"quality_weight": 2.0, "cost_weight": 0.7, "latency_weight": 0.2, "cost_scale_usd": 0.005,
           "latency_scale_s": 4.0, "cap": 5.0}
FORMULA = "U = 2·Q − 0.7·min(C/$0.005, 5) − 0.2·min(L/4s, 5)"
BASELINES = ("oracle_utility", "best_fixed_utility", "random_utility", "best_fixed_worker", "per_worker_utility", "n_tasks")


@pytest.fixture
def weighted(project, monkeypatch):
    """The project with a worker YAML whose reward: block is far from the defaults, and short
    training configs, 3 folds for the head set (read by both sides)."""
    assert UtilityConfig(**WEIGHTS) != UtilityConfig()
    cfg = yaml.safe_load((project / "configs" / "workers.mock.yaml").read_text())
    cfg["reward"] = WEIGHTS
    (project / "configs" / "w.yaml").write_text(yaml.safe_dump(cfg))
    short_training(project)
    monkeypatch.chdir(project)
    monkeypatch.setenv("DAGSTER_HOME", str(project))
    return project


@pytest.mark.slow
def test_cli_and_assets_report_the_same_utility_from_the_same_worker_yaml(weighted, capsys):
    # the command line: generate -> train-sft -> evaluate, with the worker YAML's weights
    W = ["--workers", "configs/w.yaml"]
    with (weighted / "configs" / "train.yaml").open("a") as fh:  # the main job fits the head set on its way: the
        fh.write(NO_CASCADE + ONE_POINT_HEADS)                     # smallest one (nothing of it is checked here)
    assert main(["generate", *W, "--tasks", "data/benchgen/sample.jsonl", "--output", "r.jsonl"]) == 0
    common = ["--data", "r.jsonl", *W, "--device", "cpu"]
    assert main(["train-sft", *common, "--encoder", "tiny", "--output", "cli-models"]) == 0
    assert main(["evaluate", "--checkpoint", "cli-models", *common, "--output", "cli-report.json"]) == 0
    cli_out = capsys.readouterr().out
    cli = json.loads((weighted / "cli-report.json").read_text())

    # the assets: the main job over the same project and worker YAML
    assert main(["pipeline", "--project-dir", str(weighted), *W, "--encoder", "tiny", "--stop-after", "eval_report_sft"]) == 0
    job_out = capsys.readouterr().out
    sft_dir = next((weighted / "models" / "sft").iterdir())
    asset = json.loads((sft_dir / "reports" / "test.json").read_text())

    for rep in (cli, asset):
        assert rep["utility_weights"] == WEIGHTS and rep["utility_formula"] == FORMULA
        assert "the reward: block of configs/w.yaml" in rep["utility_source"]
        assert rep["summary"].endswith(FORMULA)
    for key in BASELINES:
        assert cli[key] == pytest.approx(asset[key], abs=1e-12), key
    # same data, same weights, same features, same seed: the same router, byte for byte
    assert cli["router_utility"] == pytest.approx(asset["router_utility"], abs=1e-12)
    assert cli["checkpoint"].endswith(sft_dir.name) and cli["data_version"] == asset["data_version"]
    # and both printed the weights
    assert FORMULA in cli_out and f"utility: {FORMULA}" in job_out
    print(f"\nCLI   {cli['summary']}\nasset {asset['summary']}")


def test_an_imported_jsonl_gets_the_weights_of_the_yaml_in_both_paths(weighted, capsys):
    rows = []
    for i in range(30):
        q, cost, lat = [float(i % 2), 1.0 - i % 2, 0.5], [0.001, 0.004, 0.0005], [1.0, 6.0, 0.5]
        made_with_defaults = [UtilityConfig().utility(*c) for c in zip(q, cost, lat)]
        rows.append({"task_id": f"t{i}", "prompt": f"task {i}", "split": ("train", "val", "test")[i % 3],
                     "worker_ids": ["a", "b", "c"], "quality": q, "cost_usd": cost, "latency_s": lat,
                     "rewards": made_with_defaults})
    (weighted / "imp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    defs = build_defs(str(weighted), "configs/w.yaml")
    with dg.instance_for_test() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("reward_matrix")],
            run_config={"ops": {"reward_matrix": {"config": {"import_path": "imp.jsonl"}}}})
    meta = res.get_asset_materialization_events()[0].materialization.metadata
    assert meta["utility_weights"].value == WEIGHTS and meta["utility"].value.startswith(FORMULA)
    asset_db = weighted / "data" / "reward_matrix.duckdb"

    from argparse import Namespace

    from fugu_pipeline.cli.training import matrix_db

    cli_db = matrix_db(Namespace(data="imp.jsonl", reward_config="configs/w.yaml", work_dir="data/imports"))
    a, c = read_arrays(asset_db), read_arrays(cli_db)
    expected = np.array([[UtilityConfig(**WEIGHTS).utility(*x) for x in zip(r["quality"], r["cost_usd"], r["latency_s"])]
                         for r in sorted(rows, key=lambda r: r["task_id"])])
    np.testing.assert_allclose(a.utility, expected, atol=1e-12)
    np.testing.assert_allclose(c.utility, expected, atol=1e-12)
    for db in (asset_db, cli_db):
        assert read_utility_config(db) == UtilityConfig(**WEIGHTS)
        note = read_utility_source(db)
        # recorded in the matrix: how, with which weights, and that the file's own rewards disagree
        assert "30 row(s) recomputed from quality" in note and "the reward: block of configs/w.yaml" in note
        assert "30 row(s) carry rewards these weights do not reproduce" in note
    # a duckdb matrix carries its weights: other weights on the command line are refused, not mixed in
    shutil.copy(REPO / "configs" / "workers.mock.yaml", weighted / "defaults.yaml")
    assert main(["train-sft", "--data", str(asset_db), "--workers", "defaults.yaml", "--encoder", "tiny", "--device", "cpu"]) == 2
    assert f"was built with {FORMULA}" in capsys.readouterr().err


@pytest.mark.slow
def test_fugu_lite_train_and_the_router_heads_asset_save_the_same_heads(weighted, capsys):
    """`fugu-lite train` over the matrix the assets built and the `router_heads` and `router_cascade` assets: the same
    configured heads (configs/train.yaml), the same weights byte for byte, the same manifests (the
    feature dtype included) apart from when they were written, and so the same directory names."""
    W = ["--workers", "configs/w.yaml"]
    assert main(["pipeline", "--project-dir", str(weighted), *W, "--encoder", "tiny", "--stop-after", "router_cascade"]) == 0
    asset = {p.parent.parent.name: p.parent for p in (weighted / "models").glob("*/*/manifest.json")}
    assert main(["train", "--data", "data/reward_matrix.duckdb", *W, "--encoder", "tiny", "--device", "cpu",
                 "--output", "cli-models"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    cli = {p.parent.parent.name: p.parent for p in (weighted / "cli-models").glob("*/*/manifest.json")}
    assert cli and set(cli) <= set(asset) and (weighted / printed).resolve() in {p.resolve() for p in cli.values()}

    def comparable(path):
        m = json.loads((path / "manifest.json").read_text())
        for key in ("created_at", "wall_s"):
            m.pop(key)
        return m

    for kind, path in cli.items():
        assert (path / "head.safetensors").read_bytes() == (asset[kind] / "head.safetensors").read_bytes(), kind
        assert comparable(path) == comparable(asset[kind]), kind
        assert path.name == asset[kind].name, kind  # the content hash: no timing is hashed
        assert comparable(path)["metrics"]["feature_dtype"] in ("float32", "bfloat16")
