"""`fugu-lite sample-data`: the offline routing sample the routing pages run on."""

import csv
import json
import shutil

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.matrix.import_format import read_reward_jsonl
from fugu_pipeline_tests.conftest import REPO, short_training


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    (tmp_path / "data" / "benchgen").mkdir(parents=True)
    shutil.copy(REPO / "data" / "benchgen" / "sample.jsonl", tmp_path / "data" / "benchgen" / "sample.jsonl")
    return short_training(tmp_path)


@pytest.mark.slow
def test_sample_data_writes_routing_rows_with_replies_that_import_and_train(workdir, capsys):
    assert main(["sample-data", "--limit", "120"]) == 0  # the defaults: the mock pool over the shipped sample
    out = workdir / "data" / "sample"
    printed = capsys.readouterr().out
    assert "synthetic" in printed and "wrote 120 tasks x 3 workers" in printed
    rows = read_reward_jsonl(out / "routing.jsonl")
    assert len(rows) == 120
    assert {r.domain for r in rows} == {"math", "code", "general"}
    assert {r.split for r in rows} == {"train", "val", "test"}
    assert {"number", "text"} <= {r.answer_kind for r in rows}
    for r in rows:
        assert r.answers and all(isinstance(a, str) and a for a in r.answers)  # every worker's reply
        assert r.answer_kind in ("number", "code", "text", None)  # None: a judged task, read by detection
        assert len(r.quality) == len(r.cost_usd) == len(r.latency_s) == len(r.rewards) == 3
        assert all(c > 0 for c in r.cost_usd) and all(0.0 <= q <= 1.0 for q in r.quality)
    assert (out / "workers.yaml").read_text() == (workdir / "configs" / "workers.mock.yaml").read_text()

    # the same sample as a wide and a long table: `import` reads them back to the same quality matrix
    by_id = {r.task_id: r for r in rows}
    assert main(["import", "table", str(out / "scores.csv"), "--output", "t.jsonl", "--id-column", "task_id",
                 "--domain-column", "domain", "--split-column", "split", "--cost-column", "{worker}|cost_usd",
                 "--answer-column", "{worker}|answer"]) == 0
    assert main(["import", "long", str(out / "calls.csv"), "--output", "l.jsonl", "--id-column", "task_id",
                 "--worker-column", "worker", "--score-column", "quality", "--domain-column", "domain",
                 "--split-column", "split", "--cost-column", "cost_usd", "--latency-column", "latency_s",
                 "--answer-column", "answer"]) == 0
    for name in ("t.jsonl", "l.jsonl"):
        back = read_reward_jsonl(workdir / name)
        assert len(back) == 120
        for b in back:
            r = by_id[b.task_id]
            assert dict(zip(b.worker_ids, b.quality)) == dict(zip(r.worker_ids, r.quality))
            assert dict(zip(b.worker_ids, b.answers)) == dict(zip(r.worker_ids, r.answers))
            assert b.split == r.split and b.domain == r.domain

    # it trains: the head set and, since the rows hold replies, the cascade
    capsys.readouterr()
    assert main(["train", "--data", str(out / "routing.jsonl"), "--workers", str(out / "workers.yaml"), "--encoder", "tiny",
                 "--device", "cpu", "--output", "models"]) == 0
    text = capsys.readouterr().out
    assert "cascade" in text
    ckpt = workdir / text.strip().splitlines()[-1]
    assert json.loads((ckpt / "manifest.json").read_text())


def test_sample_data_refuses_to_overwrite_and_to_call_real_workers(workdir, capsys):
    assert main(["sample-data", "--limit", "30"]) == 0
    before = (workdir / "data" / "sample" / "routing.jsonl").read_bytes()
    assert main(["sample-data", "--limit", "20"]) == 2
    assert "already holds routing.jsonl" in capsys.readouterr().err
    assert (workdir / "data" / "sample" / "routing.jsonl").read_bytes() == before  # nothing lost
    assert main(["sample-data", "--limit", "20", "--force"]) == 0
    with open(workdir / "data" / "sample" / "calls.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == 20 * 3
    assert main(["sample-data", "--workers", "configs/workers.openrouter.example.yaml", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "not mock worker(s)" in err and "fugu-lite generate" in err and not (workdir / "x").exists()
