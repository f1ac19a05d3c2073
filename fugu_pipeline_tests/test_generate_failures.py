"""`fugu-lite generate` with failed cells: it writes the complete rows, then names every failed cell
(task, worker, what went wrong: the first ten, then how many more) and exits 3, a status of its own
(2 is a usage error)."""

from __future__ import annotations

import yaml

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO

SAMPLE = REPO / "data" / "benchgen" / "sample.jsonl"


def test_failed_cells_are_named_and_the_exit_status_is_3(tmp_path, capsys):
    workers = tmp_path / "w.yaml"
    workers.write_text(yaml.safe_dump({"workers": [{"id": "good", "kind": "mock"},
                                                   {"id": "flaky", "kind": "mock", "mock": {"fail_rate": 0.6}}]}))
    args = ["generate", "--workers", str(workers), "--tasks", str(SAMPLE), "--limit", "18", "--output",
            str(tmp_path / "r.jsonl"), "--ledger", str(tmp_path / "costs.jsonl")]
    assert main(args) == 3
    err = capsys.readouterr().err.splitlines()
    at = next(i for i, line in enumerate(err) if " cells failed (exit status 3)" in line)
    n = int(err[at].split("generate: ")[1].split()[0])
    assert err[at] == (f"fugu-lite generate: {n} of 36 cells failed (exit status 3); run the same command with "
                       "--resume to call them again:")
    named = err[at + 1:at + 11]
    assert n > 10 and all(line.startswith("  ") and " x " in line for line in named)
    assert "  math-0000 x flaky: mock worker flaky" in named
    assert err[at + 11] == f"  and {n - 10} more" and len(err) == at + 12
    assert (tmp_path / "r.jsonl").exists()  # the complete rows are written all the same
