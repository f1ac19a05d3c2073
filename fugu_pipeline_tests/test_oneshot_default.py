"""The cost-aware default of a one-shot router (`policies/oneshot/default_point.py`): on a matrix without
replies, with quality-only weights and recorded costs, `fugu-lite train` saves the cheapest
λ-routing not significantly below always the strongest worker out of fold (or the strongest alone,
with the reason) in `budget.json`; `route`, `serve` and `evaluate` use it when no cap is asked, an
explicit cap overrides it, `--no-default-budget` turns it off."""

import json

import re

import numpy as np
import pytest

from fugu_pipeline.route.budget import LAMBDAS
from fugu_pipeline.policies.oneshot.default_point import choose_default, choose_default_route
from fugu_pipeline_tests.cli_project import WORKERS, hard_math_rows, run, write_inputs

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("oneshot_default")
    common = write_inputs(work, hard_math_rows())
    (work / "train.yaml").write_text("features: {layer_sets: \"off\", prompt_rules: \"off\", lexical: false}\n"
                                     "heads:\n  knn: {k: [10, 30], prior_weight: [0], same_domain_bonus: [0], "
                                     "temperature: [null], prior_m: 20}\n")
    code, out = run("train", *common, "--encoder", "tiny", "--config", str(work / "train.yaml"),
                    "--output", str(work / "models"))
    assert code == 0, out
    return work, out.strip().splitlines()[-1], common, out


def test_a_cheap_worker_as_good_on_most_rows_is_the_default(trained):
    """(a) quality-only weights, no replies: the default is a λ-routing that does not send
    everything to the strongest worker, costs well under it and is not significantly below it out of fold."""
    work, ckpt, _, out = trained
    cal = json.loads((work / ckpt / "budget.json").read_text())
    dp = cal["default"]
    assert dp["kind"] == "lambda" and dp["strongest_worker"] == "c", dp
    assert dp["oof_cost_usd"] < 0.5 * dp["strongest_cost_usd"]
    assert dp["difference"][2] >= 0 and dp["difference"][0] >= -0.005
    assert "is the cheapest policy not significantly below always the strongest worker (c)" in dp["reason"]
    assert f"reason: {dp['reason']}" in out


def test_route_uses_the_default_and_a_cap_overrides_it(trained):
    """(d) `route` with no cap routes by the default point; an explicit cap and --no-default-budget override it."""
    work, ckpt, common, _ = trained
    easy = "solve compute matrix python list sum value"
    code, out = run("route", "--checkpoint", ckpt, "--prompt", easy, "--domain", "code", "--device", "cpu")
    got = json.loads(out)
    assert code == 0 and got["worker"] != "c" and got["budget"]["default"] is True, got
    assert got["score_kind"] == "predicted_quality_minus_cost"
    code, out = run("route", "--checkpoint", ckpt, "--prompt", easy, "--domain", "code", "--device", "cpu",
                    "--no-default-budget")
    assert code == 0 and "budget" not in json.loads(out)
    code, out = run("route", "--checkpoint", ckpt, "--prompt", easy, "--domain", "code", "--device", "cpu",
                    "--budget-share", "2")
    got = json.loads(out)
    assert code == 0 and "default" not in got["budget"] and got["budget"]["cap"].startswith("cap 200%"), got
    # the held-out report says which point it used and compares it with the strongest worker
    code, out = run("evaluate", "--checkpoint", ckpt, *common)
    assert code == 0 and "operating point used (no cap asked): the default operating point (λ = " in out
    rep = json.loads((work / ckpt / "reports" / "test.json").read_text())
    sec = rep["default_point"]
    assert sec["strongest_worker"] == "c" and sec["expected_share_of_strongest"] < 0.5
    assert sec["minus_strongest"]["high"] >= 0
    # on other data (a report-only calibration) the point reported is still the one the checkpoint routes by
    (work / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hard_math_rows()[:-12]))
    other = [a if a != str(work / "r.jsonl") else str(work / "other.jsonl") for a in common]
    code, out = run("evaluate", "--checkpoint", ckpt, *other, "--output", str(work / "o.json"))
    assert code == 0 and json.loads((work / "o.json").read_text())["default_point"]["lambda"] == sec["lambda"]


def test_serve_uses_the_default_and_a_request_cap_overrides_it(trained):
    """(d) `serve`: a request without a cap gets the default point, `fugu_budget` overrides it, and a
    server started with default_point=False serves the plain route."""
    from starlette.testclient import TestClient

    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve.app import create_app

    work, ckpt, _, _ = trained
    (work / "workers.yaml").write_text("workers:\n" + "".join(
        f"  - {{id: {w}, kind: mock}}\n" for w in WORKERS))
    msg = [{"role": "user", "content": "solve compute matrix python list sum value"}]
    for default_point in (True, False):
        router = Router.load(ckpt, device="cpu")
        with TestClient(create_app(router, work / "workers.yaml", **({} if default_point else {"default_point": False})),
                        base_url="http://127.0.0.1") as tc:
            info = tc.post("/v1/chat/completions", json={"messages": msg, "domain": "code"}).json()["fugu_lite"]
            if default_point:
                assert info["budget"]["default"] is True and info["chosen_worker"] != "c", info
            else:
                assert "budget" not in info, info
            info = tc.post("/v1/chat/completions", json={"messages": msg, "domain": "code",
                                                         "fugu_budget": {"share": 2}}).json()["fugu_lite"]
            assert "default" not in info["budget"] and info["budget"]["cap"].startswith("cap 200%"), info
        router.close()


def _synthetic(n=400, seed=0, signal=True, head_worse=False):
    """OOF predictions, quality and expected cost over n rows of 2 workers (0 cheap, 1 strong)."""
    rng = np.random.default_rng(seed)
    hard = rng.random(n) < 0.3
    strong = (rng.random(n) < 0.9).astype(float)
    cheap = np.where(hard, 0.0, strong)  # as good as the strongest wherever the row is easy
    quality = np.stack([cheap, strong], axis=1)
    noise = rng.normal(0, 0.01, (n, 2))
    if head_worse:  # the plain head sends the hard rows to the cheap worker
        q_oof = np.stack([np.where(hard, 0.95, 0.85), np.full(n, 0.9)], axis=1) + noise
    elif signal:
        q_oof = np.stack([np.where(hard, 0.1, 0.9), np.full(n, 0.9)], axis=1) + noise
    else:  # a head that cannot tell the rows apart: the same prediction for every row
        q_oof = np.stack([np.full(n, 0.85), np.full(n, 0.9)], axis=1)
    c_hat = np.tile([0.1e-3, 1e-3], (n, 1))
    folds = np.arange(n) % 5
    return q_oof, quality, c_hat, folds


def test_a_head_with_no_signal_ships_the_strongest_with_the_reason():
    """(b) every λ that saves anything is significantly below the strongest: the strongest alone."""
    q_oof, quality, c_hat, folds = _synthetic(signal=False)
    p = choose_default(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "strongest" and p.strongest_worker == "strong" and p.lam is None
    assert p.reason.startswith("no cheaper policy is within 0.5 point of always the strongest worker (strong")
    good = choose_default(*_synthetic(signal=True)[:3], 1e-3, folds, ["cheap", "strong"], LAMBDAS)
    assert good.kind == "lambda" and good.oof_cost_usd < 0.5 * good.strongest_cost_usd  # the same rows with a signal


def test_the_default_says_when_its_strongest_is_other_folds_strongest_workers():
    """Two workers about as accurate: each fold's strongest (the most accurate on the other folds)
    is not always the one that serves, and the reason says whose figures "always the strongest" are;
    with one clear strongest it says nothing of the kind."""
    n = 500
    folds = np.arange(n) % 5
    quality = np.zeros((n, 3))
    quality[:, 2] = (np.arange(n) // 5) % 2  # "b": right on every other row of each fold (0.5)
    quality[:, 1] = (np.arange(n) // 5) % 2  # "a": the same rows ...
    quality[(folds == 0) & ((np.arange(n) // 5) % 2 == 0), 1] = 1.0  # ... and all of fold 0's others
    quality[(folds == 1) & ((np.arange(n) // 5) % 2 == 0), 2] = 1.0  # "b" all of fold 1's others
    quality[(folds == 1) & ((np.arange(n) // 5) % 4 == 0), 2] = 0.0
    tops = [int(np.argmax(quality[folds != f].mean(axis=0))) for f in range(5)]
    served = int(np.argmax(quality.mean(axis=0)))
    assert len(set(tops)) == 2 and any(t != served for t in tops)  # the fixture alternates
    q_oof, c_hat = quality + 0.0, np.tile([1e-4, 1e-3, 1e-3], (n, 1))
    p = choose_default(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "a", "b"], LAMBDAS)
    names = ["cheap", "a", "b"]
    assert p.strongest_worker == names[served]
    said = {names[t]: tops.count(t) for t in set(tops)}
    shown = ", ".join(f"{w} on {k} of 5 folds" for w, k in sorted(said.items(), key=lambda kv: -kv[1]))
    assert (f"; always the strongest worker, out of fold each fold's own strongest (the most accurate on the other "
            f"folds): {shown}; {names[served]}, the most accurate on every non-test row, serves") in p.reason
    clear = choose_default(*_synthetic(signal=True)[:3], 1e-3, _synthetic(signal=True)[3], ["cheap", "strong"], LAMBDAS)
    assert "each fold's own strongest" not in clear.reason


def test_a_plain_head_significantly_below_the_strongest_ships_the_strongest():
    """(c) the plain head (λ = 0) is already significantly below the strongest: the strongest alone."""
    q_oof, quality, c_hat, folds = _synthetic(head_worse=True)
    p = choose_default(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "strongest" and p.strongest_worker == "strong"
    assert p.reason.startswith("the plain head (λ = 0) is significantly below always the strongest worker (strong)")
    assert p.difference == (0.0, 0.0, 0.0)


def test_at_equal_costs_a_more_accurate_head_is_kept():
    """Every worker costs the same: nothing is cheaper than the strongest, and the plain head, more
    accurate at the same cost, stays the default (not the strongest alone)."""
    rng = np.random.default_rng(0)
    n = 400
    g = rng.random(n) < 0.3  # rows where only the other worker is right
    quality = np.stack([g.astype(float), (~g).astype(float)], axis=1)
    q_oof = np.stack([np.where(g, 0.9, 0.1), np.where(g, 0.1, 0.9)], axis=1) + rng.normal(0, 0.01, (n, 2))
    p = choose_default(q_oof, quality, np.full((n, 2), 1e-3), 1e-3, np.arange(n) % 5, ["other", "strong"], LAMBDAS)
    assert p.kind == "lambda" and p.lam == 0.0 and p.difference[1] > 0
    assert "costs no more than always the strongest worker (strong) and is significantly more accurate" in p.reason


def test_at_equal_costs_a_gain_within_chance_ships_the_strongest():
    """Every worker costs the same and the head beats the strongest on 3 rows of 400 out of fold
    (interval reaching below 0): no saving and no proven gain, so the strongest ships, not the head."""
    n = 400
    good = np.zeros(n, bool)
    good[[3, 150, 311]] = True  # rows where only the other worker is right, and the head knows it
    quality = np.stack([good.astype(float), np.ones(n) - good], axis=1)
    quality[[7, 160], 1] = 1.0
    q_oof = np.stack([np.where(good, 0.9, 0.1), np.where(good, 0.1, 0.9)], axis=1)
    p = choose_default(q_oof, quality, np.full((n, 2), 1e-3), 1e-3, np.arange(n) % 5, ["other", "strong"], LAMBDAS)
    plain = np.argmax(q_oof, axis=1)
    assert quality[np.arange(n), plain].mean() > quality[:, 1].mean()  # the head is more accurate on these rows
    assert p.kind == "strongest" and p.strongest_worker == "strong"


def _one_fold_breaks(broken: bool):
    """Rows the head ranks for the cheap worker in three bands: `sure` (cheap right everywhere), then
    `edge` (40 rows, half of them in fold 0), then the rest (the strongest only). With `broken`, the
    cheap worker is wrong on fold 0's edge rows: the whole sees the edge cost 20 rows and keeps λ
    short of it, but the other folds, seeing their edge rows right, take it, and fold 0's edge rows
    then pay. Costs: the cheap worker a tenth of the strongest's."""
    sure, edge, rest = 200, 40, 260
    n = sure + edge + rest
    p_cheap = np.concatenate([np.full(sure, 0.95), np.full(edge, 0.9), np.full(rest, 0.1)])
    folds = np.arange(n) % 5
    folds[sure:sure + edge] = np.concatenate([np.zeros(20, int), 1 + np.arange(20) % 4])
    cheap = np.concatenate([np.ones(sure), np.ones(edge), np.zeros(rest)])
    if broken:
        cheap[sure:sure + 20] = 0.0
    quality = np.stack([cheap, np.ones(n)], axis=1)
    q_oof = np.stack([p_cheap, np.ones(n)], axis=1)
    return q_oof, quality, np.tile([0.1, 1.0], (n, 1)), folds


def test_a_point_whose_rule_fails_inside_the_folds_ships_the_strongest():
    """The point passes on the rows it was chosen on, but the same rule run per fold (chosen on the
    other folds, routing this fold) loses 20 rows: the strongest ships, the reason says why; without
    the check the point would ship."""
    q_oof, quality, c_hat, folds = _one_fold_breaks(broken=True)
    plain, _ = choose_default_route(q_oof, quality, c_hat, 1.0, folds, ["cheap", "strong"], LAMBDAS, nested=False)
    assert plain.kind == "lambda" and plain.difference[0] == 0.0  # the sure rows only, out of fold
    p, route = choose_default_route(q_oof, quality, c_hat, 1.0, folds, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "strongest" and p.lam is None and (route == 1).all()
    assert "the rule run inside the folds (each fold routed by the point chosen on the others): difference -0.0400" \
        in p.reason and "the strongest worker (strong) is the default" in p.reason


def test_a_point_whose_rule_holds_inside_the_folds_ships_with_that_figure():
    q_oof, quality, c_hat, folds = _one_fold_breaks(broken=False)
    p, route = choose_default_route(q_oof, quality, c_hat, 1.0, folds, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "lambda" and (route[:240] == 0).all() and (route[240:] == 1).all()
    assert p.reason.endswith("the rule run inside the folds (each fold routed by the point chosen on the others): "
                             "difference +0.0000 [+0.0000, +0.0000] at 57% of the strongest's cost")


# --------------------------------------------------------------------------- a point per domain


def _two_kinds(n=600, seed=0):
    """Two domains the head cannot tell apart (the same prediction everywhere: cheap 0.85, strong
    0.9): on `code` the cheap worker is right wherever the strong one is, on `mc` on 30% of rows."""
    rng = np.random.default_rng(seed)
    doms = np.array(["code", "mc"] * (n // 2))
    strong = (rng.random(n) < 0.85).astype(float)
    cheap = np.where(doms == "code", strong, (rng.random(n) < 0.3).astype(float))
    quality = np.stack([cheap, strong], axis=1)
    q_oof = np.stack([np.full(n, 0.85), np.full(n, 0.9)], axis=1) + rng.normal(0, 0.01, (n, 2))
    return q_oof, quality, np.tile([0.1e-3, 1e-3], (n, 1)), np.arange(n) % 5, doms


def test_a_point_per_domain_serves_the_cheap_worker_where_it_ties_the_strongest():
    """One λ for both domains either sends multiple choice to the cheap worker (significantly below)
    or pays for the strongest everywhere; a λ per domain, held to the rule per domain and for the
    whole, routes code to the cheap worker at about half the cost, and the route is what it says."""
    from fugu_pipeline.policies.oneshot.default_point import choose_default_route

    q_oof, quality, c_hat, folds, doms = _two_kinds()
    pooled, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS)
    assert pooled.oof_cost_usd > 0.9 * pooled.strongest_cost_usd and not pooled.per_domain
    said: list[str] = []
    p, route = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=doms,
                                    log=said.append)
    assert set(p.per_domain) == {"code", "mc"}, p
    assert p.oof_cost_usd < 0.6 * p.strongest_cost_usd and p.difference[2] >= 0 and p.difference[1] >= -0.02
    assert (route[doms == "code"] == 0).all() and (route[doms == "mc"] == 1).mean() > 0.95
    lams = p.lambdas(list(doms), len(doms))  # the λ each row is routed with, as the Router reads it
    got = np.where(np.isnan(lams), 1, np.argmax(q_oof - np.nan_to_num(lams)[:, None] * c_hat / 1e-3, axis=1))
    assert (got == route).all()
    assert p.describe().startswith("the default operating point, per domain (code: λ = ")
    assert "a point per domain (code: " in p.reason and said[0] == "default operating point per domain, out of fold:"
    assert np.isnan(p.lambdas(["never-seen"], 1)[0]) == (pooled.kind == "strongest")  # unseen: the pooled point
    from fugu_pipeline.route.shipped import ShippedPolicy

    said_to_clients = ShippedPolicy(kind="one-shot", name="one-shot knn", checkpoint="knn/abc", content_hash="abc",
                                    operating_point=p)
    assert said_to_clients.how().startswith("per domain (code: λ = ")
    assert said_to_clients.public()["lambda_per_domain"] == p.per_domain


def test_domains_too_small_or_alike_keep_one_point():
    from fugu_pipeline.policies.oneshot.default_point import choose_default_route

    q_oof, quality, c_hat, folds, _ = _two_kinds()
    one = np.array(["general"] * len(folds))
    p, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=one)
    assert not p.per_domain
    said: list[str] = []
    alike = np.array(["a", "a", "b", "b"] * (len(folds) // 4))  # each holds both kinds alike: the same choice on each
    p, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=alike,
                                log=said.append)
    assert not p.per_domain
    assert len(said) == 1 and said[0].startswith("default operating point: one point for every domain kept: "), said
    tiny = np.array(["a", "b"] * (len(folds) // 2))
    p, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=tiny,
                                min_rows=10_000)
    assert not p.per_domain


def test_the_router_routes_each_domain_by_its_own_point(trained):
    """A default with a point per domain: each request is routed by its domain's λ (or to the
    strongest worker where that is the domain's choice), the others by the pooled point, and each
    decision says which λ it used."""
    from fugu_pipeline.route.router import Router

    work, ckpt, _, _ = trained
    router = Router.load(str(work / ckpt), device="cpu")
    try:
        pooled = router.default_point
        assert pooled is not None and pooled.kind == "lambda"
        per = pooled.model_copy(update={"per_domain": {"math": None, "code": 50.0}})
        if router.shipped is not None:
            router.shipped = router.shipped.model_copy(update={"operating_point": per})
        router.calibration.default = per
        easy = "solve compute matrix python list sum value"
        got = router.route_batch([easy] * 3, ["math", "code", "chat"])
        assert got[0].worker_id == "c" and got[0].extra["budget"]["lambda"] is None  # always the strongest there
        assert got[1].worker_id == "a" and got[1].extra["budget"]["lambda"] == 50.0  # a large λ: the cheapest
        assert got[2].extra["budget"]["lambda"] == pooled.lam  # a domain without its own point: the pooled one
        assert all(d.extra["budget"]["operating_point"].startswith("the default operating point, per domain (code: λ = 50")
                   for d in got)
    finally:
        router.close()


def _two_kinds_features(n=600, apart=6.0, seed=1):
    """Prompt features of `_two_kinds`' rows: the code rows' lie apart from the multiple-choice rows'
    (`apart` standard deviations on the first 4 of 24 columns; 0: one kind of prompt)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 24))
    X[::2, :4] += apart  # `_two_kinds` puts "code" on the even rows
    return X.astype(np.float32)


def test_an_import_without_domains_gets_a_point_per_prompt_cluster():
    """Every row's domain is "general": the prompt clusters find the two kinds (no outcome read) and
    the point per cluster routes the code cluster to the cheap worker at about half the cost, by the
    same rule per group and for the whole; saved and read back, it puts each prompt in the cluster
    training put it in, and the route is what it says."""
    from fugu_pipeline.policies.oneshot.default_point import choose_default_route
    from fugu_pipeline.route.default_point import DefaultPoint

    q_oof, quality, c_hat, folds, kind = _two_kinds()
    X = _two_kinds_features()
    general = ["general"] * len(folds)
    prompts = [("def f(): return " if k == "code" else "Which option: ") + str(i) for i, k in enumerate(kind)]
    said: list[str] = []
    p, route = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=general,
                                    features=X, prompts=prompts, log=said.append)
    assert p.clusters is not None and p.by == "prompt cluster" and set(p.per_domain) == set(p.clusters.names), p
    keys = np.asarray(p.group_keys(None, X))
    assert len(set(keys[kind == "code"])) == 1 and len(set(keys[kind == "mc"])) == 1
    code, mc = keys[kind == "code"][0], keys[kind == "mc"][0]
    assert code != mc
    assert p.oof_cost_usd < 0.6 * p.strongest_cost_usd and p.difference[2] >= 0 and p.difference[1] >= -0.02
    lams = p.lambdas(keys, len(keys))
    got = np.where(np.isnan(lams), 1, np.argmax(q_oof - np.nan_to_num(lams)[:, None] * c_hat / 1e-3, axis=1))
    assert (got == route).all() and (route[kind == "code"] == 0).all() and (route[kind == "mc"] == 1).mean() > 0.95
    assert p.describe().startswith("the default operating point, per prompt cluster (prompt cluster ")
    assert p.reason.startswith("a point per prompt cluster (") and "other prompt clusters" not in p.reason  # every prompt has one
    assert any(line.startswith("default operating point: no domains to choose a point by; 2 prompt clusters")
               for line in said), said
    assert "default operating point per prompt cluster, out of fold:" in said
    back = DefaultPoint.model_validate_json(p.model_dump_json())  # as budget.json and policy.json keep it
    assert back.group_keys(["whatever"] * len(X), X) == list(keys)
    none, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS, domains=general)
    assert not none.per_domain and none.clusters is None  # no features: nothing to cluster


def test_prompts_of_one_kind_keep_one_point_with_one_line():
    from fugu_pipeline.policies.oneshot.default_point import choose_default_route

    q_oof, quality, c_hat, folds, _ = _two_kinds()
    said: list[str] = []
    p, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS,
                                domains=["general"] * len(folds), features=_two_kinds_features(apart=0.0),
                                log=said.append)
    assert not p.per_domain and p.clusters is None
    line = [s for s in said if "do not fall apart into clusters" in s]
    assert len(line) == 1 and line[0].endswith("one point for every prompt"), said


def test_a_point_with_broken_prompt_clusters_is_refused_by_field():
    """budget.json or policy.json edited by hand: clusters that do not match the λs, centroids that are
    not unit rows, a wrong width, or features of another width at routing time: each is named."""
    import pydantic

    from fugu_pipeline.policies.oneshot.default_point import choose_default_route
    from fugu_pipeline.route.default_point import DefaultPoint

    q_oof, quality, c_hat, folds, _ = _two_kinds()
    p, _ = choose_default_route(q_oof, quality, c_hat, 1e-3, folds, ["cheap", "strong"], LAMBDAS,
                                domains=["general"] * len(folds), features=_two_kinds_features())
    good = json.loads(p.model_dump_json())
    for edit, needle in ((lambda d: d.update(per_domain={"prompt cluster 9": None}), "are not"),
                         (lambda d: d["clusters"]["centroids"][0].__setitem__(0, 3.0), "unit rows"),
                         (lambda d: d["clusters"]["scale"].pop(), "columns"),
                         (lambda d: d["clusters"]["scale"].__setitem__(0, 0.0), "greater than 0"),
                         (lambda d: d["clusters"].update(names=["a", "b"]), "start with")):
        bad = json.loads(json.dumps(good))
        edit(bad)
        with pytest.raises(pydantic.ValidationError, match=needle):
            DefaultPoint.model_validate(bad)
    with pytest.raises(ValueError, match="read 24 feature columns; these prompts have 7"):
        p.group_keys(None, np.zeros((2, 7)))
    with pytest.raises(ValueError, match="features are needed"):
        p.group_keys(["general"])


def test_the_router_routes_each_prompt_cluster_by_its_own_point(trained):
    """A default per prompt cluster: the router encodes each batch once, puts each prompt in its
    nearest cluster, routes it by that cluster's λ, and each decision names its cluster."""
    from fugu_pipeline.route.default_point import PointClusters
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.train.clusters import fit_clusters

    work, ckpt, _, _ = trained
    router = Router.load(str(work / ckpt), device="cpu")
    try:
        pooled = router.default_point
        assert pooled is not None and pooled.kind == "lambda"
        a = [f"compute the integral of x^{i} over the unit interval, then simplify" for i in range(40)]
        b = [f"sort the python list and return index {i} from the array" for i in range(40)]
        feats = router.encode(a + b)
        clusters = fit_clusters(feats, 10, max_k=2)  # the two kinds (within each, the numbers make clusters of their own)
        assert clusters is not None
        ca, cb = clusters.assign(feats[:1])[0], clusters.assign(feats[40:41])[0]
        assert ca != cb
        per = pooled.model_copy(update={"per_domain": {ca: None, cb: 50.0}, "clusters": PointClusters.of(clusters)})
        if router.shipped is not None:
            router.shipped = router.shipped.model_copy(update={"operating_point": per})
        router.calibration.default = per
        calls = []
        encode = router.encoder.encode
        router.encoder.encode = lambda *args, **kw: calls.append(1) or encode(*args, **kw)
        got = router.route_batch([a[3], b[5]])
        assert len(calls) == 1  # one encoding serves the clusters and the head
        assert got[0].worker_id == "c" and got[0].extra["budget"]["lambda"] is None
        assert got[0].extra["budget"]["group"] == ca
        assert got[1].worker_id == "a" and got[1].extra["budget"]["lambda"] == 50.0
        assert got[1].extra["budget"]["group"] == cb
        assert got[0].extra["budget"]["operating_point"].startswith("the default operating point, per prompt cluster (")
    finally:
        router.close()


def test_through_the_commands_an_import_without_domains_routes_each_prompt_cluster_by_its_point(tmp_path):
    """`fugu-lite train` on an import without domains or replies (the heads limited to the domain prior,
    which without domains gives every prompt the same prediction): the default point per prompt cluster
    ships at about half the strongest's cost; `route` sends a new code prompt to the cheap worker and an
    option prompt to the strong one, each naming its cluster; `evaluate` reports each cluster's rows;
    the server, through the official client, routes as `route` does."""
    import openai

    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline_tests.cli_project import two_kinds_rows

    common = write_inputs(tmp_path, two_kinds_rows(answers=False))
    (tmp_path / "train.yaml").write_text('features: {layer_sets: "off", prompt_rules: "off"}\n'
                                         "heads:\n  knn: null\n  ridge: null\n  ensemble: null\n")
    code, out = run("train", *common, "--encoder", "tiny", "--config", str(tmp_path / "train.yaml"),
                    "--output", str(tmp_path / "models"))
    assert code == 0, out
    shipped = next(line for line in out.splitlines() if line.startswith("shipped policy: "))
    import re

    share = int(re.search(r"= (\d+)% of strong's cost", shipped).group(1))
    assert ", per prompt cluster (prompt cluster " in shipped and 40 <= share <= 60, shipped
    ckpt = out.strip().splitlines()[-1]
    got = {}
    prompts = {"code": "Write a Python function: sort a list of strings and return the index",
               "mc": "Choose the correct option: which statement is true"}
    for kind, prompt in prompts.items():
        code, said = run("route", "--checkpoint", ckpt, "--prompt", prompt, "--device", "cpu")
        assert code == 0, said
        got[kind] = json.loads(said)
    assert got["code"]["worker"] == "cheap" and got["mc"]["worker"] == "strong", got
    assert got["code"]["budget"]["group"] != got["mc"]["budget"]["group"]
    assert got["mc"]["budget"]["lambda"] is None and got["code"]["policy"]["grouped_by"] == "prompt cluster"
    assert got["code"]["policy"]["line"] == shipped  # one description: what train printed is what serves
    code, said = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(tmp_path / "eval.json"))
    assert code == 0, said
    rep = json.loads((tmp_path / "eval.json").read_text())
    served = rep["default_point"]["realised_usd_per_1k"]
    assert rep["routes_by"].startswith("the default operating point, per prompt cluster (")
    # every figure of the report reads the route served, not the head's argmax (the strong worker everywhere)
    assert rep["router_mean_cost_usd"] * 1000 == pytest.approx(served) and served < 0.6 * rep["best_fixed_mean_cost_usd"] * 1000
    assert 0 < rep["route_distribution"]["cheap"] < rep["n_tasks"]
    plain_code, plain = run("evaluate", "--checkpoint", ckpt, *common, "--no-default-budget",
                            "--output", str(tmp_path / "plain.json"))
    assert plain_code == 0, plain
    plain_rep = json.loads((tmp_path / "plain.json").read_text())
    assert plain_rep["routes_by"].startswith("the head's plain route") and "default_point" not in plain_rep
    assert plain_rep["route_distribution"]["cheap"] == 0  # the domain prior alone prefers the strong worker
    per = [line.strip() for line in said.splitlines() if line.startswith("  prompt cluster ")]
    assert len(per) == 2 and any("always strong" in line for line in per), said
    assert any("expected cost 1% of strong's" in line for line in per), per

    (tmp_path / "mock.yaml").write_text("workers:\n  - {id: cheap, kind: mock}\n  - {id: strong, kind: mock}\n")
    srv = ServerThread(create_app(Router.load(ckpt, device="cpu"), tmp_path / "mock.yaml"))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for kind, prompt in prompts.items():
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}])
            info = r.model_extra["fugu_lite"]
            assert info["chosen_worker"] == got[kind]["worker"], info
            assert info["budget"]["group"] == got[kind]["budget"]["group"], info
    finally:
        srv.stop()


def test_prompt_clusters_of_another_width_beside_a_checkpoint_are_refused_at_load(trained, capsys):
    """A point per prompt cluster whose centroids read another number of feature columns than the
    checkpoint's (files copied from another run): `Router.load` refuses it in one line naming both
    widths and the files, before any request; `evaluate` says the same line."""
    import shutil

    from fugu_pipeline.route.budget import load_calibration
    from fugu_pipeline.route.default_point import PointClusters
    from fugu_pipeline.route.router import Router, RouterError
    from fugu_pipeline.route.shipped import read_shipped

    work, ckpt, _, _ = trained
    copy = work / "wrong_width"
    shutil.copytree(work / ckpt, copy)
    cal = load_calibration(copy)
    dim = 5
    unit = [[1.0] + [0.0] * (dim - 1), [0.0, 1.0] + [0.0] * (dim - 2)]
    wrong = PointClusters(names=["prompt cluster 1", "prompt cluster 2"], center=[0.0] * dim, scale=[1.0] * dim,
                          centroids=unit)
    point = cal.default.model_copy(update={"per_domain": {"prompt cluster 1": None, "prompt cluster 2": None},
                                           "clusters": wrong})
    cal.default = point
    cal.save(copy)
    shipped, _ = read_shipped(copy, cal.checkpoint)
    if shipped is not None:
        shipped.model_copy(update={"operating_point": point}).save(copy)
    with pytest.raises(RouterError, match=r"prompt clusters \(policy.json / budget.json beside it\) read 5 feature "
                                          r"columns, and the checkpoint's features have \d+"):
        Router.load(str(copy), device="cpu")
    _, _, common, _ = trained
    capsys.readouterr()
    code, _ = run("evaluate", "--checkpoint", str(copy), *common)  # evaluate and the contest read the same check
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and said.startswith("fugu-lite evaluate: checkpoint ") and \
        "read 5 feature columns, and the checkpoint's features have" in said, said


def test_the_reason_names_the_closest_policy_that_counts_as_cheaper_with_its_interval():
    """A λ that sends one row to the cheap worker (99.1% of the strongest's cost) ties it, but does
    not save the 2% a cheaper policy must; the next sends 21 rows and loses 20. The strongest is the
    default, and the reason names the closest policy that counts as cheaper, with its interval."""
    n = 100
    p_cheap = np.concatenate([[0.99], np.full(20, 0.5), np.zeros(79)])
    q_oof = np.stack([p_cheap, np.ones(n)], axis=1)
    quality = np.stack([np.concatenate([[1.0], np.zeros(99)]), np.ones(n)], axis=1)
    c_hat = np.tile([0.1, 1.0], (n, 1))
    p, route = choose_default_route(q_oof, quality, c_hat, 1.0, np.arange(n) % 5, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "strongest" and (route == 1).all()
    assert "nan" not in p.reason
    assert re.search(r"the closest cheaper one, λ-routing at λ = [0-9.]+, is -0\.2000 \[-0\.\d+, -0\.\d+\]", p.reason), p.reason


def test_a_saving_the_rule_does_not_repeat_inside_the_folds_ships_the_strongest():
    """20 of 450 rows go to the cheap worker (a tenth of the cost): a 4% saving, two of them lost,
    −0.0044, within the half-point margin. Inside the folds each fold's rule sees both losses on the
    other folds' 360 rows unless one is its own, −0.0056, and keeps the strongest: 2 folds of 5
    route cheaply, a 1.6% saving, under the 2% minimum. The strongest ships and the reason says so."""
    n = 450
    cheap_rows = np.arange(n) < 20
    cheap = np.where(cheap_rows, 1.0, 0.0)
    cheap[[0, 1]] = 0.0  # the two losses, in folds 0 and 1
    quality = np.stack([cheap, np.ones(n)], axis=1)
    q_oof = np.stack([np.where(cheap_rows, 0.95, 0.1), np.full(n, 0.9)], axis=1)
    c_hat, folds = np.tile([0.1, 1.0], (n, 1)), np.arange(n) % 5
    plain, _ = choose_default_route(q_oof, quality, c_hat, 1.0, folds, ["cheap", "strong"], LAMBDAS, nested=False)
    assert plain.kind == "lambda" and plain.oof_cost_usd == pytest.approx(1 - 20 * 0.9 / n)  # 96%: saves 4%
    p, route = choose_default_route(q_oof, quality, c_hat, 1.0, folds, ["cheap", "strong"], LAMBDAS)
    assert p.kind == "strongest" and (route == 1).all()
    assert "at 98% of the strongest's cost saves less than 2% of its cost" in p.reason
