"""Slow clients against `fugu-lite serve`: a flood of idle half-open connections (each sends only
`POST /v1/chat/completions HTTP/1.1\\r\\nHost: 127`, no token, then nothing) against the server with
an open-file limit of 4,096, while a prober measures `/health` and an authenticated request.

    python benchmarks/bench_slow_clients.py                              # 6,000 then 20,000 connections
    python benchmarks/bench_slow_clients.py --flood 6000 --server-tree /tmp/base   # another checkout (before)

Processes on 127.0.0.1: the stub LLM server (`python -m fugu_pipeline.testing.stub_llm`),
`fugu-lite serve` (a tiny-encoder SFT router trained here, default flags) started with
`RLIMIT_NOFILE` 4,096 (what `ulimit -n 4096` sets), the attackers (subprocesses of this script,
at most 8,000 connections each, from source addresses 127.0.0.2-254 so ports do not run out),
and the prober (this process). The attackers keep their connections: one the server closes is
opened again at once, as a slowloris client does, for `--attack-s` seconds (`--no-reconnect`:
each is opened once). They run at nice 19: a remote attacker would take none of the server
machine's CPU, these take what the server leaves.

Figures
- every second, a new connection's `GET /health` and an authenticated `POST /v1/chat/completions`
  (a new connection each, 10 s timeout): answered or not, and its latency; summed before and after
  `--settle-s` (15 s) into the attack, and after the attack;
- the server's open file descriptors (/proc/PID/fd) at each probe;
- the connections the attackers saw the server close, against what the server counted
  (`fugu_connections_closed_total` in /metrics) and what its log said (first lines plus sums);
- whether the server process is still up, and answers once the attack stops.

`--server-tree DIR` runs the server from another checkout of the project (e.g. the commit before
the connection guard: `git archive <commit> | tar -x -C DIR`) with this venv; flags it lacks are
not passed. The attackers, the stub and the server share the machine's cores: on a small shared
machine every latency is noisy.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.bench_serve import cpu_s, free_port, start_stub  # noqa: E402
from benchmarks.machine import describe  # noqa: E402

PY = sys.executable
TOKEN = "slow-clients-token"
HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127"
NOFILE = 4096
PER_ATTACKER = 8000


# --------------------------------------------------------------------------- the attacker (a subprocess)


def attack(port: int, n: int, seconds: float, first_source: int, reconnect: bool) -> None:
    """Hold `n` half-open connections to 127.0.0.1:`port` for `seconds` (`reconnect`: opening
    again each one the server closes); print `opened closed_by_server failed` at the end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.nice(19)  # a remote attacker costs the server's machine no CPU: this one yields it to the server
    sel = selectors.DefaultSelector()
    opened = closed = failed = 0
    source = first_source

    def open_one() -> None:
        nonlocal opened, failed, source
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((f"127.0.0.{source}", 0))
            source = source % 253 + 2
            if s.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS):
                raise OSError("connect")
        except OSError:
            s.close()
            failed += 1
            return
        sel.register(s, selectors.EVENT_WRITE, "connecting")
        opened += 1

    end = time.monotonic() + seconds
    want = n
    while time.monotonic() < end:
        for _ in range(min(want, 200)):
            open_one()
            want -= 1
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            if key.data == "connecting":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sel.unregister(s)
                    s.close()
                    failed += 1
                    want += 1
                    continue
                try:
                    s.send(HALF_OPEN)
                except OSError:
                    pass
                sel.modify(s, selectors.EVENT_READ, "holding")
                continue
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:  # the server closed it: open another
                sel.unregister(s)
                s.close()
                closed += 1
                want += reconnect
    print(opened, closed, failed, flush=True)
    for key in list(sel.get_map().values()):
        key.fileobj.close()


# --------------------------------------------------------------------------- the server and the prober


def start_server(tree: Path, models: Path, workers: Path, log: Path, nofile: int) -> tuple[subprocess.Popen, str, bool]:
    """`fugu-lite serve` from `tree` with RLIMIT_NOFILE `nofile`; (process, url, it has the guard)."""
    guarded = "--header-timeout-s" in subprocess.run([PY, "-m", "fugu_pipeline.cli", "serve", "--help"], cwd=tree,
                                                     env={**os.environ, "PYTHONPATH": str(tree)},
                                                     capture_output=True, text=True).stdout
    port = free_port()
    cmd = [PY, "-m", "fugu_pipeline.cli", "serve", "--models-dir", str(models), "--workers", str(workers),
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tree, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(tree), "FUGU_SERVE_TOKEN": TOKEN},
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fugu-lite serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, guarded
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"fugu-lite serve did not answer /health within 180 s; see {log}")


def probe(url: str) -> dict:
    """One `/health` and one authenticated chat request, each on a new connection."""
    import httpx

    out = {}
    for name, call in (("health", lambda c: c.get(url + "/health")),
                       ("auth", lambda c: c.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                                                 json={"model": "fugu-lite", "messages": [{"role": "user", "content": "hi"}]}))):
        t = time.perf_counter()
        try:
            with httpx.Client(timeout=10) as c:
                status = call(c).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        out[name] = (status, time.perf_counter() - t)
    return out


def half_a_body(port: int) -> socket.socket:
    """A connection that sends a request's headers (with the token) and half its body, then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"messages\": [")
    s.setblocking(False)
    return s


def ended(s: socket.socket, t0: float) -> str:
    """How the half-a-body connection ended, as of now."""
    s.setblocking(True)
    s.settimeout(0.5)
    try:
        got = s.recv(4096)
    except TimeoutError:
        return f"still connected after {time.monotonic() - t0:.0f} s"
    except OSError as exc:
        return f"reset ({exc})"
    finally:
        s.close()
    status_line = got.split(b"\r\n")[0].decode()
    return f"answered {status_line!r} and closed" if got else "closed without an answer"


def fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def summary(rows: list[dict], name: str) -> str:
    if not rows:
        return "no probes"
    ok = [r[name][1] for r in rows if r[name][0] == 200]
    failed = sorted({str(r[name][0]) for r in rows if r[name][0] != 200})
    lat = f", max {max(ok):.2f} s, median {sorted(ok)[len(ok) // 2]:.2f} s" if ok else ""
    return f"{len(ok)}/{len(rows)} answered{lat}" + (f" (others: {', '.join(failed)})" if failed else "")


def closed_counts(url: str) -> dict[str, float] | None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(r.text)
            if f.name == "fugu_connections_closed" for s in f.samples if s.name.endswith("_total")}


def logged_counts(log: str) -> dict[str, int]:
    """Per reason, the drops the server's log said: one per first line, plus the sums."""
    out: dict[str, int] = {}
    for reason in re.findall(r"\((\w+); more of these are summed", log):
        out[reason] = out.get(reason, 0) + 1
    for line in re.findall(r"since the last line of their kind: (.*)", log):
        for n, reason in re.findall(r"([\d,]+) (\w+)", line):
            out[reason] = out.get(reason, 0) + int(n.replace(",", ""))
    return out


def run(flood: int, args, models: Path, workers: Path, tmp: Path) -> bool:
    log = tmp / f"serve-{flood}.log"
    proc, url, guarded = start_server(args.server_tree, models, workers, log, NOFILE)
    what = "kept (reopened when closed)" if args.reconnect else "opened once"
    print(f"\n{flood:,} half-open connections {what} for {args.attack_s:g} s against the server from {args.server_tree} "
          f"({'with' if guarded else 'WITHOUT'} the connection guard), RLIMIT_NOFILE {NOFILE:,}:", flush=True)
    attackers = []
    for k in range(0, flood, PER_ATTACKER):
        attackers.append(subprocess.Popen([PY, __file__, "--attacker", str(int(url.rsplit(":", 1)[1])),
                                           str(min(PER_ATTACKER, flood - k)), str(args.attack_s), str(2 + k % 250),
                                           str(int(args.reconnect))],
                                          stdout=subprocess.PIPE, text=True))
    slow_body = half_a_body(int(url.rsplit(":", 1)[1]))
    cpu0, t0 = cpu_s(proc.pid), time.monotonic()
    rows = []
    while (t := time.monotonic() - t0) < args.attack_s - 1:
        r = probe(url)
        r["t"], r["fds"] = t, fds(proc.pid)
        rows.append(r)
        if args.verbose:
            print(f"  t={t:5.1f} s  health {r['health'][0]} {r['health'][1]:.2f} s  auth {r['auth'][0]} "
                  f"{r['auth'][1]:.2f} s  server fds {r['fds']}", flush=True)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - t)))
    body_fate = ended(slow_body, t0)
    busy = (cpu_s(proc.pid) - cpu0) / (time.monotonic() - t0)
    seen = [list(map(int, a.communicate(timeout=120)[0].split())) for a in attackers]
    opened, closed, failed = (sum(x[i] for x in seen) for i in range(3))
    time.sleep(2)
    alive = proc.poll() is None
    after = [probe(url) for _ in range(5)] if alive else []
    counted = closed_counts(url) if alive else None
    early = [r for r in rows if r["t"] < args.settle_s]
    late = [r for r in rows if r["t"] >= args.settle_s]
    peak = max((r["fds"] or 0) for r in rows) if rows else 0
    print(f"  first {args.settle_s:g} s:  /health {summary(early, 'health')};  authenticated {summary(early, 'auth')}")
    print(f"  after {args.settle_s:g} s:  /health {summary(late, 'health')};  authenticated {summary(late, 'auth')}")
    print(f"  attack over:   /health {summary(after, 'health')};  authenticated {summary(after, 'auth')}")
    print(f"  a client that sent its headers and half its body at the start: {body_fate}")
    print(f"  server: {'up' if alive else f'EXITED ({proc.returncode})'}, {busy:.0%} of a core during the attack, at most "
          f"{peak:,} open file descriptors; "
          f"attackers opened {opened:,} connections, saw {closed:,} closed by the server, {failed:,} failed to connect")
    stop(proc)
    said = logged_counts(log.read_text())
    if counted is not None:
        dropped = {k: int(v) for k, v in counted.items() if v and k != "idle"}
        print(f"  /metrics fugu_connections_closed_total: {dropped}; the log said {said} "
              f"({'the same' if said == dropped else 'NOT the same'})")
    else:
        print(f"  no /metrics; log lines about dropped connections: {len(re.findall('closed the connection', log.read_text()))}")
    met = bool(late) and all(r[k][0] == 200 and r[k][1] <= 2.0 for r in late for k in ("health", "auth"))
    print(f"  goal (every probe after {args.settle_s:g} s answered within 2 s): {'met' if met else 'NOT met'}", flush=True)
    return met and alive


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--attacker":
        attack(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flood", default="6000,20000", help="comma-separated numbers of half-open connections")
    ap.add_argument("--attack-s", type=float, default=40.0)
    ap.add_argument("--settle-s", type=float, default=15.0)
    ap.add_argument("--server-tree", type=Path, default=REPO, help="the checkout the server runs from")
    ap.add_argument("--models-dir", type=Path, help="a models folder with a promoted router over the stub "
                    "workers alpha, beta, gamma (default: train one here, ~20 s)")
    ap.add_argument("--reconnect", action=argparse.BooleanOptionalAction, default=True,
                    help="the attackers open a new connection for each one the server closes (default), or not")
    ap.add_argument("--verbose", action="store_true", help="print every probe")
    args = ap.parse_args()
    args.server_tree = args.server_tree.resolve()
    print(f"machine: {describe()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        models = args.models_dir
        if models is None:
            from fugu_pipeline.testing.serving import build_checkpoints

            models = tmp / "models"
            build_checkpoints(models, seeds=(0,), epochs=5)
        stub, stub_url = start_stub(0.05, tmp / "stub.log")
        try:
            from fugu_pipeline.testing.serving import stub_workers_config

            workers = tmp / "workers.yaml"
            workers.write_text(stub_workers_config(stub_url + "/v1").model_dump_json(exclude_none=True))
            ok = [run(int(n), args, models, workers, tmp) for n in args.flood.split(",")]
        finally:
            stub.terminate()
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
