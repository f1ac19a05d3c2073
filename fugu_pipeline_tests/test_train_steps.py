"""`fugu-lite train-sft` (and the other stages) run the step the assets run (`steps/oneshot.py`):
the same config rule (the file named, else the project's `configs/train_<method>.yaml`, else the
built-in defaults), content-addressed (the same data, settings and code: the checkpoint kept, nothing
trained), and a config file edited while the stage trains fails it in one line with nothing recorded."""

import contextlib
import io
import json
import random
from pathlib import Path

import pytest

from fugu_pipeline.cli import main

WORKERS = ["a", "b", "c"]


def rows(n: int = 150) -> list[dict]:
    rng = random.Random(1)
    words = "solve compute integral matrix python list prove derivative train hours value sum".split()
    out = []
    for i in range(n):
        d = ("math", "code")[i % 2]
        q = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
        hard = "integral" in q or "prove" in q
        out.append({"task_id": f"t{i:03d}", "prompt": q, "domain": d, "worker_ids": WORKERS,
                    "rewards": [0.0 if hard else 0.9, 0.2 if hard and d == "math" else 0.8, 0.7],
                    "split": ("train", "train", "train", "val", "test")[i % 5]})
    return out


@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "train_sft.yaml").write_text("epochs: 4\n")  # the project's file, as the asset reads it
    monkeypatch.chdir(tmp_path)
    return tmp_path


def train_sft(*extra) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train-sft", "--data", "r.jsonl", "--encoder", "tiny", "--device", "cpu", "--cache-dir", "emb",
                     "--work-dir", "imports", "--output", "models", *extra])
    return code, out.getvalue(), err.getvalue()


def counting(monkeypatch) -> list[int]:
    import fugu_pipeline.policies.oneshot.sft as sft

    calls, real = [], sft.train_sft
    monkeypatch.setattr(sft, "train_sft", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    return calls


@pytest.mark.slow  # the built-in defaults: 100 epochs
def test_train_sft_reads_the_projects_config_file_or_else_the_built_in_defaults_like_the_asset(work):
    code, out, err = train_sft()
    assert code == 0, err
    manifest = json.loads((Path(out.strip().splitlines()[-1]) / "manifest.json").read_text())
    assert manifest["training_config"]["epochs"] == 4  # configs/train_sft.yaml
    (work / "configs" / "train_sft.yaml").unlink()  # no file: the defaults (before: "config file not found")
    code, out, err = train_sft()
    assert code == 0, err
    from fugu_pipeline.policies.oneshot.configs import SFTConfig

    manifest = json.loads((Path(out.strip().splitlines()[-1]) / "manifest.json").read_text())
    assert manifest["training_config"]["epochs"] == SFTConfig().epochs


def test_train_sft_twice_on_the_same_data_trains_once(work, monkeypatch):
    calls = counting(monkeypatch)
    first = train_sft()
    again = train_sft()
    assert first[0] == again[0] == 0, again[2]
    assert len(calls) == 1, "trained twice on the same data, settings and code"
    assert first[1].strip().splitlines()[-1] == again[1].strip().splitlines()[-1]  # the same checkpoint
    assert "nothing trained" in again[1]
    (work / "configs" / "train_sft.yaml").write_text("epochs: 5\n")  # a setting changed: trained again
    assert train_sft()[0] == 0 and len(calls) == 2


def test_a_config_edited_while_the_stage_trains_fails_in_one_line_and_records_nothing(work, monkeypatch):
    import fugu_pipeline.policies.oneshot.sft as sft

    real = sft.train_sft

    def edits_its_config(*a, **kw):
        result = real(*a, **kw)
        (work / "configs" / "train_sft.yaml").write_text("epochs: 9\n")  # someone saves the file meanwhile
        return result

    monkeypatch.setattr(sft, "train_sft", edits_its_config)
    code, out, err = train_sft()
    assert code != 0
    said = [line for line in err.splitlines() if "changed while this step ran" in line]
    assert len(said) == 1 and "configs/train_sft.yaml" in said[0] and "run the step again" in said[0], err
    assert not list((work / "models").glob(".steps/sft/*/record.json"))  # nothing recorded
    assert not list((work / "models").glob("sft/*/manifest.json"))  # nor saved
