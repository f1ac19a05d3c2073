"""The appender chains only onto a last line it can vouch for: an edited, duplicated or
foreign-signed last line stops the append with one line naming the file, the line and what to do,
and nothing is cut or written; a torn or garbage tail is still cut with a warning. A collector key
file that others may read is refused with the exact `chmod` to run."""

from __future__ import annotations

import json
import logging
import os

import pytest

from fugu_pipeline.collector_key import CollectorKeyError, key_file, load_collector_key, new_private_key
from fugu_pipeline.ledger import CostLedger, LedgerEntry, LedgerError, verify_ledger


def genuine(path, n: int = 3):
    with CostLedger(path) as book:
        for i in range(n):
            book.append("collection", 0.1, worker_id="w0", task_id=f"t{i}", ref="b")
    return path


def refused(path, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=match):
        with CostLedger(path) as book:
            book.append("collection", 0.01, task_id="next")
    assert path.read_bytes() == before  # nothing cut, nothing appended


def test_an_edited_last_line_stops_the_append_naming_the_line(tmp_path):
    path = genuine(tmp_path / "costs.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    last = json.loads(lines[-1])
    last["cost_usd"] = 0.0  # a cheaper call than the one paid
    path.write_bytes(b"".join(lines[:-1]) + json.dumps(last, separators=(",", ":")).encode() + b"\n")
    refused(path, f"^{path} line 3: its hash does not match its content \\(edited after it was written\\): nothing "
                  "appended; restore the ledger from a copy, or move it aside to start a new one$")


def test_a_duplicated_last_line_stops_the_append(tmp_path):
    path = genuine(tmp_path / "costs.jsonl")
    with open(path, "ab") as f:
        f.write(path.read_bytes().splitlines(keepends=True)[-1])
    refused(path, f"^{path} line 4: it does not follow the line before it \\(seq 3 after 3")


def test_a_line_signed_by_another_collector_stops_the_append(tmp_path, monkeypatch):
    path = genuine(tmp_path / "costs.jsonl")
    own = load_collector_key()
    monkeypatch.setenv("FUGU_COLLECTOR_KEY", new_private_key())  # someone else's collector appends a line
    other = load_collector_key()
    monkeypatch.delenv("FUGU_COLLECTOR_KEY")
    last = LedgerEntry.model_validate_json(path.read_bytes().splitlines()[-1])
    e = LedgerEntry(seq=4, at=1.0, kind="collection", task_id="theirs", cost_usd=0.01, prev=last.hash, key=other.fingerprint)
    e.hash = e.digest()
    e.sig = other.sign(e.hash)
    with open(path, "ab") as f:
        f.write(e.model_dump_json().encode() + b"\n")
    foreign = other.fingerprint
    with pytest.raises(LedgerError, match=f"line 4: signed by collector key {foreign}, not this collector's "
                                          f"\\({own.fingerprint}\\) nor one this host trusts: nothing appended; if "
                                          f"{foreign} is this host's older key .* else move the ledger aside"):
        with CostLedger(path) as book:
            book.append("collection", 0.01)


def test_a_torn_or_garbage_tail_is_still_cut_with_a_warning(tmp_path, caplog):
    path = genuine(tmp_path / "costs.jsonl")
    with open(path, "ab") as f:
        f.write(b'{"seq": 4, "garb\n{"seq": 5, "torn')
    with caplog.at_level(logging.WARNING, logger="fugu_pipeline.ledger"), CostLedger(path) as book:
        assert book.append("judge", 0.0002).seq == 4
    assert verify_ledger(path).lines == 4 and len(caplog.records) == 2


def test_a_collector_key_file_others_can_read_is_refused_with_the_chmod_to_run(tmp_path, monkeypatch):
    monkeypatch.delenv("FUGU_COLLECTOR_KEY", raising=False)
    monkeypatch.setenv("FUGU_COLLECTOR_KEY_FILE", str(tmp_path / "my keys" / "collector.key"))
    assert load_collector_key(create=True) is not None  # made 0600
    path = key_file()
    os.chmod(path, 0o644)
    with pytest.raises(CollectorKeyError) as exc:
        CostLedger(tmp_path / "costs.jsonl")
    assert str(exc.value) == (f"{path}: the collector key is readable or writable by others (mode 0644); "
                              f"run: chmod 600 '{path}'")
    os.chmod(path, 0o600)
    assert load_collector_key() is not None
    monkeypatch.setenv("FUGU_COLLECTOR_KEY", new_private_key())  # the environment's key needs no file
    os.chmod(path, 0o644)
    assert load_collector_key().source == "$FUGU_COLLECTOR_KEY"


def test_generate_stops_before_any_call_on_a_ledger_it_cannot_append_to(tmp_path, capsys):
    from fugu_pipeline.cli import main
    from fugu_pipeline_tests.conftest import REPO

    path = genuine(tmp_path / "costs.jsonl")
    with open(path, "ab") as f:
        f.write(path.read_bytes().splitlines(keepends=True)[-1])
    out = tmp_path / "r.jsonl"
    assert main(["generate", "--workers", str(REPO / "configs" / "workers.mock.yaml"), "--tasks",
                 str(REPO / "data" / "benchgen" / "sample.jsonl"), "--limit", "3", "--output", str(out),
                 "--ledger", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"fugu-lite generate: {path} line 4: it does not follow the line before it")
    assert not any(p.stat().st_size for p in (tmp_path / "r.jsonl.responses").rglob("*.jsonl"))  # no cell called
