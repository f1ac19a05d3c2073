"""Incremental by Dagster's versions: what `fugu-lite pipeline` runs again, and what it skips.

On one project (the mock pool, short training, 120 tasks), run once cold, then:

- again with nothing changed: no Dagster run starts, no trainer or encoder is called, no worker
  answers, no file under models/ or data/ changes, and every step prints why it was skipped;
- with the utility's cost weight changed in the worker YAML's `reward:` block: exactly the matrix and
  what is downstream of it is materialized again (not the batch, not the collection);
- with the CMA-ES trainer's YAML changed: exactly `router_es`, its report and the promotion.

And the single assets on a fresh instance, as the `dagster` command line runs them: one batch's
`tasks` partition materializes alone; `router_es` before `router_rl` is one line naming what to
materialize first; and a step refuses an input that is stale, in one line.
"""

import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from fugu_pipeline.defs.runner import DOWNSTREAM, run_pipeline
from fugu_pipeline_tests.conftest import REPO, new_project, short_training

DAGSTER = str(REPO / ".venv" / "bin" / "dagster")
# every function that trains (or fits) something, by module: counted while the pipeline runs in-process
TRAINERS = {"fugu_pipeline.policies.oneshot.sft": "train_sft", "fugu_pipeline.policies.oneshot.rl": "train_rl", "fugu_pipeline.policies.oneshot.es": "train_es",
            "fugu_pipeline.policies.oneshot.fit": "select_heads", "fugu_pipeline.policies.cascade.train": "train_cascade",
            "fugu_pipeline.policies.triage.train": "train_triage", "fugu_pipeline.features.cache": "embed_prompts"}

MATH_PREAMBLE = ("You are taking a maths test. Read the question below carefully, work it out step by step in your head, "
                 "and then reply with the final number only, without units, words or any explanation of how you got it.\n"
                 "Example: What is 2 + 2? Answer: 4\n")


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """A project after one cold `fugu-lite pipeline` run (in this process, as the command runs it)."""
    project = new_project(tmp_path_factory.mktemp("rerun"))
    rows = [json.loads(line) for line in (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:120]]
    for row in rows:  # a preamble every math prompt shares: the SFT stage chooses its prompt rules on validation
        row["prompt"] = MATH_PREAMBLE + row["prompt"] if row["domain"] == "math" else row["prompt"]
    (project / "data" / "benchgen" / "sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    short_training(project, cascade=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(project))
        elsewhere = tmp_path_factory.mktemp("caller")  # the workers path is the project's; the caller's cwd comes back
        mp.chdir(elsewhere)
        run_pipeline(project, "configs/workers.mock.yaml", encoder="tiny", echo=lambda s: None)
        assert Path.cwd() == elsewhere
    return project


@pytest.fixture
def proj(cold, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(cold))
    monkeypatch.chdir(cold)
    return cold


def calls(monkeypatch) -> dict[str, int]:
    """Count the calls of every trainer and of the encoder's cache fill while the pipeline runs."""
    import importlib

    counted: dict[str, int] = {}
    for module, name in TRAINERS.items():
        mod = importlib.import_module(module)
        real = getattr(mod, name)

        def counting(*a, _real=real, _name=name, **kw):
            counted[_name] = counted.get(_name, 0) + 1
            return _real(*a, **kw)

        monkeypatch.setattr(mod, name, counting)
    return counted


def files(project: Path) -> dict[str, tuple[int, int]]:
    """Every file the pipeline writes (checkpoints, reports, records, the matrix, the cache, the
    responses, the ledger) with its size and modification time."""
    out = {}
    for top in ("models", "data"):
        for p in (project / top).rglob("*"):
            if p.is_file():
                st = p.stat()
                out[str(p.relative_to(project))] = (st.st_size, st.st_mtime_ns)
    return out


def pipeline(project: Path) -> list[str]:
    lines: list[str] = []
    run_pipeline(project, "configs/workers.mock.yaml", encoder="tiny", echo=lines.append)
    return lines


def materialized_since(project: Path, cursor: int) -> set[str]:
    with dg.DagsterInstance.from_config(str(project)) as instance:
        keys = [k for k in instance.get_asset_keys()]
        return {k.to_user_string() for k in keys
                if instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=k, after_storage_id=cursor), limit=1).records}


def latest_storage_id(project: Path) -> int:
    with dg.DagsterInstance.from_config(str(project)) as instance:
        records = [instance.fetch_materializations(k, limit=1).records for k in instance.get_asset_keys()]
        return max(r[0].storage_id for r in records if r)


def n_runs(project: Path) -> int:
    with dg.DagsterInstance.from_config(str(project)) as instance:
        return len(instance.get_runs())


@pytest.mark.slow
def test_a_rerun_with_nothing_changed_starts_no_run_trains_nothing_and_says_why(proj, monkeypatch):
    before, runs = files(proj), n_runs(proj)
    counted = calls(monkeypatch)
    lines = pipeline(proj)
    assert counted == {}, f"trained or encoded again: {counted}"
    assert n_runs(proj) == runs, "a Dagster run was started"
    changed = sorted(k for k, v in files(proj).items() if before.get(k) != v)
    assert not changed, f"files written by a re-run that changed nothing: {changed[:10]}"
    steps = [line.split()[0] for line in lines if line.startswith("  ")]
    skipped = {line.split()[0]: line for line in lines if "skipped, fresh:" in line}
    assert set(steps) == set(skipped), lines  # every step said it was skipped, and why
    for step in ["tasks[sample]", "reward_matrix", *DOWNSTREAM]:
        assert "unchanged since run " in skipped[step], skipped.get(step)


@pytest.mark.slow
def test_changing_the_reward_weight_runs_exactly_the_matrix_and_what_is_downstream(proj, monkeypatch):
    pipeline(proj)  # fresh first (a no-op after the cold run)
    cursor, before = latest_storage_id(proj), files(proj)
    path = proj / "configs" / "workers.mock.yaml"
    text = path.read_text()
    assert "  cost_weight: 0.1\n" in text
    path.write_text(text.replace("  cost_weight: 0.1\n", "  cost_weight: 0.2\n"))
    counted = calls(monkeypatch)
    lines = pipeline(proj)
    assert materialized_since(proj, cursor) == {"reward_matrix", *DOWNSTREAM}, lines
    # (the cascade is off in this project's train.yaml: router_cascade records the skip without fitting)
    assert {"train_sft", "train_rl", "train_es", "select_heads", "train_triage"} <= set(counted), counted
    assert "train_cascade" not in counted, counted
    assert counted["train_rl"] == counted["train_es"] == 1, counted  # (SFT with and without its prompt rules)
    assert not [k for k in files(proj) if k.startswith("data/responses") and files(proj)[k] != before.get(k)]  # no call
    why = {line.split()[0]: line for line in lines}
    assert "config_reward changed" in why["reward_matrix"] and "skipped, fresh" in why["tasks[sample]"], lines


@pytest.mark.slow
def test_changing_a_trainer_yaml_runs_exactly_what_reads_it(proj, monkeypatch):
    pipeline(proj)
    cursor = latest_storage_id(proj)
    (proj / "configs" / "train_es.yaml").write_text("generations: 12\nval_every: 4\n")
    counted = calls(monkeypatch)
    lines = pipeline(proj)
    assert materialized_since(proj, cursor) == {"router_es", "eval_report_es", "promoted_router"}, lines
    assert {k: v for k, v in counted.items() if k != "embed_prompts"} == {"train_es": 1}, counted  # (reports read the cache)
    assert any(line.split()[0] == "router_es" and "config_train_es changed" in line for line in lines), lines


@pytest.mark.slow
def test_a_responses_file_edited_by_hand_runs_its_partition_and_the_matrix_and_calls_nothing(proj, monkeypatch):
    """A grade fixed by hand in one worker's responses file: that partition runs again (no call: every
    cell is there), records the file's new version, and the matrix and what reads it are built again."""
    pipeline(proj)
    cursor, before = latest_storage_id(proj), files(proj)
    path = sorted((proj / "data" / "responses").rglob("*.jsonl"))[0]
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    row["quality"] = 1.0 - float(row["quality"])  # the grade, corrected
    path.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    said = pipeline(proj)
    part = f"responses[{path.parent.name}|{path.stem}]"
    why = next(line for line in said if line.split()[0] == part)
    assert f"stale: {path.name} changed on disk since run " in why, said
    assert {"responses", "reward_matrix", *DOWNSTREAM} <= materialized_since(proj, cursor), said
    ledger = "data/ledger/costs.jsonl"
    assert files(proj).get(ledger) == before.get(ledger), "a worker was called (the cost ledger grew)"
    assert "skipped, fresh" in next(line for line in pipeline(proj) if line.split()[0] == part)  # then fresh again


def dagster_cli(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "FUGU_"))}
    env.update(DAGSTER_HOME=str(home), FUGU_PROJECT_DIR=str(project), FUGU_ENCODER="tiny")
    return subprocess.run([DAGSTER, "asset", "materialize", "-m", "fugu_pipeline.definitions", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a `dagster` command: its start alone takes more than ten seconds on 2 cores
def test_one_batch_partition_materializes_alone_on_a_fresh_instance(project, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = dagster_cli(project, home, "--select", "tasks", "--partition", "sample")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("tasks"))
        assert event is not None and event.asset_materialization.partition == "sample"
        assert event.asset_materialization.metadata["tasks"].value == 300


@pytest.mark.slow  # a `dagster` command: its start alone takes more than ten seconds on 2 cores
def test_an_asset_before_its_input_is_one_line_naming_what_to_materialize_first(project, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = dagster_cli(project, home, "--select", "router_es")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    said = [line for line in text.splitlines() if "router_es needs router_rl" in line]
    assert said and "materialize it first" in said[0] and "--select router_rl" in said[0], text[-3000:]
    assert "FileNotFoundError" not in text and "Traceback" not in text, text[-3000:]
    assert not (project / "models").exists()  # nothing half-written


@pytest.mark.slow
def test_a_step_refuses_a_stale_input_in_one_line(proj):
    from fugu_pipeline.defs.assemble import build_defs

    pipeline(proj)
    (proj / "configs" / "train_rl.yaml").write_text("epochs: 3\n")  # router_rl is stale now, not yet rebuilt
    defs = build_defs(str(proj), None, "tiny")
    with dg.DagsterInstance.get() as instance:
        from fugu_pipeline.defs.settings import observe

        observe(instance, defs.resources["pipeline"], defs.resources["encoder"])
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("router_es")], raise_on_error=False)
    assert not res.success
    failure = next(e for e in res.all_events if e.is_step_failure)
    message = str(failure.event_specific_data.error.message).strip()
    assert message.startswith("router_es needs router_rl, which is stale (config_train_rl changed); nothing was run")
    assert "\n" not in message and "materialize it first (fugu-lite materialize router_rl" in message
    (proj / "configs" / "train_rl.yaml").write_text("epochs: 2\n")  # as the fixture wrote it: the others stay fresh


def test_the_settings_sensor_records_what_changed_through_evaluate_tick(project):
    from fugu_pipeline.defs.assemble import build_defs
    from fugu_pipeline_tests.daemon_path import tick

    defs = build_defs(str(project), "configs/workers.mock.yaml", "tiny")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, "settings_sensor")
        seen = {e.asset_key.to_user_string(): e for e in first.asset_events}
        assert {"config_reward", "config_encoder", "config_train_es", "config_train", "config_promotion"} <= set(seen)
        assert seen["config_train_es"].tags["dagster/data_version"] == "absent"  # no file: the built-in defaults
        for event in first.asset_events:  # what the daemon does with them
            instance.report_runless_asset_event(event)
        assert not tick(defs, instance, "settings_sensor").asset_events  # nothing changed since
        (project / "configs" / "train_es.yaml").write_text("generations: 12\n")
        changed = tick(defs, instance, "settings_sensor").asset_events
        assert [e.asset_key.to_user_string() for e in changed] == ["config_train_es"]
        (project / "configs" / "train_es.yaml").write_text("# the same settings, another comment\ngenerations: 12\n")
        instance.report_runless_asset_event(changed[0])
        assert not tick(defs, instance, "settings_sensor").asset_events  # a comment is not a change


def test_a_partition_or_asset_that_does_not_exist_is_one_line_and_runs_nothing(project, monkeypatch, capsys):
    from fugu_pipeline.cli.main import main

    monkeypatch.setenv("DAGSTER_HOME", str(project))
    assert main(["materialize", "tasks", "--partition", "nosuch", "--project-dir", str(project), "--encoder", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: partition 'nosuch' of tasks does not exist: no batch file {project}/data/benchgen/nosuch.jsonl "
                   "(batches: sample); add the file there or name an existing batch"), err
    assert main(["materialize", "router_esx", "--project-dir", str(project), "--encoder", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no asset 'router_esx'; nothing was run. The assets: ") and "router_es," in err
    with dg.DagsterInstance.from_config(str(project)) as instance:
        assert not instance.get_runs()  # nothing was run


@pytest.mark.slow
def test_the_train_commands_and_the_assets_run_the_same_steps(proj, capsys):
    """`fugu-lite train-sft` then `train-rl --checkpoint` on the project's matrix, with no flag but
    the encoder: the same config files, the same choice of prompt rules (the math prompts share a
    preamble), the warm start's own features, so the same checkpoints, byte for byte (their folders
    are named by their content hash). Before, the asset never chose prompt rules and read the RL
    warm start on the resource's features."""
    from fugu_pipeline.cli.main import main

    pipeline(proj)
    with dg.DagsterInstance.from_config(str(proj)) as instance:
        asset = {m: Path(instance.get_latest_materialization_event(dg.AssetKey(f"router_{m}"))
                         .asset_materialization.metadata["checkpoint"].value) for m in ("sft", "rl")}
    common = ["--data", "data/reward_matrix.duckdb", "--encoder", "tiny", "--cache-dir", "data/embeddings",
              "--output", "cli-models"]
    capsys.readouterr()
    assert main(["train-sft", *common]) == 0
    sft = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["train-rl", "--checkpoint", str(sft), *common]) == 0
    rl = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert (sft.parent.name, sft.name) == ("sft", asset["sft"].name)
    assert (rl.parent.name, rl.name) == ("rl", asset["rl"].name)
    assert (rl / "head.safetensors").read_bytes() == (asset["rl"] / "head.safetensors").read_bytes()
    choice = json.loads((asset["sft"] / "manifest.json").read_text())["metrics"].get("prompt_rules_choice")
    assert choice and choice["mode"] == "auto", choice  # the asset chose the prompt rules, as the command does
