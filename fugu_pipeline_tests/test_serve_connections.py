"""Slow and idle clients against the server (`serve/connections.py`): raw sockets and the official
`openai` client on loopback, stub LLM workers on 127.0.0.1.

What users found: no header or body read timeout and no connection cap. A client that sent half a
body was still connected after 40 s; clients holding thousands of connections that sent only
`POST /v1/chat/completions HTTP/1.1\\r\\nHost: 127` (no token needed) took the server to its
open-file limit, after which `/health` and authenticated requests got no answer; nothing was logged.

Timeouts are short here (a fraction of a second) so the tests are quick; no assertion is about how
long anything took: a socket read waits up to a generous deadline, and a server that never closes
the connection fails the test by reaching it. `fugu-lite serve` at its open-file limit facing a
flood of half-open connections: `test_serve_flood.py`."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.serve.connections import ConnectionLimits, DropLog, uvicorn_options
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.serve_fixtures import ask, closed_total
from fugu_pipeline_tests.waiting import wait_until

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub

TOKEN = "conn-test-token"
HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127"  # what the flood sent, byte for byte
WAIT_S = 30.0  # the most a socket read waits for the server to answer or close
QUICK = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5, max_connections=8, max_in_flight=2)
PATIENT = QUICK.model_copy(update={"header_timeout_s": WAIT_S, "keep_alive_s": WAIT_S})  # nothing closes but the cap


def serve_with(models, stub, limits: ConnectionLimits) -> ServerThread:
    app = create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url), api_token=TOKEN,
                     batch_window_ms=1, limits=limits)
    srv = ServerThread(app, uvicorn_options(app, limits))
    srv.app = app
    return srv


@pytest.fixture
def server(models, stub):
    srv = serve_with(models, stub, QUICK)
    yield srv
    srv.stop()


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    sock.settimeout(WAIT_S)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def test_half_sent_headers_get_a_408_and_the_connection_is_closed(server, stub, caplog):
    stub.reset_counts()
    with caplog.at_level(logging.WARNING, logger="fugu_pipeline.serve"), connect(server.port) as s:
        s.sendall(HALF_OPEN)
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in reply
    with connect(server.port) as silent:  # a connection that sends nothing is closed too, without a reply
        assert read_until_closed(silent) == b""
    assert closed_total(server.url, TOKEN)["header_timeout"] == 2
    said = [r.getMessage() for r in caplog.records if "header_timeout" in r.getMessage()]
    assert len(said) == 1 and "--header-timeout-s" in said[0]  # the second is summed, not said again
    assert stub.chat_requests() == []


def test_a_slow_body_is_cut_and_the_worker_never_called(server, stub):
    stub.reset_counts()
    with connect(server.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 200\r\n\r\n{\"messages\": ")
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 408 ") and b"body" in reply
    assert closed_total(server.url, TOKEN)["body_timeout"] == 1
    assert stub.chat_requests() == []


def test_an_idle_kept_alive_connection_is_closed_after_its_answer(server):
    with connect(server.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = read_until_closed(s)  # the answer, then the close once keep_alive_s has passed
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert closed_total(server.url, TOKEN)["idle"] >= 1


def test_a_full_server_closes_the_oldest_half_open_connections_and_keeps_answering(models, stub):
    server = serve_with(models, stub, PATIENT)
    guard = server.app.state.fugu_metrics.guard
    flood = [connect(server.port) for _ in range(20)]
    try:
        for s in flood:
            s.sendall(HALF_OPEN)
        wait_until(lambda: guard.closed["evicted"] == 20 - QUICK.max_connections, "the flood to be admitted")
        assert httpx.get(server.url + "/health", timeout=WAIT_S).status_code == 200  # evicts one (and closes)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S)
        assert client.chat.completions.create(model="fugu-lite", messages=ask("hi")).choices[0].message.content
        closed = closed_total(server.url, TOKEN)  # the scrape's own connection evicts one more
        assert closed["evicted"] == 20 - QUICK.max_connections + 2
        assert all(read_until_closed(s) == b"" for s in flood[:14])  # the oldest went first
        assert guard.waiting and all(s.fileno() for s in flood[14:])
    finally:
        for s in flood:
            s.close()
        server.stop()


def test_requests_over_the_in_flight_cap_get_a_503_with_retry_after(server, stub):
    gate = server.app.state.fugu_metrics.gate
    stub.set_latency(2.0)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S)
    answers: list[str] = []
    slow = [threading.Thread(target=lambda: answers.append(client.chat.completions.create(
        model="fugu-lite", messages=ask("slow")).choices[0].message.content)) for _ in range(QUICK.max_in_flight)]
    for t in slow:
        t.start()
    wait_until(lambda: gate.in_flight == QUICK.max_in_flight, "the slow requests to be in flight")
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="fugu-lite", messages=ask("one more"))
    assert exc.value.status_code == 503 and exc.value.response.headers["retry-after"] == str(QUICK.retry_after_s)
    assert exc.value.response.json()["error"]["code"] == "server_busy"
    assert httpx.get(server.url + "/health", timeout=WAIT_S).status_code == 200  # not counted, not refused
    for t in slow:
        t.join(WAIT_S)
    assert len(answers) == QUICK.max_in_flight
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    refused = {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
               if f.name == "fugu_requests_refused" for s in f.samples if s.name.endswith("_total")}
    assert refused == {"in_flight": 1.0}


def test_a_flood_of_drops_is_logged_in_two_lines(caplog):
    async def flood():
        log = DropLog(every_s=0.05)
        for k in range(1000):
            log.note("header_timeout", f"closed connection {k}")
        await asyncio.sleep(0.2)  # the period ends: the rest are summed in one line

    with caplog.at_level(logging.WARNING, logger="fugu_pipeline.serve"):
        asyncio.run(flood())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "closed connection 0" in lines[0] and "since the last line of their kind: 999 header_timeout" in lines[1]


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_timeout_flag_is_one_line_naming_it(capsys, tmp_path, value):
    # before: --header-timeout-s inf started a server that never timed out a slow client's headers (here
    # an empty models folder would then be the one line)
    from fugu_pipeline.cli import main

    assert main(["serve", "--workers", str(REPO / "configs" / "workers.mock.yaml"), "--models-dir", str(tmp_path),
                 "--header-timeout-s", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fugu-lite serve: --header-timeout-s {value}: ") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("flag, value, says", [
    ("--port", "-1", "a TCP port is 0 to 65535"), ("--port", "70000", "a TCP port is 0 to 65535"),
    ("--torch-threads", "-1", "0 (torch's default) to 1024"), ("--torch-threads", "99999999999", "0 (torch's default)"),
    ("--batch-window-ms", "-1", "0 (no waiting) to 10000"), ("--batch-window-ms", "nan", "0 (no waiting)"),
    ("--max-batch", "0", "1 (no batching) to 4096"), ("--max-body-bytes", "0", "at least 1024"),
    ("--shutdown-grace-s", "inf", "0 to 3600"), ("--auth-cooldown-s", "nan", "0 (never keep a worker out)"),
])
def test_a_port_or_thread_count_out_of_range_is_one_line(capsys, tmp_path, flag, value, says):
    # before: OverflowError from bind(), torch's "set_num_threads expects a positive integer", the batcher's
    # ValueError once the router had loaded: tracebacks; an infinite grace never stopped on Ctrl-C
    from fugu_pipeline.cli import main

    assert main(["serve", "--workers", str(REPO / "configs" / "workers.mock.yaml"), "--models-dir", str(tmp_path),
                 flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fugu-lite serve: {flag} {value}: ") and says in err and len(err.splitlines()) == 1, err
