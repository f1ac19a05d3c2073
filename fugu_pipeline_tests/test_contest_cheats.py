"""The cheats a submitter might try, each refused in one line naming the check, before any worker
is called, with nothing promoted: an exact copy of the king, a disguised copy (one random vector
added to every worker row, +5 on every bias), invented receipt figures, a renamed submitter, an
unsigned pack, a pack signed by a key the host does not hold (the tampered triage manifest is in
`test_triage.py`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fugu_pipeline.evaluate.preflight import host_expectation, preflight
from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.ledger import CostLedger
from fugu_pipeline.train.checkpoints import load_checkpoint, save_checkpoint
from fugu_pipeline.policies.oneshot.configs import SFTConfig
from fugu_pipeline.train.exchange import pack
from fugu_pipeline.train.pointer import read_pointer
from fugu_pipeline.train.signing import SIGNATURE_FILE, accept_key, new_key_pair, sign_pack
from fugu_pipeline.train.exchange import PACK_FILES
from fugu_pipeline.policies.oneshot.sft import train_sft
from fugu_pipeline_tests.test_promotion import data  # noqa: F401 (the fixture)

DAILY = PromotionPolicy()  # the shipped rules: one attempt a day per key
KEYS = {name: new_key_pair() for name in ("alice", "bob", "mallory")}


class CountingLive:
    """A live evaluator that counts the calls it was asked to make (none, for a refused pack)."""

    name = "counting"

    def __init__(self):
        self.asked = 0

    def evaluate(self, policy, tasks):
        from fugu_pipeline.evaluate.live import LiveOutcome

        self.asked += len(tasks)
        return [LiveOutcome(t, 1.0, workers=[policy.routes[t]]) for t in tasks]


@pytest.fixture
def host(data, tmp_path):  # noqa: F811
    """A host whose king (an SFT head) is promoted, accepting alice's and bob's keys, with the
    ledger of the calls its data cost."""
    models = tmp_path / "models"
    king = train_sft(data, SFTConfig(epochs=40)).save(models)
    assert promote_best([str(king)], data, models, DAILY)["promoted"]
    for name in ("alice", "bob"):
        accept_key(models, name, KEYS[name][1])
    ledger = tmp_path / "ledger.jsonl"
    with CostLedger(ledger) as book:
        for i in range(40):
            book.append("collection", 0.01, worker_id="math-w", task_id=f"t{i}", ref="b")
    return models, king, ledger


def packed(src, out, ledger, who: str):
    return pack(src, out, submitter=who, ledger=ledger, signing_key=KEYS[who][0])


def judge(pack_dir, data, models):  # noqa: F811
    """preflight (what validate runs first), then the contest only if it passed; returns the
    preflight result, the first failing line, and what the contest did."""
    pre = preflight(pack_dir, models, DAILY.gates, host=host_expectation(models, data=data), data=data)
    if not pre.ok:
        return pre, next(g.line() for g in pre.gates if not g.ok), None
    live = CountingLive()
    out = promote_best([str(pack_dir)], data, models, DAILY, submitter=pre.submitter, key=pre.key, live=live,
                       tasks={t: t for t in data.task_ids})
    refused = next((r for r in out["reasons"] if r.startswith(("REFUSED", "FAIL"))), None)
    assert (live.asked == 0) == (out["contest"] is None)  # a pack refused by a gate calls no worker
    return pre, refused, out


def disguised(king, out_dir, seed: int = 0):
    """The king's head with one random vector added to every worker row and +5 on every bias."""
    ck = load_checkpoint(king)
    state = {k: v.clone() for k, v in ck.state_dict.items()}
    v = torch.randn(state["linear.weight"].shape[1], generator=torch.Generator().manual_seed(seed)) * 3
    state["linear.weight"] += v
    state["linear.bias"] += 5.0
    m = ck.manifest
    return save_checkpoint(out_dir, "es", m.head_kind, state, {
        "worker_ids": m.worker_ids, "feature_contract": m.feature_contract, "data_version": m.data_version,
        "curves": m.curves, "metrics": m.metrics})


def raw_cosine(a, b) -> float:
    wa = np.concatenate([load_checkpoint(a).state_dict[k].numpy().ravel() for k in ("linear.bias", "linear.weight")])
    wb = np.concatenate([load_checkpoint(b).state_dict[k].numpy().ravel() for k in ("linear.bias", "linear.weight")])
    return float(wa @ wb / np.linalg.norm(wa) / np.linalg.norm(wb))


def test_the_cheat_table(data, host, tmp_path, capsys):  # noqa: F811
    models, king, ledger = host
    rows = []

    # 1. an exact copy of the king, packed and signed by bob
    pre, line, out = judge(packed(king, tmp_path / "exact", ledger, "bob"), data, models)
    rows.append(("exact copy", line))
    assert "FAIL duplicate: behaves like sft" in line and "cosine 1.0000" in line

    # 2. a disguised copy: its raw final layer has a low cosine with the king's (the old gate passed it)
    fake = disguised(king, tmp_path / "elsewhere")
    assert raw_cosine(fake, king) < 0.5
    pre, line, out = judge(packed(fake, tmp_path / "disguised", ledger, "bob"), data, models)
    rows.append(("disguised copy", line))
    assert "FAIL duplicate: behaves like sft" in line and "cosine 1.0000" in line and "same decision on 100%" in line

    # 3. invented receipt figures, re-signed by their own key
    honest = train_sft(data, SFTConfig(epochs=40, seed=3)).save(tmp_path / "alice-models")
    p = packed(honest, tmp_path / "invented", ledger, "alice")
    r = json.loads((p / "receipt.json").read_text())
    r.update(fitness=[0.99, 0.995, 0.999], fitness_curve="val_utility", data_cost_usd=123.45)
    (p / "receipt.json").write_text(json.dumps(r))
    sign_pack(p, list(PACK_FILES), KEYS["alice"][0])
    pre, line, out = judge(p, data, models)
    rows.append(("invented receipt figures", line))
    assert line.startswith("FAIL receipt: fitness [0.99, 0.995, 0.999] (val_utility) is not what training recorded")
    assert "it claims a training cost of $123.4500, the ledger's paid calls total $0.4000" in line

    # 4. a renamed submitter: alice's attempt today, then the same key under another name
    p = packed(honest, tmp_path / "alice-pack", ledger, "alice")
    pre, _, out = judge(p, data, models)
    assert pre.ok and out["contest"] is not None  # alice's attempt of the day, scored
    again = packed(train_sft(data, SFTConfig(epochs=40, seed=4)).save(tmp_path / "a2"), tmp_path / "renamed", ledger, "alice")
    r = json.loads((again / "receipt.json").read_text())
    r["submitter"] = "definitely-not-alice"
    (again / "receipt.json").write_text(json.dumps(r))
    pre, line, out = judge(again, data, models)
    assert line.startswith("FAIL signature: receipt.json changed after signing")  # edited after signing
    sign_pack(again, list(PACK_FILES), KEYS["alice"][0])  # re-signed: the key is still alice's
    pre, line, out = judge(again, data, models)
    rows.append(("renamed submitter", line))
    assert line.startswith("FAIL rate limit: 'alice' (key ") and "made an attempt at" in line

    # 5. an unsigned pack, and one signed by a key the host does not hold
    p = pack(train_sft(data, SFTConfig(epochs=40, seed=5)).save(tmp_path / "b"), tmp_path / "unsigned", ledger=ledger)
    assert not (p / SIGNATURE_FILE).exists()
    pre, line, out = judge(p, data, models)
    rows.append(("unsigned pack", line))
    assert line.startswith("FAIL files: missing signature.json")
    assert any(g.line().startswith("FAIL signature: unsigned pack") for g in pre.gates)
    pre, line, out = judge(packed(train_sft(data, SFTConfig(epochs=40, seed=6)).save(tmp_path / "c"), tmp_path / "mallory",
                                  ledger, "mallory"), data, models)
    rows.append(("unknown key", line))
    assert line.startswith("FAIL signature: signed by key") and "which this host does not accept" in line

    assert read_pointer(models)["content_hash"] != fake.name and read_pointer(models)["checkpoint"].startswith("sft/")
    with capsys.disabled():
        print("\n| cheat | refused with |\n|---|---|\n" + "\n".join(f"| {k} | `{v}` |" for k, v in rows))
