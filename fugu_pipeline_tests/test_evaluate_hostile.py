"""Degenerate and hostile data on the command line's training and evaluation paths, as users meet
them: out-of-range numeric flags, a --data path that is not a regular file, a held-out split of one
row. Each bad input is one line (exit 2, no traceback) naming the flag or file; degenerate but valid
data gets figures that say where they are undefined instead of a zero-width interval."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline.cli import main


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch):
    """These commands name the shipped configs as typed (`configs/train_sft.yaml`), from the checkout."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])


def reward_jsonl(path: Path, n: int = 30, workers=("a", "b", "c"), splits=None, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            split = splits[i] if splits else ("test" if i % 3 == 0 else "train")
            f.write(json.dumps({"task_id": f"t{i}", "prompt": f"question {i} {'x' * (i % 5)}", "domain": ["math", "code"][i % 2],
                                "split": split, "worker_ids": list(workers),
                                "rewards": [round(rng.random(), 3) for _ in workers]}) + "\n")
    return path


def one_line_exit_2(capsys, argv, *needles, progress: bool = False):
    """Exit 2 and one line of error (after the progress lines a command prints, with `progress`)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    if progress:
        err = err.splitlines()[-1]
        assert err.startswith(f"fugu-lite {argv[0]}: "), err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(("flag", "value"), [("--seeds", "0"), ("--seeds", "-3"), ("--repeats", "0"),
                                             ("--repeats", "-1"), ("--seeds", "100000000")])
def test_baseline_counts_out_of_range_name_the_flag(tmp_path, capsys, flag, value):
    # before: --seeds 0 / --repeats 0 -> IndexError from np.percentile of nothing, --seeds -3 ->
    # "negative dimensions are not allowed", --seeds 1e8 -> a (1e8 x N) route array, killed for memory
    data = reward_jsonl(tmp_path / "r.jsonl")
    one_line_exit_2(capsys, ["baseline", "all", "--data", str(data), "--work-dir", str(tmp_path / "wd"), flag, value], flag)


@pytest.mark.parametrize(("flags", "needle"), [(["--max-length", "-5"], "--max-length"),
                                               (["--token-position", "5"], "--token-position"),
                                               (["--template", "no prompt here"], "--template")])
def test_train_sft_encoder_flags_out_of_range_are_one_line(tmp_path, capsys, flags, needle):
    # before: pydantic's ValidationError of EncoderSettings as a traceback
    data = reward_jsonl(tmp_path / "r.jsonl")
    one_line_exit_2(capsys, ["train-sft", "--config", "configs/train_sft.yaml", "--data", str(data), "--encoder", "tiny",
                             "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "cache"),
                             "--output", str(tmp_path / "models"), *flags], needle)
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("folds", ["0", "1"])
def test_train_folds_out_of_range_is_one_line(tmp_path, capsys, folds):
    # before: TrainSetConfig's ValidationError as a traceback
    data = reward_jsonl(tmp_path / "r.jsonl")
    one_line_exit_2(capsys, ["train", "--data", str(data), "--encoder", "tiny", "--work-dir", str(tmp_path / "wd"),
                             "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "models"),
                             "--folds", folds], "--folds")


def test_data_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    # before: a FIFO named *.duckdb was opened by DuckDB, which blocked forever waiting for a writer
    fifo = tmp_path / "matrix.duckdb"
    os.mkfifo(fifo)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", main(["baseline", "all", "--data", str(fifo)])), daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "wb"):
            pass
        pytest.fail("a FIFO given as --data blocked the command")
    assert result["rc"] == 2
    err = capsys.readouterr().err.strip()
    assert str(fifo) in err and "not a regular file" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("name", ["folder", "folder.duckdb", "folder.jsonl"])
def test_data_that_is_a_folder_says_so(tmp_path, capsys, name):
    # before: "file not found" (a .jsonl folder) or "damaged ... rebuild it" (a .duckdb folder)
    (tmp_path / name).mkdir()
    one_line_exit_2(capsys, ["baseline", "all", "--data", str(tmp_path / name)], "is a folder")


def test_one_held_out_row_has_no_interval_and_no_cross_fit(tmp_path):
    from fugu_pipeline.evaluate.baselines import baseline_lines, baseline_rows
    from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report, summary_line

    U = np.array([[0.1, 0.9, 0.3]])
    rep = evaluation_report(EvalInputs(worker_ids=["a", "b", "c"], utility=U, scores=np.array([[0.0, 1.0, 0.0]]),
                                       train_utility=np.array([[0.5, 0.1, 0.2], [0.6, 0.2, 0.1]])))
    ci = rep["router_minus_best_fixed"]
    assert ci["mean"] == pytest.approx(0.8) and ci["low"] is None and ci["high"] is None and "1 row" in ci["note"]
    line = summary_line(rep)
    assert "+0.8000 [+0.8000, +0.8000]" not in line and "no interval" in line, line
    b = baseline_rows(["a", "b", "c"], U, router={"utility": 0.9})
    cf = b["utility"]["cross_fit_oracle"]
    # before: the mean over workers (random routing's expectation) stood in, with a zero-width interval
    assert cf["mean"] is None and "1 row" in cf["note"]
    assert b["utility"]["headroom"] is None and b["utility"]["router_share_of_headroom"] is None
    text = "\n".join(baseline_lines(b))
    assert "cross-fit oracle" in text and "undefined" in text and "nan" not in text.lower(), text
    json.dumps(b, allow_nan=False)


@pytest.mark.parametrize("workers", [("x", "y", "z"), tuple(f"w{i}" for i in range(200))], ids=["renamed", "200"])
def test_a_warm_start_over_other_workers_is_refused_in_one_line(tmp_path, capsys, workers):
    # before: 200 workers -> torch's "size mismatch for linear.weight" traceback; three renamed workers ->
    # trained silently, the checkpoint's column for `a` now meaning `x`
    common = ["--encoder", "tiny", "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "cache")]
    sft = tmp_path / "sft"
    assert main(["train-sft", "--config", "configs/train_sft.yaml", "--data", str(reward_jsonl(tmp_path / "abc.jsonl")),
                 *common, "--output", str(sft)]) == 0
    capsys.readouterr()
    other = reward_jsonl(tmp_path / "other.jsonl", workers=workers)
    one_line_exit_2(capsys, ["train-rl", "--config", "configs/train_rl.yaml", "--data", str(other), *common,
                             "--checkpoint", str(sft), "--output", str(tmp_path / "rl")], "['a', 'b', 'c']", progress=True)
    assert not (tmp_path / "rl").exists()


def test_two_workers_with_the_same_mean_have_no_apgr_rather_than_zero(tmp_path):
    # before: PGR's 0/0 was taken as 0, "APGR 0.000 CPT50 never" (worse than random routing's 0.5)
    from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report, summary_line
    from fugu_pipeline.evaluate.plots import plot_report

    U = np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [1.0, 1.0]])
    rep = evaluation_report(EvalInputs(worker_ids=["a", "b"], utility=U, scores=np.array([[1.0, 0.0]] * 4),
                                       train_utility=np.array([[0.2, 0.8], [0.3, 0.1]])))
    assert rep["apgr"]["apgr"] is None and "no gap" in rep["apgr"]["note"]
    line = summary_line(rep)
    assert "APGR 0.000" not in line and "APGR undefined" in line, line
    plot_report(rep, tmp_path)  # no curve to draw, and no KeyError for it
    json.dumps(rep, allow_nan=False)


def test_training_output_that_is_a_file_is_refused_before_training(tmp_path, capsys):
    # before: NotADirectoryError as a traceback, after the whole fit
    out = tmp_path / "models"
    out.write_text("keep me\n")
    data = reward_jsonl(tmp_path / "r.jsonl")
    common = ["--data", str(data), "--encoder", "tiny", "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "c")]
    one_line_exit_2(capsys, ["train-sft", "--config", "configs/train_sft.yaml", *common, "--output", str(out)], "is a file")
    one_line_exit_2(capsys, ["train", *common, "--output", str(out)], "is a file")
    assert out.read_text() == "keep me\n"
    assert not (tmp_path / "wd").exists()  # refused before the matrix was built


def test_evaluate_output_never_replaces_the_checkpoints_own_files(tmp_path, capsys):
    # before: --output <checkpoint>/manifest.json wrote the report over the manifest (the checkpoint no
    # longer loaded), and --output report.txt wrote report.json
    data = reward_jsonl(tmp_path / "r.jsonl")
    common = ["--data", str(data), "--encoder", "tiny", "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "c")]
    assert main(["train-sft", "--config", "configs/train_sft.yaml", *common, "--output", str(tmp_path / "m")]) == 0
    ckpt = Path(capsys.readouterr().out.strip().splitlines()[-1])
    before = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
    ev = ["evaluate", "--checkpoint", str(ckpt), *common, "--models-dir", str(tmp_path / "none")]
    for name in ("manifest.json", "budget.json"):
        one_line_exit_2(capsys, [*ev, "--output", str(ckpt / name)], "checkpoint's own folder")
    one_line_exit_2(capsys, [*ev, "--output", str(tmp_path / "report.txt")], "ending in .json")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()} == before
    assert main([*ev, "--output", str(tmp_path / "report.json")]) == 0
    assert (tmp_path / "report.json").is_file()


@pytest.mark.parametrize("flag", ["--work-dir", "--cache-dir"])
def test_a_work_or_cache_dir_that_is_a_file_is_one_line(tmp_path, capsys, flag):
    # before: FileExistsError / NotADirectoryError as a traceback
    spot = tmp_path / "spot"
    spot.write_text("keep me\n")
    dirs = {"--work-dir": str(tmp_path / "wd"), "--cache-dir": str(tmp_path / "c"), flag: str(spot)}
    one_line_exit_2(capsys, ["train-sft", "--config", "configs/train_sft.yaml", "--data", str(reward_jsonl(tmp_path / "r.jsonl")),
                             "--encoder", "tiny", *[x for kv in dirs.items() for x in kv], "--output", str(tmp_path / "m")], flag)
    assert spot.read_text() == "keep me\n"


def test_evaluate_on_data_without_training_rows_says_why(tmp_path, capsys):
    # before: "no training rows to fit the expected cost on" (a budget error, for data without costs), or
    # "cannot carve a validation split from 0 training row(s)", neither saying what to do
    common = ["--encoder", "tiny", "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "c")]
    assert main(["train-sft", "--config", "configs/train_sft.yaml", "--data", str(reward_jsonl(tmp_path / "r.jsonl")),
                 *common, "--output", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    splits = ["val" if i % 4 == 0 else "test" for i in range(30)]
    held = reward_jsonl(tmp_path / "held.jsonl", splits=splits)
    ev = ["evaluate", "--checkpoint", str(tmp_path / "m"), *common, "--models-dir", str(tmp_path / "none")]
    one_line_exit_2(capsys, [*ev, "--data", str(held)], "'train' split has no rows", "training rows", progress=True)
    only_test = reward_jsonl(tmp_path / "test.jsonl", splits=["test"] * 30)
    one_line_exit_2(capsys, [*ev, "--data", str(only_test)], "split 'train'", progress=True)


@pytest.mark.parametrize("n_domains", [1, 2, 3])
def test_leave_one_domain_out_needs_four_domains_and_says_so(n_domains):
    # before: one domain -> "the 'train' split has no rows (counts: 0, 0, 0)" after numpy's mean-of-empty
    # warning; two or three -> "objective 'lodo' needs at least 3 domains ..., got ['y']", about the inner set
    from fugu_pipeline.policies.oneshot.lodo import leave_one_domain_out
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline_tests.test_heads_selection import make_data

    d = make_data(n=60)
    d = dataclasses.replace(d, domains=[f"d{i % n_domains}" for i in range(len(d.domains))])
    with pytest.raises(TrainingDataError, match=f"at least 4 domains .*this data has {n_domains}"):
        leave_one_domain_out(d, TrainSetConfig())


def test_a_split_emptied_by_a_workers_missing_cells_names_the_worker(tmp_path, capsys):
    # before: "the 'test' split has no rows ...: hold some out with `fugu-lite import jsonl --test-fraction`"
    # (evaluate), advice for another problem: the 10 test rows were there, each lacking worker b's reward
    import duckdb

    wd = tmp_path / "wd"
    assert main(["baseline", "all", "--data", str(reward_jsonl(tmp_path / "r.jsonl")), "--work-dir", str(wd)]) == 0
    db = next(wd.glob("*.duckdb"))
    holes = tmp_path / "holes.duckdb"
    holes.write_bytes(db.read_bytes())
    with duckdb.connect(str(holes)) as con:
        con.execute("DELETE FROM rewards WHERE position = 1 AND task_id IN (SELECT task_id FROM tasks WHERE split = 'test')")
    capsys.readouterr()
    one_line_exit_2(capsys, ["baseline", "all", "--data", str(holes)], "10 row(s) all lack a worker's reward", "b has 20 of 30")


def test_triage_report_output_never_replaces_the_heads_own_files(tmp_path, capsys):
    rng = random.Random(3)
    with open(tmp_path / "q.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"task_id": f"t{i}", "prompt": f"{['math', 'code'][i % 2]} question {i}",
                                "domain": ["math", "code"][i % 2], "split": ["train", "train", "test"][i % 3],
                                "worker_ids": ["a", "b"], "quality": [float(rng.random() < 0.4), float(rng.random() < 0.7)]}) + "\n")
    (tmp_path / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    common = ["--data", str(tmp_path / "q.jsonl"), "--workers", str(tmp_path / "w.yaml"), "--encoder", "tiny",
              "--work-dir", str(tmp_path / "wd"), "--cache-dir", str(tmp_path / "c")]
    assert main(["train-triage", *common, "--output", str(tmp_path / "m")]) == 0
    head = Path(capsys.readouterr().out.strip().splitlines()[-1])
    before = {p.name: p.read_bytes() for p in head.iterdir() if p.is_file()}
    for name in ("manifest.json", "report.txt"):
        one_line_exit_2(capsys, ["triage-report", "--checkpoint", str(head), *common, "--output", str(head / name)], "--output")
    assert {p.name: p.read_bytes() for p in head.iterdir() if p.is_file()} == before


def test_odd_domain_names_print_one_row_each_and_stay_apart(capsys):
    # before: '' and ' ' both printed blank, and 'line\nbreak' broke its row in two
    from fugu_pipeline.cli.reporting import print_groups

    names = ["", " ", "line\nbreak", "d" * 5000, "math"]
    rep = {"best_fixed_worker": "a", "per_domain": [{"domain": d, "n": 1, "router": 0.5, "best_fixed": 0.5, "oracle": 1.0}
                                                   for d in names]}
    print_groups(rep)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(names), lines
    assert lines[2].split()[0] == "''" and lines[3].strip().startswith("' '"), lines
    assert lines[4].strip().startswith("'line\\nbreak'"), lines
    assert all(len(line) < 100 for line in lines), lines


@pytest.mark.parametrize("case", ["tasks folder", "models dir a file", "project dir a file"])
def test_a_path_of_the_wrong_kind_is_one_line_naming_it(tmp_path, capsys, case):
    # before: IsADirectoryError / NotADirectoryError tracebacks from the file reads under these flags
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder\n")
    argv, needles = {
        "tasks folder": (["generate", "--workers", "configs/workers.mock.yaml", "--tasks", str(tmp_path),
                          "--output", str(tmp_path / "out.jsonl")], [str(tmp_path), "a folder, not a batch file"]),
        "models dir a file": (["route", "--models-dir", str(a_file), "--prompt", "hi"],
                              [str(a_file), "a file, not a models folder"]),
        "project dir a file": (["evaluate-roles", "--project-dir", str(a_file)],
                               [str(a_file), "a folder on its path is a file"]),
    }[case]
    one_line_exit_2(capsys, argv, *needles)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("how", ["flag", "config"])
def test_a_negative_seed_is_one_line_naming_it(tmp_path, capsys, how):
    # before: "ValueError: expected non-negative integer" from numpy's first draw, a traceback
    data = reward_jsonl(tmp_path / "r.jsonl")
    if how == "flag":
        argv, needle = ["train", "--data", str(data), "--output", str(tmp_path / "m"), "--seed", "-1"], "--seed"
    else:
        cfg = tmp_path / "sft.yaml"
        cfg.write_text("seed: -1\n")
        argv, needle = ["train-sft", "--config", str(cfg), "--data", str(data), "--output", str(tmp_path / "m")], "seed"
    one_line_exit_2(capsys, [*argv, "--encoder", "tiny", "--work-dir", str(tmp_path / "wd")], needle, "greater than or equal to 0",
                    progress=True)
    assert not (tmp_path / "m").exists()
