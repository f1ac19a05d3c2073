"""The one-step router's quick start as its users type it: the shipped example files load through
the project's loaders, each `--checkpoint` takes the folder a training command wrote (its latest
checkpoint, said on stderr), a JSONL whose rows carry their rewards trains without a worker YAML,
and `reward.judge_model` is the `judge:` block."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO

WORKERS = ["--workers", "configs/workers.yaml"]


def test_the_shipped_examples_load_through_the_projects_loaders(tmp_path):
    from dotenv import dotenv_values

    from fugu_pipeline.matrix.build import build, from_import
    from fugu_pipeline.matrix.import_format import read_reward_jsonl
    from fugu_pipeline.matrix.read import read_arrays
    from fugu_pipeline.reward import UtilityConfig
    from fugu_pipeline.tasks.loading import load_tasks

    tasks = load_tasks(REPO / "data" / "tasks.sample.jsonl")
    assert len(tasks) == 300 and {t.domain for t in tasks} == {"math", "code", "general"}
    example = REPO / "data" / "rewards.schema.example.jsonl"
    rows = read_reward_jsonl(example)
    assert len({tuple(r.worker_ids) for r in rows}) == 1 and all(len(r.rewards) == len(r.worker_ids) for r in rows)
    build(from_import(example, UtilityConfig(), "none applied (every row gives rewards)"), tmp_path / "m.duckdb")
    arrays = read_arrays(tmp_path / "m.duckdb")
    assert arrays.worker_ids == rows[0].worker_ids and sorted(arrays.utility.tolist()) == sorted(r.rewards for r in rows)
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", (REPO / "docs" / "reference" / "environment.md").read_text(), re.M))
    env_text = (REPO / ".env.example").read_text()
    named = set(dotenv_values(REPO / ".env.example")) | set(re.findall(r"^# ([A-Z_]+)=", env_text, re.M))
    assert named and named <= documented, named - documented
    assert not [v for v in dotenv_values(REPO / ".env.example").values() if v]  # no value, let alone a key


def _checkpoint(folder: Path, created: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"created_at": created}))
    return folder


def test_the_latest_checkpoint_of_a_folder_is_the_one_its_last_training_command_named(tmp_path):
    from fugu_pipeline.cli.checkpoints import LATEST_FILE, record_latest, resolve_checkpoint

    out = tmp_path / "artifacts" / "router"
    old = _checkpoint(out / "sft" / "aaaa", "2026-01-02T00:00:00+00:00")
    new = _checkpoint(out / "rl" / "bbbb", "2026-01-03T00:00:00+00:00")
    _checkpoint(out / "promoted" / "cccc", "2027-01-01T00:00:00+00:00")  # a pointers' folder, never a checkpoint
    _checkpoint(out / "sft" / ".tmp-dddd-x", "2027-01-01T00:00:00+00:00")  # a save in progress
    said: list[str] = []
    assert resolve_checkpoint(str(out), echo=said.append) == new  # no record: the newest manifest
    assert "the newest manifest, created 2026-01-03" in said[-1] and "of 2 there" in said[-1]
    record_latest(out, old, "train-sft")  # a re-run that landed on a checkpoint already there names it again
    assert resolve_checkpoint(str(out), echo=said.append) == old
    assert f"its latest checkpoint, {old} (written by fugu-lite train-sft at " in said[-1]
    shutil.rmtree(old)  # the recorded one is gone: the newest manifest again
    assert resolve_checkpoint(str(out), echo=said.append) == new
    assert resolve_checkpoint(str(new)) == new and resolve_checkpoint(str(new / "manifest.json")) == new
    (out / LATEST_FILE).write_text("{not json")
    assert resolve_checkpoint(str(out), echo=said.append) == new
    record_latest(out, tmp_path / "elsewhere" / "x", "train")  # outside the folder: nothing recorded
    assert (out / LATEST_FILE).read_text() == "{not json"


def test_rewards_carried_in_the_rows_are_used_without_a_worker_yaml(tmp_path, monkeypatch, capsys):
    from fugu_pipeline.cli.training import matrix_db
    from fugu_pipeline.matrix.read import read_arrays

    rows = [{"task_id": f"t{i}", "prompt": f"What is {i} + 1?", "domain": "math", "split": "train",
             "worker_ids": ["a", "b"], "rewards": [0.25 * i, 0.5], "quality": [1.0, 0.0]} for i in range(3)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = type("Args", (), {"data": str(tmp_path / "r.jsonl"), "reward_config": None, "work_dir": str(tmp_path / "w"),
                             "cache_dir": None})()
    db = matrix_db(args)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the rewards" in err and "as given (no --workers" in err
    arrays = read_arrays(db)
    assert arrays.utility.tolist() == [[0.0, 0.5], [0.25, 0.5], [0.5, 0.5]]  # as given, not 1·Q − costs
    assert arrays.quality.tolist() == [[1.0, 0.0]] * 3  # quality kept for the accuracy figures


def test_reward_judge_model_is_the_judge_block(tmp_path):
    from fugu_pipeline.workers.config import WorkerConfigError, load_reward_block, load_workers_config

    (tmp_path / "w.yaml").write_text("reward: {quality_weight: 1.0, cost_weight: 0.2, judge_model: openai/gpt-4o-mini}\n"
                                     "workers:\n  - {id: a, kind: mock}\n")
    config = load_workers_config(tmp_path / "w.yaml")
    assert (config.judge.id, config.judge.kind, config.judge.model) == ("judge", "openrouter", "openai/gpt-4o-mini")
    assert config.reward.cost_weight == 0.2 and load_reward_block(tmp_path / "w.yaml")[0].cost_weight == 0.2
    (tmp_path / "both.yaml").write_text("reward: {judge_model: x/y}\njudge: {id: j, kind: mock}\nworkers:\n  - {id: a, kind: mock}\n")
    with pytest.raises(WorkerConfigError, match=r"keep one: judge: \{id: judge, kind: openrouter, model: x/y\}") as exc:
        load_workers_config(tmp_path / "both.yaml")
    assert len(str(exc.value).splitlines()) == 1


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The quick start's folder: the shipped configs and examples, `configs/workers.yaml` the mock pool
    (offline), training lengths a test can afford, the tiny encoder."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    shutil.copy(REPO / "configs" / "workers.mock.yaml", tmp_path / "configs" / "workers.yaml")
    (tmp_path / "data").mkdir()
    shutil.copy(REPO / "data" / "tasks.sample.jsonl", tmp_path / "data" / "tasks.sample.jsonl")
    (tmp_path / "configs" / "train_sft.yaml").write_text("epochs: 5\n")
    (tmp_path / "configs" / "train_rl.yaml").write_text("epochs: 1\n")
    monkeypatch.setenv("FUGU_ENCODER", "tiny")
    return tmp_path


@pytest.mark.slow
def test_the_quick_start_commands_take_the_folders_training_wrote(project, monkeypatch, capsys):
    """generate -> train-sft -> train-rl -> evaluate -> route -> ask -> serve, each as the quick start
    types it: no --workers for training (the rows carry their rewards), each --checkpoint a folder."""
    import fugu_pipeline.serve as serve_module

    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", "data/tasks.sample.jsonl",
                 "--output", "data/rewards.mock.jsonl", "--limit", "60"]) == 0
    data = ["--data", "data/rewards.mock.jsonl"]
    assert main(["train-sft", "--config", "configs/train_sft.yaml", *data, "--output", "artifacts/router-sft"]) == 0
    out = capsys.readouterr()
    assert "as given (no --workers" in out.err
    sft = out.out.strip().splitlines()[-1]
    assert main(["train-rl", "--config", "configs/train_rl.yaml", *data, "--checkpoint", "artifacts/router-sft",
                 "--output", "artifacts/router-rl"]) == 0
    rl = capsys.readouterr().out.strip().splitlines()[-1]
    assert rl.startswith("artifacts/router-rl/rl/")
    said = f"--checkpoint artifacts/router-rl: its latest checkpoint, {rl} (written by fugu-lite train-rl at "
    assert main(["evaluate", "--checkpoint", "artifacts/router-rl", *data, "--split", "test",
                 "--output", "artifacts/router-rl/test_metrics.json"]) == 0
    assert said in capsys.readouterr().err
    assert json.loads((project / "artifacts" / "router-rl" / "test_metrics.json").read_text())["checkpoint"] == rl
    prompt = ["--domain", "code", "--prompt", "Find the bug in this Python function ..."]
    assert main(["route", "--checkpoint", "artifacts/router-rl", *prompt]) == 0
    out = capsys.readouterr()
    assert said in out.err and json.loads(out.out)["worker"] in ("math-expert", "code-expert", "general-expert")
    assert main(["ask", "--checkpoint", "artifacts/router-rl", *WORKERS, *prompt]) == 0
    out = capsys.readouterr()
    assert said in out.err and '"served_by"' in out.out
    served = []
    monkeypatch.setattr(serve_module, "serve", lambda source, *a, **k: served.append(Path(source)))
    assert main(["serve", "--checkpoint", "artifacts/router-rl", *WORKERS, "--port", "0"]) == 0
    assert said in capsys.readouterr().err and served == [Path(rl)]
    assert sft != rl


def test_a_taken_port_is_said_before_anything_loads(tmp_path, monkeypatch, capsys):
    import socket

    import fugu_pipeline.serve as serve_module

    monkeypatch.setattr(serve_module, "serve", lambda *a, **k: pytest.fail("serve() ran on a port that is taken"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", "--workers", str(REPO / "configs" / "workers.mock.yaml"), "--models-dir",
                     str(tmp_path / "models"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and err.count("\n") == 1


def test_the_pipeline_from_the_wrong_folder_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a project\n")
    assert main(["pipeline", "--encoder", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path} is not a fugu_pipeline project" in err and "--project-dir" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no history/, schedules/, lock
    assert "DAGSTER_HOME" not in os.environ


def test_the_pipeline_checks_its_workers_and_encoder_before_any_call(tmp_path, monkeypatch, capsys):
    from fugu_pipeline_tests.conftest import new_project

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    project = new_project(tmp_path / "p")
    before = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    t0 = time.monotonic()
    assert main(["pipeline", "--project-dir", str(project), "--encoder", str(tmp_path / "no-such-encoder")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-encoder" in err and "does not exist" in err
    assert main(["pipeline", "--project-dir", str(project), "--encoder", "tiny", "--workers", "configs/nope.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "configs/nope.yaml" in err
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == before  # nothing collected, nothing written
    print(f"both refused in {time.monotonic() - t0:.1f}s")


def test_the_pipeline_takes_the_flag_its_broken_king_message_names():
    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.cli.pipeline import asset_config

    args = build_parser().parse_args(["pipeline", "--replace-broken-king", "--layer-sets", "-1"])
    config = asset_config(args)
    assert {k: v.get("replace_broken_king") for k, v in config.items()} == {
        "router_heads": None, "promoted_router": True, "eval_report_triage": True, "eval_report_roles": True}
    assert asset_config(build_parser().parse_args(["pipeline"])) == {}
