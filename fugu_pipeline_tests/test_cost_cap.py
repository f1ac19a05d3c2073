"""One cost cap: one model, one syntax (`--cap usd_per_1k=2.5`, `--cap share=0.3`, the same keys in a
YAML block and in the server's `fugu_budget`), one validation (finite, > 0, bounded; refused in one
line naming the flag or field), one test of "within the cap", used by route, train and serve."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from fugu_pipeline.cli import main
from fugu_pipeline_tests.test_budget_cli import WORKERS, run, trained  # noqa: F401  (the fixture)

BAD = ["usd_per_1k=inf", "usd_per_1k=nan", "share=-0.3", "share=0", "usd_per_1k=1e12", "share=lots", "cost=2"]


def one_line(capsys, argv, needle: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("text", BAD)
def test_a_cap_that_is_not_finite_positive_and_bounded_is_one_line_in_every_command(tmp_path, capsys, text):
    """Before: `train --cap usd_per_1k=inf` was taken (a cap of nothing), and route, ask, evaluate
    and serve had no --cap at all."""
    missing = str(tmp_path / "missing")  # never read: the cap is refused first
    commands = [["route", "--checkpoint", missing, "--prompt", "hi"],
                ["ask", "--checkpoint", missing, "--workers", missing, "--prompt", "hi"],
                ["evaluate", "--checkpoint", missing, "--data", missing],
                ["serve", "--checkpoint", missing, "--workers", missing],
                ["train", "--data", missing, "--output", str(tmp_path / "models")]]
    for argv in commands:
        line = one_line(capsys, [*argv, "--cap", text], f"--cap {text}")
        assert line.startswith(f"fugu-lite {argv[0]}: ")
    one_line(capsys, [commands[-1][0], *commands[-1][1:], "--domain-cap", f"math:{text}"], f"--domain-cap math: {text}")
    assert not (tmp_path / "models").exists()  # refused before anything was written


@pytest.mark.parametrize("flags, needle", [([], "no such file"), (["--cap", "usd_per_1k=inf"], "--cap usd_per_1k=inf"),
                                           (["--domain-cap", "math"], "--domain-cap 'math'")])
def test_train_refuses_a_bad_flag_or_a_missing_file_before_loading_torch(tmp_path, flags, needle):
    """Before: the training config's module imported the heads, so every `fugu-lite train` loaded
    torch (seconds) before it read --cap or --data; a typo waited for it. The order is kept: a bad
    flag is named before a missing file (the test above)."""
    import subprocess
    import sys

    argv = ["train", "--data", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "models"), *flags]
    code = ("import sys; from fugu_pipeline.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], (out.stdout, out.stderr)
    err = [line for line in out.stderr.splitlines() if line.startswith("fugu-lite train: ")]
    assert len(err) == 1 and needle in err[0], out.stderr
    assert not (tmp_path / "models").exists()


def test_inf_is_refused_by_name_in_a_yaml_cap_and_in_a_request():
    from fugu_pipeline.serve.protocol import APIError, parse_budget
    from fugu_pipeline.policies.cascade.config import CascadeConfig

    with pytest.raises(ValueError, match=r"cap\.usd_per_1k\s+Input should be a finite number"):
        CascadeConfig.model_validate(yaml.safe_load("cap: {usd_per_1k: .inf}"))
    for raw in ("usd_per_1k=inf", {"share": float("nan")}):
        with pytest.raises(APIError) as err:
            parse_budget(raw)
        assert err.value.status == 400 and err.value.param == "fugu_budget" and "finite" in err.value.message


def test_the_same_cap_string_is_the_same_cap_in_route_train_and_serve():
    """Before: `Budget` (route, serve) and `Cap` (cascades) were two models with two validations."""
    from fugu_pipeline.cli.training import budget_of, cascade_flags
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.serve.protocol import parse_budget
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig

    for text, expected in (("usd_per_1k=2.5", CostCap(usd_per_1k=2.5)), ("share=0.33", CostCap(share=0.33)),
                           ("share=0.3,margin_z=1", CostCap(share=0.3, margin_z=1.0))):
        route = budget_of(SimpleNamespace(cap=text))
        train = cascade_flags(SimpleNamespace(cap=text, domain_cap=[f"math:{text}"], per_domain=False),
                              TrainSetConfig()).cascade
        yaml_block = CascadeConfig.model_validate(yaml.safe_load(f"cap: {text}"))
        serve = [parse_budget(text), parse_budget({k: v for k, v in expected.model_dump().items() if v is not None})]
        caps = [route, train.cap, train.domain_caps["math"], yaml_block.cap, *serve, Budget.model_validate(text)]
        assert caps == [expected] * len(caps)
        assert {c.usd_per_request(0.004) for c in caps} == {expected.usd_per_request(0.004)}
        assert expected.spelled() == text


def test_a_persisted_cap_of_either_old_model_loads():
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.cascade.config import CascadeConfig

    # a cascade manifest's config (the old Cap: no margin) and a report's operating point (the old Budget)
    old_cascade = {"cap": {"usd_per_1k": 2.5, "share": None}, "domain_caps": {"math": {"share": 0.2, "usd_per_1k": None}}}
    cfg = CascadeConfig.model_validate(old_cascade)
    assert cfg.cap == CostCap(usd_per_1k=2.5) and cfg.domain_caps["math"] == CostCap(share=0.2)
    assert CostCap.model_validate({"usd_per_1k": None, "share": 0.3, "margin_z": 2.0}) == CostCap(share=0.3, margin_z=2)


@pytest.mark.parametrize("over, within", [(5e-10, True), (1e-6, False)])
def test_within_the_cap_is_one_test_in_every_place_that_compares(over, within):
    """A cost a rounding error above the cap is within it, a real excess is not, wherever it is
    decided. Before: a one-step head's λ (absolute 1e-12 in the cap's unit) refused what the
    cascade (relative 1e-9) took."""
    import numpy as np

    from fugu_pipeline.route.budget import Budget, BudgetCalibration, BudgetError, CurvePoint, cap_route_oof
    from fugu_pipeline.route.expected_cost import ExpectedCost
    from fugu_pipeline.policies.cascade.frontier import best_within
    from fugu_pipeline.policies.cascade.plans import Points

    cost, share = 0.0025, 0.3  # USD per request, and that as a share of the reference's cost
    cal = BudgetCalibration(worker_ids=["a", "b"], reference_worker="b", reference_cost_usd=cost / share,
                            cost_model=ExpectedCost(worker_ids=["a", "b"], per_token=[0, 0], offset={"*": [cost, cost / share]}),
                            n_val=10, val_reference_cost_usd=cost / share,
                            curve=[CurvePoint(lam=1.0, cost_usd=cost, cost_se=0.0, share=share, share_se=0.0)])

    def chosen(budget) -> bool:
        try:
            return cal.choose(budget).met_on_validation
        except BudgetError:
            return False

    decisions = {
        "route: λ for usd_per_1k": chosen(Budget(usd_per_1k=cost * 1000 / (1 + over), margin_z=0)),
        "route: λ for share": chosen(Budget(share=share / (1 + over), margin_z=0)),
        "train: the cascade's plan": best_within(Points([(((0,), None, None),)], np.array([cost]), np.array([0.9]),
                                                        np.zeros(1), np.zeros(1), 10), cost / (1 + over)) is not None,
        "train: a one-shot head at the cap": cap_route_oof(np.ones((4, 1)), np.full((4, 1), cost), cost, 0, np.arange(4) % 2,
                                                            [Budget(usd_per_1k=cost * 1000 / (1 + over), margin_z=0)], np.arange(4))[0] is not None,
    }
    assert decisions == dict.fromkeys(decisions, within)


@pytest.mark.slow
def test_the_same_cap_gives_the_same_route_on_the_command_line_and_through_the_server(trained, tmp_path, capsys):  # noqa: F811
    """`route --cap share=0.5`, the old `--budget-share 0.5` (one line on stderr giving the new
    form) and a request to `fugu-lite serve` with `"fugu_budget": "share=0.5"` (the official openai
    client on loopback) route the first prompt to the same worker at the same λ; the server's later
    requests follow the cost of its replies."""
    from openai import OpenAI

    from fugu_pipeline.route.follow import effective_cap
    from fugu_pipeline_tests.serve_fixtures import start, stop

    work, ckpt, _ = trained
    prompts = ["compute the sum of a list", "prove the integral of x", "python matrix value"]
    (work / "mock.yaml").write_text("workers:\n" + "".join(f"  - id: {w}\n    kind: mock\n" for w in WORKERS))
    new, old = [], []
    for prompt in prompts:
        code, out = run("route", "--checkpoint", ckpt, "--prompt", prompt, "--domain", "code", "--device", "cpu",
                        "--cap", "share=0.5")
        assert code == 0 and capsys.readouterr().err == ""
        new.append(json.loads(out))
        code, out = run("route", "--checkpoint", ckpt, "--prompt", prompt, "--domain", "code", "--device", "cpu",
                        "--budget-share", "0.5")
        assert code == 0 and capsys.readouterr().err.splitlines() == ["--budget-share 0.5: the old form of --cap share=0.5"]
        old.append(json.loads(out))
    assert [(d["worker"], d["budget"]["lambda"]) for d in new] == [(d["worker"], d["budget"]["lambda"]) for d in old]

    proc, url = start(["--checkpoint", str(work / ckpt), "--workers", str(work / "mock.yaml"), "--device", "cpu"],
                      tmp_path / "serve.log")
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        served = []
        for prompt in prompts:
            reply = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}],
                                                   extra_body={"domain": "code", "fugu_budget": "share=0.5"})
            served.append(reply.model_extra["fugu_lite"])
    finally:
        stop(proc)
    # the first request of the cap is routed as the command routes it (a follower at its target); each
    # one after it follows the replies' cost so far (route/follow.py), which a command that calls nothing lacks
    assert (served[0]["chosen_worker"], served[0]["budget"]["lambda"]) == (new[0]["worker"], new[0]["budget"]["lambda"])
    cap = served[0]["budget"]["follow"]["cap_usd"]
    assert [s["budget"]["follow"]["effective_cap_usd"] for s in served[1:]] == pytest.approx(
        [effective_cap(cap, k, sum(s["cost_usd"] for s in served[:k])) for k in (1, 2)])
