"""Run untrusted Python (a worker's answer) against a test program in an isolated subprocess.

`run_untrusted(code, test)` never raises on hostile code: every outcome is a `SandboxResult`.
The isolation steps themselves run in the child's trusted first stage (`sandbox_child.py`);
this side adds the wall-clock limit, a minimal environment, capped output capture and the
kill-everything cleanup. Standard library only, so it also runs where pydantic is absent.

Mechanisms (the result's `isolation` lists the ones that applied; see `sandbox_child.py`):
network namespace; mount namespace with private tmpfs for every world-writable folder and empty
read-only tmpfs over `Limits.hide_paths`; rlimits; a fresh uid when run as root (a user namespace
otherwise); no_new_privs. Processes: the whole process group, and as root every process of the
run's uid, is killed when the child exits or times out.
Without a network namespace the fallback is a Python audit hook, labelled `audit-hook(best-effort)`
(network, ctypes, new programs, and, without a mount namespace, opening hidden paths):
native code can bypass it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

Reason = Literal["passed", "failed", "timeout", "memory", "crashed", "killed", "error"]

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
_RESULT_CAP = 4096
SETUP_LIMIT_S = 60.0  # the child's own start and isolation; the code's wall clock starts after
# The CPU limit counts the child's own start too (an rlimit counts the process's whole life), the wall
# clock does not: without a `cpu_s`, the CPU limit is the wall clock plus this much, so a busy loop is
# stopped by the wall clock it was given and the CPU limit stops only code that burns CPU faster than
# the clock runs (threads)
CPU_SETUP_ALLOWANCE_S = 1.0
_UID_RANGE = (1_000_000_000, 2_000_000_000)  # fresh uids: no user owns files or processes there
DEFAULT_HIDDEN = ("/work", "/home", "/root", "/mnt", "/media", "/srv", "/opt", "/data")
# A source checkout (wherever it was cloned: CI clones outside /work) is hidden as well; an
# installed package's folder is not a checkout and holds nothing secret.
_CHECKOUT = CHILD_SCRIPT.parents[2]
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. `timeout_s` is the wall clock of the untrusted code and its
    tests: it starts once the sandbox is set up (SETUP_LIMIT_S bounds that part, and running past
    it is an `error`, not the code's timeout). `cpu_s` defaults to `timeout_s` plus
    `CPU_SETUP_ALLOWANCE_S` (`cpu_limit_s`)."""

    timeout_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int = 512
    max_processes: int = 16
    max_output_bytes: int = 16_384
    max_file_mb: int = 64
    require_isolation: bool = False
    hide_paths: tuple[str, ...] = DEFAULT_HIDDEN

    @property
    def cpu_limit_s(self) -> float:
        return self.cpu_s if self.cpu_s is not None else self.timeout_s + CPU_SETUP_ALLOWANCE_S


@dataclass(frozen=True)
class SandboxResult:
    """`reason`: passed | failed (the code or its tests raised, or it exited before the tests
    finished) | timeout (wall clock or CPU) | memory | crashed (a fatal signal) | killed (SIGKILL
    or SIGTERM the sandbox did not send, e.g. the OOM killer) | error (the sandbox itself could not
    run; not the code's fault)."""

    passed: bool
    reason: Reason
    seconds: float
    stderr_tail: str = ""
    stdout_tail: str = ""
    truncated: bool = False
    exit_code: int | None = None
    isolation: tuple[str, ...] = field(default_factory=tuple)
    detail: str = ""


class _Tail:
    """Keeps the last `cap` bytes of a stream and whether anything was dropped."""

    def __init__(self, cap: int) -> None:
        self.cap, self.buf, self.dropped = cap, bytearray(), False

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > self.cap:
            del self.buf[: len(self.buf) - self.cap]
            self.dropped = True

    def text(self) -> str:
        return self.buf.decode("utf-8", "replace")


def _live_processes_of(uid: int) -> list[int]:
    """Pids of the uid's processes that are not zombies (a zombie can neither run nor fork)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line[:4] in ("Stat", "Uid:"))
        except (OSError, ValueError):
            continue
        state, uids = fields.get("State", "Z").split(), fields.get("Uid", "").split()
        if uids and int(uids[0]) == uid and state[0] not in "ZX":
            pids.append(int(entry))
    return pids


def _kill_all(pgid: int, uid: int | None) -> None:
    """Kill the process group; with a fresh uid also every process of that uid (children that
    called setsid() included): stop them all first so none can fork while we kill."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    if uid is None:
        return
    for _ in range(100):
        pids = _live_processes_of(uid)
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        time.sleep(0.005)


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (wait4 collects its status later)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _pump(
    proc: subprocess.Popen, result_fd: int, limits: Limits, uid: int | None
) -> tuple[str | None, _Tail, _Tail, bytes]:
    """Read stdout, stderr and the result pipe until the child exits (then kill what it left
    behind and drain for at most a second) or a deadline passes. The wall clock of
    `limits.timeout_s` starts when the child reports its isolation set up (the result pipe's first
    line): a host under load, where starting Python and creating namespaces can take seconds, does
    not spend the answer's time. Until then the deadline is SETUP_LIMIT_S. Returns (which deadline
    passed: None | "setup" | "run", stdout, stderr, result bytes). Never holds more than the caps."""
    out, err, res = _Tail(limits.max_output_bytes), _Tail(limits.max_output_bytes), bytearray()
    sinks: dict[int, Callable[[bytes], None]] = {
        proc.stdout.fileno(): out.add,  # type: ignore[union-attr]
        proc.stderr.fileno(): err.add,  # type: ignore[union-attr]
        result_fd: lambda b: res.extend(b[: max(0, _RESULT_CAP - len(res))]),  # keep the head
    }
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    timed_out: str | None = None
    exited_at, phase, deadline = None, "setup", time.monotonic() + SETUP_LIMIT_S
    try:
        while sinks:
            now = time.monotonic()
            if phase == "setup" and b"\n" in res:
                phase, deadline = "run", now + limits.timeout_s
            if exited_at is None and _exited(proc.pid):
                exited_at = now
                _kill_all(proc.pid, uid)  # descendants die with it; then drain the pipes
            if exited_at is not None and now - exited_at > 1.0:
                break
            if exited_at is None and now >= deadline:
                timed_out = phase
                break
            for key, _ in sel.select(timeout=min(0.05, max(0.0, deadline - now))):
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    sinks[key.fd](chunk)
                else:
                    sel.unregister(key.fd)
                    del sinks[key.fd]
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
    return timed_out, out, err, bytes(res)


def _classify(
    timed_out: str | None, status: int, cpu_s: float, limits: Limits, result: bytes, stderr: str
) -> tuple[Reason, str]:
    first_line = result.partition(b"\n")[0]
    if first_line.startswith(b"ERR "):
        return "error", first_line[4:].decode("utf-8", "replace")
    if timed_out == "setup":
        return "error", f"the sandbox did not finish setting up within {SETUP_LIMIT_S:g}s (nothing untrusted ran)"
    if timed_out:
        return "timeout", f"wall clock limit {limits.timeout_s:g}s"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limits.cpu_limit_s):
            return "timeout", f"CPU limit {limits.cpu_limit_s:g}s"
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return ("killed" if sig in (signal.SIGKILL, signal.SIGTERM) else "crashed"), f"signal {name}"
    code = os.WEXITSTATUS(status)
    if code != 0:
        if "MemoryError" in stderr[-2000:]:
            return "memory", f"MemoryError (limit {limits.memory_mb} MB)"
        return "failed", f"exit code {code}"
    return "failed", "exited before the tests finished"


def run_untrusted(code: str, test: str = "", limits: Limits = Limits(), python: str | None = None) -> SandboxResult:
    """Run `code` then `test` in one namespace in a sandboxed child process. Passed means the
    test program ran to its end and the process exited with status 0. Never raises."""
    start = time.monotonic()
    try:
        payload_text = json.dumps({"code": code, "test": test})
    except (TypeError, ValueError) as exc:
        return SandboxResult(False, "failed", 0.0, detail=f"code is not text: {exc}")
    if len(payload_text) > MAX_PAYLOAD_BYTES:
        return SandboxResult(False, "failed", 0.0, detail="code and tests exceed the payload limit")
    try:
        return _run(code, test, limits, python or interpreter(), start)
    except Exception as exc:  # noqa: BLE001 - a sandbox failure must not end the caller's run
        return SandboxResult(False, "error", time.monotonic() - start, detail=f"sandbox error: {exc!r}")


def _run(code: str, test: str, limits: Limits, python: str, start: float) -> SandboxResult:
    uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] if os.geteuid() == 0 else None
    nonce = secrets.token_hex(16)
    payload = json.dumps(
        {
            "nonce": nonce,
            "code": code,
            "test": test,
            "limits": {
                "memory_mb": limits.memory_mb,
                "cpu_s": limits.cpu_limit_s,
                "uid": uid,
                "max_file_mb": limits.max_file_mb,
                "max_processes": limits.max_processes,
                "require_isolation": limits.require_isolation,
                "hide_paths": _hide_paths(limits),
            },
        }
    ).encode()
    workdir = tempfile.mkdtemp(prefix="fugu-sandbox-")  # used only where no private tmpfs works
    if uid is not None:
        os.chown(workdir, uid, uid)
    env = dict(_CHILD_ENV, HOME=workdir, TMPDIR=workdir)
    read_end, write_end = os.pipe()
    proc, isolation = None, ()
    try:
        proc = subprocess.Popen(
            [python, "-I", "-B", str(CHILD_SCRIPT), str(write_end)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=env,
            pass_fds=(write_end,),
            start_new_session=True,
        )
        os.close(write_end)
        write_end = -1
        try:
            proc.stdin.write(payload)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass
        timed_out, out, err, result = _pump(proc, read_end, limits, uid)
        _kill_all(proc.pid, uid)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        reason, detail = _classify(timed_out, status, cpu, limits, result, err.text())
        iso_line = result.partition(b"\n")[0]
        isolation = tuple(json.loads(iso_line[4:])) if iso_line.startswith(b"ISO ") else ()
        passed = not timed_out and status == 0 and result.endswith(nonce.encode()) and reason != "error"
        if passed:
            reason, detail = "passed", "tests finished"
        return SandboxResult(
            passed,
            reason,
            round(time.monotonic() - start, 4),
            err.text(),
            out.text(),
            out.dropped or err.dropped,
            proc.returncode,
            isolation,
            detail,
        )
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                stream.close()  # type: ignore[union-attr]
            if proc.returncode is None:
                _kill_all(proc.pid, uid)
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None and "private-tmp" not in isolation:
            _remove_owned_files(uid)


def _remove_owned_files(uid: int) -> None:
    """Where no private tmpfs applied, the fresh uid could only write to world-writable dirs."""
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except OSError:
                continue


def _hide_paths(limits: Limits) -> list[str]:
    paths = list(limits.hide_paths)
    if (_CHECKOUT / "pyproject.toml").is_file() and str(_CHECKOUT) != "/":
        paths.append(str(_CHECKOUT))
    return paths


@lru_cache(maxsize=1)
def interpreter() -> str:
    """The Python the child runs: the base interpreter behind this one (standard library only, so a
    virtual environment inside the hidden checkout is not needed), unless (as root, dropping to a
    fresh uid) its standard library is unreadable to other users, then the first system Python
    whose is."""
    base = os.path.realpath(sys.executable)
    options = [base, sys.executable] + [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)]
    probe = "import email.mime.text, decimal, json, unittest"
    for python in options:
        try:
            if _run(probe, "", Limits(timeout_s=20), python, time.monotonic()).passed:
                return python
        except Exception:  # noqa: BLE001 - try the next interpreter
            continue
    return sys.executable


def describe() -> dict[str, object]:
    """What isolation a run gets on this machine (one probe run)."""
    res = run_untrusted("import socket", "")
    return {"python": interpreter(), "isolation": list(res.isolation), "reason": res.reason, "detail": res.detail}
