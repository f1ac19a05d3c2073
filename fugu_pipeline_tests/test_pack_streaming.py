"""Packs verified by streaming: a signature nobody the host accepts is refused before a member is
read; a member over the size cap (or a pack over the total cap) is refused unread, in one line
naming the member and the cap; a tampered member is refused; a checkpoint import reads the
weights once, and the bytes it keeps are the bytes it checked."""

from __future__ import annotations

import builtins
import io
import os
import tracemalloc
from pathlib import Path

import pytest

from fugu_pipeline.train.checkpoints import WEIGHTS_FILE
from fugu_pipeline.train.exchange import import_checkpoint, pack
from fugu_pipeline.train.signing import AcceptedKey, AcceptedKeys, SigningError, new_key_pair, sign_pack, verify_pack
from fugu_pipeline_tests.harness_data import controlled_data, routing_head

KEY = new_key_pair()
NAMES = ["head.safetensors", "ledger.jsonl"]
BIG = 48 * 2**20  # a sparse member: cheap to make, 48 MiB when read


def signed(tmp_path, size: int = BIG):
    folder = tmp_path / "pack"
    folder.mkdir()
    with open(folder / "head.safetensors", "wb") as f:
        f.truncate(size)
    (folder / "ledger.jsonl").write_bytes(b"")
    sign_pack(folder, NAMES, KEY[0])
    return folder


def peak_while(fn) -> tuple[int, object]:
    """(the peak of Python's allocations while fn runs, what it returned or raised)."""
    tracemalloc.start()
    try:
        out = fn()
    except SigningError as exc:
        out = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, out


def test_a_key_the_host_does_not_accept_is_refused_before_a_member_is_read(tmp_path):
    folder = signed(tmp_path)
    peak, out = peak_while(lambda: verify_pack(folder, NAMES, AcceptedKeys()))
    print(f"\nrefused: {out}; peak {peak / 2**20:.2f} MiB of Python allocations for a {BIG / 2**20:.0f} MiB member")
    assert isinstance(out, SigningError) and "which this host does not accept" in str(out)
    assert peak < 4 * 2**20


def test_a_member_over_the_cap_is_refused_unread_naming_the_member_and_the_cap(tmp_path):
    folder = signed(tmp_path)
    keys = AcceptedKeys(keys={"alice": AcceptedKey(public_key=KEY[1])})
    peak, out = peak_while(lambda: verify_pack(folder, NAMES, keys, member_cap=16 * 2**20))
    assert str(out) == (f"head.safetensors: {BIG:,} bytes, over the cap of {16 * 2**20:,} bytes a pack member may hold "
                        "(pack_member_max_bytes): refused unread")
    assert peak < 4 * 2**20
    (folder / "ledger.jsonl").write_bytes(b"x" * 1000)
    sign_pack(folder, NAMES, KEY[0])
    with pytest.raises(SigningError, match=f"the pack's members hold {BIG + 1000:,} bytes, over the cap of {BIG:,} "
                       "bytes a pack may hold \\(pack_total_max_bytes\\): refused unread"):
        verify_pack(folder, NAMES, keys, member_cap=BIG, total_cap=BIG)
    peak, out = peak_while(lambda: verify_pack(folder, NAMES, keys))  # under the default caps: hashed by streaming
    assert out == ("alice", out[1]) and peak < 4 * 2**20


def test_a_member_tampered_after_signing_is_refused(tmp_path):
    folder = signed(tmp_path, 3 * 2**20)
    with open(folder / "head.safetensors", "r+b") as f:  # one byte in the middle, same size
        f.seek(2**20 + 7)
        f.write(b"\x01")
    keys = AcceptedKeys(keys={"alice": AcceptedKey(public_key=KEY[1])})
    with pytest.raises(SigningError, match="head.safetensors changed after signing"):
        verify_pack(folder, NAMES, keys)


def test_an_import_reads_the_weights_once_and_keeps_the_bytes_it_checked(tmp_path, monkeypatch):
    """The pack's weights are swapped for other bytes the moment they are first opened (a submitter
    racing the host): whatever is read after that is not what was checked."""
    data = controlled_data(n_test=200)
    ckpt = routing_head(tmp_path / "elsewhere", data, (0, 1, 2), method="es")
    p = pack(ckpt, tmp_path / "pack")
    weights = p / WEIGHTS_FILE
    checked = weights.read_bytes()
    opens = []
    real_open = io.open

    def watching_open(file, mode="r", *a, **kw):
        fh = real_open(file, mode, *a, **kw)
        if isinstance(file, (str, os.PathLike)) and Path(file) == weights and "r" in mode:
            opens.append(mode)
            if len(opens) == 1:
                swapped = p / ".swap"
                swapped.write_bytes(bytes(b ^ 0xFF for b in checked))
                os.replace(swapped, weights)  # the open file still reads the bytes being checked
        return fh

    monkeypatch.setattr(builtins, "open", watching_open)
    monkeypatch.setattr(io, "open", watching_open)
    target = import_checkpoint(p, tmp_path / "models")
    monkeypatch.undo()
    kept_is_checked = (target / WEIGHTS_FILE).read_bytes() == checked
    print(f"\nopens of the pack's weights: {len(opens)}; the kept bytes are the checked bytes: {kept_is_checked}")
    assert (len(opens), kept_is_checked) == (1, True)


def test_an_import_of_other_bytes_than_the_judged_ones_is_refused(tmp_path):
    data = controlled_data(n_test=200)
    judged = pack(routing_head(tmp_path / "a", data, (0, 1, 2), method="es"), tmp_path / "pack")
    other = routing_head(tmp_path / "b", data, (1, 0, 2), method="es")
    expected = judged.joinpath("manifest.json").read_text()
    for name in ("head.safetensors", "manifest.json"):  # replaced by another valid checkpoint after judging
        (judged / name).write_bytes((other / name).read_bytes())
    from fugu_pipeline.train.checkpoints import CheckpointError, Manifest

    want = Manifest.model_validate_json(expected).content_hash
    with pytest.raises(CheckpointError, match=f"not {want}, the checkpoint judged"):
        import_checkpoint(judged, tmp_path / "models", expected_hash=want)
    assert not (tmp_path / "models" / "es").exists() or not any((tmp_path / "models" / "es").iterdir())
