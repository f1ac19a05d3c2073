"""The contest reads nothing of a pack the host would refuse: given straight to the contest API
(`promote_best`, `run_contest`: no preflight first), a pack signed by a key the host does not
accept, or holding a member over the size cap, is refused before any of its weights is opened or
loaded, for every kind, in the line preflight prints; the receipt gate hashes a pack's weights by
streaming, under the same cap, never reading them whole."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import safetensors.torch

from fugu_pipeline.evaluate.contest import Entrant, KindBase, run_contest
from fugu_pipeline.evaluate.gates import GateConfig, history
from fugu_pipeline.evaluate.preflight import preflight
from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.files import CHUNK_BYTES
from fugu_pipeline.train.checkpoints import WEIGHTS_FILE, Manifest
from fugu_pipeline.train.exchange import PACK_FILES, pack
from fugu_pipeline.train.signing import accept_key, new_key_pair, sign_pack
from fugu_pipeline_tests.harness_data import CONTRACT, controlled_data, routing_head
from fugu_pipeline_tests.test_receipts import genuine

ALICE, MALLORY = new_key_pair(), new_key_pair()
GATES = GateConfig(rate_limit_s=0)


class Reads:
    """Every open of one file (and every read of it, with the size asked for) and every
    safetensors load while it is installed."""

    def __init__(self, monkeypatch, path: Path):
        self.path, self.opens, self.sizes, self.loads = path, [], [], 0
        real_open, real_load = io.open, safetensors.torch.load

        def watching_open(file, mode="r", *a, **kw):
            fh = real_open(file, mode, *a, **kw)
            if isinstance(file, (str, os.PathLike)) and Path(file) == self.path:
                self.opens.append(mode)
                return Watched(fh, self.sizes)
            return fh

        def watching_load(*a, **kw):
            self.loads += 1
            return real_load(*a, **kw)

        for mod in (builtins, io):
            monkeypatch.setattr(mod, "open", watching_open)
        monkeypatch.setattr(safetensors.torch, "load", watching_load)


class Watched:
    def __init__(self, fh, sizes: list):
        self._fh, self._sizes = fh, sizes

    def read(self, size: int = -1):
        self._sizes.append(size)
        return self._fh.read(size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)


def submitted(tmp_path, key, *, accepted=(ALICE,), pad: int = 0):
    """A host folder accepting `accepted`, and a router head packed elsewhere with the genuine
    ledger of its training cost and signed with `key` (its weights padded by `pad` bytes before signing: a larger member, still under what the
    manifest's tensors could take)."""
    data = controlled_data(n_test=200)
    models = tmp_path / "models"
    models.mkdir()
    for i, k in enumerate(accepted):
        accept_key(models, f"key{i}", k[1])
    p = pack(routing_head(tmp_path / "elsewhere", data, (0, 1, 2), method="es", cost=0.5), tmp_path / "pack",
             submitter="x", ledger=genuine(tmp_path / "costs.jsonl", 5, 0.1), signing_key=key[0])
    if pad:
        with open(p / WEIGHTS_FILE, "ab") as f:
            f.write(b"\0" * pad)
        sign_pack(p, list(PACK_FILES), key[0])
    return data, models, p


def contest_api(kind: str, data):
    """Each kind's way into the one contest, as a caller of the core API reaches it."""
    if kind == "router":  # one-step heads and cascades share the router slot
        return lambda paths, models, policy: promote_best(paths, data, models, policy)
    if kind == "triage":
        from fugu_pipeline.policies.triage.contest import TriageKind

        return lambda paths, models, policy: run_contest(TriageKind(data), paths, models, policy)
    from fugu_pipeline.policies.coordinator.project import evaluate_coordinator
    from fugu_pipeline.policies.coordinator.contest import RolesKind

    run = SimpleNamespace(featurizer=SimpleNamespace(contract=lambda: CONTRACT))  # nothing of it is used before load
    if kind == "coordinator":
        return lambda paths, models, policy: run_contest(RolesKind(run, [], None), paths, models, policy)
    # evaluate-roles --promote: the held-out report would run the pack's sessions before its contest
    return lambda paths, models, policy: evaluate_coordinator(run, Path(paths[0]), [], None, models,
                                                              policy=policy)["promotion"]


@pytest.mark.parametrize("kind", ["router", "triage", "coordinator", "coordinator report"])
def test_a_key_the_host_does_not_accept_is_refused_by_the_contest_with_no_weight_opened(tmp_path, monkeypatch, kind):
    data, models, p = submitted(tmp_path, MALLORY)
    line = next(g.line() for g in preflight(p, models, GATES).gates if g.name == "signature")
    assert line.startswith("FAIL signature: signed by key") and "which this host does not accept" in line
    reads = Reads(monkeypatch, p / WEIGHTS_FILE)
    out = contest_api(kind, data)([str(p)], models, PromotionPolicy(gates=GATES))
    monkeypatch.undo()
    print(f"\n{kind}: {out['reasons'][-1]}; opens of the weights: {len(reads.opens)}, safetensors loads: {reads.loads}")
    assert (reads.opens, reads.loads) == ([], 0)
    assert out["reasons"][-1] == f"REFUSED {p}: {line}" and not out["promoted"] and out["contest"] is None
    assert history(models, {"router": "history.jsonl", "triage": "triage-history.jsonl",
                            "coordinator": "roles-history.jsonl"}[kind.split()[0]])[-1]["reasons"] == [line]


def test_a_member_over_the_cap_given_straight_to_the_contest_is_refused_unread(tmp_path, monkeypatch):
    data, models, p = submitted(tmp_path, ALICE, pad=60_000)
    gates = GATES.model_copy(update={"pack_member_max_bytes": 4096})
    line = next(g.line() for g in preflight(p, models, gates).gates if g.name == "signature")
    size = (p / WEIGHTS_FILE).stat().st_size
    assert line == (f"FAIL signature: {WEIGHTS_FILE}: {size:,} bytes, over the cap of 4,096 bytes a pack member may "
                    "hold (pack_member_max_bytes): refused unread")
    reads = Reads(monkeypatch, p / WEIGHTS_FILE)
    out = promote_best([str(p)], data, models, PromotionPolicy(gates=gates))
    monkeypatch.undo()
    assert (reads.opens, reads.loads) == ([], 0)
    assert out["reasons"][-1] == f"REFUSED {p}: {line}" and not out["promoted"]


def test_the_receipt_gate_streams_the_weights_under_the_pack_cap(tmp_path, monkeypatch):
    _, models, p = submitted(tmp_path, ALICE)
    kind = KindBase()
    kind.models_dir = models
    manifest = Manifest.model_validate_json((p / "manifest.json").read_text())
    entrant = Entrant(str(p), manifest.method, manifest.content_hash, None, manifest)
    reads = Reads(monkeypatch, p / WEIGHTS_FILE)
    gate = kind.receipt(entrant, PromotionPolicy(gates=GATES))
    monkeypatch.undo()
    print(f"\n{gate.line()}; reads of the weights: {reads.sizes}")
    assert gate.ok, gate.line()
    assert len(reads.opens) == 1 and reads.sizes and all(0 < n <= CHUNK_BYTES for n in reads.sizes)  # never read(-1)

    size = (p / WEIGHTS_FILE).stat().st_size  # under a cap smaller than the weights: refused unread
    reads = Reads(monkeypatch, p / WEIGHTS_FILE)
    gate = kind.receipt(entrant, PromotionPolicy(gates=GATES.model_copy(update={"pack_member_max_bytes": size - 1})))
    monkeypatch.undo()
    assert not gate.ok and reads.opens == []
    assert gate.line() == (f"FAIL receipt: {p / WEIGHTS_FILE}: {size:,} bytes, over the cap of {size - 1:,} "
                           "(pack_member_max_bytes): refused")
