"""The goal, shown: a served cascade answers the request that once stopped the server, and every
hostile text of the property tests, within a second, while `/health` and other clients are answered.

    python benchmarks/bench_serve_untrusted.py                  # this checkout
    python benchmarks/bench_serve_untrusted.py --tree ../base   # the same, the server from another checkout

Processes on 127.0.0.1: the stub LLM server (in this process; its three models echo each hostile
prompt back, as the mock workers of the offline main job do), `fugu-lite serve` in a subprocess as a
user starts it (`python -m fugu_pipeline.cli serve --checkpoint C --workers W --device cpu`, from
`--tree` when given) over a cascade checkpoint (`testing/cascade_serving.py`: tiny encoder, a
verifier, the plan `[alpha, beta] stop if 2 agree or verifier >= 0.99 -> [gamma]`), and this load
generator: one client polling `/health` and one sending a normal prompt back to back the whole
time, while a third sends each hostile prompt (`testing/hostile_text.py`, `--chars` characters;
lone surrogates are refused with a 400, which is an answer too) with a `--timeout` of its own.
Prints, per hostile prompt: its status (an answer: 200; 400 for lone surrogates; 502 when every
worker's echo is blank, as a reply of only spaces is) and seconds, whether that is under a second,
and how many of the `/health` polls and normal requests in flight while it ran were answered (a
timeout of 30 s is not), with the slowest answered.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import describe  # noqa: E402

REPORTED = "Compute x = " + "10" * 20 + " y = 1"
NORMAL = "What is 3 + 4?"


class Background:
    """`/health` polls and normal requests, back to back, each logged as (start, seconds, ok)."""

    def __init__(self, url: str):
        import httpx

        self.url, self.stop, self.log = url, threading.Event(), {"health": [], "normal": []}
        self.started: dict[str, float | None] = {k: None for k in self.log}  # the call waiting now
        self.http = httpx.Client(timeout=30)
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in self.log]
        for t in self.threads:
            t.start()

    def _loop(self, kind: str) -> None:
        body = {"model": "fugu-lite", "messages": [{"role": "user", "content": NORMAL}]}
        while not self.stop.is_set():
            t0 = self.started[kind] = time.perf_counter()
            try:
                r = (self.http.get(self.url + "/health") if kind == "health"
                     else self.http.post(self.url + "/v1/chat/completions", json=body))
                ok = r.status_code == 200
            except Exception:  # noqa: BLE001 - a timeout or a refused connection is what is counted
                ok = False
            self.log[kind].append((t0, time.perf_counter() - t0, ok))
            self.started[kind] = None

    def during(self, kind: str, t0: float, t1: float) -> str:
        """'answered of in flight (slowest answered seconds)' for the calls in flight in [t0, t1],
        the one still waiting counted in flight."""
        got = [(s, ok) for start, s, ok in list(self.log[kind]) if start <= t1 and start + s >= t0]
        waiting = 1 if self.started[kind] is not None and self.started[kind] <= t1 else 0
        slowest = max((s for s, ok in got if ok), default=0.0)
        return f"{sum(ok for _, ok in got)} of {len(got) + waiting} ({slowest:.3f})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chars", type=int, default=100_000, help="the hostile prompts' length (a body is at most 2 MiB)")
    ap.add_argument("--timeout", type=float, default=30.0, help="the hostile client's wait for each answer")
    ap.add_argument("--tree", type=Path, default=None, help="run the server from this checkout (before/after)")
    args = ap.parse_args()
    import httpx

    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
    from fugu_pipeline.testing.hostile_text import hostile_texts
    from fugu_pipeline.testing.serving import stub_workers_config
    from fugu_pipeline.testing.stub_llm import StubLLMServer

    prompts = {"the reported prompt (40 digits before =)": REPORTED}
    for k, v in hostile_texts(args.chars).items():
        prompts[f"{k} ({args.chars:,} chars)"] = v
        kept = "".join(c for c in v if not "\ud800" <= c <= "\udfff")
        if kept != v and kept:  # the server refuses lone surrogates (400): the rest is sent too
            prompts[f"{k}, surrogates dropped"] = kept
    print(describe())
    with tempfile.TemporaryDirectory() as tmp, StubLLMServer() as stub:
        ckpt = build_cascade_checkpoint(Path(tmp) / "models", Path(tmp) / "emb")
        for text in [NORMAL, *prompts.values()]:
            stub.set_answer(text, text if text != NORMAL else "3 + 4 = 7. #### 7")
        cfg = Path(tmp) / "workers.json"
        cfg.write_text(json.dumps(stub_workers_config(stub.openai_url).model_dump(mode="json", exclude_none=True)))
        port = free_port()
        env = {**os.environ, **({"PYTHONPATH": str(args.tree.resolve())} if args.tree else {})}
        server = subprocess.Popen([sys.executable, "-m", "fugu_pipeline.cli", "serve", "--checkpoint", str(ckpt),
                                   "--workers", str(cfg), "--device", "cpu", "--port", str(port)],
                                  cwd=args.tree or Path.cwd(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            print(f"server from {args.tree or 'this checkout'} on {url}; hostile prompts of {args.chars:,} characters")
            bg = Background(url)
            client = httpx.Client(timeout=args.timeout)
            print("hostile prompt | status | seconds | under 1 s | /health polls answered of those in flight "
                  "meanwhile (slowest s) | normal requests answered of those in flight (slowest s)")
            for name, text in prompts.items():
                body = json.dumps({"model": "fugu-lite", "messages": [{"role": "user", "content": text}]},
                                  ensure_ascii=True).encode()
                t0 = time.perf_counter()
                try:
                    status = client.post(url + "/v1/chat/completions", content=body,
                                         headers={"content-type": "application/json"}).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                t1 = time.perf_counter()
                print(f"{name} | {status} | {t1 - t0:.3f} | {'yes' if t1 - t0 < 1 and isinstance(status, int) else 'NO'} | "
                      f"{bg.during('health', t0, t1)} | {bg.during('normal', t0, t1)}", flush=True)
                if not isinstance(status, int):
                    print("the server did not answer: stopping here (the rest would wait behind it)")
                    break
            bg.stop.set()
        finally:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
