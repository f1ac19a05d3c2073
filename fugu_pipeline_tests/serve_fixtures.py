"""What the server tests share: the stub LLM workers on 127.0.0.1, a models folder with one trained
router promoted, the stub's reset after each test, `fugu-lite serve` as a subprocess, the request
bodies a server must refuse with a 400, and small helpers for messages and OpenAI-shaped errors.

A test file takes a fixture by binding it at module level, which keeps the fixture's scope that
file's (a module-scoped stub is that file's own stub):

    from fugu_pipeline_tests import serve_fixtures

    stub = serve_fixtures.stub
    models = serve_fixtures.one_router
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fugu_pipeline.serve.protocol import MAX_JSON_DEPTH
from fugu_pipeline.testing.serving import build_checkpoints
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.services import free_port

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def stub():
    """Stub LLM workers on 127.0.0.1 (`testing/stub_llm.py`), one for the file."""
    with StubLLMServer() as s:
        yield s


@pytest.fixture(scope="module")
def one_router(tmp_path_factory) -> Path:
    """A models folder holding one small trained router, promoted."""
    models = tmp_path_factory.mktemp("models")
    build_checkpoints(models, seeds=(0,))
    return models


@pytest.fixture(autouse=True)
def clean_stub(stub):
    """After each test: the stub's faults cleared and its added latency back to none."""
    yield
    stub.clear_faults()
    stub.set_latency(0.0)


# --------------------------------------------------------------------------- helpers


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def fugu(obj) -> dict:
    """The `fugu_lite` block of an `openai` client's reply."""
    return obj.model_extra["fugu_lite"]


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# --------------------------------------------------------------------------- `fugu-lite serve` as a subprocess


def fugu_lite() -> list[str]:
    script = Path(sys.executable).parent / "fugu-lite"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fugu_pipeline.cli"]


def start(args: list[str], log: Path, env: dict | None = None, preexec_fn=None) -> tuple[subprocess.Popen, str]:
    """`fugu-lite serve *args` on a free port, once it answers /health; `preexec_fn` runs in the
    child before it starts (e.g. to lower its open-file limit)."""
    port = free_port()
    proc = subprocess.Popen([*fugu_lite(), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "FUGU_SERVE_TOKEN": "", **(env or {})}, preexec_fn=preexec_fn)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"fugu-lite serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise AssertionError(f"fugu-lite serve did not answer /health within 120 s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen, within_s: float = 180) -> int:
    """SIGINT, then its exit status; a server still running `within_s` later is a stuck one (a
    bound a loaded machine never reaches: it stopped in 1-5 s, and once in 21 s at a load of 12)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"fugu-lite serve did not stop within {within_s:g} s of SIGINT: stuck") from None


# --------------------------------------------------------------------------- bodies a server refuses with a 400


def scrape(url: str, token: str, wait_s: float = 30.0) -> list:
    """The server's /metrics, parsed (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=wait_s).text
    return list(text_string_to_metric_families(text))


def closed_total(url: str, token: str) -> dict[str, float]:
    """`fugu_connections_closed_total` by reason."""
    return {s.labels["reason"]: s.value for f in scrape(url, token)
            if f.name == "fugu_connections_closed" for s in f.samples if s.name.endswith("_total")}


def gauges(url: str, token: str) -> dict[str, float]:
    """Every single-sample gauge by name."""
    return {f.name: f.samples[0].value for f in scrape(url, token) if f.type == "gauge" and len(f.samples) == 1}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_BODIES = {
    "NaN in a passed-through field": '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"50256": NaN}}',
    "Infinity in an unknown field": '{"messages": [{"role": "user", "content": "hi"}], "extra": Infinity}',
    "-Infinity as temperature": '{"messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}',
    "number out of float range": '{"messages": [{"role": "user", "content": "hi"}], "top_p": 1e999}',
    "JSON nested 1,000 deep": '{"messages": [{"role": "user", "content": "hi"}], "x": ' + nested(1000) + "}",
    "JSON nested 100,000 deep": '{"messages": [{"role": "user", "content": "hi"}], "x": ' + nested(100_000) + "}",
    f"JSON nested {MAX_JSON_DEPTH + 5} deep": '{"messages": [{"role": "user", "content": "hi"}], "x": '
                                              + nested(MAX_JSON_DEPTH + 5) + "}",
    "lone surrogate in a system message": '{"messages": [{"role": "system", "content": "\\udfff"}, '
                                          '{"role": "user", "content": "hi"}]}',
    "lone surrogate in a key": '{"messages": [{"role": "user", "content": "hi"}], "\\ud83d": 1}',
    "lone surrogate in a text part": '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
    "content a number": '{"messages": [{"role": "user", "content": 5}]}',
    "content part not an object": '{"messages": [{"role": "user", "content": [5]}]}',
    "text part without text": '{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
    "role missing": '{"messages": [{"content": "hi"}]}',
    "tool_calls a number on a user message": '{"messages": [{"role": "user", "content": "hi", "tool_calls": 1.5}]}',
    "tool_calls a list on a user message": '{"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}',
    "tool_calls true on a system message": '{"messages": [{"role": "system", "content": "be brief", "tool_calls": true}, '
                                           '{"role": "user", "content": "hi"}]}',
    "name a number": '{"messages": [{"role": "user", "content": "hi", "name": 5}]}',
    "messages empty": '{"messages": []}',
    "model a number": '{"model": 5, "messages": [{"role": "user", "content": "hi"}]}',
    "stop a number": '{"messages": [{"role": "user", "content": "hi"}], "stop": 5}',
    "stop a list of numbers": '{"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}',
    "logit_bias out of range": '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": 1000}}',
    "response_format a string": '{"messages": [{"role": "user", "content": "hi"}], "response_format": "json"}',
    "max_tokens a string": '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}',
    "max_tokens a bool": '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}',
    "stream a string": '{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    "stream_options.include_usage a string": '{"messages": [{"role": "user", "content": "hi"}], "stream": true, '
                                             '"stream_options": {"include_usage": "yes"}}',
    "fugu_cost_weight a string": '{"messages": [{"role": "user", "content": "hi"}], "fugu_cost_weight": "lots"}',
    "fugu_cost_weight NaN": '{"messages": [{"role": "user", "content": "hi"}], "fugu_cost_weight": NaN}',
    "an integer beyond float range": '{"messages": [{"role": "user", "content": "hi"}], "temperature": ' + "9" * 400 + "}",
    "an integer beyond 64 bits": '{"messages": [{"role": "user", "content": "hi"}], "seed": ' + "9" * 25 + "}",
    "fugu_budget share beyond float range": '{"messages": [{"role": "user", "content": "hi"}], "fugu_budget": '
                                            '{"share": ' + "9" * 400 + "}}",
    "fugu_cost_weight 1e300": '{"messages": [{"role": "user", "content": "hi"}], "fugu_cost_weight": 1e300}',
    "fugu_cost_weight negative": '{"messages": [{"role": "user", "content": "hi"}], "fugu_cost_weight": -1}',
    "fugu_allowed_workers a string": '{"messages": [{"role": "user", "content": "hi"}], "fugu_allowed_workers": "alpha"}',
    "fugu_lite unknown key": '{"messages": [{"role": "user", "content": "hi"}], "fugu_lite": {"rm": 1}}',
    "body a list": "[1, 2]",
    "body null": "null",
    "body empty": "",
    "invalid UTF-8 bytes": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "truncated JSON": '{"messages": [{"role": "user"',
}
