"""The harness the way it runs: the main job (`fugu-lite pipeline`, every asset through Dagster on
the project's instance, mock pool, tiny encoder) shows every baseline row and the composite with
its terms in the eval_report_* metadata, decides promotion through the gates, trains and reports
the triage head; run again the same day, the promotion attempt is rate limited."""

import json
import shutil

import pytest

from fugu_pipeline.cli import main
from fugu_pipeline_tests.conftest import REPO

FAST = {"train_sft.yaml": "epochs: 30\n", "train_rl.yaml": "epochs: 8\n", "train_es.yaml": "generations: 40\nval_every: 10\n"}


@pytest.fixture
def project(project, monkeypatch):
    for name, text in FAST.items():
        (project / "configs" / name).write_text(text)
    shutil.copy(REPO / "configs" / "promotion.yaml", project / "configs" / "promotion.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(project))
    monkeypatch.chdir(project)
    return project


@pytest.mark.slow
def test_main_job_shows_baselines_composite_gates_and_triage(project, capsys):
    from fugu_pipeline.defs.runner import run_pipeline

    results = run_pipeline(project, "configs/workers.mock.yaml", encoder="tiny", echo=lambda m: None)
    es = results["eval_report_es"]
    for row in ("always math-expert", "always code-expert", "always general-expert", "random (100 seeds)",
                "| oracle |", "| cross-fit oracle |", "cross-fit oracle by domain", "| headroom |", "| router |"):
        assert row in es["baselines"], row
    assert 0 <= es["composite"] <= 1 and es["cross_fit_oracle_utility"] <= es["oracle_utility"]
    terms = es["composite_terms"]
    for b in ("| code |", "| general |", "| math |"):
        assert b in terms
    assert "live: one call per task (route, call, grade)" in terms
    promo = results["promoted_router"]
    assert promo["promoted"] and "PASS rate limit" in promo["decision"] and "PASS receipt" in promo["decision"]
    assert "challenger composite" in promo["decision"] and 0 < promo["composite"] <= 1
    tri = results["eval_report_triage"]
    assert tri["domain_accuracy"] is not None and "domain confusion" in tri["per_domain"]
    report = json.loads(open(es["report"]).read())
    assert report["composite"]["challenger"]["benchmarks"][0]["n_live"] > 0 and "baselines" in report

    # the main command again, the same day: nothing new is called or encoded, and the promotion
    # attempt is refused by the rate limit (one a day), recorded but not counted as an attempt
    assert main(["pipeline", "--encoder", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "promotion: no change" in out and "FAIL rate limit: 'pipeline' made an attempt at" in out
    assert "composite" in out and "cross-fit oracle" in out and "triage: domain accuracy" in out
    last = json.loads((project / "models" / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["rate_limited"] is True
