"""The multi-turn report's answer-aware cascade baseline, through `fugu-lite evaluate-roles` on a small
project with the mock pool with roles and the tiny encoder: per family and overall, the cascade's
accuracy with its interval, turns (= calls) and cost per correct answer, and the paired coordinator −
cascade line; the promoted cascade by default; no cascade is one line, not a failure; a checkpoint
that is not a cascade, given with --cascade, is one line naming it."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from fugu_pipeline.testing.roles_batch import write_roles_batch
from fugu_pipeline.train.pointer import write_pointer

from .conftest import REPO

POOL = ["fast-solver", "planner", "checker"]  # configs/workers.mock-roles.yaml
FAMILIES = ("checking", "lookup", "multistep")
WORKERS = "configs/workers.mock-roles.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A project: 20 tasks a family (5 held out each), a coordinator that lets the planner answer
    alone in one turn (fitted to that script), and a cascade `[fast-solver, planner] stop if 2 agree
    or verifier ≥ 0.99 → [checker]` whose answers are read as each task's grader reads them."""
    from fugu_pipeline.policies.coordinator.project import open_run, project_tasks, roles_encoder_settings
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
    from fugu_pipeline.testing.roles_serving import scripted_coordinator
    from fugu_pipeline.policies.coordinator.train import load_roles_config
    from fugu_pipeline.workers.config import load_workers_config

    torch.set_num_threads(1)
    project = tmp_path_factory.mktemp("roles-cascade") / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copy(REPO / WORKERS, project / WORKERS)
    (project / "configs" / "train_roles.yaml").write_text("max_length: 256\n")
    write_roles_batch(project / "data" / "benchgen" / "roles.jsonl", n_per_family=20)
    tasks = project_tasks(project / "data" / "benchgen", None)
    cfg = load_roles_config(project / "configs" / "train_roles.yaml")
    enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
    with open_run(load_workers_config(project / WORKERS), enc.settings, project / "data" / "trajectories", tasks, cfg,
                  encoder=enc) as run:
        coordinator = scripted_coordinator(project / "models", run, [t for t in tasks if t.split == "train"][:12],
                                           [("planner", "worker")])
    enc.close()
    cascade = build_cascade_checkpoint(project / "models", tmp_path_factory.mktemp("emb"), workers=POOL, answer_kinds={})
    return project, coordinator, cascade


def evaluate_roles(project, coordinator, capsys, *more) -> tuple[int, list[str], str]:
    from fugu_pipeline.cli import main

    code = main(["evaluate-roles", "--project-dir", str(project), "--workers", WORKERS, "--checkpoint", str(coordinator),
                 "--device", "cpu", *more])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def test_the_report_shows_the_cascade_per_family_with_its_turns_cost_and_paired_difference(world, capsys):
    """Before: `evaluate-roles` had no cascade option and its report no cascade line at all."""
    project, coordinator, cascade = world
    code, lines, err = evaluate_roles(project, coordinator, capsys, "--cascade", str(cascade))
    assert code == 0, err
    print("\n".join(lines))
    shown = [x for x in lines if re.match(r"\s*answer-aware cascade\s+accuracy \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]  "
                                          r"turns/correct (\d+\.\d{2}|-)  cost/correct (\$\d\.\d{5}|-)  mean turns", x)]
    assert len(shown) == 1 + len(FAMILIES)  # overall, then each family
    assert sum("coordinator − answer-aware cascade: accuracy " in x for x in lines) == 1 + len(FAMILIES)
    assert any(x.startswith(f"answer-aware cascade: given ({cascade}): [fast-solver, planner] stop if 2 agree") for x in lines)

    rep = json.loads((coordinator / "reports" / "roles-test.json").read_text())
    assert rep["cascade"]["source"] == f"given ({cascade})"
    families = {d["domain"]: d for d in rep["per_domain"]}
    assert set(families) == set(FAMILIES)
    for scope in [rep, *families.values()]:
        c, coord = scope["policies"]["cascade"], scope["policies"]["coordinator"]
        # every held-out task once, each reaching step 1 (two calls) and maybe step 2 (a third)
        assert c["sessions"] == coord["sessions"] > 0 and 2.0 <= c["mean_turns"] <= 3.0
        assert sum(c["stop_reasons"].values()) == c["sessions"] and set(c["stop_reasons"]) <= {"step 1", "step 2"}
        assert c["turns_per_correct"] == c["calls_per_correct"]  # a cascade's turns are its calls
        correct = round(c["mean_turns"] * c["sessions"] / c["turns_per_correct"]) if c["turns_per_correct"] else 0
        assert correct <= c["sessions"] and (c["cost_per_correct_usd"] is None) == (correct == 0)
        if correct:
            assert c["cost_per_correct_usd"] == pytest.approx(c["mean_cost_usd"] * c["sessions"] / correct)
        # paired on the same tasks: the mean difference is the difference of the accuracies
        gain = scope["paired"]["coordinator_vs_cascade"]["accuracy"] if scope is rep else scope["coordinator_vs_cascade"]
        assert gain["mean"] == pytest.approx(coord["accuracy"]["mean"] - c["accuracy"]["mean"])
        assert gain["low"] <= gain["mean"] <= gain["high"]
    # the mock pool: on lookup the two cheap workers are right ~95%/90% of the time and agree, so the
    # cascade stops at step 1 more often there than on checking (right about half the time)
    assert (families["lookup"]["policies"]["cascade"]["stop_reasons"].get("step 1", 0)
            > families["checking"]["policies"]["cascade"]["stop_reasons"].get("step 1", 0))


def test_the_promoted_cascade_is_the_default_and_none_is_one_line(world, capsys):
    project, coordinator, cascade = world
    models = project / "models"
    (models / "promoted" / "current.json").unlink(missing_ok=True)
    code, lines, err = evaluate_roles(project, coordinator, capsys)
    assert code == 0, err
    assert [x for x in lines if x.startswith("answer-aware cascade")] == [
        f"answer-aware cascade: none to compare with (promoted: no promoted router in {models}: materialize "
        "`promoted_router` (or run `fugu-lite pipeline`), or pass a checkpoint directory explicitly)"]
    assert "cascade" not in json.loads((coordinator / "reports" / "roles-test.json").read_text())["policies"]

    manifest = json.loads((cascade / "manifest.json").read_text())
    write_pointer(models, {"checkpoint": str(cascade.relative_to(models)), "method": manifest["method"],
                           "content_hash": manifest["content_hash"]})
    code, lines, err = evaluate_roles(project, coordinator, capsys)
    assert code == 0, err
    assert any(x.startswith(f"answer-aware cascade: promoted ({cascade}): ") for x in lines)
    assert sum(bool(re.match(r"\s*answer-aware cascade\s+accuracy ", x)) for x in lines) == 1 + len(FAMILIES)


def test_a_checkpoint_that_is_not_a_cascade_is_one_line(world, capsys):
    project, coordinator, _ = world
    code, lines, err = evaluate_roles(project, coordinator, capsys, "--cascade", str(coordinator))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"fugu-lite evaluate-roles: --cascade {coordinator}: {coordinator} holds a 'roles")
    assert "not a cascade" in err
