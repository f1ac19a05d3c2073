"""The coordinator's assets through Dagster, the way `fugu-lite pipeline --roles` runs them: the whole
graph on a project holding the two task families and the mock pool with roles, then
`router_roles` -> `eval_report_roles`; a second run calls no worker (every trajectory is stored)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from fugu_pipeline.testing.roles_batch import write_roles_batch
from fugu_pipeline.train.pointer import ROLES_POINTER, read_pointer

from .conftest import REPO

SMALL = {"generations": 6, "tasks_per_generation": 10, "explore_tasks": 8, "val_every": 3, "val_tasks": 12,
         "max_length": 256}
ONE_STEP_SMALL = {"seed": 0, "folds": 3, "features": {"layer_sets": "off", "prompt_rules": "off", "lexical": True},
                  "heads": {"domain_prior": {"m": [20]}, "knn": {"k": [30], "prior_weight": [0], "same_domain_bonus": [0]},
                            "ridge": {"alpha": [100], "inputs": ["all"]}},
                  "cascade": {"enabled": "off"}}


@pytest.mark.slow
def test_pipeline_with_roles_trains_reports_and_promotes_then_resumes(tmp_path, monkeypatch):
    from fugu_pipeline.defs.runner import run_pipeline

    project = tmp_path / "project"
    shutil.copytree(REPO / "configs", project / "configs")
    shutil.copy(REPO / "dagster.yaml", project / "dagster.yaml")
    write_roles_batch(project / "data" / "benchgen" / "roles.jsonl", n_per_family=40)
    cfg = yaml.safe_load((project / "configs" / "train_roles.yaml").read_text())
    (project / "configs" / "train_roles.yaml").write_text(yaml.safe_dump({**cfg, **SMALL}))
    # the one-step router the report compares with: a small search (its own tests cover the full one)
    (project / "configs" / "train.yaml").write_text(yaml.safe_dump(ONE_STEP_SMALL))
    monkeypatch.setenv("DAGSTER_HOME", str(project))
    monkeypatch.chdir(project)
    quiet = lambda s: None  # noqa: E731

    first = run_pipeline(project, "configs/workers.mock-roles.yaml", encoder="tiny", roles=True, echo=quiet)
    trained, report = first["router_roles"], first["eval_report_roles"]
    ckpt = project / "models" / "roles"
    assert len(list(ckpt.iterdir())) == 1 and trained["param_count"] == 12 * 64  # a worker softmax per role
    assert sum(trained["worker_calls_this_run"].values()) > 0
    rep = json.loads((next(ckpt.iterdir()) / "reports" / "roles-test.json").read_text())
    assert {"coordinator", "one_step", "best_fixed"} <= set(rep["policies"])  # the promoted one-step router too
    assert {d["domain"] for d in rep["per_domain"]} == {"lookup", "multistep", "checking"} and len(rep["verdicts"]) == 3
    assert all("coordinator_roles" in d for d in rep["per_domain"])  # how each family used the roles
    assert rep["policies"]["coordinator"]["accuracy"]["n"] == rep["n_tasks"] > 0
    history = (project / "models" / "promoted" / "roles-history.jsonl").read_text().splitlines()
    assert len(history) == 1 and json.loads(history[0])["reasons"]
    assert (read_pointer(project / "models", ROLES_POINTER) is not None) == report["promoted"]

    again = run_pipeline(project, "configs/workers.mock-roles.yaml", encoder="tiny", roles=True, echo=quiet)
    assert {"router_roles", "eval_report_roles"} <= set(again.fresh)  # nothing changed: skipped, nothing called
    shutil.rmtree(next(ckpt.iterdir()))  # its checkpoint gone: trained again, every session replayed from the store
    again = run_pipeline(project, "configs/workers.mock-roles.yaml", encoder="tiny", roles=True, echo=quiet)
    assert "router_roles" not in again.fresh
    assert again["router_roles"]["worker_calls_this_run"] == {}  # replayed from the trajectory store
    assert again["router_roles"]["checkpoint"] == trained["checkpoint"]  # same seed, same checkpoint
    assert len(list(ckpt.iterdir())) == 1
