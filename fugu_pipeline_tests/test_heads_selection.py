"""The quality-predictor heads (kNN, domain prior, MLP, ensemble): saved, loaded and routed with the
domain through the same checkpoint path as every head; their own weight checks; selection on
validation only (the test split cannot change any choice); `fugu-lite train` end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import numpy as np
import pytest
import torch

from fugu_pipeline.policies.oneshot.contest import validation_utility
from fugu_pipeline.evaluate.reports import evaluate_checkpoint, head_scores, quality_predictions
from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.train.checkpoints import UNHASHED_FIELDS, load_checkpoint, save_checkpoint, weight_sanity
from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
from fugu_pipeline.policies.oneshot.families import FitData, KNNFamily
from fugu_pipeline.policies.oneshot.fit import fit_and_save, select_heads
from fugu_pipeline.policies.oneshot.heads import build_head, call_head
from fugu_pipeline.policies.oneshot.predictors import DomainPriorHead, KNNHead
from fugu_pipeline.train.selection import RULES, Objective, fold_ids, nested_rule_check
from fugu_pipeline_tests.test_training import make_data

QUIET = lambda s: None  # noqa: E731
FAST = TrainSetConfig.model_validate({"heads": {
    "domain_prior": {"m": [5, 20]},
    "knn": {"k": [10, 30], "prior_weight": [0, 30], "same_domain_bonus": [0, 1]},
    "mlp": {"hidden": [16], "epochs": [5], "n_models": 1},
    "ensemble": {"rounds": 5},
}})
KINDS = {"domain_prior", "knn", "ridge", "mlp"}


@pytest.fixture(scope="module")
def data():
    return make_data(n=500)


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory):
    return fit_and_save(data, tmp_path_factory.mktemp("models"), FAST, log=QUIET)


def test_every_kind_is_saved_loaded_and_routed_with_the_domain(data, fitted):
    test = data.split("test")
    assert KINDS <= {s.kind for s in fitted.saved}
    assert sum(s.selected for s in fitted.saved) == 1
    for s in fitted.saved:
        assert s.path.parent.name == s.kind and s.path.parent.parent.name == fitted.saved[0].path.parent.parent.name
        ckpt = load_checkpoint(s.path, expected_contract=data.contract)
        m = ckpt.manifest
        assert m.head_kind == s.kind and m.head_params and ckpt.head.uses_domains
        assert weight_sanity(ckpt.state_dict, m) == []
        assert m.metrics["selection"]["rule"] in (*RULES, "apgr") and m.metrics["selection"]["reason"]
        assert m.metrics["fit_splits"] == ["train", "val"] and m.metrics["selected"] == s.selected
        scores = head_scores(ckpt.head, test.features, test.domains)
        q = quality_predictions(ckpt.head, test.features, test.domains)
        assert scores.shape == q.shape == (len(test.task_ids), data.n_workers)
        assert np.isfinite(scores).all() and q.min() >= 0 and q.max() <= 1
        rep = evaluate_checkpoint(ckpt, data, "test")
        assert rep["head_kind"] == s.kind and rep["router_utility"] > rep["best_fixed_utility"]
        blind = head_scores(ckpt.head, test.features, None)  # the domain unknown: still routes
        assert blind.shape == scores.shape and np.isfinite(blind).all()
    best = load_checkpoint(fitted.selected_path())
    rep = evaluate_checkpoint(best, data, "test")
    assert rep["router_minus_best_fixed"]["low"] > 0


def test_unknown_or_unseen_domain_gets_the_pooled_prior():
    q = np.array([[1.0, 0.0]] * 10 + [[0.0, 1.0]] * 30)
    prior = DomainPriorHead.fit(4, q, q, ["a"] * 10 + ["b"] * 30, m=0.0)
    x = torch.zeros(3, 4)
    out = call_head(prior, x, ["a", "never-seen", None]).numpy()
    assert np.allclose(out[0], [1, 0]) and np.allclose(out[1], [0.25, 0.75]) and np.allclose(out[2], [0.25, 0.75])
    shrunk = DomainPriorHead.fit(4, q, q, ["a"] * 10 + ["b"] * 30, m=10.0)
    assert np.allclose(call_head(shrunk, x[:1], ["a"]).numpy(), [[(10 + 2.5) / 20, (0 + 7.5) / 20]])


def test_knn_grid_predictions_are_what_the_saved_head_predicts(data):
    fd = FitData.from_data(data, np.flatnonzero(data.splits != "test"))
    tr, te = np.arange(0, 300), np.arange(300, len(fd.rows))
    fam = KNNFamily(FAST.heads.knn)
    grid = fam.predict_grid(fd, tr, te, fd.domains[te].tolist())
    for name, params in fam.grid():
        head = KNNHead.fit(fd.features[tr], fd.target[tr], fd.utility[tr], fd.domains[tr].tolist(), **params)
        q, u = head.predict_both(torch.from_numpy(fd.features[te]), fd.domains[te].tolist())
        assert np.allclose(grid[name][0], q.numpy(), atol=1e-5) and np.allclose(grid[name][1], u.numpy(), atol=1e-5), name


def test_edited_or_misshapen_tables_are_refused(fitted):
    ckpt = load_checkpoint(next(s.path for s in fitted.saved if s.kind == "knn"))
    sd = dict(ckpt.state_dict)
    edited = {**sd, "neighbour_utility": sd["neighbour_utility"].flip(1)}
    assert any("routing_map" in p for p in weight_sanity(edited, ckpt.manifest))
    unnormalised = {**sd, "neighbours": sd["neighbours"] * 2}
    assert any("L2-normalised" in p for p in weight_sanity(unnormalised, ckpt.manifest))
    bad_q = {**sd, "neighbour_quality": sd["neighbour_quality"] + 2}
    assert any("[0, 1]" in p for p in weight_sanity(bad_q, ckpt.manifest))
    wrong_size = ckpt.manifest.model_copy(update={"head_params": {**ckpt.manifest.head_params, "n_neighbours": 7}})
    assert any("shape" in p for p in weight_sanity(sd, wrong_size))


def test_duplicate_gate_compares_behaviour_on_the_probe_set(fitted, data):
    """Quality predictors have no final layer: the duplicate gate compares what they predict on the
    host's probe set (centred per probe), so a head is its own duplicate and two kinds are not."""
    from fugu_pipeline.evaluate.probe import checkpoint_behaviour

    seen = [checkpoint_behaviour("p", load_checkpoint(s.path), data.features[:64], data.domains[:64]) for s in fitted.saved]
    assert all(b.vector.shape == (64 * 3,) and b.cosine(b) == pytest.approx(1.0) for b in seen)
    assert any(a.cosine(b) < 0.99 for a in seen for b in seen if a is not b)


def test_selection_never_reads_the_test_split(data):
    """Poison every test row (features, rewards, quality, domains): no figure and no choice moves.
    The control: changing validation rows does move them."""
    cfg = FAST.model_copy(update={"heads": FAST.heads.model_copy(update={"mlp": None})})
    before, _, _ = select_heads(data, cfg, log=QUIET)
    rng = np.random.default_rng(1)
    test = data.splits == "test"
    poisoned = dataclasses.replace(
        data, features=np.where(test[:, None], rng.normal(size=data.features.shape), data.features),
        utility=np.where(test[:, None], data.utility[:, ::-1], data.utility),
        quality=np.where(test[:, None], 1 - data.quality, data.quality),
        domains=[("code" if t else d) for d, t in zip(data.domains, test)], data_version="")
    after, _, _ = select_heads(poisoned, cfg, log=QUIET)
    assert after.table() == before.table()
    assert (after.selected, after.rule, after.best_per_kind) == (before.selected, before.rule, before.best_per_kind)
    val = data.splits == "val"
    control = dataclasses.replace(data, utility=np.where(val[:, None], data.utility[:, ::-1], data.utility), data_version="")
    moved, _, _ = select_heads(control, cfg, log=QUIET)
    assert moved.table() != before.table()


def test_fitted_heads_do_not_depend_on_test_rows(data, tmp_path):
    cfg = TrainSetConfig.model_validate({"heads": {"domain_prior": {"m": [20]}, "knn": {"k": [30]}, "ensemble": None}})
    a = fit_and_save(data, tmp_path / "a", cfg, log=QUIET)
    test = data.splits == "test"
    poisoned = dataclasses.replace(data, utility=np.where(test[:, None], -data.utility, data.utility), data_version="")
    b = fit_and_save(poisoned, tmp_path / "b", cfg, log=QUIET)
    for sa, sb in zip(a.saved, b.saved):
        ta, tb = load_checkpoint(sa.path).state_dict, load_checkpoint(sb.path).state_dict
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_folds_hash_the_task_id_only():
    ids = [f"task-{i}" for i in range(400)]
    f = fold_ids(ids, 5, 0)
    perm = np.random.default_rng(0).permutation(400)
    assert np.array_equal(fold_ids([ids[i] for i in perm], 5, 0), f[perm])
    assert set(f.tolist()) == set(range(5)) and not np.array_equal(fold_ids(ids, 5, 1), f)


def test_the_rule_is_the_one_that_holds_up_out_of_sample():
    """A big domain and two small ones: 'pooled' picks the head that serves only the big domain;
    judged on the other half of the folds, the macro-aware rules hold up and win."""
    doms = np.array(["big"] * 900 + ["s1"] * 50 + ["s2"] * 50)
    u = np.zeros((1000, 2))
    u[:900, 0], u[900:, 1] = 1.0, 1.0
    u = np.hstack([u, np.zeros((1000, 1))])  # three workers: no APGR
    only_big = np.tile([1.0, 0.0, 0.0], (1000, 1))
    rng = np.random.default_rng(0)
    balanced = np.where((doms == "big")[:, None] & (rng.random(1000) < 0.2)[:, None], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0])
    balanced[(doms == "big") & (rng.random(1000) >= 0.2)] = [1.0, 0.0, 0.0]
    folds = fold_ids([str(i) for i in range(1000)], 5, 0)
    out = nested_rule_check({"only_big": only_big, "balanced": balanced}, Objective(u, u, doms), folds)
    assert out["rule"] in ("macro", "blend") and out["scores"]["pooled"] < out["scores"][out["rule"]]
    assert "holds up best" in out["reason"]


def test_promotion_ranks_heads_fitted_on_val_by_their_out_of_fold_figure(data, fitted):
    ckpt = load_checkpoint(fitted.selected_path())
    assert validation_utility(ckpt, data) == pytest.approx(ckpt.manifest.metrics["val_utility"])
    other = dataclasses.replace(data, utility=data.utility + 0.0, data_version="other")
    assert validation_utility(ckpt, other) is None  # a figure from other data is no figure


def test_linear_checkpoints_keep_the_hash_they_had_before_head_params(tmp_path, data):
    head = build_head("layernorm_linear", data.dim, data.n_workers)
    path = save_checkpoint(tmp_path, "sft", "layernorm_linear", head.state_dict(),
                           {"worker_ids": data.worker_ids, "feature_contract": data.contract, "data_version": "v"})
    m = json.loads((path / "manifest.json").read_text())
    body = {k: v for k, v in m.items() if k not in UNHASHED_FIELDS and k not in ("head_params", "head_shape")}
    weights = (path / "head.safetensors").read_bytes()
    assert hashlib.sha256(weights + canonical_json(body).encode()).hexdigest()[:16] == path.name
    assert load_checkpoint(path).head.uses_domains is False


def _imported_file(path, n=240):
    rnd = random.Random(0)
    p_correct = {"math": [0.9, 0.3, 0.5], "code": [0.3, 0.9, 0.45], "general": [0.45, 0.4, 0.85]}
    rows = []
    for i in range(n):
        d = list(p_correct)[i % 3]
        rows.append({"task_id": f"t{i}", "prompt": f"{d} task {i}: " + " ".join(rnd.choice(["alpha", "beta", "gamma"]) for _ in range(5)),
                     "domain": d, "split": "test" if i % 4 == 0 else "train", "worker_ids": ["math-x", "code-x", "general-x"],
                     "quality": [int(rnd.random() < p) for p in p_correct[d]], "cost_usd": [0.002, 0.004, 0.001],
                     "latency_s": [2.0, 3.0, 1.0]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fugu_lite_train_prints_the_checkpoint_last_and_evaluate_takes_it(tmp_path, capsys):
    from fugu_pipeline.cli.main import main
    from fugu_pipeline.route.router import Router

    src = _imported_file(tmp_path / "rewards.jsonl")
    common = ["--data", str(src), "--encoder", "tiny", "--workers", "configs/workers.mock.yaml",
              "--cache-dir", str(tmp_path / "emb"), "--work-dir", str(tmp_path / "imports")]
    assert main(["train", *common, "--output", str(tmp_path / "models")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = out[-1]
    ckpt = load_checkpoint(last)
    assert ckpt.manifest.metrics["selected"] is True and str(tmp_path / "models" / ckpt.manifest.head_kind) in last
    assert any(line.startswith("validation:") for line in out) and any(line.startswith("selected") for line in out)
    assert main(["evaluate", "--checkpoint", last, *common, "--models-dir", str(tmp_path / "models")]) == 0
    report = json.loads((ckpt.path / "reports" / "test.json").read_text())
    assert report["router_minus_best_fixed"]["low"] > 0
    router = Router.load(last)
    try:
        picks = {d: router.route(f"{d} task: alpha beta", d).worker_id for d in ("math", "code", "general")}
    finally:
        router.close()
    assert picks == {"math": "math-x", "code": "code-x", "general": "general-x"}


def test_two_workers_rank_by_apgr_and_promotion_sees_utility(data, tmp_path):
    """With two workers the heads are ranked by APGR, but the figure promotion compares across head
    kinds (`val_utility`) is the out-of-fold utility of the greedy route, in the utility's units."""
    two = dataclasses.replace(data, worker_ids=data.worker_ids[:2], utility=data.utility[:, :2], quality=data.quality[:, :2],
                              cost_usd=data.cost_usd[:, :2], latency_s=data.latency_s[:, :2])
    cfg = TrainSetConfig.model_validate({"heads": {"domain_prior": {"m": [5]}, "knn": {"k": [10], "prior_weight": [0],
                                                                                          "same_domain_bonus": [0]}}})
    report = fit_and_save(two, tmp_path, cfg, log=QUIET)
    assert report.rule == "apgr"
    # a choice between feature settings compares what selection ranked by: APGR here, not the pooled utility
    assert report.val_score == report.selected_figures["apgr"] != report.val_utility
    for s in report.saved:
        m = load_checkpoint(s.path).manifest.metrics
        assert set(m["validation"]) >= {"apgr", "pooled"} and m["val_utility"] == m["validation"]["pooled"]
        assert two.utility.min() <= m["val_utility"] <= two.utility.max()


def test_leave_one_domain_out_routes_each_domain_unseen(data):
    """Each domain is held out in turn (all its splits), the choice among heads is made by an inner
    leave-one-domain-out on the other domains, and the held-out rows are routed with the domain
    hidden; the baseline is the best fixed worker of the training domains."""
    from fugu_pipeline.policies.oneshot.lodo import leave_one_domain_out

    rng = np.random.default_rng(1)  # 6 domains: each synthetic domain split in two, so 5 remain when one is out
    six = dataclasses.replace(data, domains=[d if rng.random() < 0.6 else d + "-b" for d in data.domains])
    cfg = TrainSetConfig.model_validate({"heads": {"domain_prior": {"m": [20]}, "knn": {"k": [10, 30], "prior_weight": [0],
                                                                                        "same_domain_bonus": [0]}}})
    out = leave_one_domain_out(six, cfg)
    assert [r["domain"] for r in out["rows"]] == sorted(set(six.domains))
    assert sum(r["n"] for r in out["rows"]) == len(six.task_ids)
    d = out["difference"]
    assert d["low"] <= d["mean"] <= d["high"]
    assert abs(d["mean"] - (out["router_macro"] - out["fixed_macro"])) < 1e-9
    assert d["low"] > 0  # the features tell the domains' best workers apart: routing beats the fixed worker unseen



def _weak_signal(seed: int, effect: float, n: int = 400):
    """4 domains; worker b's chance of being right moves with feature 0 by ±`effect` in every
    domain (a signal that transfers to unseen domains); worker a is a coin flip."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 4, n)
    x = rng.normal(0, 1, (n, 8))
    q = np.zeros((n, 3))
    q[:, 0] = rng.random(n) < 0.5
    q[:, 1] = rng.random(n) < 0.5 + effect * np.tanh(3 * x[:, 0])
    base = make_data(n=n, dim=8)
    return dataclasses.replace(base, domains=[("a", "b", "c", "d")[k] for k in d], features=x.astype(np.float32), quality=q,
                               utility=q, splits=np.where(rng.random(n) < 0.8, "train", "test"),
                               cost_usd=np.zeros((n, 3)), latency_s=np.zeros((n, 3)))


def test_objective_lodo_keeps_the_prior_unless_the_gain_on_unseen_domains_is_clear():
    """Under `objective: lodo` a head replaces the domain prior (the best fixed worker, for a domain
    never seen) only when its leave-one-domain-out gain over the prior has a 95% interval above
    zero: a weak signal wins the validation figure by chance and is refused; a strong one that
    every domain shares is kept."""
    cfg = TrainSetConfig.model_validate({"objective": "lodo", "heads": {
        "domain_prior": {"m": [20]}, "knn": {"k": [30, 100], "prior_weight": [0], "same_domain_bonus": [0]},
        "ridge": None, "ensemble": None}})
    weak, _, _ = select_heads(_weak_signal(2, 0.03), cfg, QUIET)
    assert weak.selected_kind == "domain_prior" and "not clearly, so the prior is kept" in weak.reason, weak.reason
    strong, _, _ = select_heads(_weak_signal(2, 0.45), cfg, QUIET)
    assert strong.selected_kind == "knn", strong.reason
    # the ordinary objective is untouched: no guard
    oof, _, _ = select_heads(_weak_signal(2, 0.03), cfg.model_copy(update={"objective": "oof"}), QUIET)
    assert "prior is kept" not in oof.reason


def test_the_sft_heads_fit_on_a_few_dozen_rows_and_on_data_without_a_val_split(tmp_path):
    """MT-Bench has 72 prompts: a fold of 5-fold selection held ~25 training rows, none of them in
    the SFT family's inner tenth, and selection died in 'the val split has no rows'. Data without
    a val split at all failed the same way in the final fit."""
    cfg = TrainSetConfig.model_validate({"heads": {"domain_prior": {"m": [5]}, "sft": {"head": ["layernorm_linear"], "lr": [0.003]},
                                                   "ensemble": None}})
    small = make_data(n=60, seed=3)
    small = dataclasses.replace(small, splits=np.where(np.arange(60) < 40, "train", "test"))  # no val rows
    report = fit_and_save(small, tmp_path / "m", cfg, log=QUIET)
    assert {s.kind for s in report.saved} >= {"sft", "domain_prior"}
    assert load_checkpoint(next(s.path for s in report.saved if s.kind == "sft")).manifest.head_kind == "layernorm_linear"


@pytest.mark.parametrize("bonus", [0.0, 0.3, 1.0, 2.5])
def test_knn_neighbours_with_the_bonus_in_the_product_are_the_masked_ones(bonus):
    """The same-domain bonus carried as √b·one-hot columns gives what cosine similarity plus b for a
    bank row of the query's own known domain gives (an unknown domain, -1, never matches): the same
    neighbours, the same similarities."""
    import torch

    from fugu_pipeline.policies.oneshot.predictors import topk_neighbours_each

    g = torch.Generator().manual_seed(3)
    xn = torch.nn.functional.normalize(torch.randn(300, 16, generator=g), dim=-1)
    bank = torch.nn.functional.normalize(torch.randn(900, 16, generator=g), dim=-1)
    codes = torch.randint(-1, 3, (300,), generator=g)
    bank_codes = torch.randint(-1, 4, (900,), generator=g)
    got_v, got_i = topk_neighbours_each(xn, codes, bank, bank_codes, 25, [bonus])[bonus]
    same = (codes[:, None] == bank_codes[None, :]) & (codes[:, None] >= 0)
    want = (xn.double() @ bank.double().T + bonus * same.double())
    want_v, want_i = torch.topk(want, 25, dim=1)
    assert torch.allclose(got_v.double(), want_v, atol=1e-5)
    assert (got_i == want_i).float().mean() > 0.99  # equal but for near-ties in float32
    if bonus:
        assert same.gather(1, got_i).float().mean() > same.float().mean() + 0.2  # the bonus moved own-domain rows up


def test_knn_neighbours_for_several_bonuses_at_once_are_each_bonus_own():
    """Every bonus of one call gets what cosine plus that bonus for its own domain's rows gives, with
    a domain the bank lacks, a domain with fewer rows than k, unknown bank rows and queries, and more
    queries than one chunk."""
    import torch

    from fugu_pipeline.policies.oneshot import predictors
    from fugu_pipeline.policies.oneshot.predictors import topk_neighbours_each

    g = torch.Generator().manual_seed(5)
    n = predictors._CHUNK + 300
    xn = torch.nn.functional.normalize(torch.randn(n, 12, generator=g), dim=-1)
    bank = torch.nn.functional.normalize(torch.randn(400, 12, generator=g), dim=-1)
    codes = torch.randint(-1, 5, (n,), generator=g)  # domain 4: no bank row
    bank_codes = torch.randint(-1, 3, (400,), generator=g)
    bank_codes[:5] = 3  # domain 3: 5 bank rows, fewer than k
    bank_codes[5:] = torch.where(bank_codes[5:] == 3, 0, bank_codes[5:])
    bonuses = [0.0, 0.05, 1.0, 3.0]
    got = topk_neighbours_each(xn, codes, bank, bank_codes, 40, bonuses)
    assert sorted(got) == bonuses
    same = (codes[:, None] == bank_codes[None, :]) & (codes[:, None] >= 0)
    for b in bonuses:
        want_v, want_i = torch.topk(xn.double() @ bank.double().T + b * same.double(), 40, dim=1)
        got_v, got_i = got[b]
        assert got_v.shape == (n, 40) and torch.allclose(got_v.double(), want_v, atol=1e-5)
        assert (got_i == want_i).float().mean() > 0.99  # equal but for near-ties in float32
        assert torch.allclose(got_v.double(), (xn.double() @ bank.double().T + b * same.double()).gather(1, got_i), atol=1e-5)
    assert same[codes == 3].gather(1, got[3.0][1][codes == 3])[:, :5].all()  # domain 3's five rows come first


def test_a_knn_head_sorts_its_neighbours_once_and_again_when_they_change():
    """Routing keeps the neighbours sorted by domain between calls; a head loaded with another table
    routes by the new table, not by the sorted copy of the old one."""
    import torch

    from fugu_pipeline.policies.oneshot import predictors
    from fugu_pipeline.policies.oneshot.predictors import KNNHead

    rng = np.random.default_rng(2)
    doms = [["a", "b", "c"][i % 3] for i in range(90)]

    def head(seed):
        r = np.random.default_rng(seed)
        return KNNHead.fit(r.normal(size=(90, 8)), r.uniform(size=(90, 3)), r.uniform(size=(90, 3)), doms,
                           k=10, prior_weight=0.0, same_domain_bonus=1.0)

    one, other = head(0), head(1)
    x = torch.from_numpy(rng.normal(size=(7, 8)).astype(np.float32))
    codes = torch.tensor([0, 1, 2, -1, 0, 1, 2])
    sorts = []
    real = predictors.sort_bank
    predictors.sort_bank = lambda *a: sorts.append(1) or real(*a)
    try:
        first = one.predict(x, codes)[0]
        want = other.predict(x, codes)[0]
        assert torch.equal(one.predict(x, codes)[0], first) and len(sorts) == 0  # sorted when fitted
        one.load_state_dict(other.state_dict())
        assert torch.allclose(one.predict(x, codes)[0], want) and len(sorts) == 1
        assert not torch.allclose(want, first) and len(sorts) == 1
    finally:
        predictors.sort_bank = real
    one._sorted_key = None
    with torch.inference_mode():  # sorted first inside inference mode (serving), then used outside it
        inside = one.predict(x, codes)[0]
    assert torch.allclose(one.predict(x.clone().requires_grad_(True), codes)[0], inside)


def test_intervals_of_many_columns_are_each_columns_own_interval():
    """`intervals` draws the resamples `interval` draws: on 0/1 accuracy differences every column's
    figures are `interval`'s to the bit, on graded ones within rounding, whatever the chunk."""
    from fugu_pipeline.train.selection import interval, intervals

    rng = np.random.default_rng(3)
    whole = rng.integers(-1, 2, size=(537, 6)).astype(float)
    whole[:, 0] = 0.0  # a policy equal to the strongest everywhere: exactly [0, 0]
    graded = rng.random((537, 4)) - rng.random((537, 4))
    for values, exact in ((whole, True), (graded, False)):
        for chunk in (7, 100, 5000):
            got = intervals(values, 400, seed=11, chunk=chunk)
            want = np.array([interval(values[:, j], 400, seed=11) for j in range(values.shape[1])])
            if exact:
                assert np.array_equal(got, want), (chunk, got - want)
            else:
                assert np.allclose(got, want, rtol=0, atol=1e-12), (chunk, np.abs(got - want).max())
    assert intervals(whole, 400, seed=11)[0].tolist() == [0.0, 0.0, 0.0]
    assert not np.array_equal(intervals(whole, 400, seed=12), intervals(whole, 400, seed=11))  # another seed draws other resamples


def test_an_interval_drawn_in_chunks_is_the_interval_drawn_at_once():
    """`interval` bounds its memory by drawing its resamples a chunk at a time (5,000 rows: three
    chunks); the figures are those of every resample drawn in one array."""
    from fugu_pipeline.train.selection import interval

    v = np.random.default_rng(5).random(5000) - 0.5
    rng = np.random.default_rng(9)
    means = v[rng.integers(0, len(v), size=(2000, len(v)))].mean(axis=1)
    assert interval(v, 2000, seed=9) == (float(v.mean()), *map(float, np.percentile(means, [2.5, 97.5])))


def test_a_policy_that_saves_less_than_the_minimum_does_not_count_as_cheaper():
    """Two policies tie the strongest, at 99% and 97% of its cost: the 97% one ships; the 99% one alone
    does not count as cheaper (the strongest ships, the reason names the minimum), but does under a
    0.5% minimum."""
    from fugu_pipeline.train.selection import MIN_SAVING, STRONGEST, Figure, cheapest_not_below

    strong = Figure(STRONGEST, 0.8, 1.0, 0.0, 0.0, 0.0)
    near = Figure("99%", 0.8, 0.99, 0.0, -0.01, 0.01)
    far = Figure("97%", 0.8, 0.97, 0.0, -0.01, 0.01)
    assert MIN_SAVING == 0.02
    assert cheapest_not_below([strong, near, far], STRONGEST, "s", 0.005, 300).name == "97%"
    pick = cheapest_not_below([strong, near], STRONGEST, "s", 0.005, 300)
    assert pick.strongest_ships and pick.qualified == (STRONGEST,)
    assert "a saving of at least 2% of its cost" in pick.reason
    assert cheapest_not_below([strong, near], STRONGEST, "s", 0.005, 300, min_saving=0.005).name == "99%"


def test_qualifying_policies_within_the_minimum_of_each_other_are_one_price():
    """Three policies qualify: at 50%, 51% and 60% of the strongest's cost, the 51% one 1.5 points
    more accurate than the cheapest. 51% is within 2% of the strongest's cost of 50%, so it ships;
    60% is not, however accurate; with equal accuracy the cheapest ships."""
    from fugu_pipeline.train.selection import STRONGEST, Figure, cheapest_not_below

    strong = Figure(STRONGEST, 0.80, 1.0, 0.0, 0.0, 0.0)
    cheap = Figure("plan at 50%", 0.797, 0.50, -0.003, -0.015, 0.009)
    close = Figure("plan at 51%", 0.812, 0.51, 0.012, -0.001, 0.025)
    dear = Figure("plan at 60%", 0.830, 0.60, 0.030, 0.015, 0.045)
    pick = cheapest_not_below([strong, dear, close, cheap], STRONGEST, "s", 0.005, 1000)
    assert pick.name == "plan at 51%" and pick.qualified == ("plan at 50%", "plan at 51%", "plan at 60%", STRONGEST)
    assert pick.reason.startswith("plan at 51% is the most accurate policy costing within 2% of the strongest's cost of "
                                  "plan at 50% (accuracy 0.7970 at $500 per 1,000), the cheapest policy not significantly")
    tied = Figure("plan at 51%", 0.797, 0.51, -0.003, -0.015, 0.009)
    assert cheapest_not_below([strong, tied, cheap], STRONGEST, "s", 0.005, 1000).name == "plan at 50%"


def test_a_group_choice_is_held_to_the_whole_floor():
    """A group of 90 rows where a cheap choice ties the strongest on average but its interval
    reaches below −0.02 (here 2 rows each way): the group keeps the strongest by default; at the
    old five-point floor the cheap choice passed."""
    from fugu_pipeline.train.groups import DEFAULT_GROUP_FLOOR, choose_groups
    from fugu_pipeline.train.selection import STRONGEST

    n = 180
    doms = np.array(["code"] * 90 + ["mc"] * 90)
    strong = np.ones(n)
    strong[:2] = 0.0
    cheap = strong.copy()
    cheap[:2], cheap[2:4] = 1.0, 0.0  # right where the strongest is wrong, wrong on two others
    pooled = {STRONGEST: (strong, np.ones(n))}
    per_group = {("code", "cheap"): (np.where(doms == "code", cheap, 0.0), np.full(n, 0.1))}
    args = (["code"], [], doms, pooled, per_group, STRONGEST, 0.005, 1000)
    assert DEFAULT_GROUP_FLOOR == 0.02
    got = choose_groups(*args)
    assert got.groups["code"].name == STRONGEST
    loose = choose_groups(*args, floor=0.05)
    assert loose.groups["code"].name == "cheap" and -0.05 <= loose.groups["code"].vs_low < -0.02
