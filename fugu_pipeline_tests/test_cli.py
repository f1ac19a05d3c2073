"""The fugu-lite command chain on the mock pool and the tiny encoder: generate -> train -> evaluate -> route."""

import json
import shutil

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO, short_training


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return short_training(tmp_path)  # the chain, not the shipped training lengths, is under test


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
    # each worker's reply is kept beside its quality, so the file can train a cascade too
    assert all(len(r["answers"]) == 3 and all(isinstance(a, str) and a for a in r["answers"]) for r in rows)
    capsys.readouterr()

    # rows that carry quality and no rewards: the utility needs the weights of a reward: block, never silent defaults
    (workdir / "q.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "rewards"}) + "\n" for r in rows))
    assert main(["train-sft", "--data", "q.jsonl", "--encoder", "tiny", "--device", "cpu"]) == 2
    assert "pass --workers W.yaml" in capsys.readouterr().err
    W = ["--workers", "configs/workers.mock.yaml"]
    assert main(["train-sft", "--data", "r.jsonl", *W, "--encoder", "tiny", "--device", "cpu"]) == 0
    sft = last_line(capsys)
    assert sft.startswith("models/sft/")
    assert main(["train-rl", "--data", "r.jsonl", *W, "--checkpoint", sft, "--device", "cpu"]) == 0
    rl = last_line(capsys)
    assert main(["evaluate", "--checkpoint", rl, "--data", "r.jsonl", *W, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "router" in out and "best fixed" in out
    assert "U = 1·Q − 0.1·min(C/$0.01, 5) − 0.05·min(L/10s, 5)" in out
    assert "the reward: block of configs/workers.mock.yaml" in out
    report = json.loads((workdir / rl / "reports" / "test.json").read_text())
    assert report["router_utility"] > report["best_fixed_utility"]
    assert main(["route", "--checkpoint", rl, "--prompt", "What is 2 + 40?", "--domain", "math", "--device", "cpu"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["worker"] in rows[0]["worker_ids"] and abs(sum(decision["probabilities"].values()) - 1) < 1e-5


@pytest.mark.slow
def test_the_seed_chain_sft_rl_es_evaluate_through_output_folders(workdir, capsys):
    """The seed README's chain: each --checkpoint is the --output folder of the step before."""
    tasks = str(REPO / "data" / "benchgen" / "sample.jsonl")
    W = ["--workers", "configs/workers.mock.yaml"]
    assert main(["generate", *W, "--tasks", tasks, "--output", "r.jsonl"]) == 0
    common = ["--data", "r.jsonl", *W, "--device", "cpu"]
    capsys.readouterr()
    assert main(["train-sft", *common, "--encoder", "tiny", "--output", "artifacts/router-sft"]) == 0
    sft = last_line(capsys)
    assert sft.startswith("artifacts/router-sft/sft/")
    printed = {"sft": sft}
    for method, before in (("rl", "sft"), ("es", "rl")):
        start = f"artifacts/router-{before}"
        assert main([f"train-{method}", *common, "--checkpoint", start, "--output", f"artifacts/router-{method}"]) == 0
        out = capsys.readouterr()
        printed[method] = out.out.strip().splitlines()[-1]
        assert printed[method].startswith(f"artifacts/router-{method}/{method}/")
        assert f"warm start: {printed[before]}\n" in out.err  # the folder resolved to the one checkpoint in it
    assert main(["evaluate", "--checkpoint", "artifacts/router-es", *common, "--output", "artifacts/router-es/test_metrics.json"]) == 0
    report = json.loads((workdir / "artifacts" / "router-es" / "test_metrics.json").read_text())
    assert report["checkpoint"] == printed["es"] and report["method"] == "es"
    assert report["router_utility"] > report["best_fixed_utility"]
    # the printed path works as well as the folder
    assert main(["evaluate", "--checkpoint", printed["rl"], *common]) == 0
    assert (workdir / printed["rl"] / "reports" / "test.json").exists()
    # a folder with two checkpoints is its latest, the one the last training command wrote; none is a clear error
    (workdir / "other_seed.yaml").write_text("seed: 7\nepochs: 3\n")
    assert main(["train-sft", *common, "--encoder", "tiny", "--config", "other_seed.yaml", "--output", "artifacts/router-sft"]) == 0
    newest = last_line(capsys)
    assert newest != sft
    assert main(["route", "--checkpoint", "artifacts/router-sft", "--prompt", "What is 2 + 2?", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert f"its latest checkpoint, {newest} (written by fugu-lite train-sft at " in err and "of 2 there" in err
    assert main(["train-rl", *common, "--checkpoint", "artifacts/nothing-here", "--output", "x"]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_user_errors_are_one_line_not_tracebacks(workdir, capsys):
    (workdir / "bad.jsonl").write_text('{"task_id": "t1", "prompt": \n')
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", "bad.jsonl", "--output", "o.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: malformed JSON" in err and "Traceback" not in err
    assert main(["route", "--prompt", "hi", "--models-dir", "nowhere"]) == 2
    assert "no promoted router" in capsys.readouterr().err
    # a flag of the wrong type: one line naming it (argparse printed its whole usage block first)
    with pytest.raises(SystemExit) as stop:
        main(["route", "--prompt", "hi", "--budget-share", "half"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err == ["fugu-lite route: error: argument --budget-share: invalid float value: "
                                            "'half' (`fugu-lite route --help` lists the flags)"]
    assert main([]) == 2 and "usage: fugu-lite" in capsys.readouterr().err  # no command at all: the list of them


def reward_rows(n: int = 12) -> list[dict]:
    return [{"task_id": f"t{i}", "prompt": f"What is {i} + 1?", "domain": "math",
             "split": ("train", "val", "test")[i % 3], "worker_ids": ["a", "b"],
             "quality": [float(i % 2), 1.0 - i % 2], "cost_usd": [0.001, 0.004], "latency_s": [1.0, 2.5]}
            for i in range(n)]


def test_import_jsonl_through_the_command_line(workdir, capsys):
    src = workdir / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in reward_rows()))
    assert main(["import", "jsonl", str(src), "--output", "out.jsonl"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "jsonl" and summary["rows"] == 12 and summary["splits"] == {"test": 4, "train": 4, "val": 4}
    assert [json.loads(x) for x in (workdir / "out.jsonl").read_text().splitlines()] == reward_rows()
    # a seed alone draws nothing (every row keeps the split it names): a one-line error
    assert main(["import", "jsonl", str(src), "--output", "o2.jsonl", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert "keeps it" in err and "Traceback" not in err and not (workdir / "o2.jsonl").exists()


def test_import_jsonl_workers_keeps_the_named_workers_of_every_row(workdir, capsys):
    """`import jsonl --workers` writes the matrix with only the named workers, every per-worker field
    cut alike, in the file's order; a name the file lacks, or one worker, is one line naming the
    file, and nothing is written."""
    rows = [{**r, "worker_ids": ["a", "b", "c"], "quality": [1.0, 0.0, 0.5], "cost_usd": [0.001, 0.004, 0.002],
             "latency_s": [1.0, 2.5, 1.5], "answers": ["ra", "rb", None]} for r in reward_rows()]
    src = workdir / "three.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["import", "jsonl", str(src), "--output", "two.jsonl", "--workers", "c, a"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers_left_out"] == ["b"] and summary["rows"] == 12
    got = [json.loads(x) for x in (workdir / "two.jsonl").read_text().splitlines()]
    assert {tuple(r["worker_ids"]) for r in got} == {("a", "c")}
    assert got[0]["quality"] == [1.0, 0.5] and got[0]["cost_usd"] == [0.001, 0.002]
    assert got[0]["latency_s"] == [1.0, 1.5] and got[0]["answers"] == ["ra", None]
    assert [r["task_id"] for r in got] == [r["task_id"] for r in rows] and got[3]["split"] == rows[3]["split"]
    for bad, why in (("a,z", "worker 'z' is not among the file's workers (a, b, c) (--workers"),
                     ("a", "1 worker(s) named; routing needs at least 2")):
        assert main(["import", "jsonl", str(src), "--output", "bad.jsonl", "--workers", bad]) == 2
        err = capsys.readouterr().err
        assert "three.jsonl" in err and why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (workdir / "bad.jsonl").exists()
    assert main(["import", "dcrouter", str(workdir), "--output", "bad.jsonl", "--workers", "a,c"]) == 2
    assert "--workers is an option of `fugu-lite import table` and `import long` and `import jsonl`" in capsys.readouterr().err


def test_a_jsonl_without_splits_gets_them_drawn_on_import_and_evaluate_says_what_is_missing(workdir, capsys):
    """Someone's own routing data, converted without a `split` field: every row is train. Training
    says nothing is held out; `evaluate` names the fix instead of a traceback; `import jsonl
    --test-fraction` draws splits for the rows that name none (and keeps those that do)."""
    rows = [{k: v for k, v in r.items() if k != "split"} for r in reward_rows(60)]
    rows[0]["split"] = "train"  # names its split: kept, whatever the draw
    src = workdir / "mine.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--workers", "configs/reward.quality.yaml", "--encoder", "tiny"]
    assert main(["train", "--data", str(src), *common, "--output", "models", "--layer-sets", "off"]) == 0
    out, err = capsys.readouterr()
    assert "has no test rows, so nothing is held out" in err and "--test-fraction 0.3" in err
    ckpt = out.strip().splitlines()[-1]
    assert main(["evaluate", "--checkpoint", ckpt, "--data", str(src), *common]) == 2
    err = capsys.readouterr().err
    assert "the 'test' split has no rows" in err and "--test-fraction 0.3" in err and "Traceback" not in err

    for bad in (["--test-fraction", "0.7", "--val-fraction", "0.4"], ["--test-fraction", "1.5"]):
        assert main(["import", "jsonl", str(src), "--output", "bad.jsonl", *bad]) == 2
        assert "Traceback" not in capsys.readouterr().err and not (workdir / "bad.jsonl").exists()
    assert main(["import", "jsonl", str(src), "--output", "drawn.jsonl", "--test-fraction", "0.3", "--seed", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits_drawn"].startswith("59 of 60 rows had no 'split' field")
    got = [json.loads(x) for x in (workdir / "drawn.jsonl").read_text().splitlines()]
    assert got[0]["split"] == "train" and {r["split"] for r in got} == {"train", "val", "test"}
    assert summary["splits"]["test"] == sum(r["split"] == "test" for r in got) > 0
    again = workdir / "again.jsonl"
    assert main(["import", "jsonl", str(src), "--output", str(again), "--test-fraction", "0.3", "--seed", "1"]) == 0
    capsys.readouterr()
    assert again.read_text() == (workdir / "drawn.jsonl").read_text()  # the draw is a function of (seed, task id)
    assert main(["train", "--data", "drawn.jsonl", *common, "--output", "models", "--layer-sets", "off"]) == 0
    assert "has no test rows" not in capsys.readouterr().err


def test_pipeline_with_a_missing_project_directory_says_so(tmp_path, capsys):
    from fugu_pipeline.cli import main as cli_main

    missing = tmp_path / "not-a-clone"
    assert cli_main(["pipeline", "--encoder", "tiny", "--project-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"project directory {missing} does not exist" in err and "clone of the repository" in err
    assert not missing.exists()
