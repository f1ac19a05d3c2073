"""A pack's small members are read with caps of their own, by streaming: a receipt.json over 1 MiB is
refused before a byte of it is read, a ledger.jsonl is read one line at a time (a line over 4 KiB
is refused after reading no more than that; a file over the member cap is refused unread), and
every refusal is one line (a receipt that does not parse: its first problem, `field: message`).
Read counts, not memory or time, decide these tests."""

from __future__ import annotations

import builtins
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.preflight import preflight
from fugu_pipeline.ledger import CostLedger
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.train.exchange import PACK_FILES, RECEIPT_FILE, pack, pack_ledger, read_receipt
from fugu_pipeline.train.signing import accept_key, new_key_pair, sign_pack
from fugu_pipeline_tests.harness_data import controlled_data, routing_head

ALICE = new_key_pair()
MAX_RECEIPT_BYTES = 2**20  # the documented caps (docs/reference/formats.md)
MAX_LINE_BYTES = 4096


class Counted:
    """A file object that counts the bytes its caller reads from it."""

    def __init__(self, fh, tally: Counter, name: str):
        self._fh, self._tally, self._name = fh, tally, name

    def _count(self, data):
        self._tally[self._name] += len(data) if data else 0
        return data

    def read(self, *a):
        return self._count(self._fh.read(*a))

    def readline(self, *a):
        return self._count(self._fh.readline(*a))

    def readinto(self, buf):
        n = self._fh.readinto(buf)
        self._tally[self._name] += n or 0
        return n

    def __iter__(self):
        for line in self._fh:
            yield self._count(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """Bytes read per file name, through every open (builtins and io, as pathlib opens)."""
    tally: Counter = Counter()
    real = io.open

    def counting(file, mode="r", *a, **kw):
        fh = real(file, mode, *a, **kw)
        return Counted(fh, tally, Path(str(file)).name) if "r" in mode and isinstance(file, (str, Path)) else fh

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    return tally


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_a_receipt_over_its_cap_is_refused_before_it_is_read(tmp_path, reads):
    p = sparse(tmp_path / RECEIPT_FILE, 8 * 2**20)
    with pytest.raises(CheckpointError) as exc:
        read_receipt(tmp_path)
    assert str(exc.value) == (f"{p}: 8,388,608 bytes, over the cap of {MAX_RECEIPT_BYTES:,}: a receipt is a few KiB; "
                              "refused unread (pack the checkpoint again with fugu-lite pack)")
    assert reads[RECEIPT_FILE] == 0


def test_a_receipt_that_does_not_parse_is_one_line_naming_its_first_problem(tmp_path):
    (tmp_path / RECEIPT_FILE).write_text(json.dumps({"content_hash": "x", "param_count": "many"}))
    with pytest.raises(CheckpointError) as exc:
        read_receipt(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{tmp_path / RECEIPT_FILE}: not a valid receipt: ") and " more problem(s))" in msg


def test_a_ledger_line_over_its_cap_is_refused_after_reading_no_more_than_the_cap(tmp_path, reads):
    (tmp_path / "ledger.jsonl").write_bytes(b'{"seq": 1, "x": "' + b"x" * 10 * 2**20 + b'"}\n')
    got = pack_ledger(tmp_path, None, 512 * 2**20)
    assert got == (f"{tmp_path / 'ledger.jsonl'} line 1: longer than {MAX_LINE_BYTES:,} bytes: not a ledger line "
                   "(refused without reading the rest)")
    assert 0 < reads["ledger.jsonl"] <= MAX_LINE_BYTES + 1


def test_a_ledger_over_the_member_cap_is_refused_unread_and_a_good_one_streams(tmp_path, reads):
    with CostLedger(tmp_path / "ledger.jsonl") as book:
        for i in range(50):
            book.append("collection", 0.01, task_id=f"t{i}")
    size = (tmp_path / "ledger.jsonl").stat().st_size
    reads.clear()
    assert pack_ledger(tmp_path, None, size - 1) == (f"{tmp_path / 'ledger.jsonl'}: {size:,} bytes, over the cap of "
                                                     f"{size - 1:,} a ledger may take here: refused unread")
    assert reads["ledger.jsonl"] == 0
    assert pack_ledger(tmp_path, None, size).lines == 50


def test_preflight_refuses_a_signed_pack_with_a_huge_receipt_in_one_line(tmp_path, reads):
    data = controlled_data(n_test=200)
    models = tmp_path / "models"
    models.mkdir()
    accept_key(models, "alice", ALICE[1])
    ckpt = routing_head(tmp_path / "elsewhere", data, (0, 1, 2), method="es", cost=0.5)
    with CostLedger(tmp_path / "costs.jsonl") as book:
        book.append("collection", 0.5, task_id="t0")
    p = pack(ckpt, tmp_path / "pack", submitter="alice", ledger=tmp_path / "costs.jsonl", signing_key=ALICE[0])
    sparse(p / RECEIPT_FILE, 64 * 2**20)  # under the member cap, far over a receipt's
    sign_pack(p, list(PACK_FILES), ALICE[0])  # alice, whom the host accepts, signs it as it is
    reads.clear()
    gates = {g.name: g for g in preflight(p, models, GateConfig(rate_limit_s=0)).gates}
    assert not gates["receipt"].ok and gates["signature"].ok
    assert gates["receipt"].reason == (f"{p / RECEIPT_FILE}: 67,108,864 bytes, over the cap of 1,048,576: a receipt "
                                       "is a few KiB; refused unread (pack the checkpoint again with fugu-lite pack)")
    assert reads[RECEIPT_FILE] == 64 * 2**20  # hashed once by the signature check, in chunks; never parsed
