"""Budget mode against hostile and degenerate input, through the real entry points: `fugu-lite
route` (`main([...])`), the server (uvicorn on 127.0.0.1, the official `openai` client) and the
functions `train`/`evaluate` call (`calibrate_beside`, `calibrate_checkpoint`).

A bad input gets one clear error naming the flag, field or file (CLI: exit 2, one line; server: a
400 naming the field, the other requests unaffected); a degenerate but valid one gets a correct,
explained result, never a crash or a silently wrong route."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import threading
import warnings

import numpy as np
import openai
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.evaluate.budget_report import budget_lines, budget_section
from fugu_pipeline.route.budget import Budget, BudgetError, calibrate_beside, calibrate_checkpoint
from fugu_pipeline.testing.serving import WORKERS, synthetic_tasks
from fugu_pipeline_tests.test_no_cost_leak import make_data

PROMPT = "What is 3 times 4?"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A quality head on the tiny encoder, with its budget.json drawn on the training data."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.routing_data import RoutingData
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.policies.oneshot.configs import SFTConfig
    from fugu_pipeline.policies.oneshot.sft import train_sft

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu"))
    prompts, domains, utility = synthetic_tasks()
    tokens = np.array([np.ceil(len(p) / 4) for p in prompts])
    data = RoutingData(
        task_ids=[f"s{k}" for k in range(len(prompts))], prompts=prompts, domains=domains,
        splits=["val" if k % 6 == 0 else "test" if k % 6 == 1 else "train" for k in range(len(prompts))],
        worker_ids=list(WORKERS), features=enc.encode(prompts, domains), utility=utility,
        contract=enc.feature_contract(), quality=(utility >= 1.0).astype(float),
        cost_usd=tokens[:, None] * np.array([1e-6, 4e-6, 2e-5])[None, :])
    models = tmp_path_factory.mktemp("models")
    path = train_sft(data, SFTConfig(seed=0, epochs=5, patience=5, head="quality")).save(models)
    assert calibrate_beside(path, data, log=lambda m: None) is not None
    return path, data


def run(*argv) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue().strip().splitlines()


def route(ckpt, *flags):
    return run("route", "--checkpoint", str(ckpt), "--prompt", PROMPT, "--device", "cpu", *flags)


def one_error(code: int, err: list[str], *needles: str) -> str:
    assert code == 2 and len(err) == 1, err
    assert "Traceback" not in err[0]
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


def with_budget_json(trained, tmp_path, text: str | None):
    """A copy of the checkpoint whose budget.json holds `text` (None: no budget.json)."""
    path, _ = trained
    ckpt = tmp_path / path.name
    shutil.copytree(path, ckpt)
    if text is None:
        (ckpt / "budget.json").unlink()
    else:
        (ckpt / "budget.json").write_text(text)
    return ckpt


def edited(trained, change) -> str:
    cal = json.loads((trained[0] / "budget.json").read_text())
    change(cal)
    return json.dumps(cal)


# --------------------------------------------------------------------------- flags


def test_a_margin_without_a_cap_is_refused_not_ignored(trained, capsys):
    code, out, err = route(trained[0], "--budget-margin-z", "1")
    one_error(code, err, "--budget-margin-z", "--budget-share")
    assert out == ""


# --------------------------------------------------------------------------- budget.json


@pytest.mark.parametrize("text", ["", "{\"format_version\": 1, \"checkp", "not json", "[]", "{}"],
                         ids=["empty", "truncated", "not-json", "a-list", "no-fields"])
def test_an_unreadable_budget_json_is_one_error_and_plain_routing_still_works(trained, tmp_path, text):
    ckpt = with_budget_json(trained, tmp_path, text)
    code, _, err = route(ckpt, "--cap", "share=0.5")
    one_error(code, err, "budget.json", "fugu-lite evaluate")
    code, out, _ = route(ckpt)  # no cap asked: the calibration is not needed
    assert code == 0 and json.loads(out)["worker"] in WORKERS


def test_a_budget_json_for_other_weights_says_so(trained, tmp_path):
    ckpt = with_budget_json(trained, tmp_path, edited(trained, lambda c: c.update(checkpoint="0" * 16)))
    code, _, err = route(ckpt, "--cap", "share=0.5")
    one_error(code, err, "budget.json", "0" * 16, "fugu-lite evaluate")


def test_a_budget_json_naming_no_checkpoint_is_refused(trained, tmp_path):
    # checkpoint "" was taken for any checkpoint over the same workers: another head's curve
    # copied beside this one set its λ
    ckpt = with_budget_json(trained, tmp_path, edited(trained, lambda c: c.update(checkpoint="")))
    code, _, err = route(ckpt, "--cap", "share=0.5")
    one_error(code, err, "budget.json", "names no checkpoint", "fugu-lite evaluate")


def _nan_costs(c):
    for p in c["curve"]:
        p["cost_usd"] = p["share"] = float("nan")


def _negative_costs(c):
    for p in c["curve"]:
        p["cost_usd"] = p["share"] = -1.0


def _not_monotone(c):  # the costs reversed: the cheapest point now claims λ = 0
    lams = [p["lam"] for p in c["curve"]]
    c["curve"].reverse()
    for p, lam in zip(c["curve"], lams):
        p["lam"] = lam


BROKEN = {
    "nan-costs": _nan_costs,
    "negative-costs": _negative_costs,
    "empty-curve": lambda c: c.update(curve=[]),
    "not-monotone": _not_monotone,
    "negative-lambda": lambda c: [p.update(lam=-1.0 - p["lam"]) for p in c["curve"]],
    "negative-price": lambda c: c["cost_model"].update(per_token=[-1.0] * 3),
    "short-price-list": lambda c: c["cost_model"].update(per_token=[1e-6] * 2),
    "no-pooled-offset": lambda c: c["cost_model"].update(offset={}),
    "other-workers": lambda c: c.update(worker_ids=["x", "y", "z"]),
    "unknown-reference": lambda c: c.update(reference_worker="zzz"),
    "negative-reference-cost": lambda c: c.update(reference_cost_usd=-1.0),
    "negative-se": lambda c: [p.update(cost_se=-1.0, share_se=-1.0) for p in c["curve"]],
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_budget_json_with_impossible_values_is_refused(trained, tmp_path, name):
    ckpt = with_budget_json(trained, tmp_path, edited(trained, BROKEN[name]))
    code, out, err = route(ckpt, "--cap", "share=0.5")
    one_error(code, err, "budget.json", "fugu-lite evaluate")
    assert out == ""


def test_evaluate_redraws_an_unreadable_budget_json(trained, tmp_path):
    ckpt = with_budget_json(trained, tmp_path, "{\"truncat")
    logs = []
    cal = calibrate_beside(ckpt, trained[1], log=logs.append)
    assert cal is not None and any("budget.json" in m and "cannot be used" in m for m in logs), logs
    assert json.loads((ckpt / "budget.json").read_text())["checkpoint"] == ckpt.name
    code, out, _ = route(ckpt, "--cap", "share=0.5")
    assert code == 0 and json.loads(out)["budget"]["met_on_validation"]


# --------------------------------------------------------------------------- the server


@contextlib.contextmanager
def serving(ckpt, **kw):
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.workers.config import WorkersConfig

    router = Router.load(ckpt, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}}
                                                    for w in WORKERS]})
    srv = ServerThread(create_app(router, cfg, batch_window_ms=20, **kw))
    try:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
    finally:
        srv.stop()
        router.close()


def ask(client, **extra):
    return client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": PROMPT}],
                                          extra_body=extra or None)


def test_a_server_over_an_unreadable_budget_json_serves_and_refuses_only_capped_requests(trained, tmp_path):
    ckpt = with_budget_json(trained, tmp_path, "{\"curve\": [")
    with serving(ckpt) as client:
        results: dict = {}

        def one(i):
            try:
                results[i] = ask(client, **({"fugu_budget": {"share": 0.5}} if i % 2 else {}))
            except openai.APIStatusError as exc:
                results[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for i, r in results.items():
            if i % 2:  # the server's file is at fault: a 5xx naming the checkpoint by its tag, not by its path
                err = r.body if "message" in r.body else r.body["error"]
                assert r.status_code == 500 and err["code"] == "budget_unavailable" and err["type"] == "server_error"
                assert f"checkpoint sft/{ckpt.name}" in err["message"] and str(tmp_path) not in err["message"]
            else:
                assert r.choices[0].message.content and "budget" not in r.model_extra["fugu_lite"]
        assert len(results) == 8


def test_a_bad_fugu_budget_names_its_field_and_what_is_wrong_and_fails_alone(trained):
    cases = [
        ({"share": 1e300}, "'fugu_budget.share'", "less than or equal to 1000"),
        ({"usd_per_1k": 1e300}, "'fugu_budget.usd_per_1k'", "less than or equal to 1000000000"),
        ({"share": 0.3, "margin_z": 1e9}, "'fugu_budget.margin_z'", "less than or equal to 100"),
        ({"share": 0.3, "margin_z": -1}, "'fugu_budget.margin_z'", "greater than or equal to 0"),
        ({"share": 0}, "'fugu_budget.share'", "greater than 0"),
        ({"share": "0.3"}, "'fugu_budget.share'", "a finite number, got a string"),
        ({"share": True}, "'fugu_budget.share'", "got a boolean"),
        ({"share": {"v": 0.3}}, "'fugu_budget.share'", "got an object"),
        ({"share": None}, "'fugu_budget.share'", "got null"),
        ({"share": 0.3, "usd_per_1k": 1}, "exactly one of usd_per_1k", "share"),
        ({"margin_z": 1}, "exactly one of usd_per_1k", "share"),
        ({"share": 0.3, "cap": 1}, "'fugu_budget.cap' is not a budget field", "usd_per_1k"),
    ]
    with serving(trained[0]) as client:
        for budget, field, what in cases:
            with pytest.raises(openai.BadRequestError) as e:
                ask(client, fugu_budget=budget)
            err = e.value.body if "message" in e.value.body else e.value.body["error"]
            assert err["param"] == "fugu_budget" and err["code"] == "invalid_value"
            assert err["message"].startswith(field) or field in err["message"], err["message"]
            assert what in err["message"], err["message"]
        assert ask(client, fugu_budget={"share": 0.5}).model_extra["fugu_lite"]["budget"]["met_on_validation"]


# --------------------------------------------------------------------------- degenerate data


def with_cost(data, cost):
    return dataclasses.replace(data, cost_usd=cost, data_version="")


def test_a_free_strongest_worker_is_not_the_base_of_a_share():
    """The strongest worker on train ('mid') costs nothing (a local model): a share of $0 means
    nothing, so shares are of the strongest worker that costs anything, and the calibration says so."""
    data, ckpt = make_data()
    cost = data.cost_usd.copy()
    cost[:, 1] = 0.0
    cal = calibrate_checkpoint(ckpt, with_cost(data, cost))
    train_q = data.quality[data.splits == "train"].mean(axis=0)
    assert int(np.argmax(train_q)) == 1  # mid is the strongest on train
    second = ["cheap", "strong"][int(train_q[2] > train_q[0])]
    assert cal.reference_worker == second and cal.reference_cost_usd > 0
    assert "mid" in cal.reference_note and "costs nothing" in cal.reference_note
    op = cal.choose(Budget(share=0.3))
    assert op.met_on_validation and op.val_share <= 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by a zero cost
        sec = budget_section(ckpt, with_cost(data, cost), "test", cal, Budget(share=0.3), n_boot=50)
    assert sec["reference_worker"] == second and sec["reference_note"] == cal.reference_note
    assert np.isfinite([w["share"] for w in sec["workers"]]).all()
    assert "costs nothing" in "\n".join(budget_lines(sec))


def test_training_rows_without_any_cost_cannot_calibrate():
    data, ckpt = make_data()
    cost = data.cost_usd.copy()
    cost[data.splits == "train"] = 0.0  # only the held-out rows record a cost
    with pytest.raises(BudgetError, match="training rows record no cost"):
        calibrate_checkpoint(ckpt, with_cost(data, cost))


def test_equal_costs_give_an_explained_refusal_or_lambda_zero():
    data, ckpt = make_data()
    cal = calibrate_checkpoint(ckpt, with_cost(data, np.full_like(data.cost_usd, 1e-3)))
    assert cal.choose(Budget(share=1.0)).lam == 0.0  # every worker costs the same: λ changes nothing
    with pytest.raises(BudgetError, match=r"budget share 0.3: no operating point meets this cap.*100.0% of"):
        cal.choose(Budget(share=0.3))


@pytest.mark.parametrize("n_val", [0, 1])
def test_a_validation_split_too_small_for_a_margin_is_refused(n_val, trained):
    data, ckpt = make_data()
    splits = data.splits.copy()
    splits[np.flatnonzero(splits == "val")[n_val:]] = "train"
    small = dataclasses.replace(data, splits=splits, data_version="")
    with pytest.raises(BudgetError, match=f"the validation split has {n_val} row"):
        calibrate_checkpoint(ckpt, small)
    # what `evaluate --budget-share` calls: one error naming the cause, not "see above"
    path, full = trained
    rows = np.flatnonzero(full.splits == "val")
    splits = full.splits.copy()
    splits[rows[n_val:]] = "train"
    small = dataclasses.replace(full, splits=splits, data_version="")
    with pytest.raises(BudgetError, match=f"the validation split has {n_val} row"):
        calibrate_beside(path, small, log=lambda m: None, strict=True)
    assert calibrate_beside(path, small, log=lambda m: None) is None  # training, no cap asked: a log line


def test_a_domain_unseen_in_training_gets_the_pooled_cost(trained):
    code, out, _ = route(trained[0], "--cap", "share=0.5", "--domain", "astrology")
    assert code == 0
    seen = json.loads(route(trained[0], "--cap", "share=0.5", "--domain", "math")[1])
    assert json.loads(out)["budget"]["lambda"] == seen["budget"]["lambda"]
    assert json.loads(out)["budget"]["expected_cost_usd"] > 0


def test_a_report_whose_reference_cost_nothing_on_the_held_out_rows_keeps_true_shares():
    """The reference's actual cost on test is 0 (cached answers, say): shares of $0 do not exist, so
    the report's shares are of its expected cost on those rows, and it says so (they were USD / $1)."""
    data, ckpt = make_data()
    cal = calibrate_checkpoint(ckpt, data)
    ref = data.worker_ids.index(cal.reference_worker)
    cost = data.cost_usd.copy()
    cost[data.splits == "test", ref] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sec = budget_section(ckpt, with_cost(data, cost), "test", cal, Budget(share=0.5), n_boot=50)
    expected = cal.cost_model.predict(*[[x for x, s in zip(v, data.splits) if s == "test"]
                                        for v in (data.prompts, data.domains)])[:, ref].mean()
    assert sec["reference_cost_usd_per_1k"] == pytest.approx(expected * 1000)
    strong = next(w for w in sec["workers"] if w["name"] == "strong")
    assert strong["share"] == pytest.approx(strong["cost_usd_per_1k"] / 1000 / expected)
    assert "costs nothing" in sec["reference_note"] and "expected cost" in sec["reference_note"]


def test_a_validation_curve_whose_reference_expects_no_cost_shares_of_its_training_cost():
    from fugu_pipeline.route.budget import route_curve

    q = np.array([[0.9, 0.5], [0.8, 0.4], [0.7, 0.6]])
    c = np.array([[2e-3, 0.0], [2e-3, 0.0], [2e-3, 0.0]])  # the reference (column 1) expects $0 on these rows
    p = route_curve(q, c, c_ref=4e-3, ref=1, lambdas=(0.0,))[0]
    assert p.cost_usd == pytest.approx(2e-3) and p.share == pytest.approx(0.5)  # of its training mean, not of $1
