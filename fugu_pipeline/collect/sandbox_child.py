"""The trusted first stage of a sandboxed run (started by `sandbox.run_untrusted`, never imported).

It reads one JSON payload from stdin, isolates itself, then runs the untrusted code and the test
program in one namespace. Isolation, strongest first (each step labelled in the report):

- new network namespace (only a downed loopback: no connection leaves the process);
- new mount namespace with private size-limited tmpfs over every world-writable directory, the
  working directory inside it (writes vanish with the namespace), and empty read-only tmpfs over
  folders the code has no business reading (project trees, homes, data: `hide_paths`);
- resource limits: address space, CPU seconds, file size, open files, processes, no core files;
- as root: a fresh, otherwise unused uid/gid with no supplementary groups (no capabilities, cannot
  read root's files or other processes' environment, cannot signal other processes); not root:
  a user namespace with an identity map and every capability dropped;
- no_new_privs (setuid binaries do not raise privileges) and a parent-death signal.

Protocol on the result fd: first line `ISO <json list of labels>` or `ERR <message>`, written before
any untrusted code runs; after the test program returns, the run's nonce. The nonce only tells a
normal exit (`sys.exit(0)` before the tests) from a finished test; code that walks the interpreter's
frames can find it, so this is not a defence against code written to fake a pass.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# "ctypes." as a whole: the CDLL this stage loaded stays reachable (gc), and calling through it
# raises only ctypes.dlsym / ctypes.call_function.
BLOCKED_EVENTS = ("socket.", "ctypes.", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system")

_libc = ctypes.CDLL(None, use_errno=True)


def _ok(ret: int) -> bool:
    return ret == 0


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _user_namespace() -> bool:
    """Not root: enter a user namespace (identity-mapped) so the next namespaces are allowed."""
    uid, gid = os.getuid(), os.getgid()
    if not _ok(_libc.unshare(CLONE_NEWUSER)):
        return False
    try:
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError:
        return False
    return True


def _private_tmp(size_mb: int, owner: int | None) -> str | None:
    """New mount namespace, fresh tmpfs over each world-writable directory; returns the workdir."""
    if not _ok(_libc.unshare(CLONE_NEWNS)):
        return None
    if not _ok(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)):
        return None
    opts = f"size={size_mb}m,mode=1777".encode()
    for d in WRITABLE_DIRS:
        if os.path.isdir(d) and not _ok(_libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts)):
            return None
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    if owner is not None:
        os.chown(work, owner, owner)
    return work


def _hide(paths: list[str]) -> list[str]:
    """Mount an empty read-only tmpfs over each folder (project trees, homes, data), except the
    ones holding this interpreter. Returns the folders hidden."""
    keep = _keep_paths()
    hidden = []
    for d in paths:
        real = os.path.realpath(d)
        if not os.path.isdir(real) or any(_under(k, real) for k in keep):
            continue
        if _ok(_libc.mount(b"tmpfs", real.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=755")):
            hidden.append(real)
    return hidden


def _drop_capabilities() -> None:
    """Zero the effective, permitted and inheritable sets (capset, _LINUX_CAPABILITY_VERSION_3)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _set_limits(cfg: dict) -> None:
    mem = cfg["memory_mb"] * 1024 * 1024
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    fsize = cfg["max_file_mb"] * 1024 * 1024
    for res, soft, hard in (
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, cfg["max_processes"], cfg["max_processes"]),
    ):
        resource.setrlimit(res, (soft, hard))


def _audit_hook(hide: list[str]):
    """Without namespaces: refuse network, ctypes and new programs, and opening anything under
    the folders a mount namespace would have hidden (the interpreter's own folders excepted)."""
    keep = _keep_paths()
    hidden = tuple(r + "/" for r in {os.path.realpath(d) for d in hide} if not any(_under(k, r) for k in keep))

    def hook(event: str, args: tuple) -> None:
        if event.startswith(BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: {event} is blocked (no network namespace available)")
        if event == "open" and isinstance(args[0], (str, bytes)) and hidden:
            path = os.path.realpath(os.fsdecode(args[0])) + "/"
            if path.startswith(hidden):
                raise PermissionError(f"sandbox: {os.fsdecode(args[0])} is hidden")

    return hook


def _keep_paths() -> set[str]:
    return {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.executable, os.path.dirname(os.__file__))}


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def isolate(cfg: dict) -> list[str]:
    """Apply every isolation step that works here; returns their labels. Raises on a failure
    that would leave the run weaker than promised (a lost uid drop, or a required netns)."""
    labels: list[str] = []
    root = os.geteuid() == 0
    if not root and _user_namespace():
        labels.append("userns")
    netns = _ok(_libc.unshare(CLONE_NEWNET))
    if netns:
        labels.append("netns")
    elif cfg["require_isolation"]:
        raise OSError("no network namespace available and require_isolation is set")
    work = _private_tmp(cfg["max_file_mb"], cfg["uid"] if root else None)
    if work is not None:
        os.chdir(work)
        os.environ["HOME"] = os.environ["TMPDIR"] = work
        labels.append("private-tmp")
        hidden = _hide(cfg["hide_paths"])
        if hidden:
            labels.append("hidden:" + ",".join(hidden))
    _set_limits(cfg)
    labels.append("rlimits")
    if root:
        uid = cfg["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        labels.append(f"uid={uid}")
    elif "userns" in labels:
        _drop_capabilities()
    if _ok(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)):
        labels.append("no-new-privs")
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not netns:
        sys.addaudithook(_audit_hook([] if work is not None else cfg["hide_paths"]))
        labels.append("audit-hook(best-effort)")
    return labels


def main() -> None:
    fd = int(sys.argv[1])
    payload = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        labels = isolate(payload["limits"])
    except Exception as exc:  # noqa: BLE001 - reported to the parent, nothing untrusted ran
        os.write(fd, f"ERR {type(exc).__name__}: {exc}\n".encode())
        os._exit(70)
    os.write(fd, f"ISO {json.dumps(labels)}\n".encode())
    nonce = payload.pop("nonce").encode()
    code, test = payload.pop("code"), payload.pop("test")
    sys.argv = ["solution.py"]
    namespace: dict = {"__name__": "__sandbox__"}
    # Bound before any untrusted code runs: an answer that replaces builtins.exec/compile or
    # os.write must not be able to skip the test program and still report it finished.
    run, write = exec, os.write
    test_code = compile(test, "test.py", "exec")
    run(compile(code, "solution.py", "exec"), namespace)
    run(test_code, namespace)
    sys.stdout.flush()
    write(fd, nonce)


if __name__ == "__main__":
    main()
