"""Plans per kind of prompt (`policies/cascade/groups.py`): where a cheap worker ties the strongest on
one domain and only the strongest is right on another, the pooled rule pays for the strongest
everywhere; the per-domain choice serves the cheap worker on the first, by the same rule per domain
and for the whole. Domains too small to choose out of fold take the pooled plan, with one line."""

import numpy as np

from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import fit_cascade
from fugu_pipeline.policies.cascade.search import CascadeSearch
from fugu_pipeline.train.selection import STRONGEST
from fugu_pipeline_tests import cascade_fixture

FAST = CascadeSearch(thresholds=6, three_steps=False, finals=2, cheap=2)
quiet = lambda m: None  # noqa: E731


def _fig(fit, name):
    return next(c for c in fit.candidates if c.name == name)


def test_a_cheap_worker_that_ties_the_strongest_on_one_domain_serves_it_there():
    data, grid, inputs = cascade_fixture.mixed(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400), log=quiet)
    assert fit.selected == "cascade per domain", fit.reason
    assert fit.policy.plan_for("code").describe() == "[cheap]" and fit.policy.plan_for("mc").describe() == "[strong]"
    won, strong = _fig(fit, fit.selected), _fig(fit, STRONGEST)
    assert won.cost_usd <= 0.7 * strong.cost_usd  # at least 30% cheaper than the strongest, out of fold
    assert won.vs_high >= 0 and won.vs_strongest >= -0.005  # and not significantly below it, as a whole
    for g in fit.groups.table():  # and per domain, each with its interval
        assert g["vs_high"] >= 0 and g["vs_strongest"] >= -0.005 and g["vs_low"] <= g["vs_strongest"] <= g["vs_high"]
    assert {g["domain"]: g["plan"] for g in fit.groups.table()} == {"code": "[cheap]", "mc": "[strong]"}
    pooled = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400, groups="off"), log=quiet)
    assert pooled.policy.describe() == "[strong]"  # one plan for both kinds: the strongest everywhere


def test_the_report_lines_show_each_domains_choice_saving_and_interval(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import cascade_report, load_cascade, report_lines
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.train import CascadeResult

    data, grid, inputs = cascade_fixture.mixed(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    lines = CascadeResult(fit, tmp_path, fit.selected_kind, tmp_path).lines()
    code = next(line for line in lines if line.strip().startswith("domain 'code'"))
    assert "= [cheap]" in code and "saving 99%" in code and "accuracy − strongest +0.0000 [+0.0000, +0.0000]" in code
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    rep = cascade_report(ckpt, data, grid, inputs)
    by = {d["domain"]: d for d in rep["per_domain"]}
    assert by["code"]["plan"] == "[cheap]" and by["code"]["cost_share_of_pooled_strongest"] < 0.05
    assert by["code"]["minus_strongest_accuracy"]["mean"] == 0.0  # held out: the cheap worker ties it there
    text = "\n".join(report_lines(rep))
    assert "'code' (160 rows): cascade" in text or "'code' (160 rows): domain" in text


def test_domains_too_small_are_merged_into_the_pooled_plan_with_one_line():
    data, grid, inputs = cascade_fixture.mixed(n=400, tiny=15)
    lines: list[str] = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lines.append)
    said = [line for line in lines if "merged into the pooled plan" in line]
    assert said == ["cascade: group(s) 'tiny' (12 rows) have fewer than 40 non-test rows "
                    "(cascade.search.min_domain_rows) to choose a plan out of fold: merged into the pooled plan"]
    assert "tiny" not in fit.policy.per_domain and fit.policy.plan_for("tiny") == fit.policy.default
    assert fit.groups.merged == [("tiny", 12)]


def test_an_unseen_domain_is_served_the_pooled_plan(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.mixed(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    policy = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2])).head.policy
    assert policy.plan_for("code").describe() == "[cheap]"
    assert policy.plan_for("never-seen") == policy.plan_for(None) == policy.default


def test_serving_routes_each_request_by_its_domains_plan(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.mixed(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    router = CascadeRouter(load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2])), None)
    got = router.route_batch(["a", "b", "c", "d"], ["code", "mc", "never-seen", None])
    assert [d.extra["cascade"]["describe"] for d in got] == ["[cheap]", "[strong]", "[strong]", "[strong]"]
    assert [d.worker_id for d in got] == ["cheap", "strong", "strong", "strong"]


def test_the_whole_is_held_to_the_rule_when_each_domain_alone_passes():
    """Each domain's cheap choice is 0.3 point below the strongest on its rows, not significantly (3
    rows of 1,000); both together are significantly below on the 2,000 rows (6 rows): one domain
    moves to its dearer choice, and the whole passes."""
    from fugu_pipeline.policies.cascade.groups import GROUP_STRONGEST, choose_groups
    from fugu_pipeline.train.selection import interval

    rng = np.random.default_rng(0)
    n = 2000
    doms = np.array(["a", "b"] * (n // 2))
    strong_q = (rng.random(n) < 0.8).astype(float)
    cheap_q = strong_q.copy()
    for d in ("a", "b"):
        cheap_q[np.flatnonzero((doms == d) & (strong_q == 1))[:3]] = 0.0
    for d in ("a", "b"):  # each domain alone: not significantly below, within the margin
        _, _, hi = interval((cheap_q - strong_q)[doms == d], 500, 0)
        assert hi >= 0
    assert interval(cheap_q - strong_q, 500, 0)[2] < 0  # both: significantly below
    pooled = {STRONGEST: (strong_q, np.full(n, 1.0))}
    per = {(d, GROUP_STRONGEST): (cheap_q, np.full(n, 0.01)) for d in ("a", "b")}
    got = choose_groups(["a", "b"], [], doms, pooled, per, STRONGEST, margin=0.005, n_boot=500)
    assert len(got.stepped_up) == 1 and {o.name for o in got.groups.values()} == {GROUP_STRONGEST, STRONGEST}
    m, _, hi = interval(got.quality - strong_q, 500, 0)
    assert hi >= 0 and m >= -0.005 and got.cost.mean() < 0.6


def test_a_small_domain_whose_tie_cannot_be_told_from_a_loss_keeps_the_strongest():
    """89 rows where the cheap worker ties the strongest on the mean but differs on many rows: its
    interval reaches 0 and down past -0.05, so that domain keeps the strongest worker (the floor);
    with the floor at 1 (off) the cheap worker is chosen there."""
    from fugu_pipeline.policies.cascade.groups import GROUP_STRONGEST, choose_groups
    from fugu_pipeline.train.selection import interval

    n = 89
    doms = np.array(["code"] * n)
    strong_q = np.array([1.0] * 70 + [0.0] * 19)
    cheap_q = np.array([1.0] * 60 + [0.0] * 10 + [1.0] * 10 + [0.0] * 9)  # the same mean, 20 rows swapped
    m, lo, hi = interval(cheap_q - strong_q, 500, 0)
    assert hi >= 0 and m == 0 and lo < -0.05
    pooled = {STRONGEST: (strong_q, np.full(n, 1.0))}
    per = {("code", GROUP_STRONGEST): (cheap_q, np.full(n, 0.01))}
    kept = choose_groups(["code"], [], doms, pooled, per, STRONGEST, margin=0.005, n_boot=500)
    assert kept.groups["code"].name == STRONGEST
    loose = choose_groups(["code"], [], doms, pooled, per, STRONGEST, margin=0.005, n_boot=500, floor=1.0)
    assert loose.groups["code"].name == GROUP_STRONGEST


# --------------------------------------------------------------------------- an import without domains


class _Features:
    """The encoder a router reads prompts with: here the fixture's own prompt features, by prompt text."""

    def __init__(self, data):
        self.at = {p: data.features[i] for i, p in enumerate(data.prompts)}
        self.calls = 0

    def encode(self, prompts, domains=None):
        self.calls += 1
        return np.stack([self.at[p] for p in prompts])


def test_an_import_without_domains_plans_per_prompt_cluster():
    """Every row's domain is "general"; the code prompts' features lie apart from the multiple-choice
    ones. Prompt clusters find the two kinds (no outcome read) and the cheap worker serves the code
    cluster, by the same rule per group and for the whole; without clusters one plan for both kinds
    pays more (its verifier reads the prompt too, but must stop on both kinds alike)."""
    data, grid, inputs = cascade_fixture.mixed(n=400, named=False, apart=6.0)
    lines: list[str] = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400), log=lines.append)
    assert fit.selected == "cascade per prompt cluster", fit.reason
    kind = np.array(["code" if i % 2 else "mc" for i in range(len(data.task_ids))])
    label = fit.clusters.assign(data.features)
    for k in ("code", "mc"):  # each kind falls in one cluster, the two kinds in different ones
        assert len(set(label[kind == k])) == 1
    assert label[kind == "code"][0] != label[kind == "mc"][0]
    assert fit.policy.plan_for(label[kind == "code"][0]).describe() == "[cheap]"
    assert fit.policy.plan_for(label[kind == "mc"][0]).describe() == "[strong]"
    won, strong = _fig(fit, fit.selected), _fig(fit, STRONGEST)
    assert won.cost_usd <= 0.7 * strong.cost_usd and won.vs_high >= 0 and won.vs_strongest >= -0.005
    from fugu_pipeline.policies.cascade.train import CascadeResult

    shown = CascadeResult(fit, "models", fit.selected_kind, "models").lines()
    assert any(line.startswith("per prompt cluster, out of fold") for line in shown), shown
    said = [line for line in lines if "prompt clusters (mean silhouette" in line]
    assert len(said) == 1 and "no domains to choose a plan by; 2 prompt clusters" in said[0], lines
    held = [line for line in lines if "prompt clusters hold across the folds" in line]  # refitted without each fold
    assert held == ["cascade: the prompt clusters hold across the folds: refitted without each fold's rows, they put "
                    "100.0% to 100.0% of that fold's rows where the clusters of every row do"], lines
    by_domain = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400, groups="domain"), log=quiet)
    assert by_domain.clusters is None and by_domain.groups is None and not by_domain.policy.per_domain
    assert _fig(by_domain, by_domain.selected).cost_usd > won.cost_usd  # one plan for both kinds pays more


def test_prompts_of_one_kind_keep_one_plan_with_one_line():
    data, grid, inputs = cascade_fixture.mixed(n=400, named=False, apart=0.0)
    lines: list[str] = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lines.append)
    assert fit.clusters is None and fit.groups is None and not fit.policy.per_domain
    said = [line for line in lines if "do not fall apart into clusters" in line]
    assert len(said) == 1 and "cascade.cluster_min_gap 0.05" in said[0] and said[0].endswith("one plan for every prompt")


def test_a_cluster_checkpoint_serves_evaluates_and_reports_the_plan_training_chose(tmp_path):
    """Saved and loaded, the checkpoint puts every prompt in the cluster training put it in (the
    centroids travel in the safetensors); serving, the held-out replay and the report each read the
    cluster's plan, and the report's rows are the clusters."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes, cascade_report, load_cascade, report_lines
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.mixed(n=400, named=False, apart=6.0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    ckpt = load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2]))
    assert ckpt.head.clusters["names"] == fit.clusters.names
    trained = [str(g) for g in fit.clusters.assign(data.features)]
    assert ckpt.head.group_keys(data.domains, data.features) == trained
    enc = _Features(data)
    router = CascadeRouter(ckpt, enc)
    got = router.route_batch(list(data.prompts), list(data.domains))
    assert enc.calls == 1  # one encoding for the batch
    assert [d.extra["cascade"]["describe"] for d in got] == [fit.policy.plan_for(g).describe() for g in trained]
    assert [d.extra["cascade"]["group"] for d in got] == trained
    outs = cascade_outcomes(ckpt, data, grid, inputs)
    test_rows = np.flatnonzero(data.splits == "test")
    assert [o.group for o in outs] == [trained[i] for i in test_rows]
    assert [o.answered_by for o in outs] == [fit.policy.plan_for(trained[i]).steps[0].workers[0] for i in test_rows]
    rep = cascade_report(ckpt, data, grid, inputs)
    assert rep["grouped_by"] == "prompt cluster"
    assert sorted(r["domain"] for r in rep["per_domain"]) == sorted(fit.clusters.names)
    cheap = next(r for r in rep["per_domain"] if r["plan"] == "[cheap]")
    assert cheap["cost_share_of_pooled_strongest"] < 0.05 and cheap["minus_strongest_accuracy"]["mean"] == 0.0
    assert "| prompt cluster | n | plan |" in "\n".join(report_lines(rep))


def test_a_cluster_checkpoint_with_broken_centroids_is_refused(tmp_path):
    """Centroids edited in the weights file: the pinned hash refuses the file; centroids that are
    not finite in a loaded head: its sanity check names them."""
    import pytest
    from safetensors.numpy import load_file, save_file

    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.train.checkpoints import CheckpointError

    data, grid, inputs = cascade_fixture.mixed(n=400, named=False, apart=6.0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    path = save_cascade(tmp_path, data, fit, inputs.answer.shape[2])
    head = load_cascade(path).head
    assert head.sanity() == []
    head.centroids[0, 0] = float("nan")
    assert head.sanity() == ["the prompt clusters' scale or centroids hold zero, negative or non-finite values"]
    weights = load_file(str(path / "head.safetensors"))
    weights["centroids"][0, 0] = 0.5
    save_file(weights, str(path / "head.safetensors"))
    with pytest.raises(CheckpointError):
        load_cascade(path)


def test_through_the_commands_an_import_without_domains_ships_and_routes_per_prompt_cluster(tmp_path):
    """`fugu-lite train` on an import without domains (the one-shot heads limited to the domain prior,
    which without domains cannot tell the kinds apart): the cascade per prompt cluster ships below
    half the strongest's cost (the one-shot default per cluster costs half: the cascade also reads the
    cheap worker's doubt on the option prompts); `route` answers a new code prompt by the cheap worker
    alone and a new option prompt by the cheap worker then the verifier, through the tiny encoder, each
    naming its cluster; `evaluate` reports the held-out rows per cluster."""
    import json

    from fugu_pipeline_tests.cli_project import run, two_kinds_rows, write_inputs

    # 1,000 rows: on 500 the choice per cluster, made again inside the folds, reaches below the floor
    # (one fold's rows favour a cheaper rung for the option prompts); no cross-encoder (its fine-tune
    # would take minutes here and the verifier reads the cheap worker's doubt already)
    common = write_inputs(tmp_path, two_kinds_rows(1000))
    (tmp_path / "train.yaml").write_text('features: {layer_sets: "off", prompt_rules: "off"}\n'
                                         "heads:\n  knn: null\n  ridge: null\n  ensemble: null\n"
                                         "cascade: {cross_encoder: \"off\"}\n")
    code, out = run("train", *common, "--encoder", "tiny", "--config", str(tmp_path / "train.yaml"),
                    "--output", str(tmp_path / "models"))
    assert code == 0, out
    assert "shipped policy: cascade per prompt cluster" in out, out[-3000:]
    import re

    shipped = next(line for line in out.splitlines() if line.startswith("shipped policy: "))
    assert int(re.search(r"= (\d+)% of strong's cost", shipped).group(1)) < 50, shipped
    ckpt = out.strip().splitlines()[-1]
    got = {}
    for kind, prompt in (("code", "Write a Python function: sort a list of strings and return the index"),
                         ("mc", "Choose the correct option: which statement is true")):
        code, said = run("route", "--checkpoint", ckpt, "--prompt", prompt, "--device", "cpu")
        assert code == 0, said
        got[kind] = json.loads(said)
    assert got["code"]["worker"] == "cheap" and got["code"]["cascade"] == "[cheap]", got["code"]
    mc = got["mc"]["cascade"]  # the cheap worker, then the strong one where the verifier doubts its reply
    assert mc.startswith("[cheap] stop if verifier ≥ ") and mc.endswith(" → [strong]"), got["mc"]
    assert got["code"]["group"] != got["mc"]["group"] and got["code"]["group"].startswith("prompt cluster ")
    code, said = run("evaluate", "--checkpoint", ckpt, *common)
    assert code == 0 and "| prompt cluster | n | plan |" in said, said

    # served: the official client on loopback, workers a stub OpenAI-compatible server answers for
    import openai

    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.testing.stub_llm import StubLLMServer
    from fugu_pipeline.workers.config import WorkersConfig

    prompt = "Write a Python function: sort a list of strings and return the index"
    with StubLLMServer() as stub:
        for w in ("cheap", "strong"):
            stub.set_answer(prompt, "The answer is 42", model=f"stub/{w}")
        cfg = WorkersConfig.model_validate({"workers": [
            {"id": w, "kind": "openai_compatible", "model": f"stub/{w}", "base_url": stub.openai_url,
             "price_in_per_mtok": 1.0, "price_out_per_mtok": 2.0} for w in ("cheap", "strong")]})
        srv = ServerThread(create_app(load_router(ckpt, device="cpu"), cfg, batch_window_ms=2))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}])
            info = r.model_extra["fugu_lite"]
            assert info["served_by"] == "cheap" and info["cascade"]["group"] == got["code"]["group"], info
        finally:
            srv.stop()


def test_the_strongest_alone_says_when_its_out_of_fold_figure_is_other_workers():
    """Out of fold, "the strongest alone" is each fold's most accurate worker on the other folds; when
    that is not always the worker that serves, the group's line says whose figures they are."""
    from fugu_pipeline.policies.cascade.groups import fold_tops_note
    from fugu_pipeline.train.groups import GroupChoice, Option

    ids = ["gpt-3.5-turbo", "gpt-4"]
    assert fold_tops_note([1, 1, 1, 1, 1], 1, ids) == ""
    note = fold_tops_note([1, 0, 1, 1, 0], 0, ids)
    assert note.startswith("out of fold each fold's own strongest (the most accurate on the other folds): "
                           "gpt-4 on 3 of 5 folds, gpt-3.5-turbo on 2 of 5 folds")
    assert note.endswith("gpt-3.5-turbo, the most accurate on every non-test row, serves")
    opt = Option("the domain's strongest worker alone", 0.8, 0.0033, -0.01, -0.03, 0.01, spec=("alone", None))
    choice = GroupChoice({"humaneval": opt}, [], np.zeros(3), np.zeros(3), 0.004, {"humaneval": 82},
                         {"humaneval": 0.004}, plans={"humaneval": "[gpt-3.5-turbo]"}, notes={"humaneval": note})
    line = choice.lines()[0]
    assert line.startswith("  domain 'humaneval' (82 rows): the domain's strongest worker alone = [gpt-3.5-turbo]: ")
    assert line.endswith(f"({note})")
    assert choice.table()[0]["note"] == note
    assert "note" not in GroupChoice({"humaneval": opt}, [], np.zeros(3), np.zeros(3), 0.004, {"humaneval": 82},
                                     {"humaneval": 0.004}).table()[0]
