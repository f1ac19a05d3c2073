"""A cascade under a user's cap: the most accurate policy within the cap ships (no significance rule
between the user's choice and the best policy that keeps it), and the cap holds on new traffic that
escalates more than the rows it was chosen on (the spend guard, `policies/cascade/spend.py`, in
`evaluate` and in serving)."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fugu_pipeline.cost_cap import CostCap
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import fit_cascade
from fugu_pipeline.policies.cascade.search import CascadeSearch
from fugu_pipeline_tests import cascade_fixture

FAST = CascadeSearch(thresholds=6, three_steps=False, finals=2, cheap=2)
quiet = lambda m: None  # noqa: E731


def test_under_a_cap_the_most_accurate_policy_within_it_ships_without_a_significance_rule():
    """A cheap worker nearly as accurate as the strong one: a plan escalating a quarter of the rows
    is more accurate out of fold than the cheap worker alone, within a cap of 30% of the strong
    one's cost, but its gain's interval reaches zero. The user chose the cap: that plan ships."""
    data, grid, inputs = cascade_fixture.close(seed=0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400, cap=CostCap(share=0.3)), log=quiet)
    assert fit.selected_kind == "cascade" and fit.policy.describe().startswith("[cheap] stop if verifier"), fit.reason
    within = [c for c in fit.candidates if not c.note]
    best = max(within, key=lambda c: (c.quality, -c.cost_usd))
    alone = next(c for c in fit.candidates if c.kind == "best worker")
    assert fit.selected == best.name and "best out-of-fold accuracy within the cap" in fit.reason
    assert best.quality > alone.quality and best.low <= 0  # more accurate than the cheap worker, not significantly
    # beside it, the same pick made inside the folds, with its interval and its share of the strongest's cost
    assert re.search(r"the pick made inside the folds \(each fold served the most accurate candidate within the cap "
                     r"on the others\): difference [+-]\d\.\d{4} \[[+-]\d\.\d{4}, [+-]\d\.\d{4}\] at \d+%", fit.reason)


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A cascade trained at 20% of the strongest's cost on rows where the cheap worker is right 70% of
    the time; on the test rows (new traffic) it is right 20% of the time, so its plan escalates more."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.make(n=600, test_cheap=0.2)
    # one plan for both of the fixture's domains (they differ in name only): the pooled cap's own guard
    cfg = CascadeConfig(search=FAST, n_boot=300, cap=CostCap(share=0.2), groups="off")
    fit = fit_cascade(data, grid, inputs, cfg, log=quiet)
    path = save_cascade(tmp_path_factory.mktemp("capped"), data, fit, inputs.answer.shape[2])
    cap = 0.2 * fit.expected_cost["strong"]
    return data, grid, inputs, fit, load_cascade(path), cap


def test_evaluate_keeps_the_cap_on_new_rows_that_escalate_more(capped):
    """Run as served, the checkpoint follows the spend under the cap it was trained under: over the
    held-out rows (traffic whose cheap answers are wrong more often) it spends less than its plan
    alone, and over a long run of such traffic the running mean comes back under the cap where the
    plan alone spends a tenth more."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade

    data, grid, inputs, fit, ckpt, cap = capped
    alone = load_cascade(ckpt.path)
    alone.head.cap_usd = None  # the shipped plans, no guard
    plain = float(np.mean([o.cost_usd for o in cascade_outcomes(alone, data, grid, inputs)]))
    assert plain > 1.1 * cap  # the shipped plan alone overspends on the harder rows
    spent = float(np.mean([o.cost_usd for o in cascade_outcomes(ckpt, data, grid, inputs)]))
    assert spent < plain, (spent, cap, plain)
    test = np.flatnonzero(data.splits == "test")
    long = cascade_fixture.take(data, grid, inputs, np.tile(test, 20))  # a log of such traffic, in time
    rows = np.arange(20 * len(test))
    run = float(np.mean([o.cost_usd for o in cascade_outcomes(ckpt, *long, rows=rows, as_given=True)]))
    assert run <= cap < float(np.mean([o.cost_usd for o in cascade_outcomes(alone, *long, rows=rows)])) / 1.1, (run / cap)


def test_serving_escalates_less_when_the_running_spend_nears_the_cap(capped):
    """A request that names no cap is served its trained cap followed: the first gets the shipped
    plan (the most accurate saved point within 98% of the cap); after requests that cost twice the
    cap, the effective cap falls and the plan served escalates less."""
    from fugu_pipeline.policies.cascade.policy import CascadePlan
    from fugu_pipeline.policies.cascade.route import CascadeRouter

    *_, fit, ckpt, cap = capped
    router = CascadeRouter(ckpt, None)
    first = router.route_batch(["q"], ["math"])[0]
    assert CascadePlan.model_validate(first.extra["cascade"]["plan"]) == fit.policy.plan_for("math")
    assert first.extra["budget"]["guard"]["effective_cap_usd"] == pytest.approx(0.98 * cap)
    assert first.extra["budget"]["validation_cost_usd"] <= 0.98 * cap
    for _ in range(20):  # requests that cost twice the cap, as the shipped plan's calls on hard prompts do
        router.record_spend(first, 2 * cap)
    later = router.route_batch(["q"], ["math"])[0]
    guard = later.extra["budget"]["guard"]
    assert guard["requests"] == 20 and guard["effective_cap_usd"] < 0.9 * cap
    assert CascadePlan.model_validate(later.extra["cascade"]["plan"]) != fit.policy.plan_for("math")
    assert later.extra["budget"]["validation_cost_usd"] < first.extra["budget"]["validation_cost_usd"]
    assert later.extra["budget"]["validation_cost_usd"] <= guard["effective_cap_usd"]


def test_the_pooled_guard_lowers_the_allowance_only_past_the_cap_and_keeps_few_caps(capped):
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.spend import MAX_GUARDS, SpendGuard

    g = SpendGuard(1.0)
    for _ in range(10):
        g.record(0.9)  # below the cap: the cap's own allowance
    assert g.allowance() == 1.0
    for _ in range(10):
        g.record(1.5)
    assert g.allowance() < 1.0
    router = CascadeRouter(capped[4], None)
    for k in range(MAX_GUARDS + 10):  # requests naming ever new caps hold a bounded number of guards
        router.guard(0.001 * (k + 1))
    assert len(router.guards) == MAX_GUARDS and round(0.001, 15) not in router.guards


def test_a_caps_own_margin_bounds_the_plan_and_is_recorded(tmp_path):
    """`--cap share=0.2,margin_z=Z`: the plan's mean cost plus Z standard errors is what must fit the
    cap, so a wide margin searches a plan that escalates less than no margin does; the checkpoint
    records the cap and Z."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.make(n=600, test_cheap=0.2)
    fits = {z: fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=200, cap=CostCap(share=0.2, margin_z=z)),
                           log=quiet) for z in (0.0, 8.0)}
    assert fits[8.0].choices["*"].cost < fits[0.0].choices["*"].cost, {z: f.policy.describe() for z, f in fits.items()}
    ckpt = load_cascade(save_cascade(tmp_path, data, fits[0.0], inputs.answer.shape[2]))
    assert ckpt.head.cap_z == 0.0 and ckpt.head.cap_usd == pytest.approx(0.2 * fits[0.0].expected_cost["strong"])


def _mixed_fit(named: bool, share: float = 0.6, log=quiet, apart: float = 4.0, **kw):
    data, grid, inputs = cascade_fixture.mixed(n=600, named=named, apart=apart)
    cfg = CascadeConfig(search=FAST, n_boot=400, cap=CostCap(share=share), **kw)
    return data, grid, inputs, fit_cascade(data, grid, inputs, cfg, log=log)


def test_under_a_pooled_cap_the_kinds_of_prompt_share_it():
    """The cheap worker ties the strong one on code and is right on 30% of multiple choice, and no
    feature tells the kinds or a right reply apart: one plan for every prompt within 60% of the strong
    worker's cost escalates at random. Sharing the cap, code gets the cheap worker (1% of the cost)
    and multiple choice the strong one: the strong worker's accuracy at half its cost, out of fold."""
    from fugu_pipeline.policies.cascade.ship import SHARED_DOMAIN
    from fugu_pipeline.policies.cascade.train import CascadeResult

    lines: list[str] = []
    # apart 0: the prompt's features do not tell the kinds apart either (a verifier that reads them
    # could, with a fine enough threshold, stop early on code alone)
    data, grid, inputs, fit = _mixed_fit(True, log=lines.append, apart=0.0)
    got = {c.name: c for c in fit.candidates}
    assert fit.selected == SHARED_DOMAIN, fit.reason
    assert fit.policy.plan_for("code").describe() == "[cheap]" and fit.policy.plan_for("mc").describe() == "[strong]"
    shared, pooled = got[SHARED_DOMAIN], got["cascade"]
    assert shared.quality > pooled.quality + 0.01 and shared.vs_strongest == 0.0
    assert not shared.note and shared.cost_usd <= 0.6 * got["always the strongest worker"].cost_usd
    assert fit.groups.shared_cap and {o.name for o in fit.groups.groups.values()} == {"its plan within the shared cap"}
    printed = "\n".join(CascadeResult(fit, None, "cascade", None).lines())
    assert "the plans chosen together so that the whole keeps within the cap" in printed
    assert "domain 'code' (240 rows): its plan within the shared cap = [cheap]" in printed
    assert "mc: [strong]" in lines[-1] and f"selected {SHARED_DOMAIN}" in lines[-1]
    # the table at 20/33/50% holds the plans per group sharing each cap beside the pooled cascade
    assert [r["share"] for r in fit.cap_rows if r["policy"] == "plans per group"] == [0.2, 0.33, 0.5]
    assert "| 50% | plans per group |" in printed


def test_without_domains_the_prompt_clusters_share_the_cap_and_the_checkpoint_serves_them(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.ship import SHARED_CLUSTER

    data, grid, inputs, fit = _mixed_fit(False)
    assert fit.selected == SHARED_CLUSTER and fit.clusters is not None, fit.reason
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    keys = ckpt.head.group_keys(data.domains, data.features)
    code = np.array([i % 2 == 1 for i in range(len(keys))])  # the fixture's code rows
    served = np.array([ckpt.head.policy.plan_for(k).describe() for k in keys])
    assert (served[code] == "[cheap]").mean() > 0.95 and (served[~code] == "[strong]").mean() > 0.95
    assert ckpt.head.cap_usd == pytest.approx(fit.cap_usd)  # the spend guard keeps the pooled cap


def test_a_cap_per_domain_or_groups_off_keeps_one_plan_per_cap():
    """The user's own cap per domain is each domain's, not one to share; `groups: off` asks for one plan."""
    from fugu_pipeline.policies.cascade.ship import SHARED_DOMAIN

    for kw in ({"domain_caps": {"mc": CostCap(share=0.9)}}, {"groups": "off"}):
        *_, fit = _mixed_fit(True, **kw)
        assert SHARED_DOMAIN not in {c.name for c in fit.candidates} and fit.groups is None, kw


def test_a_pooled_cap_below_every_plan_ships_the_strongest_with_the_reason():
    *_, fit = _mixed_fit(True, share=0.005)
    assert fit.selected_kind == "best worker" and "cap" in fit.reason and "raise the cap" in fit.reason


def _brute(Q, C, S, w, cap, z):
    import itertools

    from fugu_pipeline.cost_cap import within_cap

    best = None
    for pick in itertools.product(*[range(len(q)) for q in Q]):
        c = sum(w[g] * C[g][k] for g, k in enumerate(pick)) + z * np.sqrt(sum((w[g] * S[g][k]) ** 2 for g, k in enumerate(pick)))
        q = sum(w[g] * Q[g][k] for g, k in enumerate(pick))
        if within_cap(c, cap) and (best is None or q > best):
            best = q
    return best


@pytest.mark.parametrize("seed", range(60))
def test_sharing_a_cap_keeps_within_it_and_near_the_best_choice(seed):
    """Against every combination: what `allocate` picks is within the cap, None exactly when no
    combination is, and no further below the best combination than one group's spread (the bound of
    a price on cost; on most draws it is the best)."""
    from fugu_pipeline.cost_cap import within_cap
    from fugu_pipeline.policies.cascade.groups import allocate

    rng = np.random.default_rng(seed)
    g = int(rng.integers(1, 4))
    Q = [rng.random(int(rng.integers(1, 6))) for _ in range(g)]
    C = [rng.random(len(q)) for q in Q]
    S = [0.05 * rng.random(len(q)) for q in Q]
    w = rng.dirichlet(np.ones(g))
    cap, z = float(rng.uniform(0.1, 0.9)), float(rng.choice([0.0, 1.645]))
    got, best = allocate(Q, C, S, w, cap, z), _brute(Q, C, S, w, cap, z)
    assert (got is None) == (best is None)
    if got is not None:
        c = sum(w[k] * C[k][i] for k, i in enumerate(got)) + z * np.sqrt(sum((w[k] * S[k][i]) ** 2 for k, i in enumerate(got)))
        q = sum(w[k] * Q[k][i] for k, i in enumerate(got))
        assert within_cap(c, cap)
        assert q >= best - max(w[k] * (Q[k].max() - Q[k].min()) for k in range(g)) - 1e-12


def test_each_group_keeps_its_part_of_a_shared_cap_in_serving_and_evaluate(tmp_path):
    """The multiple-choice plan costs the strong worker's price, above the pooled cap: a run of those
    requests at that price keeps its plan (its part of the cap is that price); the same run at twice
    the price is cut to a plan that escalates less. `evaluate`, with the test rows sorted by kind,
    spends the same as the plans unguarded."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.route.follow import TARGET

    data, grid, inputs, fit = _mixed_fit(True)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    parts = ckpt.head.group_caps
    rows = np.flatnonzero(data.splits != "test")
    doms = np.asarray(data.domains)[rows]
    assert set(parts) == {"code", "mc"}
    # each part at most its dearest saved point over the follower's target: here both groups reach
    # theirs (code saves the cheap worker alone), so the parts add up to less than the cap
    tops = {d: max(p["cost_usd"] for p in ckpt.head.head_params()["domains_frontier"][d]) / TARGET for d in parts}
    assert parts == pytest.approx(tops)
    assert sum(parts[d] * (doms == d).mean() for d in parts) < fit.cap_usd
    assert parts["mc"] > fit.cap_usd > parts["code"]
    # the parts are those a request asking the same cap gets: the trained cap and the cap asked serve alike
    from fugu_pipeline.policies.cascade.spend import request_shares

    asked = request_shares(ckpt.head.head_params(), ckpt.manifest.metrics, CostCap(usd_per_1k=fit.cap_usd * 1000))
    assert asked.group_caps == pytest.approx(parts)
    for price, kept in ((1.0, True), (2.0, False)):
        router = CascadeRouter(load_cascade(ckpt.path), None)
        first = router.route_batch(["q"], ["mc"])[0]
        assert first.extra["budget"]["guard"]["group"] == "mc"
        for _ in range(30):
            router.record_spend(first, price * fit.expected_cost["strong"])
        later = router.route_batch(["q"], ["mc"])[0]
        assert (later.extra["cascade"]["describe"] == "[strong]") == kept, (price, later.extra)
        code = router.route_batch(["q"], ["code"])[0]  # the other group's guard has seen nothing
        assert code.extra["cascade"]["describe"] == "[cheap]" and code.extra["budget"]["guard"]["requests"] == 0
    order = np.argsort(np.asarray(data.domains) != "mc", kind="stable")  # every mc row first, then every code row
    sorted_data, sorted_grid, sorted_inputs = cascade_fixture.take(data, grid, inputs, order)
    guarded = [o.answered_by for o in cascade_outcomes(ckpt, sorted_data, sorted_grid, sorted_inputs)]
    test = np.flatnonzero(sorted_data.splits == "test")
    want = [fit.policy.plan_for(sorted_data.domains[i]).steps[0].workers[0] for i in test]
    assert guarded == want


def test_traffic_that_turns_to_the_dear_kind_for_good_is_brought_back_under_the_pooled_cap(tmp_path):
    """Every request multiple choice, whose part of the cap (shared on half and half) is twice the
    pooled cap: the first ones keep their plan (a run of one kind is not cut), then the mix of
    requests moves and the cap is shared again over it, so multiple choice's part comes down to the
    pooled cap. The spend comes back under the pooled cap well before the pooled guard's slack is
    reached, and stays at the follower's target (parts kept as first shared spend the
    multiple-choice part on every row until the guard cuts every group, past its slack)."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.spend import MIX_WINDOW, POOL_SLACK
    from fugu_pipeline.route.follow import TARGET

    data, grid, inputs, fit = _mixed_fit(True)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    parts, cap = ckpt.head.group_caps, fit.cap_usd
    assert parts["mc"] > 1.5 * cap
    mc = np.flatnonzero((np.asarray(data.domains) == "mc") & (data.splits == "test"))
    n = int(12 * MIX_WINDOW)
    order = np.tile(mc, int(np.ceil(n / len(mc))))[:n]
    outs = cascade_outcomes(ckpt, *cascade_fixture.take(data, grid, inputs, order), as_given=True)  # a log in time
    cost = np.array([o.cost_usd for o in outs])
    assert {o.answered_by for o in outs[:int(MIX_WINDOW / 20)]} == {"strong"}  # a run of one kind keeps its plan
    assert cost[int(3 * MIX_WINDOW):].mean() <= cap, cost[int(3 * MIX_WINDOW):].mean() / cap  # the mix moved: within the cap
    # while the mix moves from half to all, multiple choice's part runs over the cap by about ln 2
    # windows' worth of it (parts kept as first shared run on to the pooled guard's slack)
    assert np.cumsum(cost - cap).max() < 0.75 * MIX_WINDOW * cap < POOL_SLACK * cap
    assert cost[int(6 * MIX_WINDOW):].mean() > (TARGET - 0.01) * cap  # then at the follower's target, not cut below it
    # serving: the same run through the router, each request charged what its plan's first call costs
    router = CascadeRouter(load_cascade(ckpt.path), None)
    spent = []
    for _ in range(n):
        got = router.route_batch(["q"], ["mc"])[0]
        spent.append(fit.expected_cost["strong" if got.extra["cascade"]["describe"] == "[strong]" else "cheap"])
        router.record_spend(got, spent[-1])
    assert set(spent[:int(MIX_WINDOW / 20)]) == {fit.expected_cost["strong"]}
    assert np.mean(spent[int(3 * MIX_WINDOW):]) <= cap and np.cumsum(np.array(spent) - cap).max() < 0.75 * MIX_WINDOW * cap
    code = router.route_batch(["q"], ["code"])[0].extra["budget"]["guard"]  # its own guard idle, the pooled one shared
    assert code["requests"] == 0 and code["pooled"]["requests"] == len(spent)
    rows = {r["group"]: r for r in router.spend_states()}
    assert rows["pooled"]["mix"]["mc"] > 0.99 and rows["mc"]["cap_usd"] == pytest.approx(cap)
    assert rows["mc"]["part_usd"] < 0.6 * parts["mc"]
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from fugu_pipeline.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    metrics.spend = router.spend_states  # as the app sets it
    got = {(f.name, x.labels["group"]): x for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
           for x in f.samples if f.name in ("fugu_cap_part_usd", "fugu_cap_mix_share", "fugu_cap_requests")}
    assert got[("fugu_cap_part_usd", "mc")].value == pytest.approx(rows["mc"]["part_usd"])
    assert got[("fugu_cap_mix_share", "mc")].value > 0.99 and got[("fugu_cap_mix_share", "code")].value < 0.01
    assert {got[(name, "mc")].labels["cap_usd"] for name in ("fugu_cap_part_usd", "fugu_cap_requests")} == {f"{cap:.6g}"}


def test_a_worker_shipped_alone_under_its_cap_is_kept_while_the_spend_allows_and_never_upgraded():
    """A checkpoint that shipped the best worker within its cap alone: a fresh follower serves that
    worker, though a dearer, more accurate saved point is within the effective cap; past the cap
    the most accurate point cheaper than it; never a dearer one."""
    from fugu_pipeline.policies.cascade.policy import CascadePolicy
    from fugu_pipeline.policies.cascade.spend import RequestShares, SpendGuard, own_point, request_point

    points = [_point(0.5, 0.2, "cheap"), _point(0.6, 0.4, "mid"), _point(0.9, 0.9, "strong")]
    head = type("Head", (), {"policy": CascadePolicy.model_validate({"default": _plan("mid")})})()
    metrics = {"selection": {"selected_kind": "best worker"}, "expected_cost_usd": {"mid": 0.4, "cheap": 0.2},
               "worker_quality": {"mid": 0.6}}
    own = own_point(head, metrics)
    assert own == {"cost_usd": 0.4, "quality": 0.6, "plan": _plan("mid")}
    assert own_point(head, {**metrics, "selection": {"selected_kind": "cascade"}}) is None
    guards: dict = {}
    guard_of = lambda cap, group, pooled: guards.setdefault((group, pooled), SpendGuard(cap))  # noqa: E731
    shares = RequestShares(1.0)
    assert request_point(shares, points, None, guard_of, own)[0] is own  # the strong point is within 0.98
    assert request_point(shares, points, None, guard_of)[0]["plan"] == _plan("strong")  # a cascade would take it
    for _ in range(30):
        guards[(None, False)].record(2.5)
    best, _, note = request_point(shares, points, None, guard_of, own)
    assert note["effective_cap_usd"] < 0.4 and best["plan"] == _plan("cheap")


def test_a_group_too_small_for_its_own_plan_shares_the_cap_as_the_rest_of_the_rows():
    """A third domain with fewer rows than `search.min_domain_rows` is merged, with its line; its
    rows are one more part of the mix (served the default plan), chosen with the others within
    the cap, and the guard keeps them to the pooled cap."""
    from fugu_pipeline.policies.cascade.ship import SHARED_DOMAIN

    data, grid, inputs = cascade_fixture.mixed(n=600, tiny=40)
    lines: list[str] = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400, cap=CostCap(share=0.6)), log=lines.append)
    assert any("'tiny' (32 rows) have fewer than 40 non-test rows" in line for line in lines), lines
    assert fit.selected == SHARED_DOMAIN, fit.reason
    assert set(fit.policy.per_domain) == {"code", "mc"} and set(fit.group_caps) == {"code", "mc"}
    assert fit.policy.plan_for("tiny").describe() == "[cheap]"  # the cheap worker ties the strong one there
    assert fit.choices["*"].cost < 0.05 * fit.expected_cost["strong"]


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf")])
def test_a_groups_part_of_a_cap_that_is_not_a_positive_number_is_refused_on_load(bad):
    from fugu_pipeline.policies.cascade.head import CascadeHead

    with pytest.raises(ValueError, match=r"group_caps holds a cap that is not a positive number for \['mc'\]"):
        CascadeHead(6, 2, group_caps={"code": 1e-4, "mc": bad})
    assert CascadeHead(6, 2, group_caps={"code": 1e-4}).head_params()["group_caps"] == {"code": 1e-4}


def test_the_capped_pick_made_inside_the_folds_reads_what_the_pick_was_lucky_on():
    """Two candidates within the cap: A is right on 80% of every fold; B on 78% of four folds and on
    every row of the fifth, so B is the more accurate out of fold and is picked. Made inside the
    folds, the pick serves each fold the candidate that led on the others: B wherever the lucky fold
    is among the others, A on the lucky fold itself, so the nested figure is below B's. A candidate
    over the cap on the other folds is never the pick there; with none within it, the cheapest."""
    from types import SimpleNamespace

    from fugu_pipeline.policies.cascade.nested import nested_capped
    from fugu_pipeline.train.selection import STRONGEST

    folds = np.repeat(np.arange(5), 100)
    a = (np.arange(500) % 10 < 8).astype(float)
    b = np.where(folds == 4, 1.0, (np.arange(500) % 50 < 39).astype(float))
    dear = np.ones(500)
    cf = SimpleNamespace(quality={"A": a, "B": b, "dear": dear, STRONGEST: dear},
                         cost={"A": np.full(500, 1.0), "B": np.full(500, 1.0), "dear": np.full(500, 5.0),
                               STRONGEST: np.full(500, 5.0)})
    cands = [SimpleNamespace(name=k, note="") for k in ("A", "B", "dear", STRONGEST)]
    assert b.mean() > a.mean()
    m, lo, hi, cost = nested_capped(cands, cf, folds, 2.0, 400, 0)
    assert m == pytest.approx(np.where(folds == 4, a, b).mean() - 1.0) and m < b.mean() - 1.0 and lo <= m <= hi
    assert cost == pytest.approx(1.0)
    m, _, _, cost = nested_capped(cands, cf, folds, 0.5, 400, 0)  # nothing within the cap: the cheapest
    assert cost == pytest.approx(1.0) and m == pytest.approx(np.where(folds == 4, a, b).mean() - 1.0)


@pytest.mark.parametrize("share", [0.33, 0.5])
def test_a_row_of_the_table_at_caps_is_that_cap_asked_later_out_of_fold(share):
    """A fit with no cap prints the table at 20/33/50% of the strongest's cost; its cascade row at a
    share is that cap asked of the checkpoint later, served following the spend (`follow_fold.py`):
    the same row in a fit made under that cap, within the cap out of fold, and the same figures as
    that fit's cascade candidate, which serves its cap the same way."""
    data, grid, inputs = cascade_fixture.close(seed=0)
    base = dict(search=FAST, n_boot=300, groups="off")
    free = fit_cascade(data, grid, inputs, CascadeConfig(**base), log=quiet)
    capped = fit_cascade(data, grid, inputs, CascadeConfig(**base, cap=CostCap(share=share)), log=quiet)
    row = lambda fit: next(r for r in fit.cap_rows if r["share"] == share and r["policy"] == "cascade")  # noqa: E731
    assert row(free)["accuracy"] is not None and row(free) == row(capped)
    assert row(free)["share_of_strongest"] <= share
    # the capped fit's cascade candidate is scored by that rule too: what it serves is what it was chosen on
    assert row(free)["usd_per_1k"][0] == pytest.approx(capped.oof_cost["cascade"].mean() * 1000)
    assert row(free)["accuracy"][0] == pytest.approx(capped.oof["cascade"].mean())


def test_the_out_of_fold_replay_picks_each_row_the_point_serving_picks():
    """`follow_fold.replay` (what `train` scores a cap asked later by) against `spend.request_point`
    (what serves it) over the same points and rows in the same order, one follower per group part
    and one for the rows of no group: every row the same point. The groups' parts were shared on a
    mix of 1 to 4 and requests come half and half: both re-share the parts as the mix moves, and the
    grouped rows' spend comes under the cap once the mix has moved (at the parts first shared it
    would not), the rest's near its target."""
    from fugu_pipeline.policies.cascade.follow_fold import Part, replay
    from fugu_pipeline.policies.cascade.spend import RequestShares, SpendGuard, request_point, share_parts
    from fugu_pipeline.route.follow import TARGET

    rng = np.random.default_rng(0)
    m, P = 12000, 6
    cost = np.sort(rng.random(P)) + 0.1
    quality = np.sort(rng.random(P))
    q = (rng.random((m, P)) < quality).astype(float)
    c = cost * (0.5 + rng.random((m, P)))
    keys = np.array(["a", "b", "*"])[np.arange(m) % 3]
    cap = float(cost[2] * 1.05)
    points = [{"cost_usd": float(cost[i]), "quality": float(quality[i]), "plan": i} for i in range(P)]
    dear = [("a", [p for p in points if p["plan"] >= 2], 0.2), ("b", points[:4], 0.8)]  # a: only its dearer points
    first = share_parts(dear, cap, 0.0)[0]
    assert 0.5 * first["a"] + 0.5 * first["b"] > 1.05 * cap  # the first parts, at half and half, overspend
    shares = RequestShares(cap, first, dear, 0.0)
    caps = {**first, "*": cap}
    group_pts = {"a": np.arange(2, P), "b": np.arange(4), "*": np.arange(P)}
    parts = [Part(k, np.flatnonzero(keys == k), cost[group_pts[k]], quality[group_pts[k]], q[keys == k][:, group_pts[k]],
                  c[keys == k][:, group_pts[k]], caps[k], 0 * cost[group_pts[k]], shares=shares if k != "*" else None)
             for k in caps]
    order = rng.permutation(m)
    rq, rc = replay(parts, order, m)
    guards: dict = {}

    def guard_of(cap, group, pooled):
        return guards.setdefault((round(cap, 15), group, pooled), SpendGuard(cap, slack=1e9 if pooled else 0.0))

    used = set()
    for k in order:
        mine = {g: pts for g, pts, _ in dear}[keys[k]] if keys[k] != "*" else points
        best, held, _ = request_point(shares, mine, None if keys[k] == "*" else keys[k], guard_of)
        i = best["plan"]
        used.add(i)
        assert (rq[k], rc[k]) == (q[k, i], c[k, i])
        for g in held:
            g.record(float(c[k, i]))
    assert len(used) >= 3  # the point moves with the spend
    assert shares.parts_for(guards[(round(cap, 15), None, True)].mix_now({})) != first  # the parts moved
    late = order[m // 2:][keys[order[m // 2:]] != "*"]  # grouped rows served once the mix has moved (4 windows)
    assert rc[late].mean() < cap  # the cap holds on the mix of requests
    assert 0.8 * TARGET * cap < rc[keys == "*"].mean() < cap  # the lag of a 50-request horizon keeps it a little under


def test_plans_per_group_out_of_fold_share_a_cap_as_serving_shares_it(monkeypatch):
    """The table's row of plans per group, in each fold: each group's part of the cap is what
    `spend.share_parts` gives a checkpoint whose saved points per group are that fold's (the same
    allocation, the same scaling), and every held row follows its own group's part."""
    from fugu_pipeline.policies.cascade import crossfit, follow_fold
    from fugu_pipeline.policies.cascade.spend import share_parts

    seen = []

    def spy(grid, tr, te, at, gdoms, groups, *args):
        out = follow_fold.group_points(grid, tr, te, at, gdoms, groups, *args)
        seen.append((tr, te, np.asarray(gdoms, dtype=str), args[2], args[4], out))  # the cap, its margin
        return out

    monkeypatch.setattr(crossfit, "group_points", spy)
    data, grid, inputs = cascade_fixture.mixed(n=600, named=True, apart=4.0)
    fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=200), log=quiet)
    assert len(seen) == 5 * 3 and sum(out is not None for *_, out in seen) >= 10
    for tr, te, gd, cap, z, out in seen:
        if out is None:
            continue
        mine = {p.key: p for p in out}
        assert set(mine) == {"mc", "code"} and len(out) == 2
        points = {k: [{"cost_usd": float(c), "quality": float(q), "cost_se": float(e)}
                      for c, q, e in zip(p.cost, p.quality, p.cost_se)] for k, p in mine.items()}
        caps, _ = share_parts([(k, points[k], float((gd[tr] == k).mean())) for k in mine], cap, z)
        assert caps == pytest.approx({k: p.cap for k, p in mine.items()})
        for k, p in mine.items():  # each held row of the group, and only those, follows the group's part
            assert len(p.at) == len(p.q) == int((gd[te] == k).sum())


def test_evaluate_serves_the_rows_to_the_guard_in_traffic_order_whatever_the_files_order(capped):
    """The held-out rows reach the spend guard sorted by a hash of their task ids
    (`spend.traffic_order`), as the same checkpoint would see them however the file lists them: the
    rows in reverse give every task the same outcome, and the table at caps the same figures. The
    guard does cut on these rows, so the order is one it reads."""
    from fugu_pipeline.policies.cascade.evaluate import cap_rows_on, cascade_outcomes, load_cascade

    data, grid, inputs, fit, ckpt, cap = capped
    back = cascade_fixture.take(data, grid, inputs, np.arange(len(data.task_ids))[::-1])
    ahead = {o.task_id: o for o in cascade_outcomes(ckpt, data, grid, inputs)}
    assert {o.task_id: o for o in cascade_outcomes(ckpt, *back)} == ahead
    alone = load_cascade(ckpt.path)
    alone.head.cap_usd = None  # the shipped plan on every row
    plain = {o.task_id: o.answered_by for o in cascade_outcomes(alone, data, grid, inputs)}
    assert sum(plain[t] != o.answered_by for t, o in ahead.items()) > 5  # the guard cut some rows
    strong = data.worker_ids.index("strong")
    table = lambda d, g, i: {(r["share"], r["policy"]): (r["accuracy"], r["usd_per_1k"])  # noqa: E731
                             for r in cap_rows_on(ckpt, d, g, i, np.flatnonzero(d.splits == "test"), strong)}
    ours, theirs = table(data, grid, inputs), table(*back)
    assert ours.keys() == theirs.keys() and any(k[1] == "cascade" and v[0] is not None for k, v in ours.items())
    for k, (acc, usd) in ours.items():
        if acc is not None:
            assert theirs[k][0][0] == pytest.approx(acc[0], abs=1e-12) and theirs[k][1][0] == pytest.approx(usd[0], rel=1e-12)


def test_traffic_order_interleaves_kinds_listed_one_after_another_and_ignores_the_files_order():
    from fugu_pipeline.route.follow import traffic_order

    ids = [f"humaneval/{k}" for k in range(200)] + [f"mbpp/{k}" for k in range(200)]
    order = traffic_order(ids)
    assert sorted(order.tolist()) == list(range(400))
    first = [ids[k] for k in order[:100]]
    assert 30 < sum(t.startswith("mbpp/") for t in first) < 70  # both kinds early, about half each
    back = ids[::-1]
    assert [back[k] for k in traffic_order(back)] == [ids[k] for k in order]


def served_as_evaluated(ckpt, data, budget, outs: dict) -> None:
    """`CascadeRouter` serves the held-out rows, in traffic order, each request asking `budget` and
    charged what `evaluate` says it cost (`outs`, by task id): every row the plan `evaluate` ran."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.route.follow import traffic_order

    router = CascadeRouter(load_cascade(ckpt.path), None)
    test = np.flatnonzero(data.splits == "test")
    for k in traffic_order([data.task_ids[i] for i in test]):
        i = test[k]
        got = router.route_batch(["q"], [data.domains[i]], budget=budget)[0]
        assert got.extra["cascade"]["describe"] == outs[data.task_ids[i]].plan, data.task_ids[i]
        router.record_spend(got, outs[data.task_ids[i]].cost_usd)


def test_evaluate_under_a_cap_serves_each_row_the_plan_a_request_asking_it_is_served(tmp_path):
    """`evaluate --cap` on a cascade: each held-out row runs the plan `CascadeRouter` serves a request
    asking that cap, given the same rows in traffic order and charged what each cost, and the
    guard moves between plans as the running spend nears the cap."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, cascade_report, load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.make(n=600, test_cheap=0.2)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300, groups="off"), log=quiet)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    budget = CostCap(share=0.2)
    outs = {o.task_id: o for o in cascade_outcomes(ckpt, data, grid, inputs, budget=budget)}
    assert len({o.plan for o in outs.values()}) > 1, {o.plan for o in outs.values()}  # the guard cut along the way
    served_as_evaluated(ckpt, data, budget, outs)
    rep = cascade_report(ckpt, data, grid, inputs, budget=budget)
    assert rep["policy"].startswith(f"under {budget.describe()}") and rep["budget"]["share"] == 0.2
    assert rep["cost_usd_per_1k"] == pytest.approx(1000 * np.mean([o.cost_usd for o in outs.values()]))
    assert any(" other plan(s) on the rest)" in d["plan"] for d in rep["per_domain"])


def test_an_outcome_names_the_workers_the_served_plan_called_where_the_guard_cut(capped):
    """The contest compares heads by the workers each called per row (`CascadeOutcome.path`): on
    each row, the calls of the point the cap served it, not the shipped plan's (a cap of 40% of the
    trained one serves points that call the middle worker first)."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes
    from fugu_pipeline.policies.cascade.policy import CascadePlan
    from fugu_pipeline.policies.cascade.spend import cap_points

    data, grid, inputs, fit, ckpt, cap = capped
    own = ckpt.head.policy.plan_for(None)
    points = {CascadePlan.model_validate(p["plan"]).describe(): CascadePlan.model_validate(p["plan"])
              for p in cap_points(ckpt.head.head_params(), ckpt.manifest.metrics)}
    outs = cascade_outcomes(ckpt, data, grid, inputs, budget=CostCap(share=0.08))
    for o in outs:
        plan = points[o.plan]
        assert o.path == ">".join("+".join(s.workers) for s in plan.steps[:o.stop_step + 1])
    assert {o.path for o in outs} - {">".join("+".join(s.workers) for s in own.steps[:k + 1]) for k in range(len(own.steps))}


def _plan(*workers: str) -> dict:
    from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadeStep

    return CascadePlan(steps=[CascadeStep(workers=[w]) for w in workers]).model_dump()


def _point(quality: float, cost: float, *workers: str) -> dict:
    return {"quality": quality, "cost_usd": cost, "cost_se": 0.0, "plan": _plan(*workers)}


# a checkpoint with a frontier per group: the cheap worker ties the strong one on code and is far
# below it on multiple choice; each group half the rows the plans were chosen on
PER_GROUP = {"frontier": [_point(0.6, 0.01, "cheap"), _point(0.94, 1.0, "strong")],
             "domains_frontier": {"mc": [_point(0.3, 0.01, "cheap"), _point(0.95, 1.0, "strong")],
                                  "code": [_point(0.9, 0.01, "cheap"), _point(0.92, 1.0, "strong")]}}
PER_GROUP_METRICS = {"expected_cost_usd": {"cheap": 0.01, "strong": 1.0}, "worker_quality": {"cheap": 0.6, "strong": 0.94},
                     "groups": {"chosen": [{"domain": "mc", "rows": 50}, {"domain": "code", "rows": 50}]},
                     "frontier_oof": {"rows": 100}}


def test_a_cap_asked_of_plans_per_group_is_shared_among_the_groups_as_a_trained_cap_is():
    """At 60% of the strong worker's cost, multiple choice keeps the strong worker (its part of the cap
    is above the pooled cap) and code the cheap one, half the rows each: 50.5% of the cost. Kept
    group by group within the pooled cap, multiple choice would get the cheap worker (the strong one
    alone costs more than the cap). A cap below every choice is refused, saying by how much."""
    from fugu_pipeline.policies.cascade.spend import (POOL_SLACK, CapOutOfReach, SpendGuard, cap_points, request_point,
                                                      request_shares)

    shares = request_shares(PER_GROUP, PER_GROUP_METRICS, CostCap(share=0.6))
    assert shares.cap_usd == pytest.approx(0.6)
    assert shares.group_caps["mc"] > 0.6 > shares.group_caps["code"]
    assert 0.5 * shares.group_caps["mc"] + 0.5 * shares.group_caps["code"] == pytest.approx(0.6)
    guards: dict = {}

    def guard_of(cap, group, pooled):
        return guards.setdefault((cap, group, pooled), SpendGuard(cap, slack=POOL_SLACK if pooled else 0.0))

    served = {g: request_point(shares, cap_points(PER_GROUP, PER_GROUP_METRICS, g), g, guard_of)
              for g in ("mc", "code")}
    assert {g: got[0]["plan"] for g, got in served.items()} == {"mc": _plan("strong"), "code": _plan("cheap")}
    best, held, note = served["mc"]
    assert len(held) == 2 and note["group"] == "mc" and note["pooled_cap_usd"] == pytest.approx(0.6)
    alone = request_shares({**PER_GROUP}, {**PER_GROUP_METRICS, "groups": {}}, CostCap(share=0.6))  # no group rows
    assert alone.group_caps == {}
    assert request_point(alone, cap_points(PER_GROUP, PER_GROUP_METRICS, "mc"), "mc", guard_of)[0]["plan"] == _plan("cheap")
    with pytest.raises(CapOutOfReach, match=r"the cheapest costs \$10 per 1,000 requests over the groups. mix.*"
                                              r"raise the cap to a share of at least 0\.01 or \$10 per"):
        request_shares(PER_GROUP, PER_GROUP_METRICS, CostCap(share=0.005))


def test_a_shared_cap_is_shared_again_when_the_mix_of_requests_moves_not_for_a_run_of_one_kind():
    """The parts of a 60% cap shared on half multiple choice, half code: requests that keep that mix
    keep the parts; a run of 100 multiple-choice requests keeps the strong worker; traffic that then
    stays multiple choice moves the mix, and the cap is shared again over it, so multiple choice's
    part comes down and its spend within the pooled cap."""
    from fugu_pipeline.policies.cascade.spend import MIX_BAND, cap_points, new_guard, request_point, request_shares

    shares = request_shares(PER_GROUP, PER_GROUP_METRICS, CostCap(share=0.6))
    first = dict(shares.group_caps)
    guards: dict = {}
    points = {g: cap_points(PER_GROUP, PER_GROUP_METRICS, g) for g in ("mc", "code")}
    price = {"strong": 1.0, "cheap": 0.01}

    def serve(group):
        best, held, note = request_point(shares, points[group], group, lambda c, g, p: guards.setdefault(
            (round(c, 15), g, p), new_guard(c, p)))
        worker = best["plan"]["steps"][-1]["workers"][0]
        for guard in held:
            guard.record(price[worker])
        return worker, note

    mixed = [serve(g) for _ in range(1000) for g in ("mc", "code")]
    assert {n["cap_usd"] for p, n in mixed if n["group"] == "mc"} == {first["mc"]}  # the rows' mix: the parts kept
    run = [serve("mc") for _ in range(int(MIX_BAND * 2000))]
    assert {p for p, _ in run} == {"strong"}  # a run of one kind keeps its plan
    turned = [serve("mc") for _ in range(4000)]
    assert turned[-1][1]["cap_usd"] < 0.7 * first["mc"]  # shared again over the mix of requests
    assert np.mean([price[p] for p, _ in turned[-1000:]]) <= 0.6 < first["mc"]  # within the pooled cap


def test_a_groups_part_stops_at_what_its_dearest_point_can_spend_and_the_rest_goes_to_the_others():
    """Scaled alike, a group whose dearest saved point costs 1.2 would get a part of 3 it can never
    spend; its part stops at 1.2 over the follower's target and the other group gets the rest. Where
    every group stops, the parts add up to less than the cap; a point that costs nothing gets
    nothing."""
    from fugu_pipeline.policies.cascade.groups import fill_parts
    from fugu_pipeline.route.follow import TARGET

    w = {"a": 0.5, "b": 0.5}
    got = fill_parts({"a": 1.0, "b": 1.0}, {"a": 1.2, "b": 10.0}, w, 3.0)
    assert got["a"] == pytest.approx(1.2 / TARGET) and 0.5 * got["a"] + 0.5 * got["b"] == pytest.approx(3.0)
    assert fill_parts({"a": 1.0, "b": 1.0}, {"a": 20.0, "b": 20.0}, w, 3.0) == pytest.approx({"a": 3.0, "b": 3.0})
    low = fill_parts({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0}, w, 3.0)
    assert low == pytest.approx({"a": 1.0 / TARGET, "b": 2.0 / TARGET}) and 0.5 * low["a"] + 0.5 * low["b"] < 3.0
    assert fill_parts({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 10.0}, w, 3.0) == pytest.approx({"a": 0.0, "b": 6.0})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=6),
       st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=6),
       st.floats(0.05, 0.95), st.floats(0.0, 1.0), st.floats(0.01, 1.5))
def test_a_shared_caps_parts_keep_the_cap_over_any_mix_and_never_pass_what_a_group_can_spend(a, b, w, share, cap):
    """For any two groups' saved points, rows' mix and mix of requests: the parts, weighted by the
    mix they were shared over, add up to at most the cap, and no part is above its group's dearest
    point over the follower's target."""
    from fugu_pipeline.policies.cascade.spend import MIX_STEP, RequestShares, share_parts
    from fugu_pipeline.route.follow import TARGET

    pts = {g: [{"cost_usd": c, "quality": q, "cost_se": 0.0} for c, q in v] for g, v in (("a", a), ("b", b))}
    parts = [("a", pts["a"], w), ("b", pts["b"], 1.0 - w)]
    first = share_parts(parts, cap, 0.0)
    if first is None:  # no choice within the cap: a cap asked is refused
        assert min(p["cost_usd"] for p in pts["a"]) * w + min(p["cost_usd"] for p in pts["b"]) * (1 - w) > cap
        return
    shares = RequestShares(cap, first[0], parts, 0.0)
    got = shares.parts_for({"a": share, "b": 1.0 - share})
    if got is shares.group_caps:  # near the rows' mix (or no re-share within the cap): the parts first shared
        weights = [w, 1.0 - w]
    else:  # shared again over the mix of requests, to the nearest step
        weights = [round(m / MIX_STEP) * MIX_STEP for m in (share, 1.0 - share)]
    assert sum(m * got[g] for m, g in zip(weights, "ab")) <= cap * (1 + 1e-9)
    for g, part in got.items():
        assert part <= max(p["cost_usd"] for p in pts[g]) / TARGET * (1 + 1e-9)


def test_a_follower_whose_cap_moves_keeps_what_it_owed():
    """Ten requests at 1.5 under a cap of 1 owe 5.2 over the follower's 98%; the cap then halved,
    the debt stays as it was (not 10.1, as if every request had been counted under the half)."""
    from fugu_pipeline.route.follow import HORIZON, TARGET, RunningSpend

    f = RunningSpend(1.0)
    for _ in range(10):
        f.record(1.5)
    f.set_cap(0.5)
    assert f.effective() == pytest.approx(TARGET * 0.5 - (15.0 - TARGET * 10 * 1.0) / HORIZON)
    f.set_cap(0.5)  # the same cap again: nothing moves
    assert f.effective() == pytest.approx(TARGET * 0.5 - (15.0 - TARGET * 10) / HORIZON)
    f.record(0.2)
    assert f.effective() == pytest.approx(TARGET * 0.5 - (15.2 - TARGET * (10 * 1.0 + 0.5)) / HORIZON)


def test_a_cap_asked_of_a_trained_shared_cap_serves_each_group_its_part_in_serving_and_evaluate(tmp_path):
    """The plans per group chosen under a shared 60% cap: a request asking 60% again gets multiple
    choice's strong worker (kept group by group within the pooled cap, it would get a cheaper plan),
    and `evaluate --cap share=0.6` serves every held-out row the plan the router serves it, in
    traffic order, each charged what it cost."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs, fit = _mixed_fit(True)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    budget = CostCap(share=0.6)
    first = CascadeRouter(load_cascade(ckpt.path), None).route_batch(["q"], ["mc"], budget=budget)[0]
    assert first.extra["cascade"]["describe"] == "[strong]" and first.extra["budget"]["guard"]["group"] == "mc"
    outs = {o.task_id: o for o in cascade_outcomes(ckpt, data, grid, inputs, budget=budget)}
    served_as_evaluated(ckpt, data, budget, outs)
    mc = [o for o in outs.values() if o.domain == "mc"]
    assert np.mean([o.answered_by == "strong" for o in mc]) > 0.9


def test_plans_per_group_chosen_with_no_cap_keep_each_groups_points_for_a_cap_asked_later(tmp_path):
    """With no cap, code ships the cheap worker alone and multiple choice the strong one: each group's
    own searched points are saved (the groups serve no plan of their own search), so a cap of 60%
    asked later keeps that split, within the cap, where each group's choice within the pooled cap
    would send multiple choice to the cheap worker."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.mixed(n=600, named=True, apart=0.0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400), log=quiet)
    assert fit.policy.plan_for("code").describe() == "[cheap]" and fit.policy.plan_for("mc").describe() == "[strong]"
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    assert set(ckpt.head.head_params()["domains_frontier"]) == {"code", "mc"}
    outs = cascade_outcomes(ckpt, data, grid, inputs, budget=CostCap(share=0.6))
    by = {d: np.mean([o.answered_by for o in outs if o.domain == d] == np.array("strong")) for d in ("mc", "code")}
    assert by["mc"] > 0.9 and by["code"] < 0.1, by
    assert np.mean([o.cost_usd for o in outs]) <= 0.6 * fit.expected_cost["strong"]


def test_one_worker_that_wins_under_a_cap_ships_alone_and_serves_alone_while_the_cap_allows(tmp_path, monkeypatch):
    """When always the strongest worker (or the best one within the cap) has the best out-of-fold
    accuracy within the cap, that worker alone ships, not the cascade the search found, and the
    checkpoint serves it while its follower's effective cap allows its cost."""
    from fugu_pipeline.policies.cascade import fit as fit_module
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.train.selection import STRONGEST

    def strongest_wins(cands, cf, text, baseline, worker, n_boot, seed):
        return next(c for c in cands if c.name == STRONGEST), "forced: the strongest has the best accuracy"

    monkeypatch.setattr(fit_module, "pick_capped", strongest_wins)
    data, grid, inputs = cascade_fixture.close(seed=0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=200, cap=CostCap(share=1.5)), log=quiet)
    assert fit.selected_kind == "strongest" and fit.policy.describe() == "[strong]"
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    got = CascadeRouter(ckpt, None).route_batch(["q"], ["math"])[0]
    assert got.extra["cascade"]["describe"] == "[strong]" and got.extra["budget"]["validation_cost_usd"] == pytest.approx(
        fit.expected_cost["strong"])
    assert {o.plan for o in cascade_outcomes(ckpt, data, grid, inputs)} == {"[strong]"}
    from fugu_pipeline.policies.cascade.evaluate import cascade_report

    assert cascade_report(ckpt, data, grid, inputs)["policy"].startswith("[strong], kept while its running spend allows it")


def test_evaluate_names_a_trained_caps_policy_as_train_ships_it(capped):
    """`evaluate`'s policy line for a checkpoint trained under a cap is the plan `train`'s shipped
    line names, with how it keeps the cap."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_report
    from fugu_pipeline.policies.cascade.ship import shipped_policy

    data, grid, inputs, fit, ckpt, cap = capped
    rep = cascade_report(ckpt, data, grid, inputs)
    assert rep["policy"] == shipped_policy(fit, ckpt.path).plan
    assert rep["policy"].startswith(fit.policy.describe() + ", then following the spend under the cap it was trained "
                                    f"under (${cap * 1000:.4g} per 1,000 requests)")
