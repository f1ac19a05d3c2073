"""`fugu-lite pipeline` as users run it: a `--stop-after` name it cannot stop after is refused
before anything runs, a batch file with a bad line is left out while the others are collected
(exit status 1 at the end), and two runs started at once on a fresh project: one runs, the other
says in one line that the project is held."""

import subprocess

import dagster as dg
import pytest

from fugu_pipeline.cli.main import main
from fugu_pipeline.defs.runner import DOWNSTREAM
from fugu_pipeline.matrix.read import read_arrays
from fugu_pipeline_tests.conftest import REPO, short_training, task_row, write_jsonl
from fugu_pipeline_tests.scale_project import make_project

FUGU_LITE = str(REPO / ".venv" / "bin" / "fugu-lite")


@pytest.fixture
def proj(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setenv("DAGSTER_HOME", str(project))
    return project


def test_stop_after_refuses_a_name_it_cannot_stop_after_before_anything_runs(proj, capsys):
    """Before: `responses`, `tasks` or a typo ran the whole graph, live calls and promotion included."""
    for name in ("responses", "tasks", "reward_matrx", "openrouter_catalog", "router_roles"):
        assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", name]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--stop-after {name!r}" in err[0] and "nothing was run" in err[0], err
        assert f"Use one of: reward_matrix, {', '.join(DOWNSTREAM)}" in err[0], err
    assert not (proj / "data" / "responses").exists() and not (proj / "storage").exists()  # no step, no instance


@pytest.mark.slow
def test_a_batch_with_a_bad_line_is_left_out_and_the_others_are_collected(proj, capsys):
    """Before: the first failing batch stopped the command, and the batches after it were never
    collected (here the good batch sorts after the bad one)."""
    sample = (proj / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:30]  # 30 tasks show it as well as 300
    write_jsonl(proj / "data" / "benchgen" / "sample.jsonl", sample)
    good = sample[:2]
    (proj / "data" / "benchgen" / "a_bad.jsonl").write_text("\n".join(good) + '\n{"task_id": "x3", "prompt": \n')
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", "reward_matrix"]) == 1
    out, err = capsys.readouterr()
    assert any(line.split()[0] == "tasks[a_bad]" and "LEFT OUT: a_bad.jsonl:3: malformed JSON" in line for line in out.splitlines())
    assert all(f"responses[sample|{w}]" in out for w in ("math-expert", "code-expert", "general-expert"))
    assert not [line for line in err.splitlines() if line.lstrip().startswith(str(proj))]  # no continuation lines
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "batch 'a_bad' left out: a_bad.jsonl:3: malformed JSON" in errors[0], errors
    assert "fix: correct line 3 of a_bad.jsonl" in errors[0] and "1 batch file(s) could not be loaded" in errors[1]
    assert len(read_arrays(proj / "data" / "reward_matrix.duckdb").task_ids) == 30  # the good batch, whole
    with dg.DagsterInstance.from_config(str(proj)) as instance:
        meta = instance.get_latest_materialization_event(dg.AssetKey("reward_matrix")).asset_materialization.metadata
        assert list(meta["refused_batch_files"].value) == ["a_bad.jsonl"]


@pytest.mark.slow
def test_two_pipeline_runs_at_once_on_a_fresh_project(tmp_path):
    """Before: the loser printed a 56-line SQLAlchemy traceback (both created the instance's tables),
    or both wrote the same partitions. Now the first to start holds the project; the other says so
    in one line and exits 2, and a run after them goes on from where the first stopped (the
    partitions the first collected are fresh: skipped)."""
    # ~10 s of calls (3 workers x 3 rounds of 4): the two start together, so the first holds the
    # project for the whole collection while the second, a second or two behind it at most, asks for it
    project = make_project(tmp_path / "project", REPO / "dagster.yaml", sleep_s=1.0)
    write_jsonl(project / "data" / "benchgen" / "b1.jsonl", [task_row(i) for i in range(12)])
    cmd = [FUGU_LITE, "pipeline", "--encoder", "tiny", "--workers", "configs/workers.slow.yaml", "--stop-after", "reward_matrix"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}  # DAGSTER_HOME: the project
    procs = [subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, [o[1][-2000:] for o in outs])
    loser_err = outs[codes.index(2)][1].strip().splitlines()
    assert len(loser_err) == 1 and "another `fugu-lite pipeline` run holds" in loser_err[0], loser_err
    assert "Traceback" not in outs[codes.index(2)][1] and "responses[" not in outs[codes.index(2)][0]
    again = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [line for line in again.stdout.splitlines() if line.strip().startswith("responses[")] and \
        all("skipped, fresh" in line for line in again.stdout.splitlines() if line.strip().startswith("responses["))


@pytest.mark.slow
def test_the_steps_after_the_matrix_share_one_run_and_a_failing_one_is_named(proj, capsys):
    """The steps after the matrix run as one Dagster run (one run per step paid the run's set-up a
    dozen times), each still printing its line as it ends; a step that fails there is named by its
    own asset, and the steps before it are kept."""
    sample = (proj / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:60]
    write_jsonl(proj / "data" / "benchgen" / "sample.jsonl", sample)
    short_training(proj, cascade=False)
    (proj / "configs" / "train_rl.yaml").write_text("epochs: 2\nlearning_rat: 0.1\n")  # a misspelt field
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", "router_rl"]) == 1
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: router_rl failed: ") and "learning_rat" in errors[0], err
    assert errors[0].endswith("run `fugu-lite pipeline` again: it goes on from here"), errors
    for done in ("task_embeddings", "router_sft"):
        assert any(line.split()[0] == done and "done in" in line for line in out.splitlines()), out
    with dg.DagsterInstance.from_config(str(proj)) as instance:
        assert instance.get_latest_materialization_event(dg.AssetKey("router_sft")) is not None  # kept
        runs = instance.get_runs(dg.RunsFilter(tags={"fugu/launched_by": "fugu-lite pipeline"}))
        after_matrix = [r for r in runs if r.asset_selection and dg.AssetKey("task_embeddings") in r.asset_selection]
        assert len(after_matrix) == 1, [sorted(k.to_user_string() for k in r.asset_selection or ()) for r in runs]
        assert {k.to_user_string() for k in after_matrix[0].asset_selection} == {"task_embeddings", "router_sft", "router_rl"}
        assert len(runs) == 1 + 3 + 1 + 1  # the batch, its 3 partitions, the matrix, the rest
