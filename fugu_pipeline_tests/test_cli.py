"""The fugu-lite command chain on the mock pool and the tiny encoder: generate -> train -> evaluate -> route."""

import json
import shutil

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_generate_train_evaluate_route(workdir, capsys):
    tasks = str(REPO / "data" / "benchgen" / "sample.jsonl")
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl", "--limit", "40"]) == 0
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl"]) == 2  # exists: needs --resume
    assert "add --resume" in capsys.readouterr().err
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl", "--resume"]) == 0
    rows = [json.loads(x) for x in (workdir / "r.jsonl").read_text().splitlines()]
    assert len(rows) == 300 and rows[0]["worker_ids"] == ["math-expert", "code-expert", "general-expert"]
    capsys.readouterr()

    assert main(["train-sft", "--data", "r.jsonl", "--encoder", "tiny", "--device", "cpu"]) == 0
    sft = last_line(capsys)
    assert sft.startswith("models/sft/")
    assert main(["train-rl", "--data", "r.jsonl", "--checkpoint", sft, "--device", "cpu"]) == 0
    rl = last_line(capsys)
    assert main(["evaluate", "--checkpoint", rl, "--data", "r.jsonl", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "router" in out and "best fixed" in out
    report = json.loads((workdir / rl / "reports" / "test.json").read_text())
    assert report["router_utility"] > report["best_fixed_utility"]
    assert main(["route", "--checkpoint", rl, "--prompt", "What is 2 + 40?", "--domain", "math", "--device", "cpu"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["worker"] in rows[0]["worker_ids"] and abs(sum(decision["probabilities"].values()) - 1) < 1e-5


def test_user_errors_are_one_line_not_tracebacks(workdir, capsys):
    (workdir / "bad.jsonl").write_text('{"task_id": "t1", "prompt": \n')
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", "bad.jsonl", "--output", "o.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: malformed JSON" in err and "Traceback" not in err
    assert main(["route", "--prompt", "hi", "--models-dir", "nowhere"]) == 2
    assert "no promoted router" in capsys.readouterr().err
