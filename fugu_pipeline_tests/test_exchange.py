"""The exchange format: `fugu-lite pack` writes a head, its receipt, its feature contract and the
cost ledger to one folder, signed; `fugu-lite preflight` runs the gates on it offline; `fugu-lite
validate` scores it against the king and promotes or refuses it. Every bad input is refused by
preflight with its reason."""

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fugu_pipeline.cli import main
from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.preflight import host_expectation, preflight
from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from fugu_pipeline.ledger import CostLedger
from fugu_pipeline.train.exchange import PACK_FILES, Receipt, pack
from fugu_pipeline.train.pointer import read_pointer
from fugu_pipeline.train.signing import KEY_ENV, SIGNATURE_FILE, accept_key, new_key_pair
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.harness_data import CONTRACT, WORKERS, controlled_data, routing_head

GATES = GateConfig(rate_limit_s=0)
ALICE = new_key_pair()  # (private, public)
BOB = new_key_pair()


def paid_ledger(path, calls: int = 10, cost: float = 0.1):
    """A ledger of `calls` paid collection calls of `cost` each (what training data cost)."""
    with CostLedger(path) as ledger:
        for i in range(calls):
            ledger.append("collection", cost, worker_id=WORKERS[i % 3], task_id=f"t{i:05d}", ref="b")
    return path


@pytest.fixture
def setup(tmp_path):
    """A host with a promoted king that accepts alice's key, and a challenger trained elsewhere,
    packed with the ledger of its paid calls and signed by alice."""
    data = controlled_data(contested_eval=40)
    models = tmp_path / "models"
    king = routing_head(models, data, (0, 1, 0), method="sft")
    assert promote_best([str(king)], data, models, PromotionPolicy(gates=GATES))["promoted"]
    accept_key(models, "alice", ALICE[1])
    ckpt = routing_head(tmp_path / "elsewhere", data, (0, 1, 2), method="es")
    ledger = paid_ledger(tmp_path / "elsewhere-ledger.jsonl")
    return data, models, pack(ckpt, tmp_path / "pack", submitter="alice", ledger=ledger, signing_key=ALICE[0])


def gate(result, name):
    return next(g for g in result.gates if g.name == name)


def check(pack_dir, models, **kw):
    return preflight(pack_dir, models, GATES, host=host_expectation(models), **kw)


def test_pack_writes_one_folder_that_passes_preflight(setup):
    data, models, p = setup
    assert sorted(x.name for x in p.iterdir()) == sorted([*PACK_FILES, SIGNATURE_FILE])
    receipt = Receipt.model_validate_json((p / "receipt.json").read_text())
    assert receipt.submitter == "alice" and receipt.steps == 5 and receipt.data_cost_usd == 0.5
    assert receipt.weights_sha256 == hashlib.sha256((p / "head.safetensors").read_bytes()).hexdigest()
    contract = json.loads((p / "contract.json").read_text())
    assert contract["worker_ids"] == WORKERS and contract["feature_contract"]["encoder_id"] == "synthetic-onehot"
    assert load_checkpoint(p).manifest.content_hash == receipt.content_hash  # the folder is itself a checkpoint
    result = check(p, models)
    assert result.ok, [g.line() for g in result.gates]
    assert result.submitter == "alice" and [g.name for g in result.gates] == [
        "files", "manifest", "weights", "contract", "signature", "ledger", "receipt", "duplicate", "rate limit", "king"]
    assert "matches the king sft" in gate(result, "contract").reason


def rewrite_weights(p, fn, *, fix_hashes=True):
    """Replace the pack's weights with fn(state); with fix_hashes the manifest and receipt name
    the new bytes (so only the gate under test can object)."""
    raw = st_save(fn(st_load((p / "head.safetensors").read_bytes())), metadata={"format": "pt"})
    (p / "head.safetensors").write_bytes(raw)
    if fix_hashes:
        for name in ("manifest.json", "receipt.json"):
            d = json.loads((p / name).read_text())
            d["weights_sha256"] = hashlib.sha256(raw).hexdigest()
            (p / name).write_text(json.dumps(d))


@pytest.mark.parametrize("breakage, name, reason", [
    (lambda p: (p / "receipt.json").unlink(), "receipt", "no training receipt (receipt.json is missing)"),
    (lambda p: (p / "contract.json").unlink(), "contract", "contract.json is missing"),
    (lambda p: rewrite_weights(p, lambda s: {"linear.weight": torch.ones(3, 2)}), "weights",
     "linear.weight has shape [3, 2], a normed_linear head of dim 3 with 3 workers needs [3, 3]"),
    (lambda p: rewrite_weights(p, lambda s: {"linear.weight": torch.full((3, 3), float("nan"))}), "weights",
     "linear.weight holds 9 non-finite (NaN or infinite) value(s)"),
    (lambda p: rewrite_weights(p, lambda s: {"linear.weight": s["linear.weight"] * 2}, fix_hashes=False), "weights",
     "head.safetensors does not match the manifest's weights_sha256"),
])
def test_bad_pack_is_refused_by_preflight_with_the_reason(setup, breakage, name, reason):
    data, models, p = setup
    breakage(p)
    result = check(p, models)
    assert not result.ok
    g = gate(result, name)
    print(f"\n{g.line()}")
    assert not g.ok and reason in g.reason


def test_missing_weights_or_manifest_stop_preflight(setup):
    data, models, p = setup
    (p / "head.safetensors").unlink()
    result = check(p, models)
    assert not result.ok and result.gates[-1].line() == "FAIL files: missing head.safetensors"


def test_receipt_that_does_not_match_the_weights_is_refused(setup):
    data, models, p = setup
    d = json.loads((p / "receipt.json").read_text())
    d["weights_sha256"] = "0" * 64  # a receipt from another training run
    (p / "receipt.json").write_text(json.dumps(d))
    g = gate(check(p, models), "receipt")
    assert not g.ok and "it names weights 000000000000… but head.safetensors is" in g.reason
    # the same weights re-scaled after packing, manifest hash updated, receipt left alone
    d["weights_sha256"] = hashlib.sha256((p / "head.safetensors").read_bytes()).hexdigest()
    (p / "receipt.json").write_text(json.dumps(d))
    rewrite_weights(p, lambda s: {"linear.weight": s["linear.weight"] * 3}, fix_hashes=False)
    m = json.loads((p / "manifest.json").read_text())
    m["weights_sha256"] = hashlib.sha256((p / "head.safetensors").read_bytes()).hexdigest()
    (p / "manifest.json").write_text(json.dumps(m))
    g = gate(check(p, models), "receipt")
    assert not g.ok and "but head.safetensors is" in g.reason and "content_hash is not the hash of these weights" in g.reason


def foreign_pack(tmp_path, data, workers, contract, name):
    w = torch.eye(3)
    ckpt = save_checkpoint(tmp_path / name, "es", "normed_linear", {"linear.weight": w}, {
        "worker_ids": workers, "feature_contract": contract, "data_version": data.data_version,
        "curves": {"val_utility": [0.1, 0.2, 0.3]}, "metrics": {"data_cost_usd": 1.0}})
    return pack(ckpt, tmp_path / f"{name}-pack")


def test_head_for_another_worker_set_or_encoder_is_refused(setup, tmp_path):
    data, models, _ = setup
    other_workers = foreign_pack(tmp_path, data, ["w0", "w1", "w9"], CONTRACT, "a")
    g = gate(check(other_workers, models), "contract")
    print(f"\n{g.line()}")
    assert not g.ok and "trained for workers ['w0', 'w1', 'w9'], the host routes ['w0', 'w1', 'w2']" in g.reason
    reordered = foreign_pack(tmp_path, data, ["w2", "w1", "w0"], CONTRACT, "b")
    assert not gate(check(reordered, models), "contract").ok
    other_encoder = foreign_pack(tmp_path, data, WORKERS, FeatureContract(encoder_id="Qwen/Qwen3-0.6B", dim=3, pooling="last"), "c")
    g = gate(check(other_encoder, models), "contract")
    print(g.line())
    assert not g.ok and "encoder_id: checkpoint has 'Qwen/Qwen3-0.6B', host has 'synthetic-onehot'" in g.reason
    assert "pooling: checkpoint has 'last', host has 'mean'" in g.reason


def test_preflight_command_offline(setup, capsys):
    data, models, p = setup
    assert main(["preflight", str(p), "--models-dir", str(models)]) == 0
    out = capsys.readouterr().out
    assert "PASS receipt: 5 fitness steps (val_utility), training cost $0.5000" in out and "PASSED" in out
    (p / "receipt.json").unlink()
    assert main(["preflight", str(p), "--models-dir", str(models)]) == 1
    out = capsys.readouterr().out
    assert "FAIL receipt: no training receipt (receipt.json is missing)" in out and out.strip().endswith("REFUSED")


def test_pack_refuses_a_checkpoint_changed_after_saving(tmp_path):
    data = controlled_data()
    ckpt = routing_head(tmp_path / "m", data, (0, 1, 2))
    rewrite_weights(ckpt, lambda s: {"linear.weight": s["linear.weight"] * 2}, fix_hashes=False)
    with pytest.raises(CheckpointError, match="does not match the manifest's weights_sha256"):
        pack(ckpt, tmp_path / "out")


def test_pack_refuses_a_checkpoint_that_would_not_load(tmp_path):
    # pack checked the hashes only: a re-signed checkpoint of NaN weights was packed, and refused
    # only at the host's preflight
    from fugu_pipeline.train.checkpoints import Manifest, checkpoint_hash

    data = controlled_data()
    ckpt = routing_head(tmp_path / "m", data, (0, 1, 2))
    raw = st_save({"linear.weight": torch.full((3, 3), float("nan"))}, metadata={"format": "pt"})
    (ckpt / "head.safetensors").write_bytes(raw)
    d = json.loads((ckpt / "manifest.json").read_text())
    d["weights_sha256"] = hashlib.sha256(raw).hexdigest()
    d["content_hash"] = checkpoint_hash(raw, Manifest.model_validate(d))
    (ckpt / "manifest.json").write_text(json.dumps(d))
    ckpt = ckpt.rename(ckpt.parent / d["content_hash"])
    with pytest.raises(CheckpointError, match="linear.weight holds 9 non-finite"):
        pack(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- through the command line


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(KEY_ENV, ALICE[0])  # the submitter's key, from the environment only
    accept_key(tmp_path / "models", "alice", ALICE[1])  # the host (this folder too) accepts it
    accept_key(tmp_path / "models", "bob", BOB[1])
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    tasks = str(REPO / "data" / "benchgen" / "sample.jsonl")
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl"]) == 0
    return tmp_path


def test_pack_preflight_validate_a_head_trained_elsewhere(project, capsys):
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml", "--device", "cpu"]
    tasks = ["--tasks", str(REPO / "data" / "benchgen" / "sample.jsonl")]
    assert main(["train-sft", *W, "--encoder", "tiny", "--output", "elsewhere"]) == 0
    sft = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["pack", sft, "--out", "submission", "--submitter", "alice"]) == 0
    out = capsys.readouterr().out
    assert "packed sft" in out and "fitness steps (val_utility)" in out and "training cost $" in out
    assert main(["preflight", "submission", "--workers", "configs/workers.mock.yaml", "--encoder", "tiny"]) == 0
    assert "matches workers of configs/workers.mock.yaml, encoder tiny" in capsys.readouterr().out
    # with the host's matrix: its workers are paid, and the receipt shows what training cost
    assert main(["preflight", "submission", "--workers", "configs/workers.mock.yaml", "--data", "r.jsonl"]) == 0
    out = capsys.readouterr().out
    assert "workers of configs/workers.mock.yaml" in out and "PASS receipt" in out and "training cost $" in out
    # validate: the gates, the composite with a live run on the mock pool, then the decision
    assert main(["validate", "--challenger", "submission", *W, *tasks, "--encoder", "tiny"]) == 0  # no king yet: the host names its encoder
    out = capsys.readouterr().out
    assert "PASS rate limit" in out and "PASS receipt" in out and "challenger composite" in out
    assert "live: one call per task (route, call, grade)" in out and "PROMOTED" in out
    pointer = read_pointer("models")
    assert pointer["checkpoint"].startswith("sft/") and pointer["submitter"] == "alice"
    assert (project / "models" / pointer["checkpoint"] / "head.safetensors").read_bytes() == (project / "submission" / "head.safetensors").read_bytes()
    # alice again within the day: refused before scoring, recorded, exit 1
    assert main(["train-rl", *W, "--checkpoint", sft, "--output", "elsewhere"]) == 0
    rl = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["pack", rl, "--out", "second", "--submitter", "alice"]) == 0
    assert main(["validate", "--challenger", "second", *W, *tasks]) == 1  # the king's encoder
    out = capsys.readouterr().out
    assert "FAIL rate limit: 'alice' (key " in out and "made an attempt at" in out and "REFUSED before scoring" in out
    last = json.loads((project / "models" / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["rate_limited"] is True and last["submitter"] == "alice"


def test_a_broken_king_stops_preflight_and_validate_until_it_is_replaced_on_purpose(project, capsys, monkeypatch):
    """A damaged pointer: preflight said "no king" and passed; validate then stopped. Now both stop
    at the king gate, the refusal is the host's fault so it does not spend the submitter's daily
    attempt, and --replace-broken-king lets the pack replace it facing the baselines only."""
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml", "--device", "cpu"]
    assert main(["train-sft", *W, "--encoder", "tiny", "--output", "elsewhere"]) == 0
    sft = capsys.readouterr().out.strip().splitlines()[-1]
    monkeypatch.setenv(KEY_ENV, BOB[0])
    assert main(["pack", sft, "--out", "submission", "--submitter", "bob"]) == 0
    (project / "models" / "promoted").mkdir(parents=True, exist_ok=True)
    (project / "models" / "promoted" / "current.json").write_text('{"checkpo')  # truncated
    capsys.readouterr()
    assert main(["preflight", "submission", "--workers", "configs/workers.mock.yaml", "--encoder", "tiny"]) == 1
    assert "FAIL king: the promoted checkpoint cannot be loaded" in capsys.readouterr().out
    assert main(["validate", "--challenger", "submission", *W, "--encoder", "tiny"]) == 1
    out = capsys.readouterr().out
    assert "FAIL king" in out and "--replace-broken-king" in out and "REFUSED before scoring" in out
    assert "PASS rate limit" in out
    assert main(["validate", "--challenger", "submission", *W, "--encoder", "tiny", "--replace-broken-king"]) == 0
    out = capsys.readouterr().out
    assert "PASS rate limit" in out and "PASS king" in out and "PROMOTED" in out
    assert read_pointer("models")["submitter"] == "bob"


def test_a_pack_on_other_layers_of_the_host_encoder_is_scored_on_its_own_features(project, capsys):
    """A head trained elsewhere on the host's encoder model read another way (layers [-1, 1]) is
    not refused: preflight says it reads its own features, validate scores it (and later the
    king) on them, and it serves them."""
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml", "--device", "cpu"]
    assert main(["train-sft", *W, "--encoder", "tiny", "--layers", "-1", "1", "--output", "elsewhere"]) == 0
    sft = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["pack", sft, "--out", "layers-pack", "--submitter", "bob"]) == 0
    capsys.readouterr()
    assert main(["preflight", "layers-pack", "--workers", "configs/workers.mock.yaml", "--encoder", "tiny"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "contract:" in x)
    assert "PASS contract" in line and "reads its own features of the host's encoder model (layer: checkpoint has [-1, 1], host has -1; dim" in line, line
    # what is judged here is the feature contract: the head needs only to be let in (no king yet), not
    # to beat the best worker significantly on the sample's 75 held-out tasks
    import yaml

    policy = yaml.safe_load(open("configs/promotion.yaml"))
    policy.update(require_significant=False, min_gain_over_best_fixed=-1.0)
    with open("lenient.yaml", "w") as f:
        yaml.safe_dump(policy, f)
    assert main(["validate", "--challenger", "layers-pack", *W, "--encoder", "tiny", "--policy", "lenient.yaml"]) == 0
    out = capsys.readouterr().out
    assert "PASS feature contract: the serving encoder computes this checkpoint's features" in out and "PROMOTED" in out
    from fugu_pipeline import load_promoted

    promoted = load_promoted("models", device="cpu")
    router = promoted.refresh()
    assert router.encoder.settings.layers == (-1, 1)
    assert router.route("What is 2 + 2?", domain="math").worker_id in router.worker_ids
