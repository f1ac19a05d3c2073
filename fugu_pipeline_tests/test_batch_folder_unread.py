"""The commands that do not collect batches never read the project's batch folder (`data/benchgen/`):
a broken file there does not stop `evaluate --data R.jsonl`, `train`, `route`, `ask`, `import`,
`baseline`, `validate`'s live term or a served request. Every file the commands open or list is
watched (Python's audit hook), so a read that happens to succeed is caught too. The project's own
reward matrix is the one case that reads the folder (its tasks come from there); a batch the matrix
refused is left out of the live term with a note, as the matrix leaves it out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO, SHORT_TRAIN, new_project

READS: list[str] | None = None  # the paths opened or listed while a command runs (None: not watching)
AUDITED = {"open", "os.listdir", "os.scandir", "glob.glob"}


def _hook(event: str, args: tuple) -> None:
    if READS is not None and event in AUDITED and args and isinstance(args[0], (str, bytes, os.PathLike)):
        READS.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)  # a hook cannot be removed: it records only while `watched` runs


def watched(folder: Path, argv: list[str]) -> tuple[int, list[str]]:
    """main(argv), and the paths under `folder` it opened or listed."""
    global READS
    READS = []
    try:
        rc = main(argv)
    finally:
        seen, READS = READS, None
    inside = str(folder.resolve())
    return rc, [p for p in seen if os.path.abspath(p).startswith(inside)]


BROKEN = '{"task_id": "x1", "prompt": \n'


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    """A project whose batch folder holds the sample and a broken file, a reward JSONL generated from
    60 sample tasks kept outside that folder, and an SFT checkpoint trained on it."""
    root = new_project(tmp_path_factory.mktemp("unread"))
    (root / "configs" / "train_sft.yaml").write_text(SHORT_TRAIN["train_sft.yaml"])
    (root / "data" / "benchgen" / "broken.jsonl").write_text(BROKEN)
    (root / "tasks.jsonl").write_text("".join(
        line + "\n" for line in (REPO / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:60]))
    old = Path.cwd()
    os.chdir(root)
    try:
        w = ["--workers", "configs/workers.mock.yaml"]
        assert main(["generate", *w, "--tasks", "tasks.jsonl", "--output", "R.jsonl"]) == 0
        assert main(["train-sft", "--data", "R.jsonl", *w, "--encoder", "tiny", "--device", "cpu"]) == 0
    finally:
        os.chdir(old)
    return root


@pytest.fixture
def here(proj, monkeypatch, capsys):
    monkeypatch.chdir(proj)
    capsys.readouterr()
    return proj


def checkpoint(proj: Path) -> str:
    return str(next((proj / "models" / "sft").iterdir()))


W = ["--workers", "configs/workers.mock.yaml"]


def test_evaluate_on_a_reward_file_does_not_read_the_batch_folder(here, capsys):
    """Before: exit 2, `data/benchgen/broken.jsonl: 1 problem(s) ...` (the live term's default tasks)."""
    rc, reads = watched(here / "data" / "benchgen", ["evaluate", "--checkpoint", checkpoint(here), "--data", "R.jsonl", *W])
    err = capsys.readouterr().err
    assert rc == 0 and reads == [], (rc, reads, err[-2000:])
    assert "broken.jsonl" not in err
    note = next(line for line in err.splitlines() if line.startswith("live term: not measured"))
    assert "--tasks" in note and "R.jsonl" in note and "data/reward_matrix.duckdb" in note, note


@pytest.mark.parametrize("argv", [
    ["baseline", "all", "--data", "R.jsonl", *W],
    ["import", "jsonl", "R.jsonl", "--output", "imported.jsonl"],
    ["route", "--checkpoint", "CKPT", "--prompt", "What is 2 + 2?", "--device", "cpu", *W],
    ["ask", "--checkpoint", "CKPT", "--prompt", "What is 2 + 2?", "--device", "cpu", *W],
], ids=lambda a: a[0])
def test_commands_without_batches_do_not_read_the_batch_folder(here, capsys, argv):
    argv = [checkpoint(here) if a == "CKPT" else a for a in argv]
    rc, reads = watched(here / "data" / "benchgen", argv)
    assert rc == 0 and reads == [], (rc, reads, capsys.readouterr().err[-2000:])


def test_train_does_not_read_the_batch_folder(here, capsys):
    (here / "configs" / "one.yaml").write_text("folds: 2\nheads:\n  domain_prior: {m: [20]}\n  knn: {k: [10]}\n"
                                               "cascade:\n  enabled: 'off'\nfeatures:\n  layer_sets: 'off'\n"
                                               "  prompt_rules: 'off'\n")
    rc, reads = watched(here / "data" / "benchgen", ["train", "--config", "configs/one.yaml", "--data", "R.jsonl", *W,
                                                     "--encoder", "tiny", "--device", "cpu", "--output", "trained"])
    assert rc == 0 and reads == [], (rc, reads, capsys.readouterr().err[-2000:])


def test_validate_live_term_reads_the_folder_only_for_the_projects_matrix(here, capsys):
    """`validate` (and `evaluate`) take the live term's tasks from the batch folder only when the data
    is the project's own matrix; then a batch file the matrix refused is left out with a note."""
    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.cli.reporting import live_for

    def args(data):
        return build_parser().parse_args(["validate", "--challenger", "pack", "--data", data, *W])

    global READS
    READS = []
    try:
        assert live_for(args("R.jsonl"), None) == (None, None)
    finally:
        seen, READS = READS, None
    assert not [p for p in seen if "benchgen" in p], seen
    live, tasks = live_for(args("data/reward_matrix.duckdb"), None)
    assert live is not None and len(tasks) == 300  # the sample's tasks; the broken file left out
    err = capsys.readouterr().err
    assert "live term: " in err and "broken.jsonl left out" in err and "malformed JSON" in err, err


def test_a_served_request_does_not_read_the_batch_folder(here):
    from starlette.testclient import TestClient

    from fugu_pipeline.serve.app import create_app
    from fugu_pipeline.serve.run import providers

    global READS
    READS = []
    try:
        provider, roles, absent = providers(checkpoint(here), device="cpu")
        app = create_app(provider, "configs/workers.mock.yaml", roles=roles, absent=absent)
        with TestClient(app, base_url="http://127.0.0.1") as client:  # a name the server answers
            r = client.post("/v1/chat/completions", json={"model": "fugu-lite",
                                                           "messages": [{"role": "user", "content": "What is 2 + 2?"}]})
    finally:
        seen, READS = READS, None
    assert r.status_code == 200, r.text
    inside = str((here / "data" / "benchgen").resolve())
    assert not [p for p in seen if os.path.abspath(p).startswith(inside)]


def test_the_pipelines_live_term_leaves_out_a_batch_the_matrix_left_out(proj, caplog):
    """The evaluation reports' live term reads the batch folder (the pipeline's matrix comes from it):
    a batch file that cannot be loaded is left out, as the reward matrix leaves it out. Before: every
    `eval_report_*` step failed on it (`fugu-lite pipeline` stopped with exit 2 after training, nothing
    evaluated or promoted)."""
    from fugu_pipeline.defs.harness import live_for
    from fugu_pipeline.defs.resources import PipelineResource

    live, tasks = live_for(PipelineResource(project_dir=str(proj), workers_config="configs/workers.mock.yaml"))
    assert live is not None and len(tasks) == 300  # the sample's tasks
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == ["live term: batch file left out as the matrix leaves it out: broken.jsonl:1: malformed JSON: "
                    "Expecting value at column 29"], said


def test_the_coordinators_tasks_leave_out_a_batch_the_matrix_left_out(proj):
    """`router_roles`, `eval_report_roles`, `evaluate-roles` and `validate` of a coordinator take the
    project's graded tasks (`project_tasks`): a batch file that cannot be loaded is left out and
    named, as the matrix leaves it out. Before: each stopped on it."""
    from fugu_pipeline.policies.coordinator.project import project_tasks
    from fugu_pipeline.tasks.loading import TaskFileError

    refused: list = []
    tasks = project_tasks(proj / "data" / "benchgen", None, refused)
    assert len(tasks) == 300 and [exc.path.name for exc in refused] == ["broken.jsonl"]
    assert refused[0].first_problem() == "broken.jsonl:1: malformed JSON: Expecting value at column 29"
    with pytest.raises(TaskFileError):  # without the list: the caller asked for every batch
        project_tasks(proj / "data" / "benchgen", None)
