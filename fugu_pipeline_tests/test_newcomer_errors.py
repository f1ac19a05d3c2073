"""What a new user meets first, each said in one line naming the file or port and what to do: a cap
no cascade point meets (with a cap that does), a missing worker file, a `.jsonl` given as the
worker file, a worker without `kind:`, a port already in use, a worker file that lacks the
workers the checkpoint routes to. Through the command line's entry point, in-process."""

from __future__ import annotations

import logging
import re
import socket

import pytest
import yaml

from fugu_pipeline.cli import main
from fugu_pipeline.testing.serving import WORKERS


@pytest.fixture(scope="module")
def cascade(tmp_path_factory):
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint

    root = tmp_path_factory.mktemp("newcomer")
    return build_cascade_checkpoint(root / "models", root / "emb")


@pytest.fixture
def here(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workers.yaml").write_text(yaml.safe_dump({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]}))
    (tmp_path / "R.jsonl").write_text('{"task_id": "t0", "prompt": "hi", "domain": "math", "worker_ids": ["a"], '
                                      '"quality": [1.0]}\n{"task_id": "t1", "prompt": "ho", "domain": "math", '
                                      '"worker_ids": ["a"], "quality": [0.0]}\n')
    (tmp_path / "nokind.yaml").write_text("workers:\n  - id: fast\n    model: m\n")
    capsys.readouterr()
    return tmp_path


def one_line(capsys, argv: list[str], rc: int = 2) -> str:
    assert main(argv) == rc
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_cap_no_cascade_point_meets_says_the_cap_once_and_one_that_works(cascade, capsys):
    """Before: `cap cap 1% of the strongest worker's cost ...; raise the cap` (to what, it did not say)."""
    route = ["route", "--checkpoint", str(cascade), "--device", "cpu", "--prompt", "What is 3 + 4?"]
    line = one_line(capsys, [*route, "--cap", "share=0.01"])
    assert line.startswith("fugu-lite route: cap 1% of the strongest worker's cost") and "cap cap" not in line, line
    share = re.search(r"a share of at least ([0-9.]+)", line)
    usd = re.search(r"or \$([0-9.]+) per 1,000 requests$", line)
    assert share and usd, line
    assert main([*route, "--cap", f"share={share.group(1)}"]) == 0  # the cap it names is met
    assert main([*route, "--cap", f"usd_per_1k={usd.group(1)}"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("command", ["ask", "serve"])
def test_a_missing_worker_file_names_it_and_the_files_to_pass(here, capsys, command):
    line = one_line(capsys, [command, "--workers", "configs/workers.yaml", "--models-dir", "nowhere",
                             *(["--prompt", "hi"] if command == "ask" else ["--port", "0"])])
    assert line.startswith(f"fugu-lite {command}: configs/workers.yaml: worker config not found; "), line
    assert "configs/workers.mock.yaml is the offline mock pool" in line and "workers.openrouter.example.yaml" in line


def test_a_jsonl_given_as_the_worker_file_is_named_as_such(here, capsys):
    """Before: a 4-line PyYAML error (`expected '<document start>' ...` with an excerpt of the file)."""
    line = one_line(capsys, ["ask", "--workers", "R.jsonl", "--models-dir", "nowhere", "--prompt", "hi"])
    assert line.startswith("fugu-lite ask: R.jsonl: a JSON Lines file, not a YAML worker config; give a worker YAML"), line


def test_broken_yaml_is_one_line_with_its_line_and_column(here, capsys):
    (here / "broken.yaml").write_text("workers:\n  - id: a\n    model: [\n")
    line = one_line(capsys, ["ask", "--workers", "broken.yaml", "--models-dir", "nowhere", "--prompt", "hi"])
    assert line.startswith("fugu-lite ask: broken.yaml:4:1: not valid YAML (") and "correct the file there" in line, line


def test_a_worker_without_kind_is_told_to_add_it(here, capsys):
    """Before: `field 'workers[0]': Unable to extract tag using discriminator 'kind'`."""
    line = one_line(capsys, ["ask", "--workers", "nokind.yaml", "--models-dir", "nowhere", "--prompt", "hi"])
    assert line == ("fugu-lite ask: nokind.yaml: field 'workers[0]' (id 'fast'): no `kind:` given; add `kind:` with one "
                    "of the known kinds (mock, openrouter, openai_compatible)"), line
    (here / "badkind.yaml").write_text("workers:\n  - id: fast\n    kind: mok\n")
    line = one_line(capsys, ["ask", "--workers", "badkind.yaml", "--models-dir", "nowhere", "--prompt", "hi"])
    assert "(id 'fast'): `kind: mok` is not a known kind; use one of 'mock', 'openrouter', 'openai_compatible'" in line


def test_a_port_in_use_is_said_before_the_server_is_announced(here, cascade, capsys, caplog):
    """Before: `fugu-lite serving ... on http://127.0.0.1:PORT/v1` was logged, then uvicorn's bind error (4
    lines) and exit 3."""
    caplog.set_level(logging.INFO)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(capsys, ["serve", "--checkpoint", str(cascade), "--workers", "workers.yaml", "--device", "cpu",
                                 "--port", str(port)])
    assert line.startswith(f"fugu-lite serve: port {port} on 127.0.0.1 is in use"), line
    assert "nothing was served" in line and "--port" in line, line
    assert not [r for r in caplog.records if "serving" in r.getMessage()]


def test_a_worker_file_without_the_routed_workers_is_one_line(here, cascade, capsys):
    """Before: a ValueError traceback from the app (the demo's checkpoint served with the real workers' file)."""
    (here / "other.yaml").write_text(yaml.safe_dump({"workers": [{"id": "fast-cheap", "kind": "mock"}]}))
    line = one_line(capsys, ["serve", "--checkpoint", str(cascade), "--workers", "other.yaml", "--device", "cpu",
                             "--port", "0"])
    assert line.startswith("fugu-lite serve: other.yaml: checkpoint ") and "does not define" in line, line
    assert "train a router on these workers" in line
