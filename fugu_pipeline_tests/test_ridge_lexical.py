"""The ridge head and the lexical statistics block (features that see the question).

- `lexical_features`: bounded and finite on hostile text (huge, bad unicode, giant numbers), the
  same for a text alone or in a batch;
- the contract: `lexical` off leaves every earlier fingerprint (checkpoints, caches) unchanged, on
  changes both; kNN's cosine ignores the lexical block, ridge reads the columns it names;
- ridge: the closed form equals a direct least-squares solve, an unknown domain gets the average
  one-hot, the checkpoint round trip and the weight checks hold;
- end to end: `fugu-lite train --lexical` on the tiny encoder selects among ridge points on the
  lexical block, and `route` / the server's batches compute the cached vectors (within the dtype's
  tolerance, bit for bit where the kernels give it), so the held-out routes agree.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from fugu_pipeline.cli import main
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.lexical import LEXICAL_DIM, lexical_features
from fugu_pipeline.features.parity import encoder_batch_invariance
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.train.checkpoints import load_checkpoint, weight_sanity
from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
from fugu_pipeline.policies.oneshot.families import FitData, RidgeFamily
from fugu_pipeline.policies.oneshot.heads import build_head, call_head
from fugu_pipeline.policies.oneshot.predictors import KNNHead
from fugu_pipeline.policies.oneshot.ridge import DOMAIN_WEIGHT, RidgeHead
from fugu_pipeline_tests.parity_checks import assert_routes_agree, assert_vector_parity
from fugu_pipeline_tests.test_budget_cli import run
from fugu_pipeline_tests.test_training import make_data


def test_lexical_statistics_are_bounded_on_hostile_text():
    texts = ["", "What is 2 + 2?", "x" * 1_000_000, "9" * 5000, "\ud800 lone surrogate \udfff", "é" * 300,
             "A) one\nB) two\nC) three\nAnswer:", "def f(x):\n    return x == 1;\n```", "50% of 3/4 is 1,000.5"]
    f = lexical_features(texts)
    assert f.shape == (len(texts), LEXICAL_DIM) and f.dtype == np.float32
    assert np.isfinite(f).all() and f.min() >= 0 and f.max() < 3
    assert np.linalg.norm(f, axis=1).max() < 2  # about one normalised layer, not more
    alone = np.concatenate([lexical_features([t]) for t in texts])
    assert np.array_equal(alone, f)
    assert f[6, 7] > 0 and f[7, 6] > 0 and f[8, 13] > 0  # choice markers, code markers, percent/fraction


def test_lexical_off_keeps_earlier_fingerprints_and_on_changes_them():
    c = FeatureContract(encoder_id="m", dim=8)
    body = c.model_dump(mode="json")
    for k in ("prompt_rules", "lexical"):
        body.pop(k)
    assert c.fingerprint() == sha256_text(canonical_json(body))[:16]  # what a checkpoint saved before lexical holds
    on = FeatureContract(encoder_id="m", dim=8 + LEXICAL_DIM, lexical=True)
    assert on.fingerprint() != FeatureContract(encoder_id="m", dim=8 + LEXICAL_DIM).fingerprint()
    assert on.embedding_dim == 8 and c.embedding_dim == 8
    assert any("lexical" in d for d in on.differences(FeatureContract(encoder_id="m", dim=8 + LEXICAL_DIM)))
    s = EncoderSettings(model="tiny")
    assert s.fingerprint("float32", "x") != s.model_copy(update={"lexical": True}).fingerprint("float32", "x")


def _data(n=400, lexical=True):
    data = make_data(n=n, dim=16)
    if not lexical:
        return data
    lex = np.random.default_rng(5).random((n, LEXICAL_DIM)).astype(np.float32)
    # the lexical block decides worker 2's quality, so the lexical columns carry signal of their own
    q = data.quality.copy()
    q[:, 2] = (lex[:, 0] > 0.5).astype(float)
    import dataclasses

    return dataclasses.replace(data, features=np.concatenate([data.features, lex], axis=1), quality=q, utility=q,
                               contract=FeatureContract(encoder_id="synthetic", dim=16 + LEXICAL_DIM, lexical=True))


def test_knn_cosine_reads_only_the_embedding_columns():
    data = _data()
    x, q, d = data.features, data.quality, list(data.domains)
    head = KNNHead.fit(x, q, q, d, k=20, cosine_dims=16)
    assert head.neighbours.shape == (len(x), 16) and head.head_params()["cosine_dims"] == 16
    scrambled = x.copy()
    scrambled[:, 16:] = np.random.default_rng(1).random((len(x), LEXICAL_DIM)) * 100
    a = call_head(head, torch.from_numpy(x[:50]), d[:50])
    b = call_head(head, torch.from_numpy(scrambled[:50]), d[:50])
    assert torch.equal(a, b)
    rebuilt = build_head("knn", x.shape[1], 3, head.head_params())
    rebuilt.load_state_dict(head.state_dict())
    assert torch.equal(call_head(rebuilt, torch.from_numpy(x[:50]), d[:50]), a)


def test_ridge_equals_a_direct_solve_and_reads_only_its_columns():
    data = _data()
    x, q, d = data.features.astype(np.float64), data.quality, list(data.domains)
    alpha = 7.0
    head = RidgeHead.fit(data.features, q, q, d, alpha=alpha, inputs="lexical", lexical_dim=LEXICAL_DIM)
    assert (head.col_start, head.col_end) == (16, 16 + LEXICAL_DIM)
    # direct: standardised columns + the standardised one-hot scaled up DOMAIN_WEIGHT-fold (the domain
    # is penalised alpha / DOMAIN_WEIGHT²), centred targets, (ZᵀZ + αI)⁻¹ Zᵀ y
    xs = x[:, 16:]
    vocab = sorted(set(d))
    oh = np.array([[1.0 if v == dd else 0.0 for v in vocab] for dd in d])
    z = np.concatenate([(xs - xs.mean(0)) / (xs.std(0) + 1e-6), DOMAIN_WEIGHT * (oh - oh.mean(0)) / (oh.std(0) + 1e-6)], axis=1)
    w = np.linalg.solve(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ (q - q.mean(0)))
    want = np.clip(z @ w + q.mean(0), 0, 1)
    got = head.predict_both(torch.from_numpy(data.features), d)[0].numpy()
    assert np.allclose(got, want, atol=1e-4)
    # the embedding columns do not reach it
    other = data.features.copy()
    other[:, :16] = 0
    assert torch.equal(call_head(head, torch.from_numpy(other), d), call_head(head, torch.from_numpy(data.features), d))
    # an unknown domain: the average one-hot (zero standardised block), between the domains' predictions
    z0 = torch.from_numpy(data.features[:1].repeat(len(vocab), 0))
    per = call_head(head, z0, vocab).numpy()
    unknown = call_head(head, z0[:1], [None]).numpy()[0]
    weights = oh.mean(0)
    assert np.allclose(unknown, weights @ per, atol=1e-4)


def test_ridge_grid_follows_the_contract_and_fits_the_lexical_signal():
    cfg = TrainSetConfig().heads.ridge
    fam = RidgeFamily(cfg)
    plain, lex = _data(lexical=False), _data()
    names = lambda data: [n for n, _ in fam.grid(FitData.from_data(data, np.arange(len(data.task_ids))))]  # noqa: E731
    assert all(n.startswith("ridge all") for n in names(plain))
    assert {n.split()[1] for n in names(lex)} == {"all", "lexical"}
    fd = FitData.from_data(lex, np.arange(len(lex.task_ids)))
    tr, te = np.arange(300), np.arange(300, 400)
    preds = fam.predict_grid(fd, tr, te, fd.domains[te].tolist())
    truth = lex.quality[te, 2]
    for name, (q, _) in preds.items():  # alpha 10000 on 300 rows shrinks the block to almost nothing
        if name.startswith("ridge lexical") and float(name.split("alpha=")[1]) <= 1000:
            assert np.corrcoef(q[:, 2], truth)[0, 1] > 0.6, name


def test_ridge_checkpoint_round_trip_and_edited_weights_refused(tmp_path):
    from fugu_pipeline.policies.oneshot.fit import fit_and_save

    data = _data()
    cfg = TrainSetConfig.model_validate({"heads": {"domain_prior": None, "knn": None, "ensemble": None,
                                                   "ridge": {"alpha": [1.0, 100.0], "inputs": ["lexical", "all"]}}})
    report = fit_and_save(data, tmp_path, cfg, log=lambda m: None)
    (saved,) = [s for s in report.saved if s.selected]
    assert saved.kind == "ridge"
    ck = load_checkpoint(saved.path, expected_contract=data.contract)
    assert ck.manifest.feature_contract.lexical and weight_sanity(ck.state_dict, ck.manifest) == []
    edited = dict(ck.state_dict)
    edited["weight"] = edited["weight"] * 3
    assert any("routing_map" in p for p in weight_sanity(edited, ck.manifest))


# --------------------------------------------------------------------------- end to end, tiny encoder

WORKERS = ["a", "b", "c"]
DOMAINS = ["math", "code"]


def rows(n: int = 96) -> list[dict]:
    """Who wins depends on the prompt's length and on how many numbers it holds: lexical signal."""
    rng = random.Random(3)
    words = "solve compute integral matrix python list prove value sum".split()
    out = []
    for i in range(n):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(2, 40)))
        q += " " + " ".join(str(rng.randint(1, 999)) for _ in range(rng.randint(0, 6)))
        best = 0 if len(q) < 120 else 1 if q.count(" ") % 2 else 2
        out.append({"task_id": f"t{i:03d}", "prompt": q, "domain": DOMAINS[i % 2],
                    "split": ("train", "train", "val", "test")[i % 4], "worker_ids": WORKERS,
                    "quality": [1.0 if j == best else 0.0 for j in range(3)], "cost_usd": [0.001] * 3, "tags": ["id"]})
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("lexical")
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (work / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (work / "heads.yaml").write_text("heads:\n  domain_prior: null\n  knn: {k: [10], prior_weight: [0], same_domain_bonus: [0]}\n"
                                     "  ridge: {alpha: [1, 100], inputs: [lexical, all]}\n  ensemble: {rounds: 4}\n")
    args = ["--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--device", "cpu",
            "--cache-dir", str(work / "emb"), "--work-dir", str(work / "imports")]
    code, out = run("train", *args, "--encoder", "tiny", "--max-length", "24", "--lexical",
                    "--config", str(work / "heads.yaml"), "--output", str(work / "models"))
    assert code == 0
    return work, out.strip().splitlines()[-1], args


def test_lexical_features_are_served_as_cached_and_every_route_agrees(trained):
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve.batching import RouteRequest, route_grouped
    from fugu_pipeline_tests.test_feature_parity import cached_held_out

    work, ckpt, args = trained
    ck, held = cached_held_out(work, ckpt, args)
    contract = ck.manifest.feature_contract
    assert contract.lexical and contract.dim == contract.embedding_dim + LEXICAL_DIM
    assert np.abs(held.features[:, -LEXICAL_DIM:]).sum() > 0
    cached_scores = head_scores(ck.head, held.features, held.domains)
    router = Router.load(ckpt, device="cpu")
    assert router.encoder.settings.lexical
    batched = router.encoder.encode(held.prompts, held.domains)
    single = np.concatenate([router.encoder.encode([p], [d]) for p, d in zip(held.prompts, held.domains)])
    texts = router.encoder.settings.format(held.prompts, held.domains)
    assert_vector_parity(np.concatenate([batched, single]), np.concatenate([held.features] * 2),
                         router.encoder.resolved_dtype, lambda: encoder_batch_invariance(router.encoder, texts))
    grouped = [d.worker_id for d in route_grouped(router, [RouteRequest(p, d) for p, d in zip(held.prompts, held.domains)])]
    batch = [d.worker_id for d in router.route_batch(held.prompts, held.domains)]
    assert_routes_agree(cached_scores, [head_scores(ck.head, x, held.domains) for x in (batched, single)],
                        {"server": [WORKERS.index(w) for w in grouped], "one batch": [WORKERS.index(w) for w in batch]})
    router.close()
    # the ridge points on the lexical block were candidates
    names = [c["name"] for c in json.loads((ck.path / "manifest.json").read_text())["metrics"]["selection"]["candidates"]]
    assert any(n.startswith("ridge lexical") for n in names), names


def test_train_chooses_among_layer_sets_on_validation(trained, capsys):
    """`fugu-lite train --layer-sets '-1' '-1 1'`: the heads are fitted on each setting's features and
    the setting whose selected head has the better validation figure is kept and recorded."""
    work, _, args = trained
    code, out = run("train", *args, "--encoder", "tiny", "--max-length", "24", "--lexical", "--layer-sets", "-1", "-1 1",
                    "--config", str(work / "heads.yaml"), "--output", str(work / "models-sets"))
    assert code == 0
    ckpt = out.strip().splitlines()[-1]
    m = json.loads((load_checkpoint(ckpt).path / "manifest.json").read_text())
    choice = m["metrics"]["layer_choice"]
    assert set(choice["val_score"]) == {"layers [-1]", "layers [-1, 1]"}
    best = max(choice["val_score"], key=lambda k: (choice["val_score"][k], -list(choice["val_score"]).index(k)))
    assert choice["chosen"] == best
    layer = m["feature_contract"]["layer"]
    assert (layer if isinstance(layer, list) else [layer]) == json.loads(best.removeprefix("layers "))
    assert m["metrics"]["selection"]["rule"]  # the selection record is there too
    capsys.readouterr()
    assert main(["train", *args, "--encoder", "tiny", "--layers", "-1", "--layer-sets", "-1", "-1 1",
                 "--output", str(work / "x")]) == 2
    assert "--layers or --layer-sets" in capsys.readouterr().err
    assert main(["train", *args, "--encoder", "tiny", "--layer-sets", "-1", "top", "--output", str(work / "x")]) == 2
    assert "--layer-sets 'top'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["ridge", "mlp"])
def test_a_column_constant_in_training_moves_nothing_at_serving(kind):
    """A statistic that was the same on every training prompt (say, no non-ASCII text) carries no
    information: a served prompt where it differs must not swing the prediction (it used to be
    divided by a spread of 1e-6)."""
    from fugu_pipeline.policies.oneshot.predictors import MLPHead

    data = _data()
    x = data.features.copy()
    x[:, 16 + 9] = 0.0  # the non-ASCII share: 0 on every training row
    q, d = data.quality, list(data.domains)
    if kind == "ridge":
        head = RidgeHead.fit(x, q, q, d, alpha=10.0, inputs="all", lexical_dim=LEXICAL_DIM)
    else:
        head = MLPHead.fit(x, q, q, d, hidden=8, epochs=3, n_models=1)
    probe = torch.from_numpy(x[:20].copy())
    odd = probe.clone()
    odd[:, 16 + 9] = 0.25  # a prompt that is all non-ASCII
    a, b = head.predict_both(probe, d[:20]), head.predict_both(odd, d[:20])
    assert torch.allclose(a[0], b[0], atol=1e-4) and torch.allclose(a[1], b[1], atol=1e-4)


def test_hostile_prompts_route_through_a_lexical_head(trained):
    """Huge, bad-unicode, digit-bomb and empty prompts through a checkpoint that reads the lexical
    block: each routes to a real worker, alone and batched with ordinary ones."""
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve.batching import RouteRequest, route_grouped

    _, ckpt, _ = trained
    router = Router.load(ckpt, device="cpu")
    hostile = ["", "x" * 2_000_000, "9" * 100_000, "\ud800 lone \udfff surrogates", "NaN inf -inf 1e309",
               "{" * 50_000 + "}" * 50_000, "é" * 100_000, "What is 2 + 2?"]
    alone = [router.route(p, "math").worker_id for p in hostile]
    grouped = [d.worker_id for d in route_grouped(router, [RouteRequest(p, "math") for p in hostile])]
    assert alone == grouped and set(alone) <= set(WORKERS)
    feats = router.encoder.encode(hostile, ["math"] * len(hostile))
    assert np.isfinite(feats).all()
    router.close()
