"""The composite score: each term by hand, the overfit gate, left-out terms, benchmarks, the paired
bootstrap, and the live term through the `LiveEvaluator` interface (the mock pool, and a
multi-turn-shaped evaluator standing in for the session loop)."""

import numpy as np
import pytest

from fugu_pipeline.evaluate.composite import (
    CompositeConfig,
    HeldOut,
    LiveRows,
    audit_mask,
    benchmark_names,
    paired_difference,
    score_head,
)
from fugu_pipeline.policies.oneshot.contest import live_rows
from fugu_pipeline.evaluate.live import LiveOutcome, LivePolicy, OneCallEvaluator, tasks_by_id
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline_tests.conftest import REPO


def held(measure, benchmarks=None, audit=None):
    n = len(measure)
    return HeldOut(task_ids=[f"t{i}" for i in range(n)],
                   benchmarks=np.array(benchmarks or ["b"] * n, dtype=object),
                   audit=np.zeros(n, bool) if audit is None else np.asarray(audit, bool),
                   measure=np.asarray(measure, float), measure_name="quality", worker_ids=["w0", "w1"])


def test_the_seeds_defaults():
    c = CompositeConfig()
    assert c.weights() == {"cached": 0.70, "live": 0.15, "efficiency": 0.10, "novelty": 0.05}
    assert (c.overfit_reject_gap, c.overfit_penalty_gap, c.overfit_penalty) == (0.15, 0.08, 0.85)
    assert c.live_sample == 20
    with pytest.raises(ValueError, match="must not exceed"):
        CompositeConfig(overfit_penalty_gap=0.2)


def test_every_term_by_hand():
    # 10 eval rows; the head routes rows 0-5 to w0 (right) and rows 6-9 to w1 (wrong): cached 0.6;
    # the king sends rows 0-7 to w0: the head differs on rows 6, 7 (novelty 0.2).
    m = np.zeros((10, 2))
    m[:, 0] = 1.0
    routes = np.array([0] * 6 + [1] * 4)
    king = np.array([0] * 8 + [1] * 2)
    # live: 5 tasks, 3 right, 8 calls in all (a multi-turn policy)
    live = {"b": LiveRows(quality=np.array([1, 1, 1, 0, 0.0]), calls=np.array([1, 2, 1, 3, 1.0]), cost_usd=0.01, errors=0)}
    s = score_head(routes, held(m), CompositeConfig(), king_routes=king, live=live)
    r = s["benchmarks"][0]
    assert r["cached"] == pytest.approx(0.6) and r["live"] == pytest.approx(0.6)
    assert r["efficiency"] == pytest.approx(3 / 8) and r["efficiency_source"] == "live"
    assert r["novelty"] == pytest.approx(0.2) and r["left_out"] == []
    assert s["composite"] == pytest.approx(0.70 * 0.6 + 0.15 * 0.6 + 0.10 * 3 / 8 + 0.05 * 0.2)
    # the king itself: novelty 0 by definition
    k = score_head(king, held(m), CompositeConfig(), live=live, is_king=True)
    assert k["benchmarks"][0]["novelty"] == 0.0


def test_the_terms_are_summed_in_one_order_in_every_process():
    """Summed over a set, the terms' order followed the process's string hash seed, and so did the
    last bit of a composite: the same report differed from one run to the next (and a re-run drew
    its plots again). Here two orders of the sum differ; the score is the one in the terms' order."""
    import itertools

    from fugu_pipeline.evaluate.composite import TERMS

    m = np.zeros((10, 2))
    m[:, 0] = 1.0
    routes, king = np.array([0] + [1] * 9), np.array([0] + [1] * 9)
    live = {"b": LiveRows(quality=np.array([1, 1, 0, 0, 0.0]), calls=np.array([1, 2, 1, 3, 1.0]), cost_usd=0.01, errors=0)}
    r = score_head(routes, held(m), CompositeConfig(), king_routes=king, live=live)["benchmarks"][0]
    sums = {order: sum(r["weights"][k] * r[k] for k in order) for order in itertools.permutations(TERMS)}
    assert len(set(sums.values())) > 1  # the order matters for these figures
    assert r["score_before_overfit"] == sums[TERMS]


def test_terms_that_cannot_be_measured_are_left_out_and_the_rest_rescaled():
    m = np.ones((8, 2))
    s = score_head(np.zeros(8, int), held(m), CompositeConfig())  # no king, no live run
    r = s["benchmarks"][0]
    assert r["left_out"] == ["live", "novelty"] and r["efficiency_source"].startswith("cached")
    assert r["weights"]["cached"] == pytest.approx(0.70 / 0.80) and r["weights"]["efficiency"] == pytest.approx(0.10 / 0.80)
    assert s["composite"] == pytest.approx(1.0)


def test_benchmarks_are_domains_or_an_explicit_grouping_and_the_composite_is_their_mean():
    assert list(benchmark_names(["a", "b", "c"], CompositeConfig())) == ["a", "b", "c"]
    grouped = CompositeConfig(benchmarks={"stem": ["a", "b"]})
    assert list(benchmark_names(["a", "b", "c"], grouped)) == ["stem", "stem", "c"]
    m = np.zeros((6, 2))
    m[:3, 0] = 1.0  # benchmark x solved, benchmark y not
    s = score_head(np.zeros(6, int), held(m, ["x"] * 3 + ["y"] * 3), CompositeConfig())
    assert [r["score"] for r in s["benchmarks"]] == [pytest.approx(1.0), 0.0] and s["composite"] == pytest.approx(0.5)


def test_a_few_rows_of_odd_domains_are_pooled_into_one_benchmark():
    """Three test rows from two domains never seen in training weighed as two whole benchmarks of
    four: one wrong row moved the composite by a quarter. Pooled, they are one benchmark."""
    domains = ["math"] * 20 + ["code"] * 20 + ["typo-math"] + ["new"] * 2
    names = list(benchmark_names(domains, CompositeConfig()))
    assert names[:40] == domains[:40] and set(names[40:]) == {"(small domains)"}
    assert list(benchmark_names(domains, CompositeConfig(min_benchmark_rows=1))) == domains
    m = np.ones((len(domains), 2))
    m[40:, 0] = 0.0  # the head's worker w0 is wrong on the three odd rows
    s = score_head(np.zeros(len(domains), int), held(m, names), CompositeConfig())
    assert len(s["benchmarks"]) == 3 and s["composite"] == pytest.approx(2 / 3)


def test_audit_slice_is_salted_stable_and_order_free():
    ids = [f"task-{i}" for i in range(2000)]
    a = audit_mask(ids, CompositeConfig())
    assert 0.27 < a.mean() < 0.33
    assert list(audit_mask(ids[::-1], CompositeConfig())[::-1]) == list(a)
    assert (audit_mask(ids, CompositeConfig(audit_seed=1)) != a).mean() > 0.3


def overfit_case(eval_acc, audit_acc, n_eval=150, n_audit=150):  # TinyRouter's 150 questions
    m = np.zeros((n_eval + n_audit, 2))
    m[: round(eval_acc * n_eval), 0] = 1.0
    m[n_eval : n_eval + round(audit_acc * n_audit), 0] = 1.0
    return held(m, audit=[False] * n_eval + [True] * n_audit)


@pytest.mark.parametrize("eval_acc, audit_acc, verdict, factor", [
    (0.90, 0.70, "reject", 0.0),     # gap 0.20 > 0.15
    (0.80, 0.70, "penalty", 0.85),   # gap 0.10 > 0.08
    (0.80, 0.75, "ok", 1.0),         # gap 0.05
    (0.70, 0.80, "ok", 1.0),         # audit better: no overfit
])
def test_overfit_gate(eval_acc, audit_acc, verdict, factor):
    s = score_head(np.zeros(300, int), overfit_case(eval_acc, audit_acc), CompositeConfig())
    of = s["benchmarks"][0]["overfit"]
    assert of["verdict"] == verdict and of["factor"] == factor
    assert of["gap"] == pytest.approx(eval_acc - audit_acc, abs=0.005)
    assert s["rejected"] is (verdict == "reject")
    assert s["benchmarks"][0]["score"] == pytest.approx(s["benchmarks"][0]["score_before_overfit"] * factor)


def test_the_literal_rule_is_the_default_and_the_guarded_rule_an_option():
    small = overfit_case(0.74, 0.33, n_eval=19, n_audit=6)  # the sample batch's math domain: 2 of 6 right
    guarded = score_head(np.zeros(25, int), small, CompositeConfig(overfit_rule="guarded"))["benchmarks"][0]["overfit"]
    assert guarded["verdict"].startswith("not judged (6 audit rows here") and guarded["factor"] == 1.0
    # TinyRouter's rule as published, by default: no pooling, no significance
    assert CompositeConfig().overfit_rule == "literal"
    assert score_head(np.zeros(25, int), small, CompositeConfig())["benchmarks"][0]["overfit"]["verdict"] == "reject"
    # the guarded rule's knobs do not bend the literal rule
    assert score_head(np.zeros(25, int), small, CompositeConfig(min_audit_rows=30, overfit_significant=True)
                      )["benchmarks"][0]["overfit"]["verdict"] == "reject"
    # significance alone: a gap of 0.29 on 14 / 6 rows is within chance (the literal rule rejects it)
    tiny = overfit_case(0.79, 0.5, n_eval=14, n_audit=6)
    sig_only = CompositeConfig(overfit_rule="guarded", min_audit_rows=1)
    assert score_head(np.zeros(20, int), tiny, sig_only)["benchmarks"][0]["overfit"]["verdict"] == "within noise"
    assert score_head(np.zeros(20, int), tiny, CompositeConfig())["benchmarks"][0]["overfit"]["verdict"] == "reject"


@pytest.mark.parametrize("eval_right, audit_right, n", [(29, 25, 50), (45, 41, 50), (33, 25, 100), (90, 82, 100)])
def test_a_gap_of_exactly_0_08_is_the_same_whatever_the_two_accuracies(eval_right, audit_right, n):
    """0.58 − 0.50 is 0.07999999999999996 in binary floats and 0.90 − 0.82 is 0.08000000000000007:
    under the literal rule the second was penalised and the first not. Compared as decimals, a gap
    of exactly 0.08 is never above 0.08 (and one of exactly 0.15 never above 0.15)."""
    h = overfit_case(eval_right / n, audit_right / n, n_eval=n, n_audit=n)
    of = score_head(np.zeros(2 * n, int), h, CompositeConfig(overfit_rule="literal"))["benchmarks"][0]["overfit"]
    assert of["gap"] == 0.08 and of["verdict"] == "ok" and of["factor"] == 1.0
    gap15 = overfit_case(0.95, 0.80, n_eval=100, n_audit=100)  # 0.95 − 0.80 = 0.1499999999999999
    assert score_head(np.zeros(200, int), gap15, CompositeConfig())["benchmarks"][0]["overfit"]["verdict"] == "penalty"
    gap15b = overfit_case(0.65, 0.50, n_eval=100, n_audit=100)  # 0.65 − 0.50 = 0.15000000000000002
    assert score_head(np.zeros(200, int), gap15b, CompositeConfig())["benchmarks"][0]["overfit"]["verdict"] == "penalty"


def test_small_benchmarks_are_judged_on_the_pooled_gap():
    m = np.zeros((300, 2))
    m[:, 0] = 1.0
    audit = np.zeros(300, bool)
    audit[::3] = True  # 100 audit rows pooled, 20 in each of 5 benchmarks
    m[audit, 0] = 0.0  # the head is right on every eval row and wrong on every audit row
    h = held(m, [f"b{i % 5}" for i in range(300)], audit)
    s = score_head(np.zeros(300, int), h, CompositeConfig(overfit_rule="guarded"))
    assert all(r["overfit"]["verdict"] == "pooled reject" for r in s["benchmarks"]) and s["rejected"]


def test_paired_difference_of_identical_heads_is_zero_and_of_a_better_head_positive():
    rng = np.random.default_rng(0)
    m = (rng.random((300, 2)) < [0.5, 0.8]).astype(float)
    h, cfg = held(m), CompositeConfig()
    a, b = np.zeros(300, int), np.ones(300, int)
    ka = score_head(a, h, cfg, is_king=True)
    same = paired_difference(a, a, h, cfg, score_head(a, h, cfg, king_routes=a), ka)
    assert same["mean"] == 0.0 and same["low"] == 0.0 == same["high"]
    better = score_head(b, h, cfg, king_routes=a)
    d = paired_difference(b, a, h, cfg, better, ka)
    assert d["mean"] == pytest.approx(better["composite"] - ka["composite"]) and 0 < d["low"] < d["mean"] < d["high"]


class MultiTurnStandIn:
    """What the session loop's evaluator will look like to the composite: it reads the checkpoint
    path of the policy and reports turns and calls per task (here: every answer takes 3 calls)."""

    name = "multi-turn stand-in"

    def __init__(self):
        self.seen: list[LivePolicy] = []

    def evaluate(self, policy, tasks):
        self.seen.append(policy)
        return [LiveOutcome(t.task_id, 1.0, calls=3, turns=3, workers=[policy.routes[t.task_id]] * 3) for t in tasks]


def sample_tasks():
    return tasks_by_id(REPO / "data" / "benchgen" / "sample.jsonl")


def test_a_multi_turn_evaluator_plugs_into_the_live_term():
    tasks = sample_tasks()
    ids = [t for t, task in tasks.items() if task.split == "test"][:30]
    h = HeldOut(task_ids=ids, benchmarks=np.array([tasks[t].domain for t in ids], dtype=object), audit=np.zeros(30, bool),
                measure=np.ones((30, 3)), measure_name="quality", worker_ids=["math-expert", "code-expert", "general-expert"])
    ev = MultiTurnStandIn()
    cfg = CompositeConfig(live_sample=4)
    live, note = live_rows(ev, tasks, "challenger", "models/roles/abc", np.zeros(30, int), h, cfg)
    assert note.startswith("live: multi-turn stand-in") and all(len(r.quality) == 4 for r in live.values())
    assert ev.seen[0].checkpoint == "models/roles/abc" and set(ev.seen[0].routes.values()) == {"math-expert"}
    s = score_head(np.zeros(30, int), h, cfg, live=live)
    assert all(r["live"] == 1.0 and r["efficiency"] == pytest.approx(1 / 3) for r in s["benchmarks"])


def test_one_call_evaluator_calls_the_mock_pool_grades_and_memoises():
    tasks = sample_tasks()
    config = load_workers_config(REPO / "configs" / "workers.mock.yaml")
    ids = [t for t, task in tasks.items() if task.split == "test" and task.grader.type != "llm_judge"][:12]
    ev = OneCallEvaluator(config)
    expert = {"math": "math-expert", "code": "code-expert", "general": "general-expert"}
    policy = LivePolicy("challenger", "x", {t: expert[tasks[t].domain] for t in ids})
    out = ev.evaluate(policy, [tasks[t] for t in ids])
    assert ev.calls == 12 and all(o.calls == 1 and o.error is None and o.cost_usd > 0 for o in out)
    assert sum(o.quality for o in out) >= 8  # experts on their own domain solve about 9 in 10
    # the king routing the same (task, worker) shares the answer: no new call
    ev.evaluate(LivePolicy("king", "y", policy.routes), [tasks[t] for t in ids])
    assert ev.calls == 12
    # a budget that cannot cover the next call stops before it is made
    poor = OneCallEvaluator(config, max_usd=0.003)
    with pytest.raises(RuntimeError, match="live evaluation: spent"):
        poor.evaluate(policy, [tasks[t] for t in ids])
    assert poor.spent <= 0.003


def test_live_term_says_why_it_was_not_measured():
    h = held(np.ones((4, 2)))
    assert live_rows(None, None, "c", "p", np.zeros(4, int), h, CompositeConfig())[1].startswith("live term not measured: no live evaluator")
    assert live_rows(MultiTurnStandIn(), None, "c", "p", np.zeros(4, int), h, CompositeConfig())[1].startswith(
        "live term not measured: no task file")
    assert live_rows(MultiTurnStandIn(), {}, "c", "p", np.zeros(4, int), h, CompositeConfig(live_sample=0))[1] == "live term off (live_sample: 0)"


def test_a_live_run_that_fails_for_one_head_is_dropped_for_both(tmp_path):
    """The king's live calls hit the budget after the challenger's went through: neither head gets
    a live term (a live term for one head only would weigh the two differently)."""
    from fugu_pipeline.policies.oneshot.contest import score_against_king
    from fugu_pipeline.evaluate.live import LiveBudgetExceeded
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline_tests.harness_data import controlled_data, routing_head

    data = controlled_data(contested_eval=30)
    king = load_checkpoint(routing_head(tmp_path, data, (0, 1, 0), method="sft"))
    challenger = load_checkpoint(routing_head(tmp_path, data, (0, 1, 2), method="es"))

    class Flaky(MultiTurnStandIn):
        def evaluate(self, policy, tasks):
            if policy.label == "king":
                raise LiveBudgetExceeded("live evaluation: spent $5.0000 of max $5.0000")
            return super().evaluate(policy, tasks)

    from types import SimpleNamespace

    tasks = {t: SimpleNamespace(task_id=t) for t in data.split("test").task_ids}
    out = score_against_king(challenger, king, data, CompositeConfig(), live=Flaky(), tasks=tasks)
    assert out["live"] == "live term not measured: live evaluation: spent $5.0000 of max $5.0000"
    assert out["challenger"]["benchmarks"][0]["live"] is None and out["king"]["benchmarks"][0]["live"] is None


def test_the_live_term_is_kept_per_head_task_and_seed(tmp_path):
    """A re-judgement (a second evaluator over the same store: another run, validate again) calls
    nothing; every call made is in the cost ledger."""
    from fugu_pipeline.evaluate.live import live_evaluator
    from fugu_pipeline.ledger import verify_ledger

    tasks = sample_tasks()
    config = load_workers_config(REPO / "configs" / "workers.mock.yaml")
    ids = [t for t, task in tasks.items() if task.split == "test" and task.grader.type != "llm_judge"][:10]
    policy = LivePolicy("challenger", "x", {t: "math-expert" for t in ids}, head="a" * 16, seed=0)
    first = live_evaluator(config, tmp_path)
    out = first.evaluate(policy, [tasks[t] for t in ids])
    assert first.calls == 10 and verify_ledger(tmp_path / "data" / "ledger" / "costs.jsonl").totals["live"].calls == 10
    again = live_evaluator(config, tmp_path)
    assert again.evaluate(policy, [tasks[t] for t in ids]) == out and again.calls == 0
    other_seed = live_evaluator(config, tmp_path)
    other_seed.evaluate(LivePolicy("c", "x", policy.routes, head="a" * 16, seed=1), [tasks[t] for t in ids[:2]])
    assert other_seed.calls == 2  # another seed is another draw
