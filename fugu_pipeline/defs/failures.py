"""Failures as users read them: a data error is one line with metadata (file, line, fix), and the
console of the runs the sensors launch prints it once, without Dagster's stack.

- `explained_failure(what, fix)`: the `dg.Failure` of an expected, explained problem. The UI's
  run log shows it as one line, what went wrong and the fix, with no stack: on the failed step
  (above its metadata table) and on the run's failure, which repeats it (`ExplainedFailure`).
- `batch_failure(exc)`: that failure for a batch file that cannot be loaded: one line
  (`badline.jsonl:3: malformed JSON: ... — fix: correct line 3 of badline.jsonl ...`), and as
  metadata the file, the line, the number of problems and the fix.
- `run_console`: the console logger of the jobs the sensors launch (`RUN_CONSOLE_CONFIG` names
  it in their run config). It prints what Dagster's default console logger prints (the
  `dagster dev` terminal), except that a `dg.Failure` is one line (its description and the
  metadata's `fix`, on the run's failure) instead of the message plus ~20 lines of framework
  stack printed twice (with the step's failure and again with the run's). Any other error (a
  bug) keeps its stack, once. The sensors' run requests select it (`RUN_CONSOLE_CONFIG`).
"""

from __future__ import annotations

import logging
import sys

import dagster as dg
from dagster._core.errors import DagsterUserCodeProcessError
from dagster._utils.error import SerializableErrorInfo

from fugu_pipeline.tasks.loading import TaskFileError, shown_name

RUN_CONSOLE_CONFIG = {"loggers": {"console": {}}}  # run config that selects `run_console`


def first_problem(exc: TaskFileError) -> str:
    """The first problem of a batch file, one line: `name:line: message (+N more)`."""
    return exc.first_problem()


def batch_fix(exc: TaskFileError, rerun: str) -> str:
    """What to do about a batch file that cannot be loaded; `rerun`: what happens after."""
    line = exc.problems[0][0] if exc.problems else 0
    what = f"correct line {line} of {shown_name(exc.path.name)}" if line else f"correct {shown_name(exc.path.name)}"
    return f"{what} (or move it out of {exc.path.parent}); {rerun}"


class ExplainedFailure(dg.Failure, DagsterUserCodeProcessError):
    """A `dg.Failure` whose error, as the run log stores and shows it, is its one line and nothing
    else: no stack. Dagster records an error it already holds in serialized form (one raised in
    another process) as that form; this failure is that form from the start: the one line as the
    message, no frames (every frame would be Dagster's, from its step runner down to the `raise`).
    The step's failure and the run's failure (which repeats the first failed step's error) both
    show the one line, first; the metadata (file, line, fix) stays on the step's failure. Dagster
    passes it on as it is, so a retry policy does not retry it: an explained problem is met again
    (`allow_retries` is False to say so)."""

    def __init__(self, description: str, metadata: dict | None = None):
        text = " ".join(description.split())
        plain = dg.Failure(description=text, metadata=metadata, allow_retries=False)  # Dagster's checks
        Exception.__init__(self, text)  # (the two bases' own __init__s take different arguments)
        self.description, self.metadata, self.allow_retries = plain.description, plain.metadata, plain.allow_retries
        self.user_code_process_error_infos = [SerializableErrorInfo(message=f"{text}\n", stack=[], cls_name="Failure")]


def explained_failure(what: str, fix: str | None = None, metadata: dict | None = None) -> ExplainedFailure:
    """The step failure of an expected, explained problem: `what` went wrong and the `fix`, in one
    line (the fix also as metadata)."""
    text = f"{what} — fix: {fix}" if fix else what
    return ExplainedFailure(text, {**(metadata or {}), **({"fix": fix} if fix else {})})


def batch_failure(exc: TaskFileError, rerun: str = "the batch sensor loads it again when the file changes "
                                                   "(`fugu-lite pipeline`: run it again)") -> dg.Failure:
    """The step failure of a file of tasks or rows that cannot be loaded (no retry: the file must change)."""
    line = exc.problems[0][0] if exc.problems else 0
    return explained_failure(
        f"{first_problem(exc)}; nothing of this batch is used until the file is fixed",
        batch_fix(exc, rerun),
        metadata={"file": dg.MetadataValue.path(str(exc.path)), "line": line, "problems": len(exc.problems) or 1},
    )


def _error_of(event) -> object | None:
    data = getattr(event, "event_specific_data", None)
    return getattr(data, "error", None) if data is not None else None


def _short_failure(event) -> str | None:
    """One line for an event whose error is a `dg.Failure` (its description, then its fix)."""
    data = event.event_specific_data
    failure = getattr(data, "user_failure_data", None)
    if failure is None:
        return None
    text = " ".join((failure.description or "").split())
    fix = failure.metadata.get("fix") if failure.metadata else None
    return text + (f" — fix: {fix.value}" if fix is not None and str(fix.value) not in text else "")


class OneLineFailures(logging.Formatter):
    """Dagster's console format, with a run's failure said once and a `dg.Failure` in one line.

    A step stopped by a `dg.Failure` prints its head only (`STEP_FAILURE - Execution of step ...
    failed.`); the run's failure after it carries the Failure's line and fix. The run's line is the
    one the `dagster dev` terminal always shows: a step's own lines reach it through Dagster's
    compute-log mirror, which can drop a step's last lines when the step ends. Any other error
    (a bug) keeps Dagster's message and stack on its step, and the run's failure does not repeat it."""

    def __init__(self):
        super().__init__("%(asctime)s - dagster - %(levelname)s - %(message)s", "%Y-%m-%d %H:%M:%S %z")

    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None)
        event = meta.get("dagster_event") if meta else None
        if event is None or _error_of(event) is None:
            return super().format(record)
        parts = [meta.get("job_name"), meta.get("run_id"), str(event.pid) if event.pid else None, meta.get("step_key"),
                 event.event_type.name, meta.get("orig_message")]
        head = " - ".join(p for p in parts if p)
        if event.event_type == dg.DagsterEventType.STEP_FAILURE:
            text = head if _short_failure(event) is not None else None
        elif event.event_type == dg.DagsterEventType.RUN_FAILURE:
            step = getattr(event.event_specific_data, "first_step_failure_event", None)
            short = _short_failure(step) if step is not None else None
            text = f"{head} {short}" if short else head if step is not None else None
        else:
            text = None
        if text is None:  # not a dg.Failure, nor a step's failure said already: keep what Dagster prints (the stack)
            return super().format(record)
        return super().format(logging.makeLogRecord({**record.__dict__, "msg": text, "args": ()}))


@dg.logger(
    config_schema={"log_level": dg.Field(str, is_required=False, default_value="DEBUG")},
    description="The console of the runs the sensors launch: Dagster's console lines, a dg.Failure in one line "
                "without stack, a run's failure not repeating its step's.",
)
def run_console(init_context: dg.InitLoggerContext) -> logging.Logger:
    log = logging.Logger("dagster", level=init_context.logger_config["log_level"].upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFailures())
    log.addHandler(handler)
    return log
