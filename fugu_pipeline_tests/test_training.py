"""Router training on a synthetic reward matrix: SFT, RL and CMA-ES beat the best fixed worker on
held-out tasks, runs are reproducible to the byte, bad data is refused before training, and
checkpoints round-trip and refuse what they should."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import (
    RoutingData,
    TrainingDataError,
    carve_validation,
)
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.train.checkpoints import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    weight_sanity,
)
from fugu_pipeline.policies.oneshot.configs import ESConfig, RLConfig, SFTConfig
from fugu_pipeline.config_files import ConfigError, load_config
from fugu_pipeline.policies.oneshot.es import train_es
from fugu_pipeline.policies.oneshot.heads import HEADS, LINEAR_HEAD_KINDS, LinearHead, QualityHead, build_head
from fugu_pipeline.train.result import evaluate_head, greedy_utility
from fugu_pipeline.policies.oneshot.rl import train_rl
from fugu_pipeline.policies.oneshot.sft import train_sft

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
WORKERS = ["math-expert", "code-expert", "generalist"]
DOMAINS = ["math", "code", "general"]
QUIET = lambda s: None  # noqa: E731


def make_data(n: int = 600, dim: int = 32, seed: int = 0, noise: float = 2.0) -> RoutingData:
    """3 domains, linearly decodable from the features plus noise; 3 workers, each best on one
    domain; quality is a Bernoulli draw, utility = quality - cost and latency penalties."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 3, n)
    centers = rng.normal(0.0, 1.5, (3, dim))
    feats = (centers[d] + rng.normal(0.0, noise, (n, dim))).astype(np.float32)
    p_correct = np.array([[0.9, 0.3, 0.5], [0.3, 0.9, 0.45], [0.45, 0.4, 0.85]])  # [domain, worker]
    quality = (rng.random((n, 3)) < p_correct[d]).astype(np.float64)
    cost = np.tile([0.004, 0.006, 0.001], (n, 1))
    latency = np.tile([2.0, 3.0, 1.0], (n, 1))
    ucfg = UtilityConfig()
    utility = np.vectorize(ucfg.utility)(quality, cost, latency)
    r = rng.random(n)
    ids = [f"t{i:04d}" for i in range(n)]
    return RoutingData(
        task_ids=ids, prompts=[f"prompt {t}" for t in ids], domains=[DOMAINS[k] for k in d],
        splits=np.where(r < 0.6, "train", np.where(r < 0.8, "val", "test")), worker_ids=WORKERS,
        features=feats, utility=utility, quality=quality, cost_usd=cost, latency_s=latency,
        contract=FeatureContract(encoder_id="synthetic", dim=dim), utility_config=ucfg,
    )


@pytest.fixture(scope="module")
def data() -> RoutingData:
    return make_data()


@pytest.fixture(scope="module")
def sft(data):
    return train_sft(data, SFTConfig(), log=QUIET)


@pytest.fixture(scope="module")
def rl(data, sft):
    return train_rl(data, RLConfig(), init_state=sft.state_dict, log=QUIET)


@pytest.fixture(scope="module")
def es(data, sft):
    return train_es(data, ESConfig(generations=60), init_state=sft.state_dict, log=QUIET)


def held_out(result, data) -> dict:
    return evaluate_head(result.state_dict, result.head_kind, data.split("test"), data.split("train"))


def val_utility(state, kind, data) -> float:
    return evaluate_head(state, kind, data.split("val"))["router_utility"]


# --------------------------------------------------------------------------- learning


def test_sft_beats_best_fixed_on_test(data, sft):
    ev = held_out(sft, data)
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev
    assert sft.best_epoch >= 1 and len(sft.curves["train_loss"]) == len(sft.curves["val_utility"])
    assert sft.curves["val_utility"][sft.best_epoch - 1] == pytest.approx(sft.metrics["val_utility"])


@pytest.mark.parametrize("estimator", ["reinforce", "expected_reward"])
def test_rl_from_scratch_beats_best_fixed_on_test(data, estimator):
    res = train_rl(data, RLConfig(estimator=estimator), log=QUIET)
    ev = held_out(res, data)
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev


def test_rl_warm_start_never_worse_on_val_and_beats_best_fixed(data, sft, rl):
    assert rl.metrics["val_utility"] >= sft.metrics["val_utility"]
    ev = held_out(rl, data)
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev


def test_es_beats_best_fixed_on_test(data, es):
    ev = held_out(es, data)
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev
    assert len(es.curves["train_best"]) == 60 and es.curves["val_generation"] == [0, 10, 20, 30, 40, 50, 60]


def test_es_from_random_init_learns(data):
    res = train_es(data, ESConfig(generations=60, sigma0=0.5), log=QUIET)
    start = val_utility(build_head("layernorm_linear", data.dim, 3).state_dict(), "layernorm_linear", data)
    ev = held_out(res, data)
    assert res.metrics["val_utility"] > start
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev


def test_es_never_worse_on_val_than_warm_start(data, sft, es):
    assert val_utility(es.state_dict, "layernorm_linear", data) >= val_utility(sft.state_dict, "layernorm_linear", data)


def test_es_keeps_a_deliberately_good_warm_start(data):
    # a hand-built head that is near-perfect on val: each worker's weight row is the mean
    # normalised feature of its own domain's val tasks
    head = LinearHead(data.dim, 3)
    val = data.split("val")
    with torch.no_grad():
        z = head.frozen(torch.from_numpy(val.features)).numpy()
        dom = np.array([DOMAINS.index(x) for x in val.domains])
        head.linear.weight.copy_(torch.tensor(np.stack([z[dom == k].mean(0) for k in range(3)]) * 5.0))
        head.linear.bias.zero_()
    good = {k: v.clone() for k, v in head.state_dict().items()}
    res = train_es(data, ESConfig(generations=30, sigma0=0.05), init_state=good, log=QUIET)
    assert val_utility(res.state_dict, "layernorm_linear", data) >= val_utility(good, "layernorm_linear", data)


def test_quality_head_trains_and_routes_on_quality_minus_cost(data):
    res = train_sft(data, SFTConfig(head="quality"), log=QUIET)
    head = res.head()
    assert isinstance(head, QualityHead) and head.cost_weight.item() == pytest.approx(0.1)
    x = torch.from_numpy(data.features[:5])
    with torch.no_grad():
        assert torch.allclose(head(x), head.route_scores(x, head.cost_weight, head.expected_cost))
        assert bool(((head.predict_quality(x) >= 0) & (head.predict_quality(x) <= 1)).all())
    ev = held_out(res, data)
    assert ev["router_utility"] > ev["best_fixed_utility"] + 0.1, ev


def test_heads_param_counts():
    assert build_head("layernorm_linear", 32, 3).param_count() == 2 * 32 + 32 * 3 + 3
    assert build_head("normed_linear", 32, 3).param_count() == 32 * 3
    assert build_head("quality", 32, 3).param_count() == 2 * 32 + 32 * 3 + 3
    assert build_head("roles_linear", 1024, 3).param_count() == 6 * 1024  # TinyRouter's 6,144: (3 workers + 3 roles) x 1,024
    assert set(LINEAR_HEAD_KINDS) == {"layernorm_linear", "normed_linear", "quality"}
    assert set(HEADS) == set(LINEAR_HEAD_KINDS) | {"knn", "domain_prior", "ridge", "mlp", "ensemble", "roles_linear", "roles_linear_svf", "cascade", "triage_linear"}
    with pytest.raises(ValueError, match="unknown head kind"):
        build_head("transformer", 32, 3)


def test_greedy_utility_first_index_on_ties():
    u = np.array([[0.0, 1.0], [1.0, 0.0]])
    assert greedy_utility(np.array([[0.0, 1.0], [0.5, 0.5]]), u) == 1.0


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("method", ["sft", "rl", "es"])
def test_same_seed_same_checkpoint_bytes(tmp_path, data, sft, rl, es, method):
    first = {"sft": sft, "rl": rl, "es": es}[method]
    if method == "sft":
        again = train_sft(data, SFTConfig(), log=QUIET)
    elif method == "rl":
        again = train_rl(data, RLConfig(), init_state=sft.state_dict, log=QUIET)
    else:
        again = train_es(data, ESConfig(generations=60), init_state=sft.state_dict, log=QUIET)
    a, b = first.save(tmp_path / "a"), again.save(tmp_path / "b")
    assert a.name == b.name and a.parent.name == method
    assert (a / "head.safetensors").read_bytes() == (b / "head.safetensors").read_bytes()


def test_linear_heads_train_on_one_thread_whatever_the_caller_set_and_give_it_back(data, sft):
    """A busy CPU made these tiny heads 10-50x slower on two threads (OpenMP barriers waiting on a
    descheduled thread): SFT, RL, CMA-ES and triage train on one, restore the caller's count, and
    save the same bytes whatever it was."""
    from fugu_pipeline.policies.triage.train import TriageConfig, train_triage

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen: dict[str, set[int]] = {}
        runs = {
            "sft": lambda log: train_sft(data, SFTConfig(epochs=3), log=log),
            "rl": lambda log: train_rl(data, RLConfig(epochs=2), init_state=sft.state_dict, log=log),
            "es": lambda log: train_es(data, ESConfig(generations=3), init_state=sft.state_dict, log=log),
            "triage": lambda log: train_triage(data, TriageConfig(epochs=3), log=log),
        }
        for name, run in runs.items():
            run(lambda m, name=name: seen.setdefault(name, set()).add(torch.get_num_threads()))
            assert seen[name] == {1}, f"{name} logged from a training loop on {seen[name]} threads"
            assert torch.get_num_threads() == 2, f"{name} did not give the caller its 2 threads back"
        two = train_sft(data, SFTConfig(epochs=3), log=QUIET)
        torch.set_num_threads(1)
        one = train_sft(data, SFTConfig(epochs=3), log=QUIET)
        for k, v in two.state_dict.items():
            assert torch.equal(v, one.state_dict[k]), k
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- bad data


def _bad(data: RoutingData, **changes) -> RoutingData:
    return dataclasses.replace(data, data_version="", **changes)


def _assert_refused_before_training(bad: RoutingData, match: str, **kw):
    with pytest.raises(TrainingDataError, match=match):
        bad.validate(**kw)
    for fn in (train_sft, train_rl, train_es):
        logged: list[str] = []
        with pytest.raises(TrainingDataError, match=match):
            fn(bad, log=logged.append)
        assert logged == [], f"{fn.__name__} started training before refusing"


def test_nan_reward_refused_naming_task_and_worker(data):
    u = data.utility.copy()
    u[7, 1] = np.nan
    _assert_refused_before_training(_bad(data, utility=u), r"utility .*t0007.*code-expert")


def test_infinite_feature_refused_naming_task_and_column(data):
    f = data.features.copy()
    f[3, 5] = np.inf
    _assert_refused_before_training(_bad(data, features=f), r"features .*t0003.*dim 5")


def test_feature_rows_must_match_reward_rows(data):
    _assert_refused_before_training(_bad(data, features=data.features[:-1]), "features have 599 rows")


def test_feature_task_order_must_match_reward_order(data):
    order = list(data.task_ids)
    order[10], order[11] = order[11], order[10]
    _assert_refused_before_training(_bad(data, feature_task_ids=order), r"not in reward-matrix task order.*row 10")


def test_missing_val_split_refused_with_the_fix(data):
    splits = np.where(data.splits == "val", "train", data.splits)
    _assert_refused_before_training(_bad(data, splits=splits), r"'val' split has no rows.*carve_validation")


def test_no_learning_signal_refused_unless_forced(data):
    tied = _bad(data, utility=np.ones_like(data.utility))
    _assert_refused_before_training(tied, r"no learning signal.*force=True")
    tied.validate(force=True)


def test_quality_head_needs_quality(data):
    with pytest.raises(TrainingDataError, match="no quality matrix"):
        train_sft(_bad(data, quality=None), SFTConfig(head="quality"), log=QUIET)


def test_carve_validation_is_deterministic_and_order_free(data):
    no_val = _bad(data, splits=np.where(data.splits == "val", "train", data.splits))
    carved = carve_validation(no_val, fraction=0.15, seed=3)
    val_ids = {t for t, s in zip(carved.task_ids, carved.splits) if s == "val"}
    n_train = int((no_val.splits == "train").sum())
    assert 0.08 * n_train < len(val_ids) < 0.22 * n_train
    assert carved.counts()["test"] == no_val.counts()["test"]
    rev = carve_validation(no_val.subset(np.arange(no_val.n_tasks)[::-1]), fraction=0.15, seed=3)
    assert {t for t, s in zip(rev.task_ids, rev.splits) if s == "val"} == val_ids
    carved.validate()
    assert carve_validation(data) is data


def test_data_version_tracks_content(data):
    assert data.data_version == make_data().data_version
    u = data.utility.copy()
    u[0, 0] += 0.5
    assert _bad(data, utility=u).data_version != data.data_version


# --------------------------------------------------------------------------- configs


def test_default_configs_load():
    assert load_config(CONFIGS / "train_sft.yaml", SFTConfig) == SFTConfig()
    assert load_config(CONFIGS / "train_rl.yaml", RLConfig) == RLConfig()
    assert load_config(CONFIGS / "train_es.yaml", ESConfig) == ESConfig()


def test_bad_config_names_file_and_field(tmp_path):
    p = tmp_path / "sft.yaml"
    p.write_text("temperature: -1\nepoch: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p, SFTConfig)
    msg = str(exc.value)
    assert str(p) in msg and "temperature" in msg and "epoch" in msg
    p.write_text("head: mlp\n")
    with pytest.raises(ConfigError, match="head.*unknown head"):
        load_config(p, RLConfig)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(tmp_path, data, sft):
    path = sft.save(tmp_path)
    assert path.parent == tmp_path / "sft" and sorted(p.name for p in path.iterdir()) == ["head.safetensors", "manifest.json"]
    ck = load_checkpoint(path, expected_contract=data.contract)
    m = ck.manifest
    assert m.worker_ids == WORKERS and m.data_version == data.data_version and m.param_count == sft.param_count
    assert m.contract_fingerprint == data.contract.fingerprint() and m.head_kind == "layernorm_linear"
    assert m.training_config == SFTConfig().model_dump() and m.metrics["best_epoch"] == sft.best_epoch
    assert not ck.head.training
    x = torch.from_numpy(data.features[:20])
    with torch.no_grad():
        assert torch.equal(ck.head(x), sft.head()(x))
    assert sft.save(tmp_path) == path  # same content: kept, not rewritten
    assert [p.name for p in (tmp_path / "sft").iterdir()] == [path.name]


def test_contract_mismatch_refused_naming_each_field(tmp_path, data, sft):
    path = sft.save(tmp_path)
    other = data.contract.model_copy(update={"encoder_id": "Qwen/Qwen3-0.6B", "pooling": "last"})
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(path, expected_contract=other)
    assert "encoder_id" in str(exc.value) and "pooling" in str(exc.value) and "dim" not in str(exc.value)


def test_nan_weights_refused(tmp_path, data, sft):
    state = {k: v.clone() for k, v in sft.state_dict.items()}
    state["linear.weight"][0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"linear.weight holds 1 non-finite"):
        save_checkpoint(tmp_path, "sft", "layernorm_linear", state, sft.manifest_fields())
    # a good checkpoint whose weights file is later replaced by NaN weights
    from safetensors.torch import save_file

    path = sft.save(tmp_path)
    save_file(state, str(path / "head.safetensors"))
    with pytest.raises(CheckpointError, match=r"non-finite.*") as exc:
        load_checkpoint(path)
    assert "weights_sha256" in str(exc.value)


def test_weight_sanity_reports_shape_and_zero(data, sft, tmp_path):
    m = load_checkpoint(sft.save(tmp_path)).manifest
    assert weight_sanity(sft.state_dict, m) == []
    state = dict(sft.state_dict)
    state["linear.weight"] = torch.zeros(3, 32)
    state["linear.bias"] = torch.zeros(4)
    problems = weight_sanity(state, m)
    assert any("linear.bias has shape [4]" in p for p in problems)
    assert any("all zero" in p for p in problems)


# --------------------------------------------------------------------------- dagster metadata


def test_train_result_metadata(tmp_path, es):
    from fugu_pipeline.defs.training import train_result_metadata

    path = es.save(tmp_path)  # read from the manifest: the same for a checkpoint trained now or kept from a run before
    md = train_result_metadata(path)
    assert md["curves"].value.startswith("![es training curves](data:image/png;base64,iVBOR")
    assert md["param_count"].value == es.param_count and md["best_epoch"].value == es.best_epoch
    assert md["checkpoint"].value == str(path)


def test_a_training_loops_lines_reach_the_run_log_as_blocks(monkeypatch):
    """Each line was its own Dagster event (a database commit); now the lines of a short run are one
    block when the loop ends, a long run's one block every `every_s` seconds, and a failed run's are
    written all the same."""
    from fugu_pipeline.defs import training

    events, now = [], [0.0]
    monkeypatch.setattr(training.time, "monotonic", lambda: now[0])
    with training.GatheredLog(events.append, every_s=10) as log:
        log("sft epoch 1")
        log("sft epoch 2")
        assert events == []
        now[0] = 10.0
        log("sft epoch 3")  # ten seconds in: the block so far is written
        assert events == ["sft epoch 1\nsft epoch 2\nsft epoch 3"]
        log("sft epoch 4")
    assert events[1:] == ["sft epoch 4"]
    with pytest.raises(RuntimeError), training.GatheredLog(events.append) as log:
        log("rl epoch 1")
        raise RuntimeError("stopped")
    assert events[2:] == ["rl epoch 1"]


def test_training_curves_are_kept_beside_the_checkpoint_and_drawn_once(tmp_path, es, monkeypatch):
    """A re-run that trains the same checkpoint again takes its curve plot from the checkpoint's
    folder (the bytes a fresh draw gives) instead of drawing it; other curves are drawn again."""
    import dataclasses

    from fugu_pipeline.defs import training
    from fugu_pipeline.evaluate import plots

    drawn = []
    real = plots.png_bytes
    monkeypatch.setattr(plots, "png_bytes", lambda *a, **k: drawn.append(1) or real(*a, **k))
    path = tmp_path / "ckpt" / training.CURVES_FILE
    png = training.curves_png(es, path)
    assert path.read_bytes() == png and len(drawn) == 1
    assert training.curves_png(es, path) == png and len(drawn) == 1  # kept, not drawn
    assert training.curves_png(es) == png and len(drawn) == 2  # a fresh draw: the same bytes
    other = dataclasses.replace(es, curves={**es.curves, "val_best": [v + 0.01 for v in es.curves["val_best"]]})
    assert training.curves_png(other, path) != png and len(drawn) == 3
    assert path.read_bytes() != png


def test_seeded_sets_the_deterministic_flag_without_loading_inductor(monkeypatch):
    """`seeded` turns torch's deterministic kernels on and restores the caller's setting (warn-only
    included) without `torch.use_deterministic_algorithms`, whose import of Inductor and Dynamo cost
    seconds of CPU in every process that trains on cached features."""
    import torch

    from fugu_pipeline.train.loop import seeded

    def refused(*a, **k):
        raise AssertionError("torch.use_deterministic_algorithms imports torch._inductor")

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    monkeypatch.setattr(torch, "use_deterministic_algorithms", refused)
    try:
        for flag, warn_only in ((True, True), (False, False)):
            torch._C._set_deterministic_algorithms(flag, warn_only=warn_only)
            with seeded(0):
                assert torch.are_deterministic_algorithms_enabled()
                assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) \
                == (flag, warn_only)
    finally:
        torch._C._set_deterministic_algorithms(before[0], warn_only=before[1])
