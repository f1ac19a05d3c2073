"""The sandbox against honest and hostile code. Every hostile run must end as a failure, bounded in
time, with this test process alive and nothing left behind."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fugu_pipeline.collect import sandbox as sandbox_module
from fugu_pipeline.collect.sandbox import (
    CHILD_SCRIPT,
    Limits,
    SandboxResult,
    _live_processes_of,
    run_untrusted,
)
from fugu_pipeline.collect.sandbox import interpreter as sandbox_interpreter

ROOT = os.geteuid() == 0
FAST = Limits(timeout_s=10)  # none of these runs is meant to reach it


def _uid(result: SandboxResult) -> int | None:
    for label in result.isolation:
        if label.startswith("uid="):
            return int(label[4:])
    return None


def _assert_nothing_left(result: SandboxResult) -> None:
    uid = _uid(result)
    if uid is not None:
        assert _live_processes_of(uid) == [], "processes of the sandbox uid survived"


def test_honest_code_passes_and_reports_isolation() -> None:
    r = run_untrusted("def f(x):\n    return x + 1\n", "assert f(1) == 2\n")
    assert r.passed and r.reason == "passed", r
    assert "rlimits" in r.isolation
    if ROOT:
        assert {"netns", "private-tmp", "no-new-privs"} <= set(r.isolation) and _uid(r)


def test_failing_test_fails() -> None:
    r = run_untrusted("def f(x):\n    return x\n", "assert f(1) == 2\n")
    assert (r.passed, r.reason) == (False, "failed") and "AssertionError" in r.stderr_tail


def test_all_humaneval_canonical_solutions_pass(data_dir: Path) -> None:
    with gzip.open(data_dir / "humaneval/HumanEval.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 164

    def run(row: dict) -> tuple[str, SandboxResult]:
        test = f"{row['test']}\n\ncheck({row['entry_point']})\n"
        return row["task_id"], run_untrusted(row["prompt"] + row["canonical_solution"], test)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, rows))
    elapsed = time.monotonic() - start
    failed = [(tid, r.reason, r.stderr_tail[-300:]) for tid, r in results if not r.passed]
    print(
        f"\nHumanEval canonical solutions: {len(rows) - len(failed)}/{len(rows)} passed in {elapsed:.1f}s "
        f"(4 threads; per run mean {sum(r.seconds for _, r in results) / len(results):.3f}s)"
    )
    assert not failed


def test_infinite_loop_times_out() -> None:
    r = run_untrusted("while True:\n    pass\n", "", Limits(timeout_s=2))
    assert (r.passed, r.reason, r.detail) == (False, "timeout", "wall clock limit 2s")
    _assert_nothing_left(r)


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock() -> None:
    r = run_untrusted("while True:\n    pass\n", "", Limits(timeout_s=20, cpu_s=1))
    assert (r.passed, r.reason) == (False, "timeout") and "CPU" in r.detail  # not the 20 s wall clock


def test_sleep_is_stopped_by_the_wall_clock() -> None:
    r = run_untrusted("import time\ntime.sleep(60)\n", "", Limits(timeout_s=1))
    assert (r.passed, r.reason, r.detail) == (False, "timeout", "wall clock limit 1s")


def _slow_python(tmp_path: Path, delay_s: float) -> str:
    """An interpreter that takes `delay_s` to start, as on a host under load."""
    script = tmp_path / "slow-python"
    script.write_text(f"#!/bin/sh\nsleep {delay_s}\nexec {sandbox_interpreter()} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_the_wall_clock_starts_after_the_sandbox_is_set_up(tmp_path: Path) -> None:
    # A CI run failed here: under load the sandbox's own start took the whole 3 s of a quick
    # answer, which was then graded a timeout. The answer's time is its own.
    slow = _slow_python(tmp_path, 2)
    r = run_untrusted("x = 1", "assert x == 1", Limits(timeout_s=1), python=slow)
    assert r.passed and r.seconds >= 2, r
    r = run_untrusted("import time\ntime.sleep(60)", "", Limits(timeout_s=1), python=slow)
    assert (r.passed, r.reason, r.detail) == (False, "timeout", "wall clock limit 1s")


def test_a_sandbox_that_cannot_start_is_an_error_not_the_answers_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_module, "SETUP_LIMIT_S", 1.0)
    r = run_untrusted("x = 1", "", Limits(timeout_s=30), python=_slow_python(tmp_path, 5))
    assert (r.passed, r.reason) == (False, "error") and "setting up" in r.detail, r  # not the answer's 30 s


def test_bounded_fork_bomb_is_capped_and_killed() -> None:
    # At most 2**8 = 256 processes even if no limit held; each prints one line, then sleeps.
    code = (
        "import os, sys, time\nfor _ in range(8):\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        "print('alive', flush=True)\ntime.sleep(60)\n"
    )
    r = run_untrusted(code, "", Limits(timeout_s=3, max_processes=8))
    assert (r.passed, r.reason, r.detail) == (False, "timeout", "wall clock limit 3s")
    assert 1 <= r.stdout_tail.count("alive") <= 8  # RLIMIT_NPROC held the tree at 8 processes
    _assert_nothing_left(r)


@pytest.mark.skipif(not ROOT, reason="killing setsid() descendants needs the fresh uid (root only)")
def test_daemonized_grandchild_is_killed_too() -> None:
    marker = f"{time.time() % 1000:.6f}"
    code = (
        f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n"
    )
    r = run_untrusted(code, "", FAST)
    assert r.passed  # the code itself exited normally; what it left behind must be gone
    _assert_nothing_left(r)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert marker.encode() not in cmdline.read_bytes()
        except OSError:
            continue


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(10**10)\n",
        "chunks = []\nfor _ in range(10_000):\n    chunks.append(bytearray(10**6))\n",  # 10 GB in 1 MB steps
    ],
)
def test_memory_hogs_fail_with_memory(code: str) -> None:
    r = run_untrusted(code, "", Limits(timeout_s=10, memory_mb=256))
    assert (r.passed, r.reason) == (False, "memory"), r
    _assert_nothing_left(r)


def test_segfault_is_a_crash() -> None:
    r = run_untrusted("import ctypes\nctypes.string_at(0)\n", "", FAST)
    assert (r.passed, r.reason) == (False, "crashed") and "SIGSEGV" in r.detail


def test_self_kill_is_killed() -> None:
    r = run_untrusted("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "", FAST)
    assert (r.passed, r.reason) == (False, "killed")


def test_no_network_even_to_an_open_local_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # open from here
        server.accept()[0].close()
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        r = run_untrusted(code, "", FAST)
        assert (r.passed, r.reason) == (False, "failed"), r
        assert "unreachable" in r.stderr_tail or "PermissionError" in r.stderr_tail
        with pytest.raises(socket.timeout):
            server.accept()  # nothing arrived


def test_planted_secret_does_not_reach_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-fake-" + uuid.uuid4().hex
    monkeypatch.setenv("FAKE_API_KEY", secret)
    code = f"""
import os
assert "FAKE_API_KEY" not in os.environ and not any("KEY" in k for k in os.environ), dict(os.environ)
leaks = []
for pid in os.listdir("/proc"):
    try:
        if {secret!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
            leaks.append(pid)
    except OSError:
        pass
assert not leaks, leaks
"""
    r = run_untrusted(code, "", FAST)
    if not ROOT:
        pytest.xfail("same uid: /proc/<parent>/environ is readable without root")  # pragma: no cover
    assert r.passed, r.stderr_tail


def test_writes_outside_the_workdir_do_not_reach_the_host() -> None:
    tag = uuid.uuid4().hex
    here = Path(__file__).parent / f"escape-{tag}"  # a root-owned folder outside /tmp
    targets = [
        f"/tmp/escape-{tag}",
        f"/var/tmp/escape-{tag}",
        f"/dev/shm/escape-{tag}",
        str(here),
        f"/etc/escape-{tag}",
    ]
    code = f"""
import os
wrote = []
for path in {targets!r} + ["here.txt"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        wrote.append(path)
    except OSError as exc:
        print("refused", path, exc)
print("wrote", wrote, "cwd", os.getcwd())
"""
    r = run_untrusted(code, "", FAST)
    assert r.passed, r.stderr_tail
    for path in targets:
        assert not os.path.exists(path), f"{path} escaped the sandbox"
    if ROOT:
        assert f"refused {here}" in r.stdout_tail  # the fresh uid may not write there
    assert not list(Path("/tmp").glob("fugu-sandbox-*/here.txt"))


def test_huge_output_is_truncated_and_the_run_still_passes() -> None:
    code = (
        "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n    sys.stderr.write('e' * 100_000)\n"
    )
    r = run_untrusted(code, "", Limits(timeout_s=20, max_output_bytes=4096))
    assert r.passed and r.truncated
    assert len(r.stdout_tail) <= 4096 and len(r.stderr_tail) <= 4096


@pytest.mark.parametrize("exit_code", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit\n"])
def test_exit_before_the_tests_is_not_a_pass(exit_code: str) -> None:
    r = run_untrusted(exit_code, "raise AssertionError('tests ran')\n", FAST)
    assert (r.passed, r.reason) == (False, "failed") and r.detail == "exited before the tests finished"


def test_non_text_or_oversized_code_fails_without_raising() -> None:
    assert run_untrusted("x = '\0'", "", FAST).reason == "failed"
    assert run_untrusted("#" * (9 * 1024 * 1024), "", FAST).reason == "failed"
    assert run_untrusted("def (", "", FAST).reason == "failed"


def test_audit_hook_fallback_blocks_sockets() -> None:
    """The fallback used where no network namespace can be made (labelled best-effort)."""
    code = (
        "import socket, sys\nsys.path.insert(0, sys.argv[1])\nimport sandbox_child as c\n"
        "sys.addaudithook(c._audit_hook([]))\n"
        "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "except PermissionError as e:\n    print('blocked', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(CHILD_SCRIPT.parent)], capture_output=True, text=True, timeout=30
    )
    assert "blocked sandbox: socket." in out.stdout, out


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv") or not shutil.which("unshare"),
                    reason="needs root and setpriv to run as another user, and unshare to ask what it may isolate")
def test_non_root_mode_uses_a_user_namespace() -> None:
    """The same module run by an unprivileged user (as on a developer's machine)."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    script = (
        "import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom fugu_pipeline.collect.sandbox import run_untrusted, Limits\n"
        "code = 'import socket\\nsocket.create_connection((\"127.0.0.1\", 9), timeout=1)'\n"
        "r = run_untrusted(code, '', Limits(timeout_s=5))\n"
        "print(json.dumps([r.reason, list(r.isolation), r.stderr_tail[-200:]]))\n"
    )
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-c",
            script,
            str(CHILD_SCRIPT.parents[2]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    reason, isolation, _tail = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nnon-root isolation: {isolation}")
    assert reason == "failed"
    # what this machine gives that user: a user namespace (and in it a network namespace), else the audit hook
    userns = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Un", "true"],
                            capture_output=True, timeout=60).returncode == 0
    if userns:
        assert {"userns", "netns"} <= set(isolation) and "audit-hook(best-effort)" not in isolation, isolation
    else:
        assert "audit-hook(best-effort)" in isolation and "netns" not in isolation, isolation


def test_project_and_data_folders_are_hidden() -> None:
    """Answers must not read the project tree, homes or benchmark files (with their solutions)."""
    code = f"open({str(CHILD_SCRIPT)!r}).read()\n"
    r = run_untrusted(code, "", FAST)
    if "private-tmp" not in r.isolation:
        pytest.skip(f"no mount namespace here: {r.isolation}")  # pragma: no cover
    assert not r.passed and "FileNotFoundError" in r.stderr_tail
