"""What one client sending 2 MB request bodies of a million small JSON values does to everyone
else (`bench_serve.py`, `--json-flood-only` runs only this): the other clients' latency with and
without it, and the server's CPU per such body. `OLD_PARSER` starts the same server with the
request parser it had before (Python's `json` with a hook call per number, on the serving loop),
for the comparison in one run."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import numpy as np

FLOOD_VALUES = 1_000_000  # `0,` a million times: 2 MB, a body the byte limit lets through
OLD_PARSER = """
import json, math, sys
import fugu_pipeline.serve.app as app, fugu_pipeline.serve.json_body as jb
def finite(text):
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text} is out of range")
    return v
def old_load(raw, max_values):  # the parser before: Python's, one hook call per number, on the serving loop
    try:
        body = json.loads(raw, parse_constant=finite, parse_float=finite, parse_int=int)
    except ValueError as exc:
        raise jb.BodyError(400, str(exc), "invalid_json") from None
    jb.check_json_tree(body, 10**12, text=True)
    return body
jb.load_json, app.INLINE_BYTES = old_load, 10**12
from fugu_pipeline.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def flood_bodies() -> list[bytes]:
    """A valid body the value limit refuses (413), and one with NaN at its end (400)."""
    head = b'{"model":"fugu-lite","messages":[{"role":"user","content":"hi"}],"x":['
    return [head + b"0," * (FLOOD_VALUES - 1) + end for end in (b"0]}", b"NaN]}")]


def flood_client(url: str, token: str, done: list):
    """A client sending the flood bodies in turn, one after another until t_end. Sent as raw
    bytes: the openai client would spend its own CPU encoding a million values each time,
    throttling the flood and flattering the server."""
    bodies, headers = flood_bodies(), {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def run(t_end: float) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            while (t := time.perf_counter()) < t_end:
                r = await http.post(url + "/v1/chat/completions", content=bodies[len(done) % 2], headers=headers)
                done.append((time.perf_counter() - t, r.status_code))
    return run


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flood_cpu(url: str, pid: int, token: str, n: int = 10) -> float:
    """The server's CPU (ms) per flood body, sent one at a time with nothing else running."""
    bodies, headers = flood_bodies(), {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(timeout=120) as http:
        http.post(url + "/v1/chat/completions", content=bodies[0], headers=headers)  # warm-up
        cpu0 = cpu_s(pid)
        for i in range(n):
            http.post(url + "/v1/chat/completions", content=bodies[i % 2], headers=headers)
        return round((cpu_s(pid) - cpu0) * 1000 / n, 1)


def json_flood(url: str, pid: int, token: str, clients: int, duration: float, prompt_fn, closed_loop) -> dict:
    """`clients` ordinary clients (bench_serve's `closed_loop`) alone, then with one flood client."""
    out = {"load_avg_before": os.getloadavg(), "cpu_ms_per_flood_request": flood_cpu(url, pid, token)}
    out["alone"] = asyncio.run(closed_loop(url, clients, duration, prompt_fn))
    done: list = []
    out["with_flood"] = asyncio.run(closed_loop(url, clients, duration, prompt_fn, extra=flood_client(url, token, done)))
    ms = np.array([d * 1000 for d, _ in done])
    out["flood"] = {"sent": len(done), "statuses": sorted({s for _, s in done}),
                    "ms": {"p50": round(float(np.percentile(ms, 50)), 1)} if len(ms) else {}}
    out["load_avg_after"] = os.getloadavg()
    return out
