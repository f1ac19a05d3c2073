"""Building blocks for serving tests and benchmarks: synthetic routing tasks in which each domain has
its own best worker, checkpoints trained on them, a worker config pointing at the stub LLM server,
and an ASGI app run by uvicorn on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import uvicorn

from fugu_pipeline.workers.config import WorkersConfig

WORKERS = {"alpha": "stub/alpha", "beta": "stub/beta", "gamma": "stub/gamma"}  # worker id -> stub model
PROMPTS = {
    "math": ["What is {i} times {j}?", "Solve for x: {i}x + {j} = 0.", "Compute the sum of the first {i} integers."],
    "code": ["Write a Python function that returns the {i}th Fibonacci number.",
             "Fix the bug: def f(x): return x[{i}] + {j}", "Explain what this loop does: for i in range({i}): print(i)"],
    "general": ["Summarise the plot of a novel in {i} sentences.", "What is the capital city of country number {i}?",
                "Give {i} tips for a better night's sleep."],
}
BEST = {"math": 0, "code": 1, "general": 2}  # the worker (column) that wins each domain


@contextlib.contextmanager
def refusing_url() -> Iterator[str]:
    """A loopback `base_url` whose port refuses connections while the `with` block runs: a socket
    bound to it that never listens. A port bound and closed at once is free again, and under a
    loaded suite another test's server took one (the worker meant to refuse then timed out)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}/v1"


def synthetic_tasks(n: int = 60) -> tuple[list[str], list[str], np.ndarray]:
    """n prompts over three domains and a utility matrix over the three workers in which each
    domain has its own best worker."""
    rng = np.random.default_rng(0)
    prompts, domains = [], []
    for k in range(n):
        dom = list(PROMPTS)[k % 3]
        prompts.append(PROMPTS[dom][(k // 3) % 3].format(i=k + 2, j=3 * k + 1))
        domains.append(dom)
    utility = rng.uniform(0.0, 0.3, size=(n, 3))
    utility[np.arange(n), [BEST[d] for d in domains]] = 1.0
    return prompts, domains, utility


def build_checkpoints(models_dir: Path, seeds: tuple[int, ...] = (0, 1), epochs: int = 20,
                      encoder: str = "tiny", head: str = "layernorm_linear", dtype: str = "auto") -> list[Path]:
    """Train one SFT checkpoint per seed (head kind `head`) on the encoder's (default: the tiny
    one) features of `synthetic_tasks`, save them under `models_dir` and promote the first. Returns
    the checkpoint directories. A `quality` head (the rows then record cost) gets its budget
    calibration (`budget.json`) beside it, as `fugu-lite train-sft` writes it."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.routing_data import RoutingData
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.policies.oneshot.configs import SFTConfig
    from fugu_pipeline.policies.oneshot.sft import train_sft

    enc = Encoder.load(EncoderSettings(model=encoder, device="cpu", dtype=dtype))
    prompts, domains, utility = synthetic_tasks()
    splits = ["val" if k % 6 == 0 else "test" if k % 6 == 1 else "train" for k in range(len(prompts))]
    data = RoutingData(
        task_ids=[f"s{k}" for k in range(len(prompts))], prompts=prompts, domains=domains, splits=splits,
        worker_ids=list(WORKERS), features=enc.encode(prompts, domains), utility=utility,
        contract=enc.feature_contract(),
        quality=(utility >= 1.0).astype(np.float64) if head == "quality" else None,
        cost_usd=np.tile([0.001, 0.002, 0.004], (len(prompts), 1)) if head == "quality" else None,
    )
    enc.close()
    paths = [train_sft(data, SFTConfig(seed=s, epochs=epochs, patience=epochs, head=head)).save(models_dir)
             for s in seeds]
    if head == "quality":
        from fugu_pipeline.route.budget import calibrate_beside

        for p in paths:
            calibrate_beside(p, data, log=lambda m: None, strict=True)
    promote(models_dir, paths[0])
    return paths


def promote(models_dir: Path, checkpoint: Path) -> None:
    from fugu_pipeline.train.pointer import write_pointer

    write_pointer(models_dir, {"checkpoint": str(checkpoint.relative_to(models_dir)), "content_hash": checkpoint.name,
                               "method": "sft"})


def stub_workers_config(base_url: str, **over) -> WorkersConfig:
    workers = [{"id": wid, "kind": "openai_compatible", "model": model, "base_url": base_url,
                "price_in_per_mtok": 1.0 + i, "price_out_per_mtok": 2.0 + i, "max_concurrency": 64}
               for i, (wid, model) in enumerate(WORKERS.items())]
    return WorkersConfig.model_validate({"workers": workers, "timeout_s": 10.0, "connect_timeout_s": 2.0,
                                         "read_timeout_s": 5.0, **over})


class ServerThread:
    """Run an ASGI app under uvicorn on a free 127.0.0.1 port in a daemon thread. `options`: more
    `uvicorn.Config` arguments (`serve.connections.uvicorn_options(app, limits)`: the connection
    guard `fugu-lite serve` runs behind)."""

    def __init__(self, app, options: dict | None = None):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                                    **(options or {})))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fugu-lite server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
