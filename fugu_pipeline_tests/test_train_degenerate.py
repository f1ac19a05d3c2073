"""Edges of a real user's inputs for training: configs/train.yaml values the heads cannot use, a YAML
that names a key twice, and BenchGen batch files saved with a BOM. Each is refused (or read) at load,
in one line naming the file and the field, before any encoding or fitting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.tasks.loading import TaskFileError, load_tasks
from fugu_pipeline.policies.oneshot.configs import SFTConfig, TrainSetConfig
from fugu_pipeline.config_files import ConfigError, load_config

# (yaml text, the field the error must name). Before the fix each of these loaded, and the run failed
# after the encoding with a traceback (k: [-5] -> "selected index k out of range" from torch.topk; a
# negative prior weight, dropout 1.5, hidden -3, weight decay -1/NaN -> ValueError from inside the
# heads), or saved nonsense (alpha/m/bonus NaN -> "refusing these weights ... 'alpha': None"), or
# trained an MLP for zero epochs.
BAD_GRIDS = [
    ("heads:\n  knn:\n    k: [-5]\n", "heads.knn.k[0]"),
    ("heads:\n  knn:\n    k: [30, 0]\n", "heads.knn.k[1]"),
    ("heads:\n  knn:\n    prior_weight: [-100]\n", "heads.knn.prior_weight[0]"),
    ("heads:\n  knn:\n    same_domain_bonus: [.nan]\n", "heads.knn.same_domain_bonus[0]"),
    ("heads:\n  knn:\n    temperature: [0]\n", "heads.knn.temperature[0]"),
    ("heads:\n  domain_prior:\n    m: [-1]\n", "heads.domain_prior.m[0]"),
    ("heads:\n  domain_prior:\n    m: [.nan]\n", "heads.domain_prior.m[0]"),
    ("heads:\n  ridge:\n    alpha: [.nan]\n", "heads.ridge.alpha[0]"),
    ("heads:\n  ridge:\n    alpha: [.inf]\n", "heads.ridge.alpha[0]"),
    ("heads:\n  mlp:\n    epochs: [0]\n", "heads.mlp.epochs[0]"),
    ("heads:\n  mlp:\n    hidden: [-3]\n", "heads.mlp.hidden[0]"),
    ("heads:\n  mlp:\n    dropout: [1.5]\n", "heads.mlp.dropout[0]"),
    ("heads:\n  mlp:\n    weight_decay: [-1]\n", "heads.mlp.weight_decay[0]"),
    ("heads:\n  mlp:\n    weight_decay: [.nan]\n", "heads.mlp.weight_decay[0]"),
    ("heads:\n  sft:\n    lr: [.nan]\n", "heads.sft.lr[0]"),
    ("heads:\n  sft:\n    lr: [-1]\n", "heads.sft.lr[0]"),
]


@pytest.mark.parametrize(("text", "field"), BAD_GRIDS, ids=[f for _, f in BAD_GRIDS])
def test_train_yaml_refuses_values_the_heads_cannot_use_at_load(tmp_path: Path, text: str, field: str):
    p = tmp_path / "train.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(p, TrainSetConfig)
    msg = str(ei.value)
    assert str(p) in msg and f"'{field}'" in msg and "\n" not in msg, msg


def test_stage_configs_refuse_an_infinite_learning_rate(tmp_path: Path):
    p = tmp_path / "train_sft.yaml"
    p.write_text("lr: .inf\n")
    with pytest.raises(ConfigError, match=r"train_sft\.yaml: field 'lr'"):
        load_config(p, SFTConfig)


def test_a_key_named_twice_is_refused_not_silently_the_last(tmp_path: Path):
    # PyYAML kept the last `seed` silently: the run trained with seed 1 while the file's first line said 0
    p = tmp_path / "train.yaml"
    p.write_text("seed: 0\nfolds: 5\nseed: 1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, TrainSetConfig)
    msg = str(ei.value)
    assert str(p) in msg and "'seed' appears twice" in msg and "line 3" in msg and "\n" not in msg, msg


def test_fugu_lite_train_refuses_a_bad_grid_in_one_line_before_encoding(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rows = [{"task_id": f"t{i}", "prompt": f"question {i}", "domain": "math", "split": "test" if i % 4 == 0 else "train",
             "worker_ids": ["a", "b"], "quality": [float(i % 2), float(i % 3 == 0)]} for i in range(12)]
    Path("R.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    Path("train.yaml").write_text("heads:\n  knn:\n    k: [-5]\n")
    rc = main(["train", "--data", "R.jsonl", "--encoder", "tiny", "--output", "models", "--config", "train.yaml"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and "train.yaml: field 'heads.knn.k[0]'" in err, err
    assert not Path("models").exists() or not any(Path("models").rglob("manifest.json"))


TASK = {"task_id": "a1", "prompt": "What is 2+3?", "domain": "math", "reference_answer": "5",
        "grader": {"type": "numeric"}}


def test_a_batch_file_saved_with_a_bom_loads(tmp_path: Path):
    # Notepad and Excel's "CSV UTF-8" write a BOM; the first line was refused as malformed JSON
    p = tmp_path / "win.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + (json.dumps(TASK) + "\r\n" + json.dumps(dict(TASK, task_id="a2")) + "\r\n").encode())
    assert [t.task_id for t in load_tasks(p)] == ["a1", "a2"]


def test_a_very_long_task_id_is_not_echoed_whole_in_the_error(tmp_path: Path):
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps(dict(TASK, task_id="x" * 5000)) + "\n")
    with pytest.raises(TaskFileError) as ei:
        load_tasks(p)
    msg = str(ei.value)
    assert "task_id" in msg and len(msg) < 1000, len(msg)
