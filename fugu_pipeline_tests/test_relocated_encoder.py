"""A checkpoint trained on a local encoder directory still serves after the directory moves (another
machine, another clone): without --encoder the error names the checkpoint, the missing directory
and the flag; with --encoder the same model loads from its new place and the contract is checked."""

import json
import shutil

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.features.settings import EncoderLoadError
from fugu_pipeline.features.tiny import ensure_tiny_encoder
from fugu_pipeline.route.router import Router
from fugu_pipeline_tests.test_budget_cli import run
from fugu_pipeline_tests.test_ridge_lexical import rows


def test_a_moved_encoder_directory_is_named_and_relocatable(tmp_path, capsys):
    enc = tmp_path / "encoder-here"
    shutil.copytree(ensure_tiny_encoder(), enc)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(48)))
    (tmp_path / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (tmp_path / "heads.yaml").write_text("heads:\n  knn: null\n  ridge: null\n  ensemble: null\n  domain_prior: {m: [5]}\n")
    code, out = run("train", "--data", str(tmp_path / "r.jsonl"), "--workers", str(tmp_path / "w.yaml"), "--device", "cpu",
                    "--cache-dir", str(tmp_path / "emb"), "--work-dir", str(tmp_path / "imports"), "--encoder", str(enc),
                    "--max-length", "16", "--config", str(tmp_path / "heads.yaml"), "--output", str(tmp_path / "models"))
    assert code == 0
    ckpt = out.strip().splitlines()[-1]
    Router.load(ckpt, device="cpu").close()

    moved = tmp_path / "encoder-elsewhere"
    enc.rename(moved)
    with pytest.raises(EncoderLoadError) as err:
        Router.load(ckpt, device="cpu")
    msg = str(err.value)
    assert ckpt in msg and str(enc) in msg and "--encoder" in msg
    router = Router.load(ckpt, device="cpu", encoder=str(moved))
    assert router.route("What is 2 + 2?", "math").worker_id in ("a", "b", "c")
    router.close()
    capsys.readouterr()
    assert main(["route", "--checkpoint", ckpt, "--prompt", "hi", "--device", "cpu"]) != 0
    assert "--encoder" in capsys.readouterr().err
    assert main(["route", "--checkpoint", ckpt, "--prompt", "hi", "--device", "cpu", "--encoder", str(moved)]) == 0
