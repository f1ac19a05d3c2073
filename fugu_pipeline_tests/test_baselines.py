"""Baselines from the matrix alone: always one worker, random routing over seeds, the oracle
ceiling and the cross-fit oracle; as a command and as rows of every evaluation report."""

import json
import shutil

import numpy as np
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.evaluate.baselines import (
    always,
    baseline_rows,
    cross_fit_oracle,
    cross_fit_scores,
    oracle,
    random_routing,
)
from fugu_pipeline_tests.conftest import REPO


def test_always_and_oracle_by_hand():
    m = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    assert always(m, ["a", "b"]) == {"a": 0.5, "b": 0.5}
    assert oracle(m) == 0.75


def test_random_routing_matches_a_direct_simulation():
    rng = np.random.default_rng(3)
    m = rng.random((50, 4))
    r = random_routing(m, seeds=200, seed=7)
    # the same draws, written out: seed 7, (seeds, n) worker indices
    routes = np.random.default_rng(7).integers(0, 4, size=(200, 50))
    means = np.array([m[np.arange(50), routes[s]].mean() for s in range(200)])
    assert r["mean"] == pytest.approx(means.mean())
    assert (r["low"], r["high"]) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    assert r["expected"] == pytest.approx(m.mean()) and r["low"] < r["expected"] < r["high"]


def test_cross_fit_scores_every_task_with_the_worker_chosen_on_the_other_half():
    rng = np.random.default_rng(0)
    m = (rng.random((41, 3)) < [0.5, 0.55, 0.45]).astype(float)
    got = cross_fit_scores(m, seed=5)
    half = np.zeros(41, bool)
    half[np.random.default_rng(5).permutation(41)[:20]] = True
    want = np.empty(41)
    want[half] = m[half, np.argmax(m[~half].mean(axis=0))]
    want[~half] = m[~half, np.argmax(m[half].mean(axis=0))]
    np.testing.assert_array_equal(got, want)


def test_cross_fit_oracle_is_not_flattered_by_choosing_on_the_scored_rows():
    """Three workers of equal true skill: the best one chosen on the same rows looks better than
    the average worker; chosen on the other half it cannot profit from the noise (the halves are
    complementary, so it even lands a little below: the estimate is conservative)."""
    rng = np.random.default_rng(1)
    m = (rng.random((60, 3)) < 0.5).astype(float)
    in_sample_best = m.mean(axis=0).max()
    cf = cross_fit_oracle(m, repeats=50)
    assert in_sample_best > m.mean() + 0.01
    assert cf["mean"] <= m.mean()


def test_cross_fit_oracle_by_domain_finds_each_domains_expert():
    doms = ["math"] * 40 + ["code"] * 40
    m = np.zeros((80, 2))
    m[:40, 0] = 1.0  # worker 0 solves math, worker 1 code
    m[40:, 1] = 1.0
    assert cross_fit_oracle(m, doms, repeats=10)["mean"] == 1.0
    assert cross_fit_oracle(m, repeats=10)["mean"] < 0.6  # one worker for both domains


def test_baseline_rows_router_share_of_headroom():
    m = np.array([[1.0, 0.0], [0.0, 1.0]] * 20)
    b = baseline_rows(["a", "b"], m, m, ["d"] * 40, router={"utility": 1.0, "quality": 1.0})
    for name in ("utility", "quality"):
        r = b[name]
        assert r["oracle"] == 1.0 and r["headroom"] == pytest.approx(1.0 - r["cross_fit_oracle"]["mean"])
        assert r["router_share_of_headroom"] == pytest.approx(1.0)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    tasks = str(REPO / "data" / "benchgen" / "sample.jsonl")
    assert main(["generate", "--workers", "configs/workers.mock.yaml", "--tasks", tasks, "--output", "r.jsonl"]) == 0
    return tmp_path


def test_baseline_command_prints_every_row(workdir, capsys):
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml"]
    capsys.readouterr()
    assert main(["baseline", "all", *W]) == 0
    out = capsys.readouterr().out
    for w in ("math-expert", "code-expert", "general-expert"):
        assert f"always {w}" in out
    for label in ("random routing (100 seeds)", "oracle ceiling", "cross-fit oracle (best single)",
                  "cross-fit oracle (per domain)", "headroom (oracle − cross-fit)", "quality on 75 tasks"):
        assert label in out
    for kind, shown, hidden in (("always", "always math-expert", "oracle ceiling"),
                                ("random", "random routing (100 seeds)", "always"),
                                ("oracle", "cross-fit oracle (best single)", "random routing")):
        assert main(["baseline", kind, *W]) == 0
        out = capsys.readouterr().out
        assert shown in out and hidden not in out
    assert main(["baseline", "random", *W, "--seeds", "30", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["utility"]["random"]["seeds"] == 30 and set(b["utility"]) == {"random"}
    assert main(["baseline", "oracle", *W, "--json", "--split", "val"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["split"] == "val" and {"oracle", "cross_fit_oracle", "headroom"} <= set(b["quality"])
    # without --workers a JSONL with quality and no rewards has no utility: the same refusal as train-* and evaluate
    rows = [json.loads(line) for line in (workdir / "r.jsonl").read_text().splitlines()]
    (workdir / "q.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "rewards"}) + "\n" for r in rows))
    assert main(["baseline", "always", "--data", "q.jsonl"]) == 2
    assert "pass --workers W.yaml" in capsys.readouterr().err


def test_every_evaluation_report_carries_the_baselines(workdir, capsys):
    W = ["--data", "r.jsonl", "--workers", "configs/workers.mock.yaml", "--device", "cpu"]
    assert main(["train-sft", *W, "--encoder", "tiny"]) == 0
    sft = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["evaluate", "--checkpoint", sft, *W, "--tasks", str(REPO / "data" / "benchgen" / "sample.jsonl")]) == 0
    out = capsys.readouterr().out
    summary = out.splitlines()[0]
    assert "random" in summary and "cross-fit oracle" in summary and "headroom" in summary and "composite" in summary
    assert "cross-fit oracle (best single)" in out and "always code-expert" in out
    rep = json.loads((workdir / sft / "reports" / "test.json").read_text())
    u = rep["baselines"]["utility"]
    assert set(u["always"]) == {"math-expert", "code-expert", "general-expert"}
    assert u["oracle"] == pytest.approx(rep["oracle_utility"])
    assert u["random"]["expected"] == pytest.approx(rep["random_utility"])
    assert u["router"] == pytest.approx(rep["router_utility"])
    assert u["cross_fit_oracle"]["mean"] <= u["oracle"]


def test_many_workers_print_the_best_and_count_the_rest():
    """EmbedLLM has 112 workers: the text shows the best ones, best first, and how many it left out;
    the report keeps every worker. The budget table keeps every worker the router chose."""
    from fugu_pipeline.evaluate.baselines import SHOWN_WORKERS, always_lines, baseline_lines, baseline_markdown
    from fugu_pipeline.evaluate.budget_report import budget_lines

    rng = np.random.default_rng(0)
    names = [f"org/m-{i}" for i in range(40)]
    m = rng.random((30, 40))
    rows = baseline_rows(names, m, m, ["d"] * 30, seed=0)
    assert len(rows["utility"]["always"]) == 40
    lines = [x for x in baseline_lines(rows) if x.startswith("  always") or x.startswith("  ...")]
    shown = [x.split()[1] for x in lines if x.startswith("  always")][:SHOWN_WORKERS - 2]  # the utility table
    ranked = sorted(rows["utility"]["always"], key=lambda w: -rows["utility"]["always"][w])
    assert shown == ranked[:SHOWN_WORKERS - 2]
    assert f"... {40 - SHOWN_WORKERS + 2} more workers, down to" in "\n".join(lines)
    md = baseline_markdown(rows)  # the asset's metadata table: the same best workers, and the count
    assert [x.split("|")[1].split()[1] for x in md.splitlines() if x.startswith("| always")][:SHOWN_WORKERS - 2] == \
        ranked[:SHOWN_WORKERS - 2]
    assert md.count("| always ") == 2 * (SHOWN_WORKERS - 2)  # utility and quality tables
    assert f"| ... {40 - SHOWN_WORKERS + 2} more workers |" in md
    few = always_lines({"a": 0.2, "b": 0.9, "c": 0.5})
    assert [x.split()[1] for x in few] == ["b", "c", "a"]
    workers = [{"name": n, "cost_usd_per_1k": 1.0 + i, "share": 0.0, "quality": float(m[:, i].mean())} for i, n in enumerate(names)]
    workers[33]["share"] = 0.4  # routed to, though not among the best
    text = "\n".join(budget_lines({"reference_worker": "org/m-0", "reference_cost_usd_per_1k": 1.0, "cost_model": "x",
                                   "workers": workers, "router_pareto": []}))
    assert "org/m-33" in text and "org/m-0 " in text
    assert f"... {40 - SHOWN_WORKERS + 2} more workers the router never chose" in text
