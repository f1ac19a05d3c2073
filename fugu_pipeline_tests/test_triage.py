"""The triage head: difficulty labels from the matrix, two bias-free linear maps with their own
softmaxes, checkpoints, the per-domain report with confusion matrices, the command line."""

import json
import shutil

import numpy as np
import pytest
import torch

from fugu_pipeline.cli import main
from fugu_pipeline.policies.triage.report import triage_lines, triage_report
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.policies.triage.train import (
    TriageConfig,
    TriageHead,
    difficulty_labels,
    load_triage,
    train_triage,
    triage_probabilities,
)
from fugu_pipeline_tests.conftest import REPO

DOMAINS = ["code", "general", "math"]
WORKERS = ["a", "b", "c"]


def test_difficulty_labels_are_the_bucketed_share_of_workers_that_solve_the_task():
    q = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0], [0.6, 0.4, 0.5]])
    bucket, share = difficulty_labels(q, TriageConfig())
    np.testing.assert_allclose(share, [1, 1 / 3, 0, 2 / 3, 2 / 3])
    assert [TriageConfig().difficulty_names[b] for b in bucket] == ["easy", "medium", "hard", "easy", "easy"]
    two = TriageConfig(difficulty_edges=[0.5], difficulty_names=["hard", "easy"])
    assert list(difficulty_labels(q, two)[0]) == [1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="needs 3 names"):
        TriageConfig(difficulty_names=["x", "y"])
    with pytest.raises(ValueError, match="ascending"):
        TriageConfig(difficulty_edges=[0.6, 0.3])


def test_two_bias_free_maps_with_separate_softmaxes():
    head = TriageHead(dim=1024, n_domains=3, n_difficulty=3)
    assert head.param_count() == 1024 * 6 and head.domain.bias is None and head.difficulty.bias is None
    d, h = head.probabilities(torch.randn(5, 1024))
    assert torch.allclose(d.sum(dim=1), torch.ones(5)) and torch.allclose(h.sum(dim=1), torch.ones(5))


@pytest.fixture(scope="module")
def data() -> RoutingData:
    """Domains are clusters in feature space; difficulty is a second direction: the further along
    it, the fewer workers solve the task."""
    rng = np.random.default_rng(0)
    n, dim = 900, 24
    dom = rng.integers(0, 3, n)
    level = rng.integers(0, 3, n)  # 0 easy, 1 medium, 2 hard
    centers, hard_dir = rng.normal(size=(3, dim)), rng.normal(size=dim)
    feats = centers[dom] + 1.2 * (level[:, None] - 1) * hard_dir + 0.4 * rng.normal(size=(n, dim))
    solvers = np.array([3, 1, 0])[level]  # easy: all three solve, medium: one, hard: none
    quality = (np.arange(3)[None, :] < solvers[:, None]).astype(float)
    quality = quality[:, rng.permutation(3)]
    expert = quality.copy()
    expert[np.arange(n), dom] = np.maximum(expert[np.arange(n), dom], (rng.random(n) < 0.5))  # each worker is better on its domain
    splits = np.array(["train"] * 600 + ["val"] * 150 + ["test"] * 150)
    return RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=[f"p{i}" for i in range(n)],
                       domains=[DOMAINS[d] for d in dom], splits=splits, worker_ids=WORKERS,
                       features=feats.astype(np.float32), utility=expert, quality=expert,
                       contract=FeatureContract(encoder_id="synthetic", dim=dim))


@pytest.fixture(scope="module")
def trained(data):
    return train_triage(data, TriageConfig(epochs=60))


def test_triage_learns_domain_and_difficulty_beyond_the_majority_label(data, trained, tmp_path):
    m = trained.metrics
    assert m["val_domain_accuracy"] > 0.95 and m["val_difficulty_accuracy"] > 0.7
    path = trained.save(tmp_path / "models")
    rep = triage_report(load_triage(path, expected_contract=data.contract), data, "test")
    print("\n" + "\n".join(triage_lines(rep)))
    assert rep["domain"]["accuracy"] > rep["domain"]["majority_baseline"] + 0.5
    assert rep["difficulty"]["accuracy"] > rep["difficulty"]["majority_baseline"] + 0.2
    conf = np.array(rep["domain"]["confusion"])
    assert conf.sum() == 150 and np.trace(conf) / 150 == pytest.approx(rep["domain"]["accuracy"])
    assert [r["domain"] for r in rep["per_domain"]] == DOMAINS and sum(r["n"] for r in rep["per_domain"]) == 150
    assert np.array(rep["difficulty"]["confusion"]).sum() == 150
    r = rep["routing"]
    assert r["by_predicted_domain"] == pytest.approx(r["by_true_domain"], abs=0.05) and r["by_true_domain"] >= r["best_fixed"]


def test_triage_checkpoint_round_trip_and_refusals(data, trained, tmp_path):
    path = trained.save(tmp_path / "models")
    assert path.parent.name == "triage" and trained.save(tmp_path / "models") == path
    again = train_triage(data, TriageConfig(epochs=60)).save(tmp_path / "again")
    assert (again / "head.safetensors").read_bytes() == (path / "head.safetensors").read_bytes()  # seeded
    ck = load_triage(path)
    p_dom, p_diff = triage_probabilities(ck.head, data.features[:4])
    assert p_dom.shape == (4, 3) and p_diff.shape == (4, 3)
    assert ck.manifest.worker_ids == WORKERS and ck.difficulty_names == ["hard", "medium", "easy"]
    with pytest.raises(CheckpointError, match="feature contract does not match the encoder .*encoder_id"):
        load_triage(path, expected_contract=FeatureContract(encoder_id="other", dim=24))
    raw = (path / "head.safetensors").read_bytes()
    (path / "head.safetensors").write_bytes(raw[:-8] + b"\x00" * 8)
    with pytest.raises(CheckpointError, match="does not match the manifest's weights_sha256"):
        load_triage(path)


def test_triage_needs_quality(data):
    no_q = RoutingData(**{**{f: getattr(data, f) for f in ("task_ids", "prompts", "domains", "splits", "worker_ids",
                                                             "features", "utility", "contract")}})
    with pytest.raises(TrainingDataError, match="difficulty labels come from each worker's quality"):
        train_triage(no_q)


def test_train_triage_and_its_report_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    tasks = str(REPO / "data" / "benchgen" / "sample.jsonl")
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl"]) == 0
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml", "--device", "cpu", "--encoder", "tiny"]
    capsys.readouterr()
    assert main(["train-triage", *W]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("triage: 384 parameters") and out[-1].startswith("models/triage/")  # 64 x (3 + 3)
    assert main(["triage-report", "--checkpoint", out[-1], *W]) == 0
    text = capsys.readouterr().out
    assert "domain accuracy" in text and "difficulty confusion" in text and "routing by predicted domain" in text
    rep = json.loads((tmp_path / out[-1] / "reports" / "triage-test.json").read_text())
    assert rep["n_tasks"] == 75 and sum(map(sum, rep["domain"]["confusion"])) == 75


def test_a_triage_manifest_with_reordered_domains_is_refused(data, trained, tmp_path):
    """Before: `load_triage` skipped the fingerprint, content-hash and folder checks, so a manifest
    with reordered `domains` (every prediction mislabelled) loaded silently. Now a triage head has
    the checkpoint Manifest and its one verified loader; a pack of one is refused by preflight."""
    from fugu_pipeline.evaluate.gates import GateConfig
    from fugu_pipeline.evaluate.preflight import preflight
    from fugu_pipeline.train.checkpoints import Manifest
    from fugu_pipeline.train.exchange import PACK_FILES, pack
    from fugu_pipeline.train.signing import accept_key, new_key_pair, sign_pack

    path = trained.save(tmp_path / "models")
    assert Manifest.model_validate_json((path / "manifest.json").read_text()).head_params["domains"] == DOMAINS
    private, public = new_key_pair()
    accept_key(tmp_path / "host", "alice", public)
    p = pack(path, tmp_path / "pack", ledger=None, signing_key=private)
    for where in (path, p):
        m = json.loads((where / "manifest.json").read_text())
        m["head_params"]["domains"] = list(reversed(m["head_params"]["domains"]))
        (where / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="content_hash does not match its weights and fields"):
        load_triage(path)
    sign_pack(p, list(PACK_FILES), private)  # re-signed: only the manifest check can object
    result = preflight(p, tmp_path / "host", GateConfig())
    line = next(g.line() for g in result.gates if not g.ok)
    print("\n" + line)
    assert not result.ok and line.startswith("FAIL manifest: its content_hash does not match its weights and fields")


def test_triage_heads_go_through_the_one_contest(data, trained, tmp_path):
    """Before: triage heads had no king, no +0.02, no 1/day and no size rule. Now the one contest:
    0.7 domain + 0.3 difficulty on the host's test rows, the majority label to beat, king + 0.02,
    one attempt a day, under 1M parameters."""
    from fugu_pipeline.evaluate.contest import run_contest
    from fugu_pipeline.evaluate.gates import GateConfig
    from fugu_pipeline.evaluate.promotion import PromotionPolicy
    from fugu_pipeline.policies.triage.contest import TriageKind
    from fugu_pipeline.train.pointer import TRIAGE_POINTER, read_pointer

    models = tmp_path / "models"
    open_gates = PromotionPolicy(gates=GateConfig(rate_limit_s=0))
    good = trained.save(models)
    out = run_contest(TriageKind(data), [str(good)], models, open_gates)
    print("\n" + "\n".join(out["reasons"]))
    assert out["promoted"] and read_pointer(models, TRIAGE_POINTER)["content_hash"] == good.name
    assert any(r.startswith("challenger composite") and "0.7 domain + 0.3 difficulty accuracy" in r for r in out["reasons"])
    assert any(r.startswith("PASS size: 384 parameters") or r.startswith("PASS size: 144 parameters") for r in out["reasons"])
    c = out["contest"]["challenger"]
    assert [r["benchmark"] for r in c["benchmarks"]] == ["all"] and c["benchmarks"][0]["left_out"] == ["live", "novelty"]
    # a weaker head does not reach king + 0.02: refused with its reasons
    weak = train_triage(data, TriageConfig(epochs=3, lr=1e-4, seed=1)).save(tmp_path / "elsewhere")  # three epochs, barely moved
    out = run_contest(TriageKind(data), [str(weak)], models, open_gates)
    print("\n".join(out["reasons"]))
    assert not out["promoted"] and any(r.startswith(f"FAIL promoted (triage {good.name}): composite") for r in out["reasons"])
    # the king again: a duplicate; one attempt a day
    out = run_contest(TriageKind(data), [str(good)], models, open_gates)
    assert any("FAIL duplicate: behaves like triage" in r for r in out["reasons"])
    daily = PromotionPolicy()
    assert run_contest(TriageKind(data), [str(weak)], tmp_path / "m2", daily)["contest"] is not None
    out = run_contest(TriageKind(data), [str(good)], tmp_path / "m2", daily)
    assert out["reasons"][0].startswith("FAIL rate limit: 'pipeline' made an attempt at")
    # a head of a million parameters or more is refused before it is scored
    big = TriageHead(dim=170_000, n_domains=3, n_difficulty=3)
    with torch.no_grad():
        for p in big.parameters():
            p.normal_()
    from fugu_pipeline.train.checkpoints import save_checkpoint

    path = save_checkpoint(tmp_path / "big", "triage", "triage_linear", big.state_dict(), {
        "head_params": trained.head_params(), "worker_ids": WORKERS, "feature_contract": FeatureContract(
            encoder_id="synthetic", dim=170_000), "data_version": data.data_version, "curves": trained.curves,
        "metrics": trained.metrics})
    out = run_contest(TriageKind(data), [str(path)], models, open_gates)
    assert not out["promoted"] and any("FAIL size: 1,020,000 parameters (not < 1,000,000)" in r for r in out["reasons"])


def test_two_triage_attempts_at_once_the_second_faces_the_new_king(data, trained, tmp_path, monkeypatch):
    """The one contest's lock and compare-and-swap, for the triage kind: of two attempts started
    together, one faces nothing and the other waits and faces the head the first promoted."""
    import threading
    import time

    from fugu_pipeline.evaluate import contest
    from fugu_pipeline.evaluate.gates import GateConfig
    from fugu_pipeline.evaluate.promotion import PromotionPolicy
    from fugu_pipeline.policies.triage.contest import TriageKind

    models = tmp_path / "models"
    heads = {"alice": trained.save(tmp_path / "a"), "bob": train_triage(data, TriageConfig(epochs=60, seed=1)).save(tmp_path / "b")}
    slow_decide = contest.decide

    def slow(*args, **kw):  # the race window: scoring takes a while
        time.sleep(1.0)
        return slow_decide(*args, **kw)

    monkeypatch.setattr(contest, "decide", slow)
    outcomes = {}
    open_gates = PromotionPolicy(gates=GateConfig(rate_limit_s=0))
    threads = [threading.Thread(target=lambda w=w: outcomes.__setitem__(w, contest.run_contest(
        TriageKind(data), [str(heads[w])], models, open_gates, submitter=w))) for w in heads]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join()
    facing_nothing = [w for w, o in outcomes.items() if "PASS promoted: nothing promoted yet" in o["reasons"]]
    assert len(facing_nothing) == 1
    other = next(w for w in outcomes if w not in facing_nothing)
    assert any(r.startswith(("PASS promoted (triage", "FAIL promoted (triage")) for r in outcomes[other]["reasons"])
    hist = [json.loads(x) for x in (models / "promoted" / "triage-history.jsonl").read_text().splitlines()]
    assert len(hist) == 2 and {h["submitter"] for h in hist} == {"alice", "bob"}


def test_a_tie_between_training_domains_names_the_first_in_the_checkpoints_order(tmp_path):
    """Two domains equally common in training: the majority label is the first of them in the
    checkpoint's order, in every process. A set's order (which follows the process's string hash
    seed) decided it before, so one report said one domain and the next run's the other; the names
    here are picked so that this process's set order puts the later one first."""
    pair = next((a, b) for i in range(200) for a, b in [(f"d{i}a", f"d{i}b")] if next(iter({a, b})) == b)
    rng = np.random.default_rng(1)
    n, dim = 120, 8
    dom = np.array([0, 1] * (n // 2))
    splits = np.array((["train"] * 4 + ["val", "test"]) * (n // 6))
    assert (dom[splits == "train"] == 0).sum() == (dom[splits == "train"] == 1).sum()  # a tie in training
    feats = rng.normal(size=(2, dim))[dom] + 0.3 * rng.normal(size=(n, dim))
    quality = (rng.random((n, 3)) < 0.5).astype(float)
    data = RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=[f"p{i}" for i in range(n)],
                       domains=[pair[d] for d in dom], splits=splits, worker_ids=WORKERS,
                       features=feats.astype(np.float32), utility=quality, quality=quality,
                       contract=FeatureContract(encoder_id="synthetic", dim=dim))
    path = train_triage(data, TriageConfig(epochs=3)).save(tmp_path / "models")
    ckpt = load_triage(path, expected_contract=data.contract)
    assert ckpt.domains == list(pair)
    assert triage_report(ckpt, data, "test")["domain"]["majority_label"] == pair[0]
