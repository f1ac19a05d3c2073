"""Load test of `fugu-lite serve` as a user runs it: CPU per request, the router's added latency at
1 and at 50 clients, what one client sending 2 MB prompts does to everyone else, server memory over
10,000 requests of varied length (bf16 and fp32), and batched versus one-at-a-time routing.

    python benchmarks/bench_serve.py                          # everything, about 10 minutes
    python benchmarks/bench_serve.py --duration 8 --memory-requests 2000 --skip-compare

Processes on 127.0.0.1: the stub LLM server (`python -m fugu_pipeline.testing.stub_llm`, every
answer after `--stub-latency` s, three models = three workers), `fugu-lite serve` in a subprocess
exactly as a user starts it (`fugu-lite serve --models-dir M --workers W.yaml --device cpu ...`,
its default `--torch-threads 1`, a tiny-encoder SFT checkpoint trained here on synthetic tasks),
and this load generator (closed loop: each client sends its next request when the last one is
answered, with the official `openai` client).

Figures
- CPU per request: the server process's user + system CPU time (/proc/<pid>/stat) over the
  measured window, divided by the requests answered in it.
- added latency, server side: `fugu_lite.overhead_ms` = the server's time from receipt to the reply
  being ready minus the time inside the worker call, measured on the server's worker loop (see
  `fugu_pipeline/serve/upstream.py`); holds parsing, routing (batch wait + encoder), queueing and
  building the reply. p50 and p99.
- added latency, client side: end-to-end minus the stub's configured latency: also holds the
  client's and the stub's own HTTP work, so an upper bound.
- JSON flood (first, `--json-flood-only` for it alone): p50 of `--big-clients` clients' latencies
  with and without one more client that sends 2 MB bodies of a million small JSON values back to
  back (refused: 413 by the value limit, 400 for NaN), their ratio, and the server's CPU per such
  body; `--old-parser` repeats it with the request parser before (`benchmarks/json_flood.py`).
- 2 MB client: p50 of the other clients' latencies with and without one more client that sends
  2,000,000-character prompts in a loop; and, to show what the encoder's character cut buys, with
  the same command run with the cut switched off (the behaviour before it).
- CPU with torch's default threads: the same 1- and 50-client runs with `--torch-threads 0`.
- memory: the server's RSS (VmRSS) at start and after every 1,000 of `--memory-requests` requests
  whose prompts run from one word to about 2,000 characters (many token lengths, so many tensor
  shapes), for `--dtype bfloat16` and `--dtype float32`, and bf16 with oneDNN's and ideep's caches
  at their default 1,024 entries (the behaviour before the encoder capped them).
- batching: answered requests per second at `--compare-clients` with the micro-batcher on and with
  `--max-batch 1`; and in process (no HTTP), prompts routed per second one at a time versus in
  batches of 32.

The load generator, the stub and the server share the machine's cores; on a small machine that
is shared with other work, every figure is noisy: run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.json_flood import FLOOD_VALUES, OLD_PARSER, json_flood  # noqa: E402
from benchmarks.machine import describe  # noqa: E402

from fugu_pipeline.features.encoder import NATIVE_CACHE_VARIABLES  # noqa: E402
from fugu_pipeline.testing.serving import build_checkpoints, stub_workers_config, synthetic_tasks  # noqa: E402

PY = sys.executable
TOKEN = "bench-token"
TICK = os.sysconf("SC_CLK_TCK")
WORDS = ("solve integral function python bug fix summarise novel capital country tips sleep prime "
         "number matrix derivative loop list string recursion history science explain why how").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fugu_lite() -> list[str]:
    script = Path(PY).parent / "fugu-lite"
    return [str(script)] if script.exists() else [PY, "-m", "fugu_pipeline.cli"]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def machine() -> str:
    return describe()


def start_stub(latency_s: float, log: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([PY, "-m", "fugu_pipeline.testing.stub_llm", "--latency", str(latency_s)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"stub server did not start; see {log}")
    return proc, url


UNCUT = ("import sys; import fugu_pipeline.features.encoder as e; e.MAX_CHARS_PER_TOKEN = 10**12; "
         "from fugu_pipeline.cli.main import main; sys.exit(main(sys.argv[1:]))")

def start_server(models: Path, workers: Path, log: Path, *extra: str, uncut: bool = False, prelude: str | None = None,
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`fugu-lite serve ...` as a user runs it. `uncut`: the same command with the encoder's
    character cut switched off, to reproduce the behaviour before it (whole prompts tokenized);
    `prelude`: the same command run by this Python code first (OLD_PARSER: the request parser before)."""
    port = free_port()
    cmd = [*fugu_lite(), "serve", "--models-dir", str(models), "--workers", str(workers), "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]
    if uncut or prelude:
        cmd = [PY, "-c", prelude or UNCUT, *cmd[len(fugu_lite()):]]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "FUGU_SERVE_TOKEN": TOKEN, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fugu-lite serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                shown = cmd[len(fugu_lite()) - 1:] if not (uncut or prelude) else [
                    "fugu-lite (character cut off)" if uncut else "fugu-lite (the parser before)", *cmd[3:]]
                print("  $ " + " ".join(shown).replace(str(REPO) + "/", ""), flush=True)
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"fugu-lite serve did not answer /health within 180 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pcts(values) -> dict:
    a = np.array([v for v in values if v is not None], dtype=float)
    return {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2)} if len(a) else {}


def varied_prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(int(rng.expovariate(1 / 60)) + 1))[:2000]


async def closed_loop(url: str, clients: int, duration_s: float, prompt_fn, warmup_s: float = 2.0,
                      pid: int | None = None, extra=None) -> dict:
    """`clients` tasks, each sending one request after another for warmup_s + duration_s; only
    requests started after the warm-up count. `extra`: one more coroutine run alongside (unmeasured)."""
    rows: list[tuple[float, int, dict]] = []
    errors: list[str] = []
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    http = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients + 2,
                                                              max_keepalive_connections=clients + 2))
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=120, http_client=http)
    cpu0 = n0 = None

    async def one(k: int) -> None:
        nonlocal cpu0, n0
        rng = random.Random(k)
        while (t := time.perf_counter()) < t_end:
            if t >= t_measure and cpu0 is None and pid is not None:
                cpu0, n0 = cpu_s(pid), len(rows)
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="fugu-lite", messages=[{"role": "user", "content": prompt_fn(rng)}])
                status, info = raw.status_code, raw.parse().model_extra.get("fugu_lite", {})
            except openai.APIStatusError as exc:
                status, info = exc.status_code, {}
            except openai.APIError as exc:
                if t >= t_measure:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if t >= t_measure:
                rows.append((time.perf_counter() - t, status, info))

    tasks = [one(k) for k in range(clients)] + ([extra(t_end)] if extra else [])
    await asyncio.gather(*tasks)
    cpu1 = cpu_s(pid) if pid is not None else None
    health = (await http.get(url + "/health")).json()
    await http.aclose()
    wall = time.perf_counter() - t_measure
    status = np.array([s for _, s, _ in rows])
    ok = [r for r in rows if r[1] == 200]
    out = {
        "clients": clients, "seconds": round(wall, 2), "requests": len(rows), "throughput_rps": round(len(ok) / wall, 1),
        "status_5xx": int((status >= 500).sum()) if len(status) else 0,
        "other_errors": len(errors) + (int(((status >= 400) & (status < 500)).sum()) if len(status) else 0),
        "e2e_ms": pcts(r[0] * 1000 for r in ok), "overhead_ms": pcts(r[2].get("overhead_ms") for r in ok),
        "route_ms": pcts(r[2].get("route_ms") for r in ok), "queue_ms": pcts(r[2].get("queue_ms") for r in ok),
        "upstream_ms": pcts(r[2].get("upstream_ms") for r in ok), "batching": health["batching"],
        "first_errors": errors[:3],
    }
    if cpu0 is not None and len(rows) > n0:
        out["cpu_ms_per_request"] = round((cpu1 - cpu0) * 1000 / (len(rows) - n0), 2)
    return out


def big_client(url: str, size: int, done: list):
    """A client that sends `size`-character prompts one after another until t_end."""
    prompt = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]

    async def run(t_end: float) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            c = openai.AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=120, http_client=http)
            while (t := time.perf_counter()) < t_end:
                try:
                    await c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompt}])
                    done.append(time.perf_counter() - t)
                except openai.APIError as exc:
                    done.append(exc)
    return run


def normal_prompt():
    """An ordinary client's prompts: the synthetic tasks, each made unique."""
    synthetic = synthetic_tasks()[0]
    return lambda rng: f"{rng.choice(synthetic)} (case {rng.randrange(10**6)})"


async def memory_run(url: str, pid: int, n: int, clients: int, every: int = 1000) -> dict:
    rng = random.Random(7)
    prompts = [varied_prompt(rng) for _ in range(n)]
    trace = [(0, round(rss_mb(pid), 1))]
    counter = {"next": 0, "done": 0, "bad": 0}
    async with httpx.AsyncClient(timeout=120) as http:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=120, http_client=http)

        async def worker() -> None:
            while counter["next"] < n:
                i = counter["next"]
                counter["next"] += 1
                try:
                    await client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": prompts[i]}])
                except openai.APIError:
                    counter["bad"] += 1
                counter["done"] += 1
                if counter["done"] % every == 0:
                    trace.append((counter["done"], round(rss_mb(pid), 1)))

        t = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(clients)])
    lengths = sorted({len(p) for p in prompts})
    return {"requests": n, "failed": counter["bad"], "seconds": round(time.perf_counter() - t, 1),
            "distinct_prompt_lengths": len(lengths), "rss_mb": trace}


def routing_throughput(models: Path, batch: int, prompt_fn, n: int = 256) -> dict:
    import torch

    from fugu_pipeline.route.promoted import PromotedRouter

    torch.set_num_threads(1)
    rng = random.Random(3)
    prompts = [prompt_fn(rng) for _ in range(n)]
    router = PromotedRouter(models, device="cpu")
    router.route_batch(prompts[:batch])
    out = {}
    for name, size in (("one_at_a_time", 1), (f"batches_of_{batch}", batch)):
        t = time.perf_counter()
        for i in range(0, n, size):
            router.route_batch(prompts[i:i + size])
        out[name] = round(n / (time.perf_counter() - t), 1)
    out["ratio"] = round(out[f"batches_of_{batch}"] / out["one_at_a_time"], 2)
    return out


def run(args) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    models = work / "models-tiny"
    if not (models / "promoted" / "current.json").exists():
        print(f"training a tiny-encoder checkpoint in {models} ...", flush=True)
        build_checkpoints(models, seeds=(0,))
    normal = normal_prompt()
    r: dict = {"machine": machine(), "stub_latency_ms": args.stub_latency * 1000, "load_avg_before": os.getloadavg()}
    stub, stub_url = start_stub(args.stub_latency, work / "stub.log")
    try:
        cfg = stub_workers_config(stub_url + "/v1").model_dump(mode="json", exclude_none=True)
        for w in cfg["workers"]:
            w["max_concurrency"] = 1024
        workers = work / "workers.yaml"
        workers.write_text(yaml.safe_dump(cfg))

        print("a client sending 2 MB bodies of a million small JSON values:", flush=True)
        for name, prelude in (("json_flood", None), ("json_flood_old_parser", OLD_PARSER if args.old_parser else None)):
            if name != "json_flood" and prelude is None:
                continue
            server, url = start_server(models, workers, work / f"server-{name}.log", prelude=prelude)
            try:
                r[name] = json_flood(url, server.pid, TOKEN, args.big_clients, args.duration, normal, closed_loop)
                print(f"  {name}: {json.dumps(r[name])}", flush=True)
            finally:
                stop(server)
        if args.json_flood_only:
            return {**r, "load_avg_after": os.getloadavg()}

        print("latency and CPU (dtype auto), 2 MB client:", flush=True)
        server, url = start_server(models, workers, work / "server.log")
        try:
            for name, clients in (("one_client", 1), ("fifty_clients", args.clients)):
                r[name] = asyncio.run(closed_loop(url, clients, args.duration, normal, pid=server.pid))
                print(f"  {name}: {json.dumps(r[name])}", flush=True)
            r["without_2mb_client"] = asyncio.run(closed_loop(url, args.big_clients, args.duration, normal))
            done: list = []
            r["with_2mb_client"] = asyncio.run(closed_loop(url, args.big_clients, args.duration, normal,
                                                           extra=big_client(url, 2_000_000, done)))
            ok = [d for d in done if isinstance(d, float)]
            r["with_2mb_client"]["big_requests"] = {"answered": len(ok), "failed": len(done) - len(ok),
                                                    "ms": pcts(d * 1000 for d in ok)}
            for k in ("without_2mb_client", "with_2mb_client"):
                print(f"  {k}: {json.dumps(r[k])}", flush=True)
        finally:
            stop(server)

        print("CPU with torch's default threads (--torch-threads 0):", flush=True)
        server, url = start_server(models, workers, work / "server-threads0.log", "--torch-threads", "0")
        try:
            for name, clients in (("one_client_default_threads", 1), ("fifty_clients_default_threads", args.clients)):
                r[name] = asyncio.run(closed_loop(url, clients, args.duration, normal, pid=server.pid))
                print(f"  {name}: {json.dumps(r[name])}", flush=True)
        finally:
            stop(server)

        if not args.skip_uncut:
            print("2 MB client with the character cut switched off (the behaviour before it):", flush=True)
            server, url = start_server(models, workers, work / "server-uncut.log", uncut=True)
            try:
                asyncio.run(closed_loop(url, 1, 1.0, normal, warmup_s=0.5))
                done = []
                r["with_2mb_client_uncut"] = asyncio.run(closed_loop(url, args.big_clients, args.duration, normal,
                                                                     extra=big_client(url, 2_000_000, done)))
                ok = [d for d in done if isinstance(d, float)]
                r["with_2mb_client_uncut"]["big_requests"] = {"answered": len(ok), "failed": len(done) - len(ok),
                                                              "ms": pcts(d * 1000 for d in ok)}
                print(f"  {json.dumps(r['with_2mb_client_uncut'])}", flush=True)
            finally:
                stop(server)

        for variant in args.memory_dtypes:
            dtype, uncapped = variant.removesuffix("-uncapped"), variant.endswith("-uncapped")
            env = {name: "1024" for name in NATIVE_CACHE_VARIABLES} if uncapped else None
            print(f"memory over {args.memory_requests} requests, --dtype {dtype}"
                  + (" (native caches at their default 1,024 entries: the behaviour before the cap)" if uncapped else ""),
                  flush=True)
            server, url = start_server(models, workers, work / f"server-{variant}.log", "--dtype", dtype, env=env)
            try:
                r[f"memory_{variant}"] = asyncio.run(memory_run(url, server.pid, args.memory_requests, args.memory_clients))
                print(f"  {json.dumps(r[f'memory_{variant}'])}", flush=True)
            finally:
                stop(server)

        if not args.skip_compare:
            print("batched vs one at a time:", flush=True)
            for name, extra in (("batched", ()), ("one_at_a_time", ("--max-batch", "1", "--batch-window-ms", "0"))):
                server, url = start_server(models, workers, work / f"server-{name}.log", *extra)
                try:
                    r[name] = asyncio.run(closed_loop(url, args.compare_clients, args.duration, normal))
                    print(f"  {name}: {json.dumps(r[name])}", flush=True)
                finally:
                    stop(server)
            r["routing_in_process"] = routing_throughput(models, 32, normal)
    finally:
        stop(stub)
    r["load_avg_after"] = os.getloadavg()
    return r


def report(r: dict) -> str:
    def lat(x):
        return (f"overhead_ms p50 {x['overhead_ms']['p50']:.2f} p99 {x['overhead_ms']['p99']:.2f}; "
                f"client e2e - stub p50 {x['e2e_ms']['p50'] - r['stub_latency_ms']:.2f} "
                f"p99 {x['e2e_ms']['p99'] - r['stub_latency_ms']:.2f}")

    lines = [f"{r['machine']}; stub latency {r['stub_latency_ms']:g} ms; load average before "
             f"{r['load_avg_before'][0]:.2f}, after {r['load_avg_after'][0]:.2f}"]
    for k in ("json_flood", "json_flood_old_parser"):
        if k in r:
            f, a, b = r[k], r[k]["alone"], r[k]["with_flood"]
            lines.append(
                f"{k}: {a['clients']} clients alone: e2e p50 {a['e2e_ms']['p50']:.1f} ms, {a['requests']} requests in "
                f"{a['seconds']:.0f} s; with one client sending 2 MB bodies of {FLOOD_VALUES:,} JSON values back to "
                f"back ({f['flood']['sent']} sent, statuses {f['flood']['statuses']}, each {f['flood']['ms'].get('p50')} "
                f"ms p50): e2e p50 {b['e2e_ms']['p50']:.1f} ms, {b['requests']} requests: ratio "
                f"{b['e2e_ms']['p50'] / a['e2e_ms']['p50']:.2f}x; server CPU per flood body "
                f"{f['cpu_ms_per_flood_request']} ms; load average {f['load_avg_before'][0]:.2f} -> "
                f"{f['load_avg_after'][0]:.2f}")
    if "one_client" not in r:  # --json-flood-only
        return "\n".join(lines)
    for name in ("one_client", "fifty_clients", "one_client_default_threads", "fifty_clients_default_threads"):
        x = r[name]
        lines.append(f"{name}: {x['clients']} client(s), {x['requests']} requests, {x['throughput_rps']} req/s, 5xx "
                     f"{x['status_5xx']}: CPU {x.get('cpu_ms_per_request')} ms/request; {lat(x)}; "
                     f"upstream_ms p50 {x['upstream_ms']['p50']:.1f}, queue_ms p99 {x['queue_ms']['p99']:.1f}")
    a, b = r["without_2mb_client"], r["with_2mb_client"]
    lines.append(f"{a['clients']} clients alone: route_ms p50 {a['route_ms']['p50']:.1f}, overhead p50 "
                 f"{a['overhead_ms']['p50']:.1f}, e2e p50 {a['e2e_ms']['p50']:.1f} ms; with one 2 MB client: route_ms "
                 f"p50 {b['route_ms']['p50']:.1f}, overhead p50 {b['overhead_ms']['p50']:.1f}, e2e p50 "
                 f"{b['e2e_ms']['p50']:.1f} ms (its own requests: {b['big_requests']})")
    if "with_2mb_client_uncut" in r:
        c = r["with_2mb_client_uncut"]
        lines.append(f"  the same with the character cut off (before the fix): route_ms p50 {c['route_ms']['p50']:.1f}, "
                     f"overhead p50 {c['overhead_ms']['p50']:.1f}, e2e p50 {c['e2e_ms']['p50']:.1f} ms "
                     f"(its own requests: {c['big_requests']})")
    for k in [k for k in r if k.startswith("memory_")]:
        m = r[k]
        lines.append(f"{k[7:]}: RSS {m['rss_mb'][0][1]:.0f} MB at start -> {m['rss_mb'][-1][1]:.0f} MB after "
                     f"{m['requests']} requests ({m['distinct_prompt_lengths']} prompt lengths, {m['failed']} failed): "
                     + ", ".join(f"{n}:{v:.0f}" for n, v in m["rss_mb"]))
    if "batched" in r:
        b, s = r["batched"]["throughput_rps"], r["one_at_a_time"]["throughput_rps"]
        lines.append(f"batched {b} req/s vs one at a time {s} req/s at {r['batched']['clients']} clients: "
                     f"{b / s:.2f}x; in process: {r['routing_in_process']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds measured per phase (after a 2 s warm-up)")
    ap.add_argument("--stub-latency", type=float, default=0.02, help="seconds before every stub answer")
    ap.add_argument("--big-clients", type=int, default=8, help="normal clients in the 2 MB comparison")
    ap.add_argument("--memory-requests", type=int, default=10_000)
    ap.add_argument("--memory-clients", type=int, default=16)
    ap.add_argument("--memory-dtypes", nargs="+", default=["bfloat16", "float32", "bfloat16-uncapped"],
                    help="'<dtype>-uncapped' runs with oneDNN's and ideep's caches at their default size")
    ap.add_argument("--compare-clients", type=int, default=32)
    ap.add_argument("--skip-compare", action="store_true", help="skip batched vs one-at-a-time")
    ap.add_argument("--skip-uncut", action="store_true", help="skip the 2 MB run with the character cut off")
    ap.add_argument("--json-flood-only", action="store_true", help="only the 2 MB JSON-values client comparison")
    ap.add_argument("--old-parser", action="store_true", help="also run that comparison with the request parser "
                    "before (Python's json with hooks, on the serving loop)")
    ap.add_argument("--workdir", help="keeps the checkpoint, logs and results (default: a new temp dir)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    r = run(args)
    print("\n" + report(r))
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
