"""The hash-chained cost ledger and the signed packs: every paid call of collection is one line
holding the previous line's hash; any edit, drop or reorder is named by its line; several
processes append to one chain; a receipt cites the ledger's head and totals, which preflight
recomputes; a pack's signature covers every file and names a key the host accepts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from fugu_pipeline.collect.partition import collect_partition
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.ledger import GENESIS, CostLedger, LedgerError, read_entries, verify_ledger
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.train.signing import (
    SIGNATURE_FILE,
    AcceptedKeys,
    AcceptedKey,
    SigningError,
    accept_key,
    new_key_pair,
    sign_pack,
    verify_pack,
)
from fugu_pipeline.workers.config import load_workers_config

from .conftest import REPO


def book(path, n: int = 5):
    with CostLedger(path) as ledger:
        for i in range(n):
            ledger.append("collection", 0.001 * (i + 1), worker_id="w", task_id=f"t{i}", ref="b")
    return path


def test_every_line_holds_the_previous_hash_and_an_edit_is_named_by_its_line(tmp_path):
    path = book(tmp_path / "costs.jsonl")
    entries = read_entries(path)
    assert entries[0].prev == GENESIS and all(b.prev == a.hash for a, b in zip(entries, entries[1:]))
    s = verify_ledger(path)
    assert s.lines == 5 and s.head == entries[-1].hash and s.totals["collection"].calls == 5
    assert s.totals["collection"].cost_usd == pytest.approx(0.015)
    lines = path.read_text().splitlines()

    edited = json.loads(lines[2])
    edited["cost_usd"] = 12.0  # a line's cost changed after the fact
    (tmp_path / "edited.jsonl").write_text("\n".join([*lines[:2], json.dumps(edited), *lines[3:]]) + "\n")
    with pytest.raises(LedgerError, match="line 3: its hash does not match its content"):
        verify_ledger(tmp_path / "edited.jsonl")
    (tmp_path / "dropped.jsonl").write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(LedgerError, match="line 2: seq 3, expected 2"):
        verify_ledger(tmp_path / "dropped.jsonl")
    (tmp_path / "swapped.jsonl").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    with pytest.raises(LedgerError, match="line 1"):
        verify_ledger(tmp_path / "swapped.jsonl")


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path):
    path = book(tmp_path / "costs.jsonl", 3)
    with open(path, "ab") as f:
        f.write(b'{"seq": 4, "at": 1.0, "kind": "coll')  # a crash mid-write
    assert verify_ledger(path).lines == 3  # not a line yet
    with CostLedger(path) as ledger:
        e = ledger.append("judge", 0.0002, task_id="t9")
    assert e.seq == 4 and verify_ledger(path).lines == 4


def test_two_processes_append_to_one_chain(tmp_path):
    path = tmp_path / "costs.jsonl"
    code = ("import sys; from fugu_pipeline.ledger import CostLedger\n"
            "with CostLedger(sys.argv[1]) as l:\n"
            "    for i in range(150): l.append('collection', 0.001, worker_id=sys.argv[2], task_id=str(i))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), w], cwd=REPO) for w in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    s = verify_ledger(path)
    assert s.lines == 300 and s.totals["collection"].calls == 300


def test_collection_appends_every_paid_call(tmp_path):
    config = load_workers_config(REPO / "configs" / "workers.mock.yaml")
    tasks = load_tasks(REPO / "data" / "benchgen" / "sample.jsonl")[:20]
    store = ResponseStore(tmp_path / "responses")
    with CostLedger(tmp_path / "costs.jsonl") as ledger:
        stats = asyncio.run(collect_partition(tasks, "b", "math-expert", config, store, ledger=ledger))
        again = asyncio.run(collect_partition(tasks, "b", "math-expert", config, store, ledger=ledger))  # nothing to call
    s = verify_ledger(tmp_path / "costs.jsonl")
    recs = store.read("b", "math-expert")
    assert stats.n_called == 20 and again.n_called == 0 and s.totals["collection"].calls == 20
    assert s.totals["collection"].cost_usd == pytest.approx(sum(r.cost_usd for r in recs.values()))
    judged = sum(1 for r in recs.values() if r.judge_cost_usd)  # llm_judge tasks: one grading call each
    assert (s.totals["judge"].calls if "judge" in s.totals else 0) == judged


def test_a_pack_is_signed_over_every_file_by_a_key_the_host_accepts(tmp_path):
    private, public = new_key_pair()
    folder = tmp_path / "pack"
    folder.mkdir()
    for name in ("a.json", "b.bin"):
        (folder / name).write_bytes(name.encode() * 10)
    sign_pack(folder, ["a.json", "b.bin"], private)
    keys = AcceptedKeys(keys={"alice": AcceptedKey(public_key=public)})
    name, fp = verify_pack(folder, ["a.json", "b.bin"], keys)
    assert name == "alice" and len(fp) == 16
    with pytest.raises(SigningError, match="which this host does not accept"):
        verify_pack(folder, ["a.json", "b.bin"], AcceptedKeys())
    (folder / "b.bin").write_bytes(b"other")
    with pytest.raises(SigningError, match="b.bin changed after signing"):
        verify_pack(folder, ["a.json", "b.bin"], keys)
    sign_pack(folder, ["a.json", "b.bin"], private)
    sig = json.loads((folder / SIGNATURE_FILE).read_text())
    other_private, other_public = new_key_pair()
    sig["public_key"] = other_public  # claim another key for the same signature
    (folder / SIGNATURE_FILE).write_text(json.dumps(sig))
    with pytest.raises(SigningError, match="does not verify"):
        verify_pack(folder, ["a.json", "b.bin"], keys)
    (folder / SIGNATURE_FILE).unlink()
    with pytest.raises(SigningError, match="unsigned pack"):
        verify_pack(folder, ["a.json", "b.bin"], keys)
    accept_key(tmp_path / "models", "alice", public)
    with pytest.raises(SigningError, match="already accepted as 'alice'"):
        accept_key(tmp_path / "models", "alice2", public)


def test_a_batch_of_lines_is_one_chain_with_the_lines_before_and_after(tmp_path):
    path = book(tmp_path / "costs.jsonl", 2)
    with CostLedger(path) as ledger:
        out = ledger.append_many([("session", 0.002, "w", f"t{i}", "s") for i in range(300)])
        ledger.append("live", 0.001)
    assert [e.seq for e in out][:2] == [3, 4] and verify_ledger(path).lines == 303
    assert verify_ledger(path).totals["session"].calls == 300


def test_a_call_abandoned_in_flight_is_counted_once_at_its_worst_case(tmp_path):
    """A task cancelled while its call is in flight (`abandon`): the call is counted at its worst case
    at once; a paying thread that finishes after it adds nothing, an abandon after a pay adds
    nothing, and a call never announced (a mock's) is not counted."""
    line = ("live", 0.5, "w", "t1", "live")
    with CostLedger(tmp_path / "costs.jsonl") as book:
        first = book.begin("live", worker_id="w", task_id="t1", ref="live", worst_usd=0.5)
        assert len(book.abandon(first, line)) == 1
        assert book.pay(first, [("live", 0.01, "w", "t1", "live")]) == []  # the thread that paid it, late
        second = book.begin("live", worker_id="w", task_id="t2", ref="live", worst_usd=0.5)
        book.pay(second, [("live", 0.01, "w", "t2", "live")])
        assert book.abandon(second, ("live", 0.5, "w", "t2", "live")) == []
        free = book.begin("live", announce=False)
        assert book.abandon(free, line) == []
    entries = read_entries(tmp_path / "costs.jsonl")
    assert [(e.task_id, e.cost_usd, e.worst_case) for e in entries] == [("t1", 0.5, True), ("t2", 0.01, False)]
    with CostLedger(tmp_path / "costs.jsonl") as book:
        assert book.settle_in_flight() == []  # nothing left in flight to count again
