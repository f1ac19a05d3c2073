"""A batch file with a bad line, as the daemon runs it (`evaluate_tick` with the definitions' own
resources, then each requested run): one failed run, not one per worker; the failure is a
`dg.Failure` in one line with its file, line and fix as metadata; and the console of the run (what
the `dagster dev` terminal shows) prints it once, without Dagster's stack."""

import dagster as dg

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline_tests.daemon_path import tick

BAD_LINE = '{"task_id": "x3", "prompt": \n'


def drop_bad_batch(project) -> None:
    good = (project / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()[:2]
    (project / "data" / "benchgen" / "badline.jsonl").write_text("\n".join(good) + "\n" + BAD_LINE)


def test_a_batch_with_a_bad_line_gets_one_failed_run_not_one_per_worker(project, capfd):
    """Before: the batch's load and each worker's partition were requested, and all four runs failed
    on the same line (each printing its stack twice in the terminal)."""
    drop_bad_batch(project)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    with dg.instance_for_test() as instance:
        result = tick(defs, instance, "benchgen_batch_sensor")
        bad = [r for r in result.run_requests if str(r.partition_key).startswith("badline")]
        assert [(r.job_name, str(r.partition_key)) for r in bad] == [("load_batch", "badline")]
        assert len(result.run_requests) - len(bad) == 4  # the good batch: its load and three workers
        warned = [line for line in capfd.readouterr().err.splitlines() if "badline.jsonl" in line]
        assert len(warned) == 1 and "no worker is called" in warned[0], warned


def test_a_bad_line_fails_in_one_line_with_its_file_line_and_fix_printed_once(project, capfd):
    drop_bad_batch(project)
    defs = build_defs(str(project), "configs/workers.mock.yaml")
    request = next(r for r in tick_requests(defs, project) if r.partition_key == "badline")
    job = defs.resolve_job_def(request.job_name)  # the job the batch sensor launches, with the run config it asks for
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("task_batches", ["badline"])
        capfd.readouterr()
        res = job.execute_in_process(instance=instance, partition_key="badline", run_config=request.run_config,
                                     tags=dict(request.tags), raise_on_error=False)
        printed = capfd.readouterr().err
        logged = instance.all_logs(res.run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE})
    assert not res.success
    failure = res.get_step_failure_events()[0].step_failure_data.user_failure_data
    assert failure.description.startswith("badline.jsonl:3: malformed JSON") and "\n" not in failure.description
    meta = {k: v.value for k, v in failure.metadata.items()}
    assert meta["file"].endswith("data/benchgen/badline.jsonl") and meta["line"] == 3 and meta["problems"] == 1
    assert meta["fix"].startswith("correct line 3 of badline.jsonl")
    # the run log the UI shows: the step's failure and the run's (which repeats the step's error) each
    # show the one line with the fix first, and no stack (before: Dagster's 11-frame stack under each,
    # and the fix only in the step's metadata table)
    shown = {r.dagster_event.event_type_value: r.dagster_event.event_specific_data.error for r in logged}
    assert set(shown) == {"STEP_FAILURE", "PIPELINE_FAILURE"}, set(shown)
    for kind, error in shown.items():
        first = error.message.splitlines()[0]
        assert first.startswith("badline.jsonl:3: malformed JSON") and "fix: correct line 3 of badline.jsonl" in first, \
            (kind, error.message)
        assert error.message.strip() == first and error.stack == [] and error.cause is None and error.context is None, \
            (kind, error.to_string()[-2000:])
    lines = printed.splitlines()
    assert "Stack Trace" not in printed and "Traceback" not in printed, printed[-3000:]
    said = [line for line in lines if "malformed JSON" in line]
    assert len(said) == 1 and "RUN_FAILURE" in said[0] and "fix: correct line 3 of badline.jsonl" in said[0], said
    # the step's own line says no more than that (the message and fix are the run's line); it is printed
    # while Dagster mirrors the step's output to its compute log, which under load can reach the
    # terminal after the run returns: absent, or this one line
    steps = [line.split(" - ")[-1] for line in lines if "STEP_FAILURE" in line]
    assert steps in ([], ['Execution of step "tasks" failed.']), steps


def tick_requests(defs, project):
    with dg.instance_for_test() as instance:
        return tick(defs, instance, "benchgen_batch_sensor").run_requests
