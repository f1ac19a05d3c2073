"""King versus challenger, the atomic pointer, and the loader downstream code uses."""

import hashlib
import json
import re
import threading

import numpy as np
import pytest
import torch
from safetensors.torch import save as st_save

from fugu_pipeline.evaluate.composite import CompositeConfig
from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.policies.registry import load_promoted
from fugu_pipeline.route.router import RouterError
from fugu_pipeline.train.checkpoints import MANIFEST_FILE, WEIGHTS_FILE
from fugu_pipeline.policies.oneshot.configs import RLConfig, SFTConfig
from fugu_pipeline.train.pointer import read_pointer, write_pointer
from fugu_pipeline.policies.oneshot.rl import train_rl
from fugu_pipeline.policies.oneshot.sft import train_sft

WORKERS = ["math-w", "code-w", "gen-w"]
OPEN = PromotionPolicy(gates=GateConfig(rate_limit_s=0))  # these tests make several attempts in a row
DOMAINS = ["math", "code", "general"]


def synthetic(features: np.ndarray, domains: list[str], contract: FeatureContract, seed: int = 0) -> RoutingData:
    rng = np.random.default_rng(seed)
    n = len(domains)
    q = np.array([[0.9 if DOMAINS[j] == d else 0.35 for j in range(3)] for d in domains])
    quality = (rng.random((n, 3)) < q).astype(float)
    utility = quality - np.array([0.02, 0.04, 0.01])
    splits = np.array(["test" if i % 4 == 0 else "val" if i % 4 == 1 else "train" for i in range(n)])
    return RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=[f"p{i}" for i in range(n)], domains=domains,
                       splits=splits, worker_ids=WORKERS, features=features, utility=utility, contract=contract,
                       quality=quality)


@pytest.fixture(scope="module")
def data() -> RoutingData:
    rng = np.random.default_rng(1)
    domains = [DOMAINS[i % 3] for i in range(600)]
    centers = rng.normal(size=(3, 16))
    feats = np.stack([centers[DOMAINS.index(d)] for d in domains]) + 0.5 * rng.normal(size=(600, 16))
    return synthetic(feats.astype(np.float32), domains, FeatureContract(encoder_id="synthetic", dim=16))


@pytest.fixture
def good(data, tmp_path):
    return train_sft(data, SFTConfig(epochs=40)).save(tmp_path / "models")


def bad_head(data, tmp_path, seed: int = 0):
    """An anti-router: a trained head with its final layer negated sends tasks to a non-expert."""
    r = train_sft(data, SFTConfig(epochs=40, seed=seed))
    state = {k: v.clone() for k, v in r.state_dict.items()}
    state["linear.weight"] = -state["linear.weight"]
    state["linear.bias"] = -state["linear.bias"]
    r.state_dict = state
    return r.save(tmp_path / "models")


def tamper(path, fn):
    """Rewrite a checkpoint's weights with fn(state) and a matching sha and content hash (so only
    sanity can refuse it). A folder named by its hash moves to the new hash (a folder named for
    another checkpoint is refused on load); use the path returned."""
    from safetensors.torch import load

    from fugu_pipeline.train.checkpoints import Manifest, checkpoint_hash

    state = fn(load((path / WEIGHTS_FILE).read_bytes()))
    raw = st_save(state, metadata={"format": "pt"})
    (path / WEIGHTS_FILE).write_bytes(raw)
    m = json.loads((path / MANIFEST_FILE).read_text())
    m["weights_sha256"] = hashlib.sha256(raw).hexdigest()
    m["content_hash"] = checkpoint_hash(raw, Manifest.model_validate(m))
    (path / MANIFEST_FILE).write_text(json.dumps(m))
    if re.fullmatch(r"[0-9a-f]{16}", path.name) and path.name != m["content_hash"]:
        path = path.rename(path.parent / m["content_hash"])
    return path


def test_better_challenger_promoted_worse_one_not(data, good, tmp_path):
    models = tmp_path / "models"
    worse = bad_head(data, tmp_path)
    out = promote_best([str(worse)], data, models, OPEN)
    assert not out["promoted"] and read_pointer(models) is None
    assert any(r.startswith("FAIL best fixed") for r in out["reasons"])
    out = promote_best([str(good)], data, models, OPEN)
    assert out["promoted"], out["reasons"]
    assert read_pointer(models)["checkpoint"] == str(good.relative_to(models))
    # the same checkpoint again, or the worse one again: judged before, refused as duplicates
    for again in (good, worse):
        out = promote_best([str(again)], data, models, OPEN)
        assert not out["promoted"] and any("FAIL duplicate: behaves like" in r and "cosine 1.0000" in r for r in out["reasons"])
    # another worse head: scored against the king, which stays
    out = promote_best([str(bad_head(data, tmp_path, seed=1))], data, models, OPEN)
    assert not out["promoted"] and any(r.startswith("FAIL promoted") for r in out["reasons"])
    assert read_pointer(models)["checkpoint"] == str(good.relative_to(models))
    history = (models / "promoted" / "history.jsonl").read_text().splitlines()
    assert [json.loads(h)["promote"] for h in history] == [False, True, False, False, False]


def test_margin_is_paired_against_the_king(data, good, tmp_path):
    models = tmp_path / "models"
    assert promote_best([str(good)], data, models, OPEN)["promoted"]
    # warm-started from another SFT run: RL from the king itself would be refused as its duplicate
    rl = train_rl(data, RLConfig(epochs=5), init_state=train_sft(data, SFTConfig(seed=5)).state_dict).save(models)
    out = promote_best([str(rl)], data, models, OPEN.model_copy(update={"margin": 0.5}))
    assert not out["promoted"] and any("needs ≥ +0.5000 and low end > 0" in r for r in out["reasons"])


@pytest.mark.parametrize("breakage, reason", [
    (lambda s: {**s, "linear.weight": torch.full_like(s["linear.weight"], float("nan"))}, "non-finite"),
    (lambda s: {**s, "linear.weight": torch.zeros(3, 8)}, "shape"),
    (lambda s: {**s, "linear.weight": torch.zeros_like(s["linear.weight"])}, "all zero"),
])
def test_broken_weights_are_refused_with_their_reason(data, good, tmp_path, breakage, reason):
    good = tamper(good, breakage)
    out = promote_best([str(good)], data, tmp_path / "models", OPEN)
    assert not out["promoted"] and read_pointer(tmp_path / "models") is None
    # the weight gate itself refuses it (it cannot even load), and the history keeps that reason
    assert any(r.startswith(f"REFUSED {good}: FAIL weights: ") and reason in r for r in out["reasons"])
    last = json.loads((tmp_path / "models" / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["promote"] is False and last["challenger"] == str(good)
    assert last["reasons"][0].startswith("FAIL weights: ") and reason in last["reasons"][0]


def test_a_broken_challenger_does_not_block_a_good_one(data, good, tmp_path):
    broken = tamper(bad_head(data, tmp_path), lambda s: {**s, "linear.bias": torch.full_like(s["linear.bias"], float("inf"))})
    out = promote_best([str(broken), str(good)], data, tmp_path / "models", OPEN)
    assert out["promoted"] and out["challenger"] == str(good)
    assert any(r.startswith(f"REFUSED {broken}: FAIL weights: ") for r in out["reasons"])


def cand(test_u, fixed_u, name="c", train=None):
    from fugu_pipeline.evaluate.promotion import Candidate

    test_u = np.asarray(test_u, float)
    return Candidate(path=name, method="sft", content_hash=name, test_utility=test_u, best_fixed_utility=np.asarray(fixed_u, float),
                     train_router_utility=float(test_u.mean()) if train is None else train)


def contest_of(king_q, ch_q, policy):
    """King and challenger whose routes give these per-task qualities (one benchmark, no audit
    slice, no live run), scored by the real composite code."""
    from fugu_pipeline.evaluate.composite import HeldOut, paired_difference, score_head

    n = len(king_q)
    held = HeldOut(task_ids=[f"t{i}" for i in range(n)], benchmarks=np.array(["b"] * n, dtype=object),
                   audit=np.zeros(n, bool), measure=np.stack([king_q, ch_q], axis=1), measure_name="quality",
                   worker_ids=["k", "c"])
    rk, rc = np.zeros(n, int), np.ones(n, int)
    ch = score_head(rc, held, policy.composite, king_routes=rk)
    kg = score_head(rk, held, policy.composite, is_king=True)
    return {"challenger": ch, "king": kg, "difference": paired_difference(rc, rk, held, policy.composite, ch, kg)}


def test_defaults_are_the_seeds_rule_king_plus_0_02_and_a_significant_gain():
    from fugu_pipeline.evaluate.promotion import decide

    policy = PromotionPolicy()
    assert policy.margin == 0.02 and policy.require_significant
    # novelty off here (its weight moved to cached: still summing to 1), so the composite
    # difference is the accuracy difference alone
    policy = policy.model_copy(update={"composite": CompositeConfig(novelty_weight=0.0, cached_weight=0.75)})
    rng = np.random.default_rng(0)
    king_u = rng.random(200)
    fixed = king_u - 0.2
    king = cand(king_u, fixed, "king")
    small = decide(cand(king_u + 0.01, fixed), king, policy, contest_of(king_u, king_u + 0.01, policy))  # better everywhere, by less than the margin
    assert not small.promote and any(r.startswith("FAIL promoted") and "+0.0100" in r for r in small.reasons)
    assert decide(cand(king_u + 0.02, fixed), king, policy, contest_of(king_u, king_u + 0.02, policy)).promote  # exactly king + 0.02
    # a large mean gain that is noise: +1.05 on half the tasks, -0.95 on the other half
    noisy = king_u + np.where(np.arange(200) % 2 == 0, 1.05, -0.95)
    d = decide(cand(noisy, noisy - 0.5), king, policy, contest_of(king_u, noisy, policy))
    assert not d.promote and d.figures["gain_over_promoted"]["mean"] >= 0.02 > 0 > d.figures["gain_over_promoted"]["low"]
    loose = policy.model_copy(update={"require_significant": False})
    assert decide(cand(noisy, noisy - 0.5), king, loose, contest_of(king_u, noisy, loose)).promote
    with pytest.raises(ValueError, match="needs the composite contest"):
        decide(cand(king_u + 0.02, fixed), king, policy)
    # against the best fixed worker too: a mean gain whose interval reaches below zero is not enough
    vs_fixed = decide(cand(king_u, king_u - np.where(np.arange(200) % 2 == 0, 1.0, -0.96)), None, policy)
    assert not vs_fixed.promote and any(r.startswith("FAIL best fixed") and "low end > 0" in r for r in vs_fixed.reasons)


def test_a_quality_head_with_near_uniform_predictions_is_refused(data, tmp_path):
    trained = train_sft(data, SFTConfig(head="quality", epochs=40)).save(tmp_path / "models")
    out = promote_best([str(trained)], data, tmp_path / "models", OPEN)
    assert out["promoted"] and any(r.startswith("PASS quality head") for r in out["reasons"])
    # the same head with its final layer shrunk: every prediction within a hair of sigmoid(bias)
    flat = train_sft(data, SFTConfig(head="quality", epochs=40, seed=1)).save(tmp_path / "other")
    flat = tamper(flat, lambda s: {**s, "linear.weight": s["linear.weight"] * 1e-4, "linear.bias": torch.zeros_like(s["linear.bias"])})
    out = promote_best([str(flat)], data, tmp_path / "flat-models", OPEN)
    assert not out["promoted"]
    line = next(r for r in out["reasons"] if r.startswith("FAIL quality head"))
    assert "std 0.00" in line and "must be ≥ 0.01" in line and "cost alone" in line


def test_mismatched_contract_is_refused(data, tmp_path):
    other = RoutingData(**{**{f: getattr(data, f) for f in ("task_ids", "prompts", "domains", "splits", "worker_ids", "features", "utility", "quality")},
                           "contract": FeatureContract(encoder_id="another-encoder", dim=16, pooling="last")})
    path = train_sft(other, SFTConfig(epochs=20)).save(tmp_path / "models")
    out = promote_best([str(path)], data, tmp_path / "models", OPEN)
    assert not out["promoted"] and out["contest"] is None  # a gate: refused before it is scored
    assert any("FAIL contract" in r and "encoder_id" in r and "pooling" in r for r in out["reasons"])


def test_reader_never_sees_a_broken_pointer(tmp_path):
    models = tmp_path / "models"
    write_pointer(models, {"checkpoint": "sft/a", "content_hash": "a" * 16, "pad": "x" * 20000})
    stop = threading.Event()
    errors, reads = [], [0]

    def reader():
        while not stop.is_set():
            try:
                ptr = read_pointer(models)
                assert ptr["content_hash"] in ("a" * 16, "b" * 16) and ptr["checkpoint"] in ("sft/a", "rl/b")
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        if i % 2:
            write_pointer(models, {"checkpoint": "sft/a", "content_hash": "a" * 16, "pad": "x" * 20000})
        else:
            write_pointer(models, {"checkpoint": "rl/b", "content_hash": "b" * 16, "pad": "y" * 30000})
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and reads[0] > 100
    assert not list((models / "promoted").glob("*.tmp"))


def test_load_promoted_follows_new_promotions_without_restart(tmp_path):
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32"))
    domains = [DOMAINS[i % 3] for i in range(300)]
    prompts = [{"math": f"Compute {i} plus {i * 3} and reply with the sum.",
                "code": f"Write a Python function number {i} that reverses a list.",
                "general": f"What is the capital city of country number {i}?"}[d] for i, d in enumerate(domains)]
    feats = enc.encode(prompts)
    base = synthetic(feats, domains, enc.feature_contract())
    models = tmp_path / "models"
    first = train_sft(base, SFTConfig(epochs=60)).save(models)
    write_pointer(models, {"checkpoint": str(first.relative_to(models)), "content_hash": first.name})
    router = load_promoted(models, device="cpu", dtype="float32")
    d1 = router.route("Compute 7 plus 21 and reply with the sum.", domain="math")
    assert d1.worker_id in WORKERS and abs(sum(d1.probabilities.values()) - 1) < 1e-5
    assert d1.checkpoint == str(first)
    encoder_before = router.router.encoder
    # promote a router trained on swapped rewards: the running loader picks it up
    swapped = RoutingData(**{**{f: getattr(base, f) for f in ("task_ids", "prompts", "domains", "splits", "worker_ids", "features", "contract", "quality")},
                             "utility": base.utility[:, ::-1].copy()})
    second = train_sft(swapped, SFTConfig(epochs=60)).save(models)
    write_pointer(models, {"checkpoint": str(second.relative_to(models)), "content_hash": second.name})
    d2 = router.route("Compute 7 plus 21 and reply with the sum.", domain="math")
    assert d2.checkpoint == str(second) and router.reloads == 2
    assert router.router.encoder is encoder_before  # same feature contract: the loaded encoder was reused
    with pytest.raises(RouterError, match="unknown worker"):
        router.route("x", allowed=["nope"])
    only = router.route("x", allowed=["gen-w"])
    assert only.worker_id == "gen-w" and list(only.probabilities) == ["gen-w"]


def test_readers_never_meet_a_closed_encoder_while_promotions_swap(tmp_path):
    """Threads route without pause while the pointer flips between two checkpoints whose feature
    contracts differ (mean vs last pooling), so every swap loads a new encoder and drops the old."""
    import gc
    import time
    import weakref

    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings

    domains = [DOMAINS[i % 3] for i in range(120)]
    prompts = [f"{d} task number {i}: please answer it" for i, d in enumerate(domains)]
    models, paths = tmp_path / "models", []
    for pooling in ("mean", "last"):
        enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32", pooling=pooling))
        data = synthetic(enc.encode(prompts, domains), domains, enc.feature_contract())
        paths.append(train_sft(data, SFTConfig(epochs=5)).save(models))
        enc.close()
    point = lambda p: write_pointer(models, {"checkpoint": str(p.relative_to(models)), "content_hash": p.name})  # noqa: E731
    point(paths[0])
    router = load_promoted(models, device="cpu", dtype="float32")
    stop, errors, routed, encoders = threading.Event(), [], [0], []

    def reader(i):
        while not stop.is_set():
            try:
                r = router.router  # hold a router the way a server batch does, and use it a little later
                encoders.append(weakref.ref(r.encoder))
                time.sleep(0.01 * (i + 1))
                d = r.route_batch([f"math question {i}", "write code"], ["math", "code"])
                assert all(x.worker_id in WORKERS for x in d)
                router.route("What is the capital of France?", domain="general")
                routed[0] += 1
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for k in range(8):
        point(paths[(k + 1) % 2])
        router.refresh()
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and routed[0] > 0 and router.reloads == 9
    # the dropped encoders were freed once their last user let go: nothing leaks
    current = router.router.encoder
    gc.collect()
    alive = {id(e()) for e in encoders if e() is not None}
    assert alive <= {id(current)}


def test_no_pointer_is_a_clear_error(tmp_path):
    with pytest.raises(RouterError, match="no promoted router"):
        load_promoted(tmp_path / "models")


def test_the_asset_config_and_the_core_policy_share_their_defaults(tmp_path):
    from fugu_pipeline.defs.harness import policy_for
    from fugu_pipeline.defs.reports import PromotionConfig
    from fugu_pipeline.defs.resources import PipelineResource
    from fugu_pipeline.evaluate.promotion import load_policy
    from fugu_pipeline_tests.conftest import REPO

    asset, core = PromotionConfig(), PromotionPolicy()
    shared = set(PromotionConfig.model_fields) & set(PromotionPolicy.model_fields)
    assert shared == {"margin", "max_train_gap", "require_significant", "min_quality_std"}
    assert all(getattr(asset, k) is None for k in shared)  # None: the policy file's value
    # the shipped policy file spells out the defaults, but one: the sample project (6 audit rows a
    # domain) judges overfitting with the guarded rule, the code's default being the literal one
    shipped = core.model_copy(update={"composite": core.composite.model_copy(update={"overfit_rule": "guarded"})})
    assert core.composite.overfit_rule == "literal"
    assert load_policy(REPO / "configs" / "promotion.yaml", required=True) == shipped
    assert policy_for(PipelineResource(project_dir=str(tmp_path)), asset.policy_file) == core
    assert policy_for(PipelineResource(project_dir=str(tmp_path)), None, margin=0.05).margin == 0.05
