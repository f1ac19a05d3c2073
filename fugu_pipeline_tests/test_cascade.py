"""Cascades: answers in the reward matrix, the accept rule, choosing a plan under a cap, selection
that does no harm, the checkpoint, and bad input named in one line."""

import gzip
import json
import re

import numpy as np
import pytest

from fugu_pipeline.features.routing_data import TrainingDataError
from fugu_pipeline.matrix.answers import read_answers
from fugu_pipeline.matrix.build import build, from_import
from fugu_pipeline.matrix.import_format import RewardRow, read_reward_jsonl
from fugu_pipeline.matrix.read import RewardMatrixError
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.final_answer import detect_kind, extract
from fugu_pipeline.tasks.loading import TaskFileError
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import BEST_WORKER, fit_cascade
from fugu_pipeline.policies.cascade.policy import CascadePlan, CascadeStep, answer_codes, decide, simulate
from fugu_pipeline.train.selection import STRONGEST
from fugu_pipeline.policies.cascade.search import Cap, CascadeSearch
from fugu_pipeline_tests import cascade_fixture

FAST = CascadeSearch(thresholds=4, three_steps=False, finals=2, cheap=2)


@pytest.mark.parametrize("reply, kind, want", [
    ("so 3*60=180.\n#### 540\n", "number", "540"), ("The total is 1,200.0 dollars", "number", "1200"),
    ("The answer is (B).", "choice", "B"), ("I think **C** is right", "choice", "C"), ("I am not sure.", "choice", None),
    # the strongest commitment wins: a boxed letter, a pairwise judge's verdict (not the output it mentions last)
    ("so the correct answer is \\boxed{C}.", "choice", "C"), ("the answer is \\boxed{(C) \\text{city}}.", "choice", "C"),
    ("likely to work for:\n\n\\(\\boxed{D}\\)", "choice", "D"), ("Option A looks close, but \\boxed{B}", "choice", "B"),
    ("\\boxed{Bob}", "choice", None), ("Therefore, Output (a) is better.", "choice", "A"),
    ("Output (b) is better. Output (b) answers it, while Output (a) adds noise.", "choice", "B"),
    ("I am not sure, but the answer is Paris.", "text", "paris"), ("```python\ndef f():  \n\n    return 1\n```", "code",
                                                                      "def f():\n    return 1"),
    ("   ", "text", None)])
def test_final_answer_is_comparable(reply, kind, want):
    assert extract(reply, kind) == want


def test_answer_kind_is_detected_when_nothing_names_it():
    assert detect_kind("Which?\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:", ["B"]) == "choice"
    assert detect_kind("How many?", ["... #### 12", "so 13"]) == "number"


def _rows(n=6, answers=True):
    return [{"task_id": f"t{i}", "prompt": f"What is {i} + 1?", "worker_ids": ["a", "b"], "quality": [1.0, float(i % 2)],
             "split": "test" if i % 3 == 0 else "train", **({"answers": [f"#### {i + 1}", f"#### {i + 1 + (i % 2 == 0)}"],
                                                            "answer_kind": "number"} if answers else {})} for i in range(n)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_answers_are_kept_with_their_cells_and_read_back(tmp_path):
    src = _write(tmp_path / "m.jsonl", _rows())
    db = tmp_path / "m.duckdb"
    build(from_import(src, UtilityConfig()), db)
    grid = read_answers(db, ["t2", "t1"], ["b", "a"])
    assert grid.text[0, 1] == "#### 3" and grid.final[0, 0] == "4" and grid.final[1, 0] == "2"
    assert grid.kinds == ["number", "number"] and len(grid.version) == 16


def test_a_matrix_without_answers_says_what_to_do(tmp_path):
    db = tmp_path / "m.duckdb"
    build(from_import(_write(tmp_path / "m.jsonl", _rows(answers=False)), UtilityConfig()), db)
    with pytest.raises(RewardMatrixError, match="holds no worker replies.*import the rows with `answers`"):
        read_answers(db, ["t1"], ["a", "b"])


@pytest.mark.parametrize("answers, where", [
    (["x"], "'answers' has 1 values for 2 worker_ids"),
    (["x", 3], "answers.1"),
    (["x", "\ud800"], "'answers.1' is not valid Unicode text")])
def test_bad_answers_are_named_by_line_and_field(tmp_path, answers, where):
    rows = _rows(3)
    rows[2]["answers"] = answers
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes a lone surrogate as \ud800
    if "\ud800" in answers:  # pydantic's JSON parser refuses it; a row built in Python gets this check
        with pytest.raises(ValueError, match=where):
            RewardRow(**rows[2])
        return
    with pytest.raises(TaskFileError) as err:
        read_reward_jsonl(path)
    assert "m.jsonl:3:" in str(err.value) and where in str(err.value)


def test_routellm_replies_are_imported_as_answers(tmp_path):
    from fugu_pipeline.matrix.importers import read_source

    csv = "prompt,m1,m2,m1_response,m2_response\n" + "".join(
        f"Q{i}?,True,False,\"so #### {i}\",\"#### {i + 1}\"\n" for i in range(8))
    (tmp_path / "gsm8k_responses.csv.gz").write_bytes(gzip.compress(csv.encode()))
    (tmp_path / "gsm8k_contaminated_prompts.jsonl").write_text("")
    rows, _ = read_source("routellm-gsm8k", tmp_path)
    assert rows[0].answers == ["so #### 0", "#### 1"] and rows[0].answer_kind == "number"


def test_offline_run_and_live_rule_agree():
    """`simulate` (vectorised, offline) and `decide` (one request, live) pick the same answer."""
    rng = np.random.default_rng(3)
    finals = rng.choice(np.array(["x", "y", "z", None], dtype=object), size=(200, 4))
    scores = rng.random((200, 4))
    plans = [CascadePlan(steps=[CascadeStep(workers=["a", "b"], agree=2, verify=0.7), CascadeStep(workers=["c"], verify=0.5),
                                CascadeStep(workers=["d"])]),
             CascadePlan(steps=[CascadeStep(workers=["b"], verify=0.4), CascadeStep(workers=["c", "d"])])]
    ids = ["a", "b", "c", "d"]
    q = rng.random((200, 4))
    for plan in plans:
        out = simulate(plan, ids, answer_codes(finals), scores, q, np.ones(4), np.ones(4))
        for i in range(200):
            fs, ss, called = [], [], []
            for k, step in enumerate(plan.steps):
                called += step.workers
                fs += [finals[i, ids.index(w)] for w in step.workers]
                ss += [scores[i, ids.index(w)] for w in step.workers]
                d = decide(step, k == len(plan.steps) - 1, fs, ss, len(step.workers))
                if d.accept:
                    break
            assert called[d.answer_index] == ids[out.answer_worker[i]] and out.stop_step[i] == k
            assert out.cost[i] == len(called)  # a step's cost only when reached


def test_a_cascade_that_pays_is_chosen_and_beats_the_best_worker():
    data, grid, inputs = cascade_fixture.make(n=300)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lambda m: None)
    c = next(x for x in fit.candidates if x.kind == "cascade")
    assert fit.selected == "cascade" and c.low > 0 and len(fit.policy.default.steps) > 1
    assert c.cost_usd < next(x for x in fit.candidates if x.name == BEST_WORKER).cost_usd


def test_selection_does_no_harm_when_nothing_beats_the_best_worker():
    """No verifier signal, wrong answers that agree, and no cost in the utility: no cheaper policy
    keeps the strongest worker's accuracy, so it ships and the output says so."""
    data, grid, inputs = cascade_fixture.make(n=300, signal=0.0, shared_wrong=True)
    u = UtilityConfig(cost_weight=0.0, latency_weight=0.0)
    import dataclasses

    data = dataclasses.replace(data, utility=data.quality.copy(), utility_config=u, data_version="")
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lambda m: None)
    assert fit.selected == STRONGEST and "the strongest worker ships" in fit.reason
    assert fit.policy.describe() == "[strong]"


def test_a_cap_is_respected_per_domain_and_an_unmeetable_one_is_named():
    data, grid, inputs = cascade_fixture.make(n=300)
    cfg = CascadeConfig(search=FAST.model_copy(update={"min_domain_rows": 20}), n_boot=300,
                        domain_caps={"math": Cap(usd_per_1k=1.0)}, cap=Cap(share=0.6))
    fit = fit_cascade(data, grid, inputs, cfg, log=lambda m: None)
    assert fit.choices["math"].cost <= 1.0 / 1000 + 1e-12
    assert "math" in fit.policy.per_domain
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, cap=Cap(usd_per_1k=0.01)), log=lambda m: None)
    assert re.search(r"no cascade meets the cap of \$0\.01 per 1,000.*raise the cap.*the strongest worker \(strong\) ships",
                     fit.reason) and fit.policy.describe() == "[strong]"


def test_a_worker_without_answers_is_named():
    data, grid, inputs = cascade_fixture.make(n=100)
    grid.text[:, 1] = None
    grid.final[:, 1] = None
    with pytest.raises(TrainingDataError, match=r"mid \(replies on 0% of the rows\).*import their replies"):
        fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, workers=["cheap", "mid", "strong"]), log=lambda m: None)


def test_cascade_checkpoint_round_trip_and_its_outcomes(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, cascade_report, load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

    data, grid, inputs = cascade_fixture.make(n=300)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lambda m: None)
    path = save_cascade(tmp_path, data, fit, inputs.answer.shape[2])
    assert path.parent.name == "cascade" and (path / "head.safetensors").exists()
    assert save_cascade(tmp_path, data, fit, inputs.answer.shape[2]) == path  # content-addressed
    ckpt = load_cascade(path)
    assert ckpt.head.policy == fit.policy
    outs = cascade_outcomes(ckpt, data, grid, inputs)
    test = np.flatnonzero(data.splits == "test")
    assert [o.task_id for o in outs] == [data.task_ids[i] for i in test]
    assert all(o.calls >= 1 and o.cost_usd > 0 for o in outs)
    rep = cascade_report(ckpt, data, grid, inputs)
    assert rep["n_tasks"] == len(test) and rep["per_domain"] and rep["accuracy"]["low"] is not None
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["head_params"]["policy"]["default"]["steps"][0]["verify"] = 0.01  # a threshold edited after saving
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="content_hash does not match|edited"):
        load_checkpoint(path)
