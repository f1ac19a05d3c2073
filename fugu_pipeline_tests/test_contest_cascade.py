"""A cascade in the router slot of the one contest: the king and a challenger may each be a one-step
head or a cascade, both scored on the same held-out rows (a cascade from the recorded replies:
the answer it returns, what its steps paid, its calls as turns), through the same gates, composite,
king + margin with a significant paired difference, compare-and-swap pointer and history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.contest import AnswerSource
from fugu_pipeline.evaluate.promotion import load_policy
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.policies.oneshot.configs import SFTConfig
from fugu_pipeline.train.pointer import read_pointer, write_pointer
from fugu_pipeline.policies.oneshot.sft import train_sft
from fugu_pipeline.policies.cascade.verifier import VerifierInputs
from fugu_pipeline_tests.conftest import REPO

W = ["math-w", "code-w", "gen-w"]
DOMAINS = ["math", "code", "general"]
COST = np.array([0.002, 0.004, 0.001])
UTILITY = UtilityConfig(cost_weight=1.0, cost_scale_usd=0.1, latency_weight=0.0)
# the shipped project's policy (guarded overfit rule: about 15 audit rows a domain here), with the
# rate limit off: these tests make several attempts in a row
OPEN = load_policy(REPO / "configs" / "promotion.yaml", required=True, rate_limit_s=0)
N_STATS = 10


@pytest.fixture(scope="module")
def world():
    """900 tasks, each worker an expert of one domain (0.9 right there, 0.35 elsewhere); right
    answers agree, wrong ones differ; the reply statistics carry a noisy sign of being right."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32"))
    n = 900
    domains = [DOMAINS[i % 3] for i in range(n)]
    prompts = [{"math": f"Compute {i} plus {i * 3} and reply with the sum.",
                "code": f"Write a Python function number {i} that reverses a list.",
                "general": f"What is the capital city of country number {i}?"}[d] for i, d in enumerate(domains)]
    feats = enc.encode(prompts)
    contract = enc.feature_contract()
    enc.close()
    rng = np.random.default_rng(0)
    p = np.array([[0.9 if DOMAINS[j] == d else 0.35 for j in range(3)] for d in domains])
    quality = (rng.random((n, 3)) < p).astype(float)
    cost = np.tile(COST, (n, 1))
    utility = np.vectorize(UTILITY.utility)(quality, cost, np.zeros_like(cost))
    splits = np.array(["test" if i % 4 == 0 else "val" if i % 4 == 1 else "train" for i in range(n)])
    data = RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=prompts, domains=domains, splits=splits, worker_ids=W,
                       features=feats, utility=utility, contract=contract, quality=quality, cost_usd=cost,
                       utility_config=UTILITY)
    final = np.array([[("right" if quality[i, j] else f"{w}-{rng.integers(0, 50)}") for j, w in enumerate(W)]
                      for i in range(n)], dtype=object)
    text = np.vectorize(lambda f: f"The answer is {f}", otypes=[object])(final)
    grid = AnswerGrid(list(data.task_ids), W, text, ["text"] * n, final, "v1")
    answer = rng.normal(size=(n, 3, N_STATS)).astype(np.float32)
    answer[:, :, 0] += 1.5 * (2 * quality - 1)
    inputs = VerifierInputs(prompt=feats, answer=answer, has=np.ones((n, 3), bool), target=quality)
    return data, grid, inputs


def answers(world) -> AnswerSource:
    _, grid, inputs = world
    return AnswerSource(lambda data, encode, names: (grid, inputs))


def save_cascade_plan(models, world, policy: dict):
    """A cascade checkpoint with this plan and a verifier fitted on the non-test rows."""
    from fugu_pipeline.policies.cascade.fit import CascadeFit
    from fugu_pipeline.policies.cascade.policy import CascadePolicy
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.search import Choice
    from fugu_pipeline.policies.cascade.verifier import fit_all

    data, _, inputs = world
    verifier = fit_all(inputs, np.flatnonzero(data.splits != "test"), 0.01)
    policy = CascadePolicy.model_validate(policy)
    frontier, figures = budget_points(world)
    choice = Choice(policy.default, 0.0, 0.0, 0.0, len(figures), frontier=frontier, figures=figures)
    fit = CascadeFit(policy=policy, verifier=verifier, objective="utility", candidates=[],
                     selected="cascade", selected_kind="cascade", reason="a fixed plan for the contest tests",
                     verifier_figures={}, choices={"*": choice}, expected_cost=dict(zip(W, COST.tolist())), answers_version="v1",
                     worker_quality={w: 0.53 for w in W}, answer_kinds={"*": "text"})
    return save_cascade(models, data, fit, inputs.answer.shape[2])


def budget_points(world) -> tuple[list[dict], list[float]]:
    """A small search's record on the validation rows: the budget frontier (cheapest to best,
    `policies/cascade/search._frontier`) of a few plans, and each plan's validation utility (what a
    cascade's receipt cites)."""
    from itertools import permutations

    from fugu_pipeline.policies.cascade.policy import CascadePlan, answer_codes, simulate
    from fugu_pipeline.policies.cascade.search import _frontier

    data, grid, _ = world
    val = np.flatnonzero(data.splits == "val")
    codes, none = answer_codes(grid.final), np.full(data.quality.shape, np.nan)
    plans = [CascadePlan.model_validate({"steps": [step(w)]}) for w in W] + [
        CascadePlan.model_validate({"steps": [step(a, b, agree=2), step(c)]}) for a, b, c in permutations(W) if a < b] + [
        CascadePlan.model_validate({"steps": [step(a, b)]}) for a, b, _ in permutations(W) if a < b] + [
        CascadePlan.model_validate({"steps": [step(*W)]})]
    points, figures = [], []
    for plan in plans:
        res = simulate(plan, W, codes, none, data.quality, data.cost_usd, np.zeros_like(data.cost_usd), val)
        points.append((float(res.cost.mean()), float(res.quality.mean()), plan))
        figures.append(float(np.mean([UTILITY.utility(q, c, 0.0) for q, c in zip(res.quality, res.cost)])))
    from fugu_pipeline.policies.cascade.plans import Points, from_model

    cost, quality = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    pts = Points([from_model(p[2], W) for p in points], cost, quality, np.zeros(len(points)), np.zeros(len(points)), len(val))
    return _frontier(pts, W), figures


def step(*workers, **rule):
    return {"workers": list(workers), **rule}


# each domain's expert first, its reply accepted when the verifier believes it; else the other two
GOOD = {"default": {"steps": [step("gen-w", verify=0.5), step("math-w", "code-w")]},
        "per_domain": {"math": {"steps": [step("math-w", verify=0.5), step("code-w", "gen-w")]},
                       "code": {"steps": [step("code-w", verify=0.5), step("math-w", "gen-w")]}}}
# right on math and code (code through two non-experts that must agree), wrong expert on general
MEDIOCRE = {"default": {"steps": [step("math-w")]},
            "per_domain": {"code": {"steps": [step("gen-w", "math-w", agree=2), step("code-w")]}}}


def weak_king(models, world):
    """A one-step head trained to send every task to gen-w, written as the promoted router."""
    data = world[0]
    tilted = RoutingData(**{**{f: getattr(data, f) for f in ("task_ids", "prompts", "domains", "splits", "worker_ids",
                                                              "features", "contract", "quality")},
                            "utility": np.tile([0.0, 0.0, 1.0], (len(data.task_ids), 1))})
    path = train_sft(tilted, SFTConfig(epochs=40)).save(models)
    write_pointer(models, {"checkpoint": str(path.relative_to(models)), "content_hash": path.name})
    return path


def good_head(models, world):
    return train_sft(world[0], SFTConfig(epochs=60)).save(models)


def history(models) -> list[dict]:
    return [json.loads(line) for line in (models / "promoted" / "history.jsonl").read_text().splitlines()]


def test_a_cascade_that_beats_the_promoted_one_step_head_replaces_it_and_route_runs_it(world, tmp_path):
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.registry import load_promoted
    from fugu_pipeline.route.router import CASCADE_PLAN

    models = tmp_path / "models"
    king = weak_king(models, world)
    cascade = save_cascade_plan(models, world, GOOD)
    out = promote_best([str(cascade)], world[0], models, OPEN, answers=answers(world))
    assert out["promoted"], "\n".join(out["reasons"])
    assert read_pointer(models)["checkpoint"] == str(cascade.relative_to(models))
    text = "\n".join(out["reasons"])
    assert f"PASS promoted (sft {king.name})" in text and "PASS best fixed" in text
    # scored from its answers: its calls count as turns, its cost is what its steps paid
    cost = out["contest"]["cost"]
    assert cost["king"]["calls_per_task"] == 1.0 and cost["challenger"]["calls_per_task"] > 1.0
    assert cost["challenger"]["usd_per_1k"] > cost["king"]["usd_per_1k"]
    rows = out["contest"]["challenger"]["benchmarks"]
    assert all(r["efficiency"] < r["cached"] and r["efficiency_source"] == "cached (its calls per task)" for r in rows)
    assert "held-out eval rows: challenger quality" in text
    last = history(models)[-1]
    assert last["promote"] and last["kind"] == "router" and last["content_hash"] == cascade.name
    # the evaluation reports (their composite against the current king) still run with a cascade king
    from fugu_pipeline.policies.oneshot.contest import add_composite
    from fugu_pipeline.train.checkpoints import load_checkpoint

    rep = add_composite({"summary": "s"}, load_checkpoint(king), world[0], models, OPEN.composite)
    assert rep["composite"]["king"] is None and rep["composite"]["king_note"].startswith("the king is a cascade")
    router = load_promoted(models, device="cpu", dtype="float32")
    assert isinstance(router.router, CascadeRouter)
    d = router.route("Compute 7 plus 21 and reply with the sum.", domain="math")
    assert d.score_kind == CASCADE_PLAN and d.checkpoint == str(cascade) and d.worker_id == "math-w"
    assert d.extra["cascade"]["plan"]["steps"][0]["workers"] == ["math-w"]


def test_a_worse_cascade_loses_to_the_promoted_head_and_the_pointer_stays(world, tmp_path):
    models = tmp_path / "models"
    good = good_head(models, world)
    assert promote_best([str(good)], world[0], models, OPEN)["promoted"]
    before = read_pointer(models)
    worse = save_cascade_plan(models, world, MEDIOCRE)
    out = promote_best([str(worse)], world[0], models, OPEN, answers=answers(world))
    assert not out["promoted"]
    assert read_pointer(models) == before
    assert any(r.startswith(f"FAIL promoted (sft {good.name})") for r in out["reasons"]), out["reasons"]
    last = history(models)[-1]
    assert not last["promote"] and last["content_hash"] == worse.name and last["kind"] == "router"
    assert any(r.startswith("FAIL promoted") for r in last["reasons"])
    assert last["contest"]["cost"]["challenger"]["calls_per_task"] > 1.0


def test_a_one_step_head_that_beats_a_promoted_cascade_replaces_it(world, tmp_path):
    models = tmp_path / "models"
    weak_king(models, world)
    cascade = save_cascade_plan(models, world, MEDIOCRE)
    first = promote_best([str(cascade)], world[0], models, OPEN, answers=answers(world))
    assert first["promoted"], first["reasons"]  # the cascade is the king now (it beat the weak head)
    good = good_head(models, world)
    out = promote_best([str(good)], world[0], models, OPEN, answers=answers(world))
    assert out["promoted"], out["reasons"]
    assert read_pointer(models)["checkpoint"] == str(good.relative_to(models))
    assert any(r.startswith(f"PASS promoted (cascade {cascade.name})") for r in out["reasons"])
    assert out["contest"]["cost"]["king"]["calls_per_task"] > 1.0  # the cascade king was scored as a cascade
    assert [(h["promote"], h["content_hash"]) for h in history(models)] == [(True, cascade.name), (True, good.name)]


def test_a_cascade_without_the_hosts_replies_is_refused_with_the_reason(world, tmp_path):
    models = tmp_path / "models"
    cascade = save_cascade_plan(models, world, GOOD)
    out = promote_best([str(cascade)], world[0], models, OPEN)
    assert not out["promoted"] and read_pointer(models) is None
    assert any("scored from the host's recorded replies" in r for r in out["reasons"])


def test_a_trained_cascade_carries_the_receipt_the_contest_checks(tmp_path):
    """A cascade `fugu-lite train` saves records its search (every plan's validation figure) and the
    cost of the calls behind its rows, so the receipt gate lets it enter the contest."""
    from fugu_pipeline.evaluate.gates import GateConfig, receipt_gate
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.train.exchange import receipt_from_manifest
    from fugu_pipeline_tests import cascade_fixture

    data, grid, inputs = cascade_fixture.make(n=300)
    search = CascadeSearch(thresholds=4, three_steps=False, finals=2, cheap=2)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=search, n_boot=300), log=lambda m: None)
    manifest = load_checkpoint(save_cascade(tmp_path, data, fit, inputs.answer.shape[2])).manifest
    assert manifest.curves["val_utility"] == fit.choices["*"].figures and len(fit.choices["*"].figures) == fit.choices["*"].considered
    assert manifest.metrics["data_cost_usd"] == pytest.approx(float(data.cost_usd[data.splits != "test"].sum()))
    gate = receipt_gate(receipt_from_manifest(manifest), GateConfig(), data=data)
    assert gate.ok, gate.reason
