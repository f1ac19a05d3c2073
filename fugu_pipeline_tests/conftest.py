import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TASK_DATA = Path(os.environ.get("FUGU_TASK_DATA", SHARED_DATA / "tasks"))

# One OpenMP/BLAS thread per test process (torch, numpy's BLAS), inherited by the commands the tests
# start: with a test process per core (and one more), a second thread per process only contends,
# and OpenMP threads spin while they wait for each other (the main job alone on a loaded machine:
# 40-50 CPU-s with 2 threads, 30 with one). Set before anything imports torch; a value in the
# environment wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The collector key that signs cost-ledger lines (collector_key.py): one per test session, in a
# temporary folder, never the user's ~/.config one; the commands the tests start inherit it.
os.environ.setdefault("FUGU_COLLECTOR_KEY_FILE", os.path.join(tempfile.mkdtemp(prefix="fugu-tests-"), "collector.key"))
# hypothesis keeps its caches (the constants it reads from the project's modules) under `.hypothesis`
# of the working folder unless told otherwise: one folder per session, never the project's (a
# property test run alone would otherwise leave it there, and the check below fail that test)
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:  # made once, by the process that starts the run
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="fugu-tests-hypothesis-")
# A home folder of the session's own (made once, by the process that starts the run; its test
# processes and every command they start inherit it): what writes under "~" (the tiny encoder,
# Dagster's telemetry, matplotlib's caches, a command the page test runs) writes there, never in the
# user's home. The Hugging Face cache stays the user's, where a real encoder may already be.
USER_HOME = Path(os.environ.get("FUGU_TESTS_USER_HOME") or Path.home())
if "FUGU_TESTS_USER_HOME" not in os.environ:
    os.environ["HF_HOME"] = os.environ.get("HF_HOME") or str(USER_HOME / ".cache" / "huggingface")
    os.environ["FUGU_TESTS_USER_HOME"] = str(USER_HOME)
    os.environ["HOME"] = tempfile.mkdtemp(prefix="fugu-tests-home-")


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): one process per core and one more, at most 4. Many of the
    slow tests wait on subprocesses and servers (dagster dev, PostgreSQL, Celery, Chromium), so a
    process more than cores keeps the cores busy while one waits. With one OpenMP thread per process
    (above) that cut the suite on 2 cores from 820 s to 741 s (same clone, quiet machine; the tests'
    CPU grew by 4%); with torch's default of a thread per core it had been slower (911 s against 868
    s: the tests' CPU grew by a quarter). `FUGU_TEST_PROCESSES` sets the number. Files are the unit
    (`--dist loadfile`): a file's tests share module fixtures. `-n 0` runs everything in this
    process (for a debugger or `-x`)."""
    wanted = os.environ.get("FUGU_TEST_PROCESSES", "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise pytest.UsageError(f"FUGU_TEST_PROCESSES={wanted!r}: give a whole number of processes, 1 or more")
        return int(wanted)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(4, cores + 1)


def pytest_addoption(parser) -> None:
    parser.addoption("--skip-budget", default=os.environ.get("FUGU_SKIP_BUDGET") or None, metavar="YAML",
                     help="the skips this machine may have, by reason (.ci/skip-budget.yaml): any other skip, or more "
                          "of one, fails the run with its reason (default: $FUGU_SKIP_BUDGET; none: no budget)")


SKIPS: list[tuple[str, str]] = []  # (test, reason) of every skip, in the process that reports (xdist's controller)


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


pytest_collectreport = pytest_runtest_logreport  # a whole module skipped while it is collected


def pytest_sessionfinish(session, exitstatus) -> None:
    """With --skip-budget: a skip its reason does not allow fails the run (printed in the summary)."""
    path = session.config.getoption("--skip-budget")
    if not path or hasattr(session.config, "workerinput"):
        return
    from fugu_pipeline_tests.skip_budget import load_budget, over_budget

    problems = over_budget(SKIPS, load_budget(Path(path)))
    session.config.stash[SKIP_PROBLEMS] = problems
    if problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


SKIP_PROBLEMS = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    problems = config.stash.get(SKIP_PROBLEMS, None)
    if problems:
        terminalreporter.section("skips the budget does not allow", red=True)
        for line in problems:
            terminalreporter.write_line(line)
    elif problems is not None:
        terminalreporter.write_line(f"skips within the budget ({config.getoption('--skip-budget')}): {len(SKIPS)}")


def _entries() -> set[Path]:
    """What a test may never add: entries of the project's folder, its data/, models/ and configs/,
    and of the user's home (a test writes only in its temporary folders)."""
    out = set()
    for folder in (REPO, REPO / "data", REPO / "models", REPO / "configs", USER_HOME):
        try:
            out |= {folder / name for name in os.listdir(folder) if name not in ("__pycache__", ".pytest_cache")}
        except OSError:
            continue
    return out


@pytest.fixture(autouse=True)
def _writes_only_in_temporary_folders():
    """Fails the test during which a file appeared in the project's folder or the user's home
    (or one beside it in another test process: the paths say what to look for)."""
    before = _entries()
    yield
    new = sorted(str(p) for p in _entries() - before)
    if new:
        pytest.fail(f"left outside its temporary folders (while this test ran): {', '.join(new)}", pytrace=False)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Files that hold a `slow` test run first: with files as the unit of distribution, a long file
    dealt out last keeps one worker busy while the others sit idle (longest jobs first). The order
    inside a file, and among the other files, is unchanged. xdist keeps this order only with
    `--no-loadscope-reorder` (pyproject's addopts): by default it deals files out by their number
    of tests, which sent the one-test files (the UI in Chromium, the main job, PostgreSQL, `dagster
    dev`: a minute or more each) out last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session", autouse=True)
def every_head_kind() -> None:
    """Every kind's heads registered (`policies/registry.heads`), as the callers do before loading a
    checkpoint: tests load checkpoints of any kind with the shared loader directly."""
    from fugu_pipeline.policies.registry import heads

    heads()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark task files (`../shared/data/tasks`, or $FUGU_TASK_DATA); skips where absent."""
    if not (TASK_DATA / "humaneval").is_dir():
        pytest.skip(f"benchmark task data not found at {TASK_DATA}: a clone outside the workspace has no "
                    "../shared/data (set FUGU_TASK_DATA to a folder holding humaneval/, math500/, qwen25math_eval/)")
    return TASK_DATA


def new_project(folder: Path) -> Path:
    """Make `folder` a throwaway project: the shipped configs and sample batch, empty outputs."""
    (folder / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "workers.mock.yaml", folder / "configs" / "workers.mock.yaml")
    shutil.copy(REPO / "dagster.yaml", folder / "dagster.yaml")
    (folder / "data" / "benchgen").mkdir(parents=True)
    shutil.copy(REPO / "data" / "benchgen" / "sample.jsonl", folder / "data" / "benchgen" / "sample.jsonl")
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A throwaway project directory: the shipped configs and sample batch, empty outputs."""
    return new_project(tmp_path)


# Training settings short enough for a test, the same everywhere they are used. What the tests
# check (the command line and the assets save the same heads, a choice is recorded, a head is
# promoted and served on its own features, a router beats the best fixed worker on the mock pool)
# holds for these; the shipped settings take minutes on 2 cores.
SHORT_TRAIN = {
    "train_sft.yaml": "epochs: 15\n",
    "train_rl.yaml": "epochs: 2\n",
    "train_es.yaml": "generations: 10\nval_every: 5\n",
    # the shipped heads and grids (a grid of under 3 points fails promotion's receipt gate) on 3
    # folds: the cascade's verifier fits its whole grid once per fold
    "train.yaml": "folds: 3\n",
}


NO_CASCADE = "cascade:\n  enabled: 'off'\n"  # most of `fugu-lite train`'s CPU: its verifier's out-of-fold grid

# For a test that runs the head set on its way and checks nothing of it (an SFT report, the encoder's
# passes): one point per head family, the features as the encoder gives them (no choice of layer
# sets or prompt rules: each doubles the fits). Appended to `SHORT_TRAIN`'s train.yaml.
ONE_POINT_HEADS = ("features:\n  layer_sets: 'off'\n  prompt_rules: 'off'\n"
                   "heads:\n  domain_prior: {m: [20]}\n  knn: {k: [30], prior_weight: [0], same_domain_bonus: [0]}\n"
                   "  ridge: {alpha: [100], inputs: [all]}\n")


def short_training(project: Path, cascade: bool = True) -> Path:
    """Write `SHORT_TRAIN`'s configs into `project`/configs; `cascade=False` for a test that checks
    nothing of the cascade the head set also fits."""
    for name, text in SHORT_TRAIN.items():
        (project / "configs" / name).write_text(text + ("" if cascade or name != "train.yaml" else NO_CASCADE))
    return project


def write_jsonl(path: Path, rows: list) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def task_row(i: int = 0, **over) -> dict:
    row = {"task_id": f"t{i}", "prompt": f"What is {i} + 1?", "domain": "math",
           "reference_answer": str(i + 1), "grader": {"type": "numeric"}, "split": "train"}
    row.update(over)
    return row
