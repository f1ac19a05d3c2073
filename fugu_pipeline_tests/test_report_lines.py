"""The lines `fugu-lite evaluate` prints say what they measure, and nothing that is not an error reads
like one:

- a `--workers` YAML holding only the utility weights (what imported data is evaluated with) gives a
  note that the live term was not measured, not a pydantic `field 'workers': Field required` line;
- the expected-cost model shows each worker's per-request part too, so a worker whose cost does not
  grow with the prompt (a flat fee, mostly output tokens) is not shown at "$0/M prompt tok" as if free;
- a tag's figures (`id`, `ood`, ...) say how they are averaged, and come both over the tag's rows and
  over its domains (each domain's mean, then their mean), as routing papers report a group of sets.
"""

import json
import random
import re

import numpy as np
import pytest

from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report
from fugu_pipeline.route.expected_cost import fit_expected_cost
from fugu_pipeline_tests.test_budget_cli import rows as budget_rows
from fugu_pipeline_tests.test_budget_cli import run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("report-lines")
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in budget_rows()))
    (work / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (work / "sft.yaml").write_text("head: quality\nepochs: 10\n")
    common = ["--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--device", "cpu", "--encoder", "tiny",
              "--cache-dir", str(work / "emb"), "--work-dir", str(work / "imports")]
    code, out = run("train-sft", *common, "--config", str(work / "sft.yaml"), "--prompt-rules", "off",
                    "--output", str(work / "models"))
    assert code == 0
    return work, out.strip().splitlines()[-1], common


def test_a_reward_only_yaml_gives_a_note_about_the_live_term_not_an_error_line(trained, tmp_path, monkeypatch, capsys):
    work, ckpt, common = trained
    (tmp_path / "data" / "benchgen").mkdir(parents=True)  # a project folder: the live term looks for its tasks
    monkeypatch.chdir(tmp_path)
    code, out = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(tmp_path / "rep.json"))
    err = capsys.readouterr().err
    assert code == 0
    assert "Field required" not in err and "field 'workers'" not in err
    assert f"live term: not measured ({work / 'w.yaml'} gives the utility weights only, no workers to call" in err


def test_a_tag_is_printed_over_its_rows_and_over_its_domains(trained, capsys):
    work, ckpt, common = trained
    code, out = run("evaluate", "--checkpoint", ckpt, *common, "--output", str(work / "rep.json"))
    assert code == 0, capsys.readouterr().err
    assert "a tag's figures averaged over its rows, and over its domains (macro" in out
    assert re.search(r"^\s+tag\s+n\s+router\s+fixed\s+oracle\s+domains\s+macro router", out, re.M)
    rep = json.loads((work / "rep.json").read_text())
    for r in rep["per_tag"]:
        assert r["averaged"] == "over rows" and r["macro"]["domains"] == 2  # math and code in both tags


def test_macro_over_domains_weighs_each_domain_once():
    # tag "id": domain big (90 rows, the router right on every one) and small (10 rows, wrong on every one)
    n_big, n_small = 90, 10
    domains = ["big"] * n_big + ["small"] * n_small + ["other"] * 20
    quality = np.array([[1.0, 0.0]] * n_big + [[0.0, 1.0]] * n_small + [[1.0, 0.0]] * 20)
    scores = np.tile([1.0, 0.0], (len(domains), 1))  # always worker a
    tags = [("id",)] * (n_big + n_small) + [("ood",)] * 20
    inp = EvalInputs(worker_ids=["a", "b"], utility=quality, scores=scores, train_utility=quality, domains=domains,
                     quality=quality, train_quality=quality, tags=tags)
    rep = evaluation_report(inp, n_boot=50)
    tag = {r["tag"]: r for r in rep["per_tag"]}["id"]
    assert tag["n"] == 100 and tag["router_quality"] == pytest.approx(0.9)  # over rows: the big set dominates
    assert tag["macro"]["domains"] == 2 and tag["macro"]["router_quality"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert tag["macro"]["oracle_quality"] == pytest.approx(1.0)


def test_a_flat_fee_worker_is_shown_at_its_cost_per_request_not_at_zero():
    # the mock pool's kind of cost: a price per call, drawn ±20% per cell, not growing with the prompt
    rng = random.Random(0)
    prompts = [" ".join("word" for _ in range(rng.randint(5, 400))) for _ in range(300)]
    tokens = np.array([-(-len(p) // 4) for p in prompts], dtype=float)
    cost = np.stack([tokens * 0.2e-6, [0.004 * (0.8 + 0.4 * rng.random()) for _ in prompts]], axis=1)
    model = fit_expected_cost(prompts, ["general"] * len(prompts), cost, ["per-token", "flat-fee"])
    line = model.describe()
    assert "per-token $0.2/M prompt tok" in line and "per-token $0.2/M prompt tok +" not in line  # no spurious offset
    m = re.search(r"flat-fee \$([0-9.e-]+)/M prompt tok \+ \$([0-9.e-]+)/request", line)
    assert m, line
    assert float(m.group(2)) == pytest.approx(0.004, rel=0.05)  # its cost is all per request
    assert model.predict(prompts[:1])[0, 1] == pytest.approx(float(m.group(2)) + float(m.group(1)) * 1e-6 * tokens[0],
                                                              rel=0.01)  # the line is the model that routes
