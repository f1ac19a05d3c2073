"""Training and evaluation on data of unusual shape, as a user runs them (found by trying them):
two workers where APGR alone would pick a head whose served route never leaves the best fixed one;
evaluate on data whose workers come in another order, or are other workers; budget flags out of
range; a reward JSONL where some rows lack the costs others give."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.matrix.import_format import read_reward_jsonl
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
from fugu_pipeline.policies.oneshot.fit import select_heads
from fugu_pipeline_tests.test_budget_cli import WORKERS, run, trained  # noqa: F401  (the fixture)


def two_workers(n: int = 240, seed: int = 0) -> RoutingData:
    """A wins on code, B elsewhere; within a domain feature 0 shifts the edge a little. A kNN with a
    large k orders the rows well (high APGR) but its predicted gap never changes sign."""
    rng = np.random.default_rng(seed)
    dom = np.array([("code", "math", "chat")[i % 3] for i in range(n)])
    f = rng.normal(size=(n, 8))
    f[:, 0] *= 4
    edge = 0.15 * np.tanh(f[:, 0])
    q = np.clip(np.stack([np.where(dom == "code", 0.75, 0.15) + edge, np.where(dom == "code", 0.2, 0.7) - edge], 1), 0, 1)
    ids = [f"t{i:04d}" for i in range(n)]
    r = rng.random(n)
    return RoutingData(task_ids=ids, prompts=ids, domains=list(dom), worker_ids=["A", "B"], features=f.astype(np.float32),
                       splits=np.where(r < 0.6, "train", np.where(r < 0.7, "val", "test")), utility=q, quality=q,
                       contract=FeatureContract(encoder_id="synthetic", dim=8),
                       utility_config=UtilityConfig(cost_weight=0, latency_weight=0))


@pytest.mark.parametrize("rule", ["auto", "pooled"])
def test_two_workers_serve_a_greedy_route_that_is_not_clearly_worse(rule):
    heads = {"domain_prior": {"m": [5]}, "ridge": None, "ensemble": None,
             "knn": {"k": [120], "prior_weight": [30], "same_domain_bonus": [0]}}
    report = select_heads(two_workers(), TrainSetConfig.model_validate({"selection_rule": rule, "heads": heads}),
                          log=lambda m: None)[0]
    knn = next(c for c in report.candidates if c.kind == "knn")
    prior = next(c for c in report.candidates if c.kind == "domain_prior")
    assert knn.figures["apgr"] > prior.figures["apgr"] and knn.figures["pooled"] < prior.figures["pooled"] - 0.1
    assert report.selected == prior.name and report.best_per_kind["domain_prior"] == prior.name
    if rule == "auto":  # APGR ranks, but the served (greedy) route of its pick trails clearly
        assert report.rule == "apgr" and "greedy route (what is served)" in report.reason
    else:  # an explicit rule is honoured with two workers too
        assert report.rule == "pooled" and "fixed by the config" in report.rule_reason


@pytest.mark.slow
def test_evaluate_aligns_reordered_workers_and_refuses_other_ones(trained, tmp_path, capsys):  # noqa: F811
    work, ckpt, common = trained
    rows = [json.loads(x) for x in (work / "r.jsonl").read_text().splitlines()]
    at = [2, 0, 1]
    for r in rows:
        for k in ("worker_ids", "quality", "cost_usd"):
            r[k] = [r[k][i] for i in at]
    (tmp_path / "reordered.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--workers", str(work / "w.yaml"), "--device", "cpu", "--cache-dir", str(work / "emb"),
            "--work-dir", str(tmp_path / "imports"), "--output", str(tmp_path / "rep.json")]
    code, out = run("evaluate", "--checkpoint", ckpt, "--data", str(tmp_path / "reordered.jsonl"), *args)
    assert code == 0, capsys.readouterr().err
    code, same = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(tmp_path / "rep0.json"))
    assert code == 0
    first = lambda text: next(x for x in text.splitlines() if x.startswith("router "))  # noqa: E731
    assert first(out) == first(same)  # the same figures as on the data in the checkpoint's order
    for r in rows:
        r["worker_ids"] = ["x", *r["worker_ids"][1:]]
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _ = run("evaluate", "--checkpoint", ckpt, "--data", str(tmp_path / "other.jsonl"), *args)
    err = capsys.readouterr().err
    assert code == 2 and "missing ['c'], extra ['x']" in err and "Traceback" not in err


@pytest.mark.parametrize("flag,value,needle", [("--budget-share", "inf", "--budget-share: Input should be a finite number"),
                                               ("--budget-share", "0", "--budget-share: Input should be greater than 0"),
                                               ("--budget-margin-z", "-5", "--budget-margin-z: Input should be greater")])
def test_budget_flags_out_of_range_name_the_flag(trained, capsys, flag, value, needle):  # noqa: F811
    work, ckpt, common = trained
    extra = ["--budget-share", "0.5"] if flag == "--budget-margin-z" else []
    code, _ = run("route", "--checkpoint", ckpt, "--prompt", "compute the sum", "--device", "cpu", flag, value, *extra)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "pydantic" not in err, err


def test_rows_must_all_give_their_costs_or_none(tmp_path):
    base = {"prompt": "p", "worker_ids": WORKERS[:2], "quality": [1, 0]}
    lines = [{**base, "task_id": "t1", "cost_usd": [0.01, 0.001]}, {**base, "task_id": "t2"},
             {**base, "task_id": "t3", "cost_usd": [0.01, 0.001], "latency_s": [1, 2]}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(TaskFileError) as err:
        read_reward_jsonl(tmp_path / "r.jsonl")
    text = str(err.value)
    assert "r.jsonl:2: lacks 'cost_usd', which the first row gives" in text
    assert "r.jsonl:3: gives 'latency_s', which the first row lacks" in text


def test_route_says_when_the_domain_is_not_one_the_head_was_trained_on(trained, capsys):  # noqa: F811
    work, ckpt, common = trained
    code, out = run("train", *common, "--encoder", "tiny", "--layer-sets", "off", "--output", str(work / "heads"))
    assert code == 0
    head = out.strip().splitlines()[-1]
    for domain, noted in (("math", False), ("Math", True), (None, False)):
        code, out = run("route", "--checkpoint", head, "--prompt", "compute the sum", "--device", "cpu",
                        *(["--domain", domain] if domain else []))
        assert code == 0
        note = json.loads(out).get("note", "")
        assert ("'Math' is not one this head was trained on (code, math)" in note) == noted, note


def test_an_odd_first_row_is_named_once_not_every_other_row(tmp_path):
    base = {"prompt": "p", "quality": [1, 0]}
    lines = [{**base, "task_id": "t0", "worker_ids": ["a", "c"]}] + \
        [{**base, "task_id": f"t{i}", "worker_ids": ["a", "b"]} for i in range(1, 6)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(TaskFileError) as err:
        read_reward_jsonl(tmp_path / "r.jsonl")
    assert err.value.problems == [(1, "worker_ids ['a', 'c'] differ from those of 5 later rows (e.g. line 2); every row "
                                      "must list the same workers in the same order")]


def test_the_per_domain_table_marks_a_domain_absent_from_training(capsys):
    from fugu_pipeline.cli.reporting import print_groups
    from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report

    u = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    rep = evaluation_report(EvalInputs(worker_ids=["a", "b"], utility=u, scores=u, train_utility=u,
                                       domains=["math", "legal", "math"], train_domains=["math", "code"]), n_boot=50)
    assert {r["domain"]: r["seen_in_training"] for r in rep["per_domain"]} == {"legal": False, "math": True}
    print_groups(rep)
    out = capsys.readouterr().out
    assert "legal *" in out and "math *" not in out and "routed as unseen" in out
