"""`fugu-lite serve` as users start it (default flags), its open-file limit lowered, facing a flood
of half-open connections that sent only `POST /v1/chat/completions HTTP/1.1\r\nHost: 127` and no
token. Before the connection guard (`serve/connections.py`) such a flood took the server to its
file limit, after which `/health` and authenticated requests got no answer at all, and nothing was
logged. `benchmarks/bench_slow_clients.py` measures the same at 6,000 and 20,000 connections."""

from __future__ import annotations

import resource
import socket

import httpx
import openai

from fugu_pipeline.testing.serving import stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, closed_total, gauges, start, stop
from fugu_pipeline_tests.waiting import wait_until

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub

TOKEN = "flood-test-token"
HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127"
WAIT_S = 30.0  # the most a request waits for its answer


NOFILE = 2048
FLOOD = 2600  # more half-open connections than the server has file descriptors


def test_serve_at_its_open_file_limit_keeps_answering_a_flood_of_half_open_connections(models, stub, tmp_path):
    """`fugu-lite serve` as users start it (default flags), its open-file limit 2,048, facing 2,600
    half-open connections without a token: `/health` and an authenticated request are answered,
    and the connections it closed are counted in /metrics and summed in its log."""
    cfg = tmp_path / "workers.yaml"
    cfg.write_text(stub_workers_config(stub.openai_url).model_dump_json(exclude_none=True))
    log = tmp_path / "serve.log"
    proc, url = start(["--models-dir", str(models), "--workers", str(cfg), "--device", "cpu"], log,
                      env={"FUGU_SERVE_TOKEN": TOKEN},
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)))
    port = int(url.rsplit(":", 1)[1])
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        for s in flood:
            try:
                s.send(HALF_OPEN)
            except OSError:  # not connected yet: it stays silent, half-open all the same
                pass
        assert httpx.get(url + "/health", timeout=WAIT_S).status_code == 200
        client = openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S)
        assert client.chat.completions.create(model="fugu-lite", messages=ask("still there?")).choices[0].message.content
        peak = gauges(url, TOKEN)
        # the flood holds its connections: the header timeout (10 s by default) closes them all
        wait_until(lambda: gauges(url, TOKEN)["fugu_connections_open"] <= 1, "the half-open connections to be closed", every=0.2)
        closed = closed_total(url, TOKEN)
    finally:
        for s in flood:
            s.close()
        stop(proc)
    assert peak["fugu_connections_open"] <= peak["fugu_connections_cap"] < NOFILE
    assert closed["evicted"] >= 1 and closed["evicted"] + closed["header_timeout"] >= peak["fugu_connections_cap"]
    said = [line for line in log.read_text().splitlines() if "evicted" in line]
    assert 1 <= len(said) <= 5, said  # the first drop, then sums: not a line per connection
