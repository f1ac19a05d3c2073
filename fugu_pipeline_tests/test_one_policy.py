"""One policy, one description: what `fugu-lite train` says ships (`route/shipped.py`, `policy.json`
beside the shipped checkpoint) is what `route`, `serve` and `evaluate` name, and what serves routes
by the very operating point `train` printed.

The fixture: three workers with recorded replies, where the cascade may only call the two dearer
ones, so a one-shot head at its default operating point (a λ-routing that sends easy rows to the
cheap worker) is the cheapest policy not significantly below the strongest. Its plain route (the
head's argmax, ties to the strongest) is not what it serves with no cap asked: the choice must score
it at the point it serves."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline_tests.cli_project import WORKERS, hard_math_rows, run, write_inputs

EASY = ["solve compute matrix python list sum value", "train hours value table graph list",
        "python list derivative sum table", "compute graph value hours matrix solve"]


def _train(work: Path, *flags: str):
    """The fixture's project trained in `work` with `flags` added: (work, the shipped checkpoint, the
    data flags, what train printed)."""
    common = write_inputs(work, hard_math_rows(600, answers=True))
    (work / "train.yaml").write_text(
        "features: {layer_sets: \"off\", prompt_rules: \"off\", lexical: false}\n"
        "heads:\n  knn: {k: [10, 30], prior_weight: [0], same_domain_bonus: [0], temperature: [null], prior_m: 20}\n"
        "cascade: {workers: [c, b], n_boot: 400, cross_encoder: \"off\", verifier_context: false,\n"
        "          search: {thresholds: 4, three_steps: false, finals: 2, cheap: 2}}\n")
    code, out = run("train", *common, "--encoder", "tiny", "--config", str(work / "train.yaml"), *flags,
                    "--output", str(work / "models"))
    assert code == 0, out
    return work, out.strip().splitlines()[-1], common, out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("one_policy"))


def shipped_line(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("shipped policy: ")][-1]


def printed_lambda(out: str) -> str:
    """The λ of the operating point the shipped line names (as printed, 4 significant digits)."""
    line = shipped_line(out)
    got = re.search(r"λ-routing at λ = ([0-9.e+-]+)", line)
    assert got, f"the line train prints for what ships names no operating point: {line!r}"
    return got.group(1)


def shipped(ckpt):
    from fugu_pipeline.route.shipped import ShippedPolicy

    return ShippedPolicy.model_validate_json((Path(ckpt) / "policy.json").read_text())


def test_train_prints_what_ships_and_saves_that_description_beside_it(trained):
    """The line `train` prints is the description saved beside the shipped checkpoint, and it names
    the shipped head's own operating point (here not the selected head's, which `train` also prints)."""
    work, ckpt, _, out = trained
    line, printed = shipped_line(out), printed_lambda(out)
    own = json.loads((Path(ckpt) / "budget.json").read_text())["default"]
    assert own["kind"] == "lambda" and f"{own['lam']:.4g}" == printed  # the shipped head's own point
    policy = shipped(ckpt)
    assert policy.describe() == line and policy.kind == "one-shot", (line, policy)
    assert policy.checkpoint == f"{Path(ckpt).parent.name}/{Path(ckpt).name}"
    lam = policy.operating_point.lam
    assert f"λ-routing at λ = {lam:.4g}" in line
    assert own["lam"] == lam  # the head's own point, not another head's
    selected = re.search(r"selected head's default operating point .*?: λ-routing at λ = ([0-9.e+-]+)", out)
    assert selected and selected.group(1) != f"{lam:.4g}", "the fixture should ship a head other than the selected one"
    # the choice's table scored the shipped head at that point: its row is the figures the line gives
    row = next(x for x in out.splitlines() if x.startswith("* one-shot"))
    assert f"${policy.oof_cost_usd * 1000:.4g} per 1,000" in row and f"quality {policy.oof_accuracy:.4f}" in row
    # no other checkpoint says it ships
    assert [p.parent for p in (work / "models").rglob("policy.json")] == [Path(ckpt)]


def _prompts():
    test = [r for r in hard_math_rows(answers=True) if r["split"] == "test"][:20]
    return [r["prompt"] for r in test] + EASY, [r["domain"] for r in test] + ["code"] * len(EASY)


def _at_point(router, prompts, domains, lam):
    scores, _ = router.lambda_scores(prompts, domains, lam)
    return [router.worker_ids[i] for i in np.argmax(scores, axis=1)]


def test_what_serves_routes_by_the_operating_point_train_printed(trained):
    """`load_router` on the printed checkpoint and `load_promoted` once it is promoted route, with no
    cap asked, by the λ `train` printed, and report the same description."""
    from fugu_pipeline.policies.registry import load_promoted, load_router
    from fugu_pipeline.testing.serving import promote

    work, ckpt, _, out = trained
    line, printed = shipped_line(out), printed_lambda(out)
    prompts, domains = _prompts()
    router = load_router(ckpt, device="cpu")
    try:
        assert f"{router.default_point.lam:.4g}" == printed  # with no cap asked it routes by the printed point
        lam = shipped(ckpt).operating_point.lam
        want = _at_point(router, prompts, domains, lam)
        plain = [d.worker_id for d in router.route_batch(prompts, domains, default_point=False)]
        assert want != plain, "the fixture's point should move some routes off the plain argmax"
        got = router.route_batch(prompts, domains)
        assert [d.worker_id for d in got] == want
        assert {d.extra["budget"]["lambda"] for d in got} == {lam}
        assert router.shipped.describe() == line
    finally:
        router.close()
    promote(work / "models", Path(ckpt))
    promoted = load_promoted(work / "models", device="cpu")
    assert [promoted.route(p, d).worker_id for p, d in zip(prompts, domains)] == want
    assert promoted.router.shipped.describe() == line


def test_the_server_reports_and_serves_the_policy_train_printed(trained, tmp_path):
    """The official client against `serve` on 127.0.0.1 with mock workers: each reply's `fugu_lite`
    names the printed policy and its chosen worker is the printed point's route; `/health` names it too."""
    import httpx
    import openai

    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.workers.config import WorkersConfig

    _, ckpt, _, out = trained
    line, printed = shipped_line(out), printed_lambda(out)
    lam = shipped(ckpt).operating_point.lam
    assert f"{lam:.4g}" == printed
    prompts, domains = _prompts()
    router = Router.load(ckpt, device="cpu")
    want = _at_point(router, prompts, domains, lam)
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]})
    srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        for p, d, w in zip(prompts, domains, want):
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": p}],
                                               extra_body={"domain": d})
            info = r.model_extra["fugu_lite"]
            assert info["policy"]["line"] == line and info["policy"]["lambda"] == lam, info
            assert info["chosen_worker"] == w and info["budget"]["lambda"] == lam, (p, info)
        health = httpx.get(srv.url + "/health", timeout=30).json()
        assert health["checkpoint"]["policy"]["line"] == line
        listed = {m.id: m for m in client.models.list().data}  # what a client sees of the router it calls
        assert listed["fugu-lite"].model_extra["policy"]["line"] == line
        assert client.models.retrieve("fugu-lite").model_extra["policy"]["lambda"] == lam
        assert listed["fugu-lite"].model_extra["checkpoint"] == health["checkpoint"]["tag"]
    finally:
        srv.stop()
        router.close()


def test_evaluate_names_the_policy_train_printed(trained):
    """`evaluate` on the shipped checkpoint reports the point it routes by, the same λ, and repeats
    the description `train` printed."""
    work, ckpt, common, out = trained
    line, printed = shipped_line(out), printed_lambda(out)
    code, said = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(work / "eval.json"))
    assert code == 0, said
    assert f"operating point used (no cap asked): the default operating point (λ = {printed})" in said
    assert f"as chosen at training: {line}" in said
    assert said.count("chosen at training: ") == 1, said  # one description: the budget file's own reason is not repeated
    rep = json.loads((work / "eval.json").read_text())
    assert f"{rep['default_point']['lambda']:.4g}" == printed and rep["shipped_policy"]["line"] == line


def test_the_contest_scores_a_one_shot_checkpoint_at_the_route_it_serves(trained):
    """Promotion's contest (`policies/oneshot/contest.py`: `head_routes`, `candidate`) routes a one-shot
    checkpoint's held-out rows as the `Router` serves them with no cap asked (the point `train`
    printed), not by the head's plain argmax."""
    from types import SimpleNamespace

    from fugu_pipeline.policies.oneshot.default_report import served_routes
    from fugu_pipeline.route.router import Router

    _, ckpt, _, _ = trained
    prompts, domains = _prompts()
    router = Router.load(ckpt, device="cpu")
    try:
        rows = SimpleNamespace(task_ids=[f"t{i}" for i in range(len(prompts))], prompts=prompts, domains=domains,
                               worker_ids=list(router.worker_ids), features=router.encode(prompts, domains))
        got = [router.worker_ids[i] for i in served_routes(router.checkpoint, rows)]
        assert got == [d.worker_id for d in router.route_batch(prompts, domains)]
        assert got != [d.worker_id for d in router.route_batch(prompts, domains, default_point=False)]
    finally:
        router.close()


def test_a_one_shot_candidate_is_scored_at_the_route_it_serves():
    """The cascade's choice scores a one-shot head at its default operating point's route (what it
    serves with no cap asked), not at its plain argmax."""
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline_tests import cascade_fixture

    data, grid, inputs = cascade_fixture.agreeing(n=300)
    n = int((data.splits != "test").sum())
    strong, cheap = data.worker_ids.index("strong"), data.worker_ids.index("cheap")
    scores = np.zeros((n, 2))
    scores[:, strong] = 1.0  # the plain argmax: always the strong worker
    route = np.full(n, cheap)  # its operating point: always the cheap one
    cfg = CascadeConfig(search=CascadeSearch(thresholds=4, three_steps=False, finals=2, cheap=2), n_boot=200)
    fit = fit_cascade(data, grid, inputs, cfg, heads={"one-shot h": scores}, log=lambda m: None,
                      head_routes={"one-shot h": route})
    h = next(c for c in fit.candidates if c.name == "one-shot h")
    rows = np.flatnonzero(data.splits != "test")
    assert h.quality == pytest.approx(float(data.quality[rows, cheap].mean()))
    assert h.quality != pytest.approx(float(data.quality[rows, strong].mean()))


def test_when_the_strongest_ships_evaluate_s_table_still_shows_each_cap_s_own_plan(tmp_path):
    """Nothing cheaper qualifies, so the strongest alone ships; the frontier's plans under 20/33/50% of
    its cost read the verifier, which is saved with the checkpoint, so the held-out table shows each
    cap's own plan within that cap (not the one plan without a verifier, the cheap worker, at every cap)."""
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.evaluate import cascade_report, load_cascade
    from fugu_pipeline.policies.cascade.fit import fit_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.search import CascadeSearch
    from fugu_pipeline_tests import cascade_fixture

    data, grid, inputs = cascade_fixture.agreeing(n=400, agree=0.6, signal=0.0)
    cfg = CascadeConfig(search=CascadeSearch(thresholds=6, three_steps=False, finals=2, cheap=2), n_boot=300)
    fit = fit_cascade(data, grid, inputs, cfg, log=lambda m: None)
    assert fit.policy.describe() == "[strong]", fit.reason
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    rows = [r for r in cascade_report(ckpt, data, grid, inputs)["cap_rows"] if r["share"] is not None]
    assert [r["share"] for r in rows] == [0.2, 0.33, 0.5]
    costs = [r["usd_per_1k"][0] for r in rows]
    assert len(set(costs)) == 3, rows  # a plan per cap, not one worker at every cap
    for r in rows:
        assert r["usd_per_1k"][0] <= r["share"] * 10 * 1.3  # within its cap, up to the held-out rows' noise


def test_route_prints_the_policy_train_printed(trained):
    """`fugu-lite route` on the shipped checkpoint: its JSON names the policy, by the same line, and
    routes by the printed point (its `budget` block gives that λ)."""
    _, ckpt, _, out = trained
    line, printed = shipped_line(out), printed_lambda(out)
    code, said = run("route", "--checkpoint", ckpt, "--prompt", EASY[0], "--domain", "code", "--device", "cpu")
    got = json.loads(said)
    assert code == 0 and got["policy"]["line"] == line, got
    assert f"{got['budget']['lambda']:.4g}" == printed and f"{got['policy']['lambda']:.4g}" == printed


def test_a_description_for_other_weights_or_unreadable_is_ignored_with_one_line(tmp_path):
    """`policy.json` names the weights it was written for: copied beside another checkpoint, or
    damaged, it is not read (the checkpoint's own `budget.json` point applies), and the reason names the file."""
    from fugu_pipeline.route.default_point import DefaultPoint
    from fugu_pipeline.route.shipped import POLICY_FILE, ShippedPolicy, read_shipped

    point = DefaultPoint(kind="lambda", lam=0.25, strongest_worker="c", reason="r", oof_accuracy=0.99, oof_cost_usd=1e-4,
                         strongest_accuracy=1.0, strongest_cost_usd=3e-4, difference=(-0.01, -0.02, 0.0), n_rows=240)
    ShippedPolicy(kind="one-shot", name="one-shot ridge", checkpoint="ridge/0123456789abcdef",
                  content_hash="0123456789abcdef", operating_point=point).save(tmp_path)
    got, why = read_shipped(tmp_path, "0123456789abcdef")
    assert got is not None and got.operating_point.lam == 0.25 and why == ""
    got, why = read_shipped(tmp_path, "fedcba9876543210")
    assert got is None and why.startswith(f"{tmp_path / POLICY_FILE} was written for checkpoint 0123456789abcdef")
    (tmp_path / POLICY_FILE).write_text("{\"kind\": \"one-shot\"")
    got, why = read_shipped(tmp_path, "0123456789abcdef")
    assert got is None and f"{tmp_path / POLICY_FILE} cannot be read" in why and "\n" not in why
    assert read_shipped(tmp_path / "absent", "0123456789abcdef") == (None, "")


def test_without_replies_the_selected_head_ships_at_its_point_and_says_so(tmp_path):
    """No replies, no cascade: the selected head ships at its default operating point; the line
    `train` prints is its description beside it, and `route` names it and routes by that point."""
    data = [{k: v for k, v in r.items() if k not in ("answers", "answer_kind")} for r in hard_math_rows(answers=True)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    (tmp_path / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (tmp_path / "train.yaml").write_text(
        "features: {layer_sets: \"off\", prompt_rules: \"off\", lexical: false}\n"
        "heads:\n  knn: {k: [10, 30], prior_weight: [0], same_domain_bonus: [0], temperature: [null], prior_m: 20}\n")
    common = ["--data", str(tmp_path / "r.jsonl"), "--workers", str(tmp_path / "w.yaml"), "--device", "cpu",
              "--cache-dir", str(tmp_path / "emb"), "--work-dir", str(tmp_path / "imports")]
    code, out = run("train", *common, "--encoder", "tiny", "--config", str(tmp_path / "train.yaml"),
                    "--output", str(tmp_path / "models"))
    assert code == 0, out
    ckpt = out.strip().splitlines()[-1]
    line, printed = shipped_line(out), printed_lambda(out)
    policy = shipped(ckpt)
    assert policy.describe() == line and "cascade" not in line
    assert policy.operating_point == shipped_point(ckpt)  # the selected head's own point, as saved beside it
    code, said = run("route", "--checkpoint", ckpt, "--prompt", EASY[0], "--domain", "code", "--device", "cpu")
    got = json.loads(said)
    assert code == 0 and got["policy"]["line"] == line and f"{got['budget']['lambda']:.4g}" == printed, got


def shipped_point(ckpt):
    from fugu_pipeline.route.default_point import DefaultPoint

    return DefaultPoint.model_validate(json.loads((Path(ckpt) / "budget.json").read_text())["default"])


@pytest.fixture(scope="module")
def trained_capped(tmp_path_factory):
    """The same project trained under a cap of 30% of the strongest's cost: the heads' default points
    (37%) are over it, and a head routed at the λ that keeps the cap is the most accurate within it."""
    return _train(tmp_path_factory.mktemp("one_policy_cap"), "--cap", "share=0.3")


def test_a_head_shipped_under_a_cap_serves_the_cap_with_no_cap_asked(trained_capped):
    """Shipped as "at the cap", the head's description carries the cap the fit was made under and
    the λ its budget calibration chooses for it (not its no-cap default point); the router, with no
    cap asked, routes as a request asking that cap is routed (λ following the spend); `evaluate`
    repeats the line."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.route.budget import load_calibration

    work, ckpt, common, out = trained_capped
    line = shipped_line(out)
    policy = shipped(ckpt)
    assert policy.kind == "one-shot" and policy.name.endswith(" at the cap") and policy.describe() == line
    cal = load_calibration(ckpt)
    (cascade,) = (work / "models" / "cascade").glob("*/manifest.json")  # the cascade fitted beside: the cap it was under
    params = json.loads(cascade.read_text())["head_params"]
    cap = CostCap(usd_per_1k=params["cap_usd"] * 1000, margin_z=params["cap_z"])
    point = policy.operating_point
    assert point.cap == cap and f"the {cap.describe()} it was trained under, λ following the spend" in line
    assert point.lam == cal.choose(cap, strict=False).lam != cal.default.lam  # the cap's point, not the no-cap default
    # its curve is drawn on every non-test row with the head's out-of-fold quality, the rows the
    # out-of-fold choice of the cap's λ is scored on (not the validation rows alone)
    non_test = sum(r["split"] != "test" for r in hard_math_rows(600, answers=True))
    assert cal.curve_rows == "non-test" and cal.n_val == non_test > sum(r["split"] == "val" for r in hard_math_rows(600, answers=True))
    prompts, domains = _prompts()
    plain, asked = load_router(ckpt, device="cpu"), load_router(ckpt, device="cpu")
    try:
        got = plain.route_batch(prompts, domains)
        assert [d.worker_id for d in got] == [d.worker_id for d in asked.route_batch(prompts, domains, budget=cap)]
        assert all(d.extra["budget"]["default"] and d.extra["budget"]["follow"]["requests"] for d in got)
        assert got[-1].extra["budget"]["follow"]["requests"] == len(prompts)  # one follower counted every prompt
    finally:
        plain.close()
        asked.close()
    # a cap the description carries that the calibration cannot keep with its margin (files edited,
    # or a calibration redrawn) is still served with no cap asked, at the curve's cheapest point: a
    # request without a cap is never refused for the shipped cap
    import shutil

    from fugu_pipeline.route.budget import BudgetError

    copy = work / "edited" / Path(ckpt).parent.name / Path(ckpt).name
    shutil.copytree(ckpt, copy)
    tiny = CostCap(usd_per_1k=1e-6)
    with pytest.raises(BudgetError):
        cal.choose(tiny)
    policy.model_copy(update={"operating_point": point.model_copy(update={"cap": tiny})}).save(copy)
    edited = load_router(copy, device="cpu")
    try:
        got = edited.route_batch(prompts, domains)
        lams, costs = cal.curve_arrays()
        assert {d.extra["budget"]["lambda"] for d in got} == {lams[int(np.argmin(costs))]}
        assert not got[0].extra["budget"]["met_on_validation"]
    finally:
        edited.close()
    # policy.py's figure is the candidate train printed, and no cost over the cap out of fold
    row = next(x for x in out.splitlines() if x.startswith("* one-shot"))
    assert "at the cap" in row and "over the cap" not in row
    # the table at caps: the selected head routed as its calibration serves each share, within it out of fold
    table = [x.split(" | ") for x in out.splitlines() if x.startswith("| 50% | one-shot |")]
    assert table and float(table[0][4].rstrip("%")) <= 50, table
    code, said = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(work / "eval.json"))
    assert code == 0, said
    assert f"as chosen at training: {line}" in said


def test_a_cap_the_head_cannot_keep_says_so_and_the_strongest_ships_with_its_rows_counted(tmp_path, capsys):
    """At 2% of the strongest's cost no λ keeps the cap in some fold: the head at the cap is no
    candidate, with its line, no plan meets the cap either, and the strongest ships; its line counts
    the non-test rows its figure is over."""
    _, ckpt, _, out = _train(tmp_path, "--cap", "share=0.02")
    said = out + capsys.readouterr().err  # the heads step's lines go to stderr
    assert re.search(r"one-shot \S+ m=5 at the cap: no candidate \(in some fold no λ keeps 2% of the strongest worker's "
                     r"cost with its margin on the other folds' rows\)", said), said
    line = shipped_line(out)
    assert line.startswith("shipped policy: always the strongest worker") and " over 480 non-test rows" in line, line


def test_evaluate_on_a_cascade_serves_the_cap_asked_or_refuses_it_in_one_line(trained, capsys):
    """`evaluate --cap` on a cascade checkpoint reports the rows as requests asking that cap are served
    (it was taken and ignored: the checkpoint's own plan was reported); a cap no saved point meets
    is one line, before the replies are read."""
    from fugu_pipeline.cli.main import main

    work, _, common, _ = trained
    (cascade,) = [p.parent for p in (work / "models" / "cascade").glob("*/manifest.json")]
    code, said = run("evaluate", "--checkpoint", str(cascade), *common, "--cap", "share=0.9", "--output",
                     str(work / "capped.json"))
    assert code == 0, said
    assert "tasks: under cap 90% of the strongest worker's cost (margin 1.645 SE): the most accurate saved point" in said
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(cascade), *common, "--cap", "share=0.0001",
                 "--output", str(work / "refused.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no cascade point of this checkpoint meets it" in err[0] and str(cascade) in err[0], err
    assert not (work / "refused.json").exists()


def test_train_saves_which_checkpoint_of_the_run_serves_each_cap_asked_later(trained):
    """The shipped description holds, per share of the table at caps `train` printed, the checkpoints
    of the run that serve it (the selected head for the one-shot row, the cascade for its row), the
    most accurate out of fold first, with the very figures the table printed; `train` says where a cap
    asked later that the shipped checkpoint cannot keep goes."""
    work, ckpt, _, out = trained
    policy = shipped(ckpt)
    assert [c.share for c in policy.at_caps] == [0.2, 0.33, 0.5], policy.at_caps
    for c in policy.at_caps:
        assert [r.accuracy for r in c.rows] == sorted((r.accuracy for r in c.rows), reverse=True), c
        for r in c.rows:
            assert (work / "models" / r.checkpoint / "manifest.json").is_file(), r
            assert (r.policy == "cascade") == r.checkpoint.startswith("cascade/"), r
            row = f"| {c.share:.0%} | {r.policy} | {r.accuracy:.4f} ["
            assert row in out, (row, out)
        assert f"  {c.share:.0%}: {', '.join(r.checkpoint for r in c.rows)} (out of fold at {c.share:.0%}" in out
    assert {r.policy for c in policy.at_caps for r in c.rows} == {"one-shot", "cascade"}


def _cascade_ships(trained, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the run's models where the description `train` wrote, its table at caps as trained,
    sits beside the cascade, as when the cascade ships: (the copied cascade, {row policy: its tag}).
    The fixture's cascade keeps no cap under about a fifth of the strongest's cost; the selected head does."""
    import shutil

    from fugu_pipeline.route.shipped import checkpoint_tag

    work, ckpt, _, _ = trained
    shutil.copytree(work / "models", tmp_path / "models")
    policy = shipped(ckpt)
    tags = {r.policy: r.checkpoint for c in policy.at_caps for r in c.rows}
    cascade = tmp_path / "models" / tags["cascade"]
    tag, content_hash = checkpoint_tag(cascade)
    (tmp_path / "models" / policy.checkpoint / "policy.json").unlink()
    policy.model_copy(update={"kind": "cascade", "checkpoint": tag, "content_hash": content_hash}).save(cascade)
    return cascade, tags


def test_a_cap_the_shipped_checkpoint_cannot_keep_goes_to_the_run_s_checkpoint_that_can(trained, tmp_path, caplog):
    """`load_router` on the shipped checkpoint loads the run's checkpoints its description names. A cap
    the shipped checkpoint keeps is its own; one it cannot keep goes to the checkpoint most accurate
    out of fold at the nearest share of the table (dollars read as a share of the strongest's cost),
    which routes it exactly as it would alone, and the decision says so. With that checkpoint gone,
    the cap is refused as before, and loading warned."""
    import shutil

    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.registry import cap_problem, load_router
    from fugu_pipeline.route.router import BudgetUnavailable

    work, ckpt, _, _ = trained
    cascade, tags = _cascade_ships(trained, tmp_path)
    prompts, domains = _prompts()
    low = CostCap(share=0.1)  # nearest 20%, whose only row is the selected head
    assert cap_problem(cascade, low) and not cap_problem(tmp_path / "models" / tags["one-shot"], low), "the fixture changed"
    router = load_router(cascade, device="cpu")
    try:
        assert set(router.cap_routers) == {tags["one-shot"]} and not router.cap_problems
        assert router.cap_routers[tags["one-shot"]].encoder is router.encoder  # same features: one encoder
        got = router.route_batch(prompts, domains, budget=low)
        alone = load_router(tmp_path / "models" / tags["one-shot"], device="cpu")
        try:
            want = alone.route_batch(prompts, domains, budget=low)
        finally:
            alone.close()
        assert [x.worker_id for x in got] == [x.worker_id for x in want] and "cascade" not in got[0].extra
        assert {x.extra["budget"]["lambda"] for x in got} == {x.extra["budget"]["lambda"] for x in want}
        assert {x.extra["checkpoint_tag"] for x in got} == {tags["one-shot"]} and got[0].router.tag == tags["one-shot"]
        sent = got[0].extra["budget"]["sent_to"]
        assert sent["table_share"] == 0.2 and f"{tags['cascade']} cannot keep this cap (" in sent["why"], sent
        usd = router.shipped.strongest_cost_usd * 1000 * 0.1
        assert router.route(prompts[0], domains[0], budget=CostCap(usd_per_1k=usd)).extra["checkpoint_tag"] == tags["one-shot"]
        for kept in (router.route(prompts[0], domains[0], budget=CostCap(share=0.5)), router.route(prompts[0], domains[0])):
            assert "cascade" in kept.extra and kept.router is None and "checkpoint_tag" not in kept.extra
            assert "sent_to" not in kept.extra.get("budget", {})
    finally:
        router.close()
    own = load_router(ckpt, device="cpu")  # the shipped head as trained keeps every share of the table itself
    try:
        assert own.cap_routers and not own.cap_problems
        for share in (0.2, 0.33, 0.5):
            assert "sent_to" not in own.route(prompts[0], domains[0], budget=CostCap(share=share)).extra["budget"]
    finally:
        own.close()
    shutil.rmtree(tmp_path / "models" / tags["one-shot"])
    with caplog.at_level("WARNING", logger="fugu_pipeline.route"):
        router = load_router(cascade, device="cpu")
    try:
        assert list(router.cap_problems) == [tags["one-shot"]] and tags["one-shot"] in caplog.text
        with pytest.raises(BudgetUnavailable, match="no cascade point of this checkpoint meets it"):
            router.route(prompts[0], domains[0], budget=low)
        import httpx

        from fugu_pipeline.serve import create_app
        from fugu_pipeline.testing.serving import ServerThread
        from fugu_pipeline.workers.config import WorkersConfig

        cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]})
        srv = ServerThread(create_app(router, cfg, batch_window_ms=5, api_token="t0ken"))
        try:  # /health says which is missing; the reason, which names server paths, only with the token
            seen = httpx.get(srv.url + "/health", timeout=30).json()["checkpoint"]["cap_checkpoints"]
            assert seen == {"loaded": [], "not_loaded": {tags["one-shot"]: "send the server's bearer token for the reason"}}
            seen = httpx.get(srv.url + "/health", timeout=30, headers={"authorization": "Bearer t0ken"}).json()
            assert str(tmp_path) in seen["checkpoint"]["cap_checkpoints"]["not_loaded"][tags["one-shot"]], seen
        finally:
            srv.stop()
    finally:
        router.close()


def test_the_server_and_the_promoted_router_send_a_cap_where_the_description_says(trained, tmp_path):
    """The official client against `serve` on 127.0.0.1 with mock workers: a request's `fugu_budget`
    the shipped cascade cannot keep is routed by the run's head and names it; one it keeps runs the
    cascade's steps; one with no cap too. `load_promoted` sends caps the same way."""
    import openai

    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.registry import load_promoted, load_router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread, promote
    from fugu_pipeline.workers.config import WorkersConfig

    cascade, tags = _cascade_ships(trained, tmp_path)
    prompts, domains = _prompts()
    router = load_router(cascade, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]})
    srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)

        def ask(**body):
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompts[0]}],
                                               extra_body={"domain": domains[0], **body})
            return r.model_extra["fugu_lite"]

        import httpx

        health = httpx.get(srv.url + "/health", timeout=30).json()["checkpoint"]
        assert health["cap_checkpoints"] == {"loaded": [tags["one-shot"]], "not_loaded": {}}, health
        head = ask(fugu_budget={"share": 0.1})
        assert head["checkpoint_tag"] == tags["one-shot"] and "mode" not in head, head
        assert head["budget"]["sent_to"]["checkpoint"] == tags["one-shot"] and head["served_by"] in WORKERS
        for body in ({"fugu_budget": "share=0.5"}, {}):
            casc = ask(**body)
            assert casc["checkpoint_tag"] == tags["cascade"] and casc["mode"] == "cascade" and casc["cascade"]["steps"], casc
            assert "sent_to" not in casc.get("budget", {})
        from prometheus_client.parser import text_string_to_metric_families

        spend = [(x.labels["checkpoint"], x.labels["group"], x.value)
                 for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics", timeout=30).text)
                 if f.name == "fugu_cap_requests" for x in f.samples]  # each cap's guard or follower, by checkpoint
        assert (tags["one-shot"], "", 1.0) in spend and {c for c, _, _ in spend} == {tags["one-shot"], tags["cascade"]}
        assert all(v == 1.0 for c, _, v in spend if c == tags["cascade"]), spend  # the one request asking 50%
    finally:
        srv.stop()
        router.close()
    promote(tmp_path / "models", cascade)
    promoted = load_promoted(tmp_path / "models", device="cpu")
    try:
        assert promoted.route(prompts[0], domains[0], budget=CostCap(share=0.1)).extra["checkpoint_tag"] == tags["one-shot"]
    finally:
        promoted.close()


def test_a_head_that_cannot_keep_a_cap_has_the_run_s_cascade_call_its_steps(trained, tmp_path, capsys):
    """The shipped head, and the table's, without their budget calibrations keep no cap: a cap the
    run's cascade keeps is served by that cascade's steps, called with the cascade (`ask` with mock workers, and `serve`
    through the official client), each naming it; with no cap the head routes as it did."""
    import shutil

    import openai

    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _, _ = trained
    shutil.copytree(work / "models", tmp_path / "models")
    head = tmp_path / "models" / Path(ckpt).parent.name / Path(ckpt).name
    rows = {r.policy: r.checkpoint for c in shipped(head).at_caps for r in c.rows}
    cascade = rows["cascade"]
    for name in {head.relative_to(tmp_path / "models"), Path(rows["one-shot"])}:  # the table's head keeps none either
        (tmp_path / "models" / name / "budget.json").unlink()
    prompts, domains = _prompts()
    (tmp_path / "mock.yaml").write_text("workers:\n" + "".join(f"  - id: {w}\n    kind: mock\n" for w in WORKERS))
    capsys.readouterr()
    code, out = run("ask", "--checkpoint", str(head), "--workers", str(tmp_path / "mock.yaml"), "--prompt", prompts[0],
                    "--domain", domains[0], "--device", "cpu", "--cap", "share=0.5")
    assert code == 0, capsys.readouterr().err
    shown = json.loads(out[out.index("{"):])["fugu_lite"]
    assert shown["mode"] == "cascade" and shown["steps"] and shown["budget"]["sent_to"]["checkpoint"] == cascade, shown
    assert f"{shipped(head).checkpoint} cannot keep this cap (" in shown["budget"]["sent_to"]["why"]
    router = load_router(head, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]})
    srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        for body, tag in (({"fugu_budget": {"share": 0.5}}, cascade), ({}, shipped(head).checkpoint)):
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompts[0]}],
                                               extra_body={"domain": domains[0], **body})
            info = r.model_extra["fugu_lite"]
            assert info["checkpoint_tag"] == tag and (info.get("mode") == "cascade") == (tag == cascade), info
        assert router.cap_routers[cascade].guards, "the cascade's spend guard counts what its steps cost"
    finally:
        srv.stop()
        router.close()


def test_a_promotion_pushed_to_the_store_carries_the_checkpoints_a_cap_may_go_to(trained, tmp_path, monkeypatch):
    """A promotion pushed to the shared store sends, beside the king, the run's checkpoints its
    description names; a machine that knows only the store's URL loads them with it and sends a cap
    the king cannot keep to its own copy of the head."""
    from fugu_pipeline import storage
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.defs.shared import SharedStore
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.policies.registry import load_promoted
    from fugu_pipeline.testing.serving import promote

    cascade, tags = _cascade_ships(trained, tmp_path)
    url = f"memory://fugu-{tmp_path.name}/models"  # fsspec's in-process store: the code path of s3://
    monkeypatch.setenv("FUGU_MODELS_URL", url)
    monkeypatch.setenv("FUGU_STORE_CACHE", str(tmp_path / "machine-b"))
    storage._FS_CACHE.clear()
    promote(tmp_path / "models", cascade)
    assert SharedStore.of(ProjectPaths(tmp_path)).push_promoted(None)
    assert set(storage.list_dirs(url)) >= {tags["cascade"].split("/")[0], tags["one-shot"].split("/")[0]}
    prompts, domains = _prompts()
    router = load_promoted(url, device="cpu")
    try:
        head = router.router.cap_routers[tags["one-shot"]]
        assert Path(head.path).is_relative_to(tmp_path / "machine-b") and not router.router.cap_problems
        d = router.route(prompts[0], domains[0], budget=CostCap(share=0.1))
        assert d.extra["checkpoint_tag"] == tags["one-shot"] and d.extra["budget"]["sent_to"]["table_share"] == 0.2
    finally:
        router.close()
        storage._FS_CACHE.clear()


@pytest.mark.slow
def test_serve_with_a_default_cap_starts_on_a_cascade_and_sends_one_it_cannot_keep(trained, tmp_path):
    """`fugu-lite serve --cap` as a user runs it (a subprocess on a loopback port, mock workers, the
    official client): on the shipped cascade a default cap it keeps is logged with its plan and runs
    its steps; one it cannot keep is logged as served by the run's head, and requests without a cap
    of their own are routed by that head."""
    import openai

    from fugu_pipeline_tests.serve_fixtures import start, stop

    cascade, tags = _cascade_ships(trained, tmp_path)
    (tmp_path / "mock.yaml").write_text("workers:\n" + "".join(f"  - id: {w}\n    kind: mock\n" for w in WORKERS))
    prompts, domains = _prompts()
    for cap, tag, said in (("share=0.5", tags["cascade"], "default cap 50% of the strongest worker's cost (margin 1.645 SE): ["),
                           ("share=0.1", tags["one-shot"], f"default cap 10% of the strongest worker's cost (margin 1.645 SE): "
                                                           f"served by {tags['one-shot']} ({tags['cascade']} cannot keep")):
        log = tmp_path / f"serve-{cap}.log"
        proc, url = start(["--checkpoint", str(cascade), "--workers", str(tmp_path / "mock.yaml"), "--device", "cpu",
                           "--cap", cap], log)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompts[0]}],
                                               extra_body={"domain": domains[0]})
            info = r.model_extra["fugu_lite"]
            assert info["checkpoint_tag"] == tag and (info.get("mode") == "cascade") == (tag == tags["cascade"]), info
        finally:
            assert stop(proc) == 0
        assert said in log.read_text(), log.read_text()[-3000:]


def test_evaluate_under_a_cap_reports_the_checkpoint_a_request_naming_it_is_served_by(trained, tmp_path, capsys):
    """`evaluate --cap` on the shipped checkpoint evaluates the checkpoint a request naming that cap is
    served by, and says so in one line: the run's head for a cap the shipped cascade cannot keep, the
    cascade itself for one it keeps."""
    from fugu_pipeline.cli.main import main

    _, _, common, _ = trained
    cascade, tags = _cascade_ships(trained, tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(cascade), *common, "--cap", "share=0.1", "--output",
                 str(tmp_path / "sent.json")]) == 0
    said = capsys.readouterr()
    assert f"cap 10% of the strongest worker's cost (margin 1.645 SE): served by {tags['one-shot']}" in said.err
    rep = json.loads((tmp_path / "sent.json").read_text())
    assert rep["checkpoint"] == str((tmp_path / "models" / tags["one-shot"]).resolve()), rep["checkpoint"]
    assert main(["evaluate", "--checkpoint", str(cascade), *common, "--cap", "share=0.5", "--output",
                 str(tmp_path / "kept.json")]) == 0
    said = capsys.readouterr()
    assert "served by" not in said.err and "tasks: under cap 50% of the strongest worker's cost" in said.out


def test_a_cap_goes_to_the_nearest_share_of_the_table_and_the_rows_keep_the_shipped_one_on_a_tie(tmp_path):
    """`for_cap`: the nearest share (equally near: the lower), dollars read against the strongest's
    out-of-fold cost, none without a table; `cap_choices`: the most accurate row first, a tie keeps the
    shipped checkpoint, and a cascade with plans per group serves the table's "plans per group" row."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.cascade.ship import cap_choices
    from fugu_pipeline.route.shipped import CapChoice, CapRow, ShippedPolicy

    row = lambda ck, acc: CapRow(policy="one-shot", checkpoint=ck, accuracy=acc, minus_strongest=(0, 0, 0))  # noqa: E731
    p = ShippedPolicy(kind="cascade", name="n", checkpoint="cascade/h", content_hash="h", strongest_cost_usd=0.002,
                      at_caps=[CapChoice(share=s, rows=[row(f"k/{s}", 0.5)]) for s in (0.2, 0.4)])
    assert p.for_cap(CostCap(share=0.3)).share == 0.2 and p.for_cap(CostCap(share=0.31)).share == 0.4
    assert p.for_cap(CostCap(share=5)).share == 0.4 and p.for_cap(CostCap(share=0.01)).share == 0.2
    assert p.for_cap(CostCap(usd_per_1k=0.78)).share == 0.4  # $0.78 per 1,000 = 39% of $2 per 1,000
    assert p.model_copy(update={"strongest_cost_usd": None}).for_cap(CostCap(usd_per_1k=0.78)) is None
    assert p.model_copy(update={"at_caps": []}).for_cap(CostCap(share=0.3)) is None

    def saved(name: str, method: str, **manifest) -> Path:
        (tmp_path / method / name).mkdir(parents=True)
        (tmp_path / method / name / "manifest.json").write_text(json.dumps({"method": method, "content_hash": name, **manifest}))
        return tmp_path / method / name

    pooled = saved("c1", "cascade", head_params={"frontier": [{}]}, metrics={})
    grouped = saved("c2", "cascade", head_params={"frontier": [{}], "domains_frontier": {"math": [{}]}},
                    metrics={"groups": {"chosen": [{"domain": "math", "rows": 10}]}, "frontier_oof": {"rows": 30}})
    head = saved("k1", "knn")
    table = lambda policy, acc, share=0.33: {"share": share, "policy": policy, "accuracy": (acc, 0, 1),  # noqa: E731
                                             "minus_strongest": (acc - 0.9, -1, 1), "share_of_strongest": share}
    rows = [table("one-shot", 0.8), table("cascade", 0.8), table("plans per group", 0.85), table("cascade", 0.7, 0.5),
            {**table("one-shot", 0.0, 0.5), "accuracy": None}]
    got = cap_choices(rows, pooled, head, "cascade/c1")
    assert [(c.share, [r.checkpoint for r in c.rows]) for c in got] == [(0.33, ["cascade/c1", "knn/k1"]), (0.5, ["cascade/c1"])]
    assert [r.checkpoint for r in cap_choices(rows, pooled, head, "knn/k1")[0].rows] == ["knn/k1", "cascade/c1"]
    got = cap_choices(rows, grouped, head, "knn/k1")[0]
    assert [(r.policy, r.checkpoint, r.accuracy) for r in got.rows] == [("plans per group", "cascade/c2", 0.85),
                                                                       ("one-shot", "knn/k1", 0.8)]
    assert cap_choices(rows, pooled, None, "cascade/c1")[0].rows[0].policy == "cascade"


def test_a_second_promotion_swaps_the_checkpoints_a_cap_may_go_to_with_the_king(trained, tmp_path):
    """Promoted: the cascade whose description sends a low cap to the run's head. Promoted over it:
    that head alone, with no description, which keeps the cap itself, with a follower of its own
    started afresh, and no checkpoints of the old king's run. Promoted back: the cascade sends the
    cap to the head again, a newly loaded one that follows the cap's spend from the start."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.registry import load_promoted
    from fugu_pipeline.testing.serving import promote

    cascade, tags = _cascade_ships(trained, tmp_path)
    models, head = tmp_path / "models", tmp_path / "models" / tags["one-shot"]
    assert not (head / "policy.json").exists(), "the fixture changed: the head should carry no description"
    prompts, domains = _prompts()
    low = CostCap(share=0.1)
    promote(models, cascade)
    promoted = load_promoted(models, device="cpu")
    try:
        first = promoted.router
        d = promoted.route(prompts[0], domains[0], budget=low)
        assert first.tag == tags["cascade"] and set(first.cap_routers) == {tags["one-shot"]}
        assert d.extra["checkpoint_tag"] == tags["one-shot"] and d.extra["budget"]["sent_to"]["checkpoint"] == tags["one-shot"]
        assert promoted.route(prompts[1], domains[1], budget=low).extra["budget"]["follow"]["requests"] == 2
        promote(models, head)
        d = promoted.route(prompts[0], domains[0], budget=low)
        king = promoted.router
        assert king is not first and king.tag == tags["one-shot"] and not king.cap_routers and king.shipped is None
        assert "sent_to" not in d.extra["budget"] and d.extra["budget"]["follow"]["requests"] == 1
        promote(models, cascade)
        d = promoted.route(prompts[0], domains[0], budget=low)
        again = promoted.router
        assert again.tag == tags["cascade"] and again is not first and set(again.cap_routers) == {tags["one-shot"]}
        assert again.cap_routers[tags["one-shot"]] is not first.cap_routers[tags["one-shot"]]
        assert d.extra["checkpoint_tag"] == tags["one-shot"] and d.extra["budget"]["follow"]["requests"] == 1
        assert promoted.reloads == 3
    finally:
        promoted.close()
