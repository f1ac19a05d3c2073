"""One promotion policy, read by every command through one function, and the rule of the project's
own runs: Dagster tells them by how it launched them (a sensor, a schedule, a backfill, the UI, the
main job of `fugu-lite pipeline`), so a backfill on the day of a promotion can promote while an
outside submitter stays at one attempt a day, whatever name it submits under."""

from __future__ import annotations

import json
import shutil
import time

import dagster as dg
import pytest
import yaml

from fugu_pipeline.defs.harness import policy_for
from fugu_pipeline.defs.partitions import MAIN_JOB_TAGS
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.evaluate import promotion
from fugu_pipeline.evaluate.promotion import PolicyError
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.harness_data import controlled_data, routing_head

KING, CHALLENGER, OTHER = (0, 1, 0), (0, 1, 2), (1, 0, 2)
DAY = 86400


def policy_of_a_run(project, tags: dict, **overrides):
    """The policy a promotion asset reads in a Dagster run launched with `tags` (what the daemon
    gives a sensor's, schedule's or backfill's run, the UI its launches, `fugu-lite pipeline` its job)."""

    @dg.op
    def read_policy(context, pipeline: PipelineResource):
        return policy_for(pipeline, context=context, **overrides)

    @dg.job(resource_defs={"pipeline": PipelineResource(project_dir=str(project))})
    def promotion_policy():
        read_policy()

    with dg.instance_for_test() as instance:
        result = promotion_policy.execute_in_process(instance=instance, tags=tags)
    return result.output_for_node("read_policy")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "promotion.yaml", tmp_path / "configs" / "promotion.yaml")  # as a clone ships it
    return tmp_path


@pytest.mark.parametrize("tags", [MAIN_JOB_TAGS, {"dagster/sensor_name": "benchgen_batch_sensor"},
                                  {"dagster/schedule_name": "openrouter_catalog_schedule"},
                                  {"dagster/backfill": "abcdefgh"}, {"dagster/from_ui": "true"}])
def test_the_project_s_own_runs_follow_the_project_runs_rule(project, tags):
    assert policy_of_a_run(project, tags).gates.rate_limit_s == 0
    # the same overrides as every caller: the asset's own config still wins over the file
    assert policy_of_a_run(project, tags, rate_limit_s=3600).gates.rate_limit_s == 3600


def test_a_run_dagster_did_not_launch_for_the_project_follows_the_outside_rule(project):
    assert policy_of_a_run(project, {"fugu/launched_by": "someone else"}).gates.rate_limit_s == DAY
    assert policy_of_a_run(project, {}).gates.rate_limit_s == DAY
    assert promotion.project_policy(project).gates.rate_limit_s == DAY  # validate, evaluate-roles, preflight


def test_a_same_day_backfill_promotes_while_an_outside_submitter_stays_rate_limited(project):
    n_eval = 700  # the controlled data's eval rows: a contested 3% of them is a composite gain of 0.03
    data = controlled_data(n_test=1000, contested_eval=round(0.03 * n_eval))
    models = project / "models"
    # the morning: the batch sensor's run promotes the first king
    first = promote_best([str(routing_head(models, data, KING, method="sft"))], data, models,
                         policy_of_a_run(project, {"dagster/sensor_name": "benchgen_batch_sensor"}))
    assert first["promoted"], first["reasons"]
    # an outside submitter's attempt, through the policy `fugu-lite validate` reads
    outside = promotion.project_policy(project)
    alice = routing_head(models, data, OTHER, method="rl")
    assert promote_best([str(alice)], data, models, outside, submitter="alice")["reasons"][0].startswith("PASS rate limit")
    # an hour later, a backfill of a new batch: the project's own run, a better head, promoted
    later = time.time() + 3600
    challenger = routing_head(models, data, CHALLENGER, method="es")
    backfill = promote_best([str(challenger)], data, models, policy_of_a_run(project, {"dagster/backfill": "newbatch"}),
                            now=later)
    print("\n" + "\n".join(backfill["reasons"]))
    assert backfill["reasons"][0] == "PASS rate limit: off" and backfill["promoted"], backfill["reasons"]
    # the outside submitter, the same day: still one attempt a day, under its own name or the pipeline's
    again = routing_head(models, data, OTHER, method="rl", noise=0.05, seed=3)
    for name in ("alice", "pipeline"):
        out = promote_best([str(again)], data, models, outside, submitter=name, now=later)
        assert out["reasons"][0].startswith(f"FAIL rate limit: '{name}' made an attempt at") and not out["promoted"]
    # a run started from a script (no launch tag) is no project run: the pipeline's name counts for nothing
    untagged = promote_best([str(again)], data, models, policy_of_a_run(project, {}), now=later)
    assert untagged["reasons"][0].startswith("FAIL rate limit: 'pipeline' made an attempt at")


def test_the_project_runs_rule_is_in_the_shipped_file_and_a_named_file_must_exist(project):
    shipped = yaml.safe_load((REPO / "configs" / "promotion.yaml").read_text())
    assert shipped["project_runs"] == {"rate_limit_s": 0} and shipped["gates"]["rate_limit_s"] == DAY
    with pytest.raises(PolicyError, match="elsewhere.yaml"):
        promotion.project_policy(project, "elsewhere.yaml")
    (project / "configs" / "promotion.yaml").write_text("project_runs:\n  rate_limit_s: 600\n")
    assert promotion.project_policy(project, project_run=True).gates.rate_limit_s == 600
    (project / "configs" / "promotion.yaml").write_text("project_runs:\n  rate_limit: 600\n")
    with pytest.raises(PolicyError, match="rate_limit"):
        promotion.project_policy(project)


@pytest.mark.parametrize("text, field", [
    ("min_gain_over_best_fixed: -.inf\n", "min_gain_over_best_fixed"),  # before: every challenger passed that gate
    ("min_gain_over_best_fixed: .nan\n", "min_gain_over_best_fixed"),  # before: none did, and nothing said why
    ("margin: .inf\n", "margin"),
    ("gates:\n  rate_limit_s: .inf\n", "gates.rate_limit_s"),
    ("composite:\n  live_weight: .inf\n", "composite.live_weight"),
])
def test_a_policy_with_an_infinite_or_nan_number_is_refused_naming_the_field(project, text, field):
    (project / "configs" / "promotion.yaml").write_text(text)
    with pytest.raises(PolicyError) as err:
        promotion.project_policy(project)
    assert field in str(err.value) and "finite" in str(err.value) and "promotion.yaml" in str(err.value)


# ------------------------------------------------------------------ evaluate-roles --promote

@pytest.fixture(scope="module")
def roles_project(tmp_path_factory):
    """A project with the roles tasks and the mock pool with roles, one scripted coordinator."""
    import torch

    from fugu_pipeline.policies.coordinator.project import open_run, project_tasks, roles_encoder_settings
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.testing.roles_batch import write_roles_batch
    from fugu_pipeline.testing.roles_serving import scripted_coordinator
    from fugu_pipeline.policies.coordinator.train import load_roles_config
    from fugu_pipeline.workers.config import load_workers_config

    torch.set_num_threads(1)
    project = tmp_path_factory.mktemp("roles-policy") / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "workers.mock-roles.yaml", project / "configs" / "workers.mock-roles.yaml")
    (project / "configs" / "train_roles.yaml").write_text("max_length: 256\n")
    write_roles_batch(project / "data" / "benchgen" / "roles.jsonl", n_per_family=20)
    tasks = project_tasks(project / "data" / "benchgen", None)
    cfg = load_roles_config(project / "configs" / "train_roles.yaml")
    enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
    with open_run(load_workers_config(project / "configs" / "workers.mock-roles.yaml"), enc.settings,
                  project / "data" / "trajectories", tasks, cfg, encoder=enc) as run:
        coordinator = scripted_coordinator(project / "models", run, [t for t in tasks if t.split == "train"][:8],
                                           [("planner", "worker")])
    enc.close()
    return project, coordinator


@pytest.mark.slow
def test_evaluate_roles_promote_reads_the_project_s_policy_file(roles_project, capsys):
    """Before: `evaluate-roles --promote` judged with the built-in defaults, whatever
    configs/promotion.yaml said: with `rate_limit_s: 0` there, its second attempt of the day was
    still refused by the rate limit."""
    from fugu_pipeline.cli import main

    project, coordinator = roles_project
    (project / "configs" / "promotion.yaml").write_text(yaml.safe_dump(
        {"gates": {"rate_limit_s": 0}, "composite": {"overfit_rule": "guarded"}}))
    args = ["evaluate-roles", "--project-dir", str(project), "--workers", "configs/workers.mock-roles.yaml",
            "--checkpoint", str(coordinator), "--device", "cpu", "--promote"]
    outs = []
    for _ in range(2):  # two attempts the same day: both judged (the second, a copy of the first, as a duplicate)
        assert main(args) == 0, capsys.readouterr().err
        outs.append(capsys.readouterr().out.splitlines())
    history = [json.loads(x) for x in (project / "models" / "promoted" / "roles-history.jsonl").read_text().splitlines()]
    assert [r.get("rate_limited", False) for r in history] == [False, False], history[-1]["reasons"][0]
    assert all("PASS rate limit: off" in out for out in outs)
    assert any(r.startswith("FAIL duplicate: behaves like roles") for r in history[1]["reasons"])
    # the same file, another rule: what `validate` would apply, evaluate-roles applies
    (project / "daily.yaml").write_text(yaml.safe_dump({"gates": {"rate_limit_s": DAY}}))
    capsys.readouterr()
    assert main([*args, "--policy", "daily.yaml"]) == 0
    last = json.loads((project / "models" / "promoted" / "roles-history.jsonl").read_text().splitlines()[-1])
    assert last["rate_limited"] is True and last["reasons"][0].startswith("FAIL rate limit: 'pipeline' made an attempt at")
    # a named policy file that is not there is one line before anything is called
    assert main([*args, "--policy", "missing.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.yaml" in err[0]


@pytest.mark.parametrize("override, field", [({"margin": float("nan")}, "margin"), ({"rate_limit_s": -5}, "gates.rate_limit_s"),
                                             ({"max_train_gap": float("inf")}, "max_train_gap")])
def test_an_override_out_of_range_is_one_line_naming_the_field(override, field):
    # a run config's margin or a flag's rate limit: before, pydantic's several lines and its URL
    with pytest.raises(PolicyError) as err:
        promotion.load_policy(None, **override)
    assert str(err.value).startswith(f"promotion policy: field '{field}': ") and "\n" not in str(err.value), str(err.value)
