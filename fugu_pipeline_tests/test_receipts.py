"""Receipts a submitter cannot invent: every cost-ledger line is signed by the host's collector key,
so a ledger written from scratch, or a genuine one edited with its hashes recomputed, is refused
by the contest in one line naming the file and the line; a genuine ledger passes. A garbage or
torn last line is cut on the next write with a warning and collection goes on; a kill at any
instant loses at most the write in flight."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

import pytest

from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.preflight import preflight
from fugu_pipeline.ledger import GENESIS, CostLedger, LedgerEntry, LedgerError, verify_ledger
from fugu_pipeline.train.exchange import LEDGER_COPY, pack
from fugu_pipeline.train.signing import accept_key, new_key_pair
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.harness_data import controlled_data, routing_head

ALICE = new_key_pair()
GATES = GateConfig(rate_limit_s=0)


def rechain(rows: list[dict]) -> bytes:
    """Ledger lines from `rows` with seq, prev and hash recomputed by the ledger's own code: what a
    submitter who read ledger.py writes (a signature, if any, is kept as it was)."""
    out, prev = [], GENESIS
    for n, row in enumerate(rows, start=1):
        e = LedgerEntry.model_validate({**row, "seq": n, "prev": prev, "hash": ""})
        e.hash = prev = e.digest()
        out.append(json.dumps({**row, **e.model_dump(mode="json", include={"seq", "prev", "hash"})}))
    return ("\n".join(out) + "\n").encode()


def judged(tmp_path, ledger):
    """Pack a head with `ledger` (signed by alice, whom the host accepts) and run the host's gates."""
    data = controlled_data(n_test=200)
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    accept_key(models, "alice", ALICE[1])
    ckpt = routing_head(tmp_path / "elsewhere", data, (0, 1, 2), method="es", cost=0.5)
    p = pack(ckpt, tmp_path / "pack", submitter="alice", ledger=ledger, signing_key=ALICE[0])
    result = preflight(p, models, GATES)
    return p, {g.name: g for g in result.gates}


def genuine(path, n: int = 5, cost: float = 0.1):
    with CostLedger(path) as book:
        for i in range(n):
            book.append("collection", cost, worker_id="w0", task_id=f"t{i:05d}", ref="b")
    return path


def test_a_ledger_written_from_scratch_is_refused_naming_the_file_and_line(tmp_path):
    rows = [{"at": 1.0 + i, "kind": "collection", "worker_id": "w0", "task_id": f"t{i:05d}", "ref": "b", "cost_usd": 0.1}
            for i in range(5)]
    (tmp_path / "scratch.jsonl").write_bytes(rechain(rows))
    assert verify_ledger(tmp_path / "scratch.jsonl").lines == 5  # the chain itself holds: it was computed
    p, gates = judged(tmp_path, tmp_path / "scratch.jsonl")
    print(f"\n{gates['ledger'].line()}")
    assert not gates["ledger"].ok and "\n" not in gates["ledger"].reason
    assert gates["ledger"].reason.startswith(f"{p / LEDGER_COPY} line 1: not signed by a collector")
    assert not gates["receipt"].ok and "its cost ledger cannot be verified" in gates["receipt"].reason


def test_a_ledger_signed_by_the_submitters_own_collector_key_is_refused(tmp_path, monkeypatch):
    from fugu_pipeline.collector_key import KEY_ENV, load_collector_key, new_private_key

    monkeypatch.setenv(KEY_ENV, new_private_key())  # the submitter runs a collector of their own
    mine = load_collector_key()
    genuine(tmp_path / "own.jsonl")
    monkeypatch.delenv(KEY_ENV)  # the host: its own key (the test session's key file)
    assert load_collector_key(create=True).fingerprint != mine.fingerprint
    p, gates = judged(tmp_path, tmp_path / "own.jsonl")
    print(f"\n{gates['ledger'].line()}")
    assert gates["ledger"].reason == (f"{p / LEDGER_COPY} line 1: signed by collector key {mine.fingerprint}, which this "
                                      "host does not trust (fugu-lite collector-key --trust NAME PUBLIC_KEY adds one)")


def test_a_genuine_ledger_edited_and_rehashed_is_refused_naming_the_line(tmp_path):
    path = genuine(tmp_path / "costs.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[2]["cost_usd"] = 12.0  # an invented cost on line 3, every hash after it recomputed
    (tmp_path / "edited.jsonl").write_bytes(rechain(rows))
    assert verify_ledger(tmp_path / "edited.jsonl").totals["collection"].cost_usd == pytest.approx(12.4)  # chain holds
    p, gates = judged(tmp_path, tmp_path / "edited.jsonl")
    print(f"\n{gates['ledger'].line()}")
    assert not gates["ledger"].ok
    assert gates["ledger"].reason.startswith(f"{p / LEDGER_COPY} line 3: its signature by collector key ")
    assert gates["ledger"].reason.endswith("does not verify (the line was edited or forged after it was written)")


def test_a_genuine_ledger_is_accepted_and_a_rotated_key_still_vouches_for_its_lines(tmp_path, monkeypatch):
    from fugu_pipeline.collector_key import KEY_FILE_ENV, rotate_key_file, trust_key, trusted_keys

    path = genuine(tmp_path / "costs.jsonl")
    p, gates = judged(tmp_path, path)
    assert gates["ledger"].ok and gates["receipt"].ok, (gates["ledger"].line(), gates["receipt"].line())
    assert "every line signed by a collector this host trusts: 5 line(s)" in gates["ledger"].reason

    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "host" / "collector.key"))  # a host of its own, then a rotation
    genuine(tmp_path / "rotated.jsonl", 2)
    old, new = rotate_key_file()
    genuine(tmp_path / "rotated.jsonl", 2)
    models = tmp_path / "models"
    with pytest.raises(LedgerError, match=f"line 1: signed by collector key {old.fingerprint}, which this host does not"):
        verify_ledger(tmp_path / "rotated.jsonl", trusted_keys(models))
    trust_key(models, "before-rotation", old.public_key)
    assert verify_ledger(tmp_path / "rotated.jsonl", trusted_keys(models)).lines == 4
    assert old.public_key not in (tmp_path / "rotated.jsonl").read_text()  # a line carries a fingerprint only


def test_a_garbage_last_line_is_cut_on_the_next_write_with_a_warning(tmp_path, caplog):
    path = genuine(tmp_path / "costs.jsonl", 3)
    at, garbage = path.stat().st_size, b"\x00\x00 not json at all\n"  # a complete last line that is not an entry
    with open(path, "ab") as f:
        f.write(garbage)
    with caplog.at_level(logging.WARNING, logger="fugu_pipeline.ledger"), CostLedger(path) as book:
        e = book.append("judge", 0.0002, task_id="t9")  # collection goes on
    assert e.seq == 4 and verify_ledger(path).lines == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: cut a last line that is not a ledger entry ({len(garbage)} bytes at byte {at}) before appending"]

    with open(path, "ab") as f:
        f.write(b"{broken}\n" + b'{"seq": 5, "at": 1.0, "ki')  # garbage, then a write cut off mid-way
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fugu_pipeline.ledger"), CostLedger(path) as book:
        book.append("collection", 0.01)
    assert verify_ledger(path).lines == 5 and len(caplog.records) == 2
    assert "torn last line" in caplog.records[0].getMessage() and "not a ledger entry" in caplog.records[1].getMessage()


def test_a_file_that_is_not_a_ledger_is_left_whole(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"a note {i}\n" for i in range(40)))
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="lines are not ledger entries: not a cost ledger \\(nothing cut\\)"):
        with CostLedger(path) as book:
            book.append("collection", 0.01)
    assert path.read_bytes() == before


def test_a_kill_at_any_instant_loses_at_most_the_line_in_flight(tmp_path):
    path = tmp_path / "costs.jsonl"
    code = ("import sys; from fugu_pipeline.ledger import CostLedger\n"
            "with CostLedger(sys.argv[1]) as l:\n"
            "    for i in range(100000):\n"
            "        e = l.append('collection', 0.001, task_id=str(i)); print(e.seq, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    done = 0
    for line in proc.stdout:
        done = int(line)
        if done >= 200:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with CostLedger(path) as book:
        e = book.append("judge", 0.0001)
    s = verify_ledger(path)
    assert s.lines == e.seq and e.seq - 1 >= done  # every finished append kept, one chain after the kill
