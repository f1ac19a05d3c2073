"""The server when a reply does not run to its end: a client that leaves mid-request, and a
graceful shutdown (SIGTERM) with replies in flight. The upstream is a raw asyncio server on
127.0.0.1 that answers slowly and records when the router closed its connection, so the tests see
the worker call itself being stopped, not just the router's side of it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
import yaml

from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, start

PACE_S, CHUNKS = 0.25, 40  # a streamed answer takes 10 s; a plain one comes after PLAIN_DELAY_S
PLAIN_DELAY_S = 10.0


class SlowUpstream:
    """An OpenAI-compatible chat endpoint (any path) that streams one chunk every PACE_S, or sleeps
    PLAIN_DELAY_S before a plain reply (or before a stream's first chunk when the prompt starts
    with "think first"). `calls` holds one record per request: `stream`, `opened`,
    `closed` (monotonic time the router closed the connection, None while open or when the answer
    ran to its end) and `completed`."""

    def __init__(self):
        self.calls: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slow-upstream")

    def __enter__(self) -> "SlowUpstream":
        self._thread.start()
        assert self._ready.wait(10), "slow upstream did not start"
        return self

    def __exit__(self, *exc) -> None:
        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE).group(1))
        body = json.loads(await reader.readexactly(length))
        rec = {"stream": bool(body.get("stream")), "opened": time.monotonic(), "closed": None, "completed": False}
        self.calls.append(rec)
        eof = asyncio.ensure_future(reader.read(1))  # b"" (or a reset) once the router closes the connection
        try:
            if rec["stream"] and str(body["messages"][-1]["content"]).startswith("think first"):
                await asyncio.wait([eof], timeout=PLAIN_DELAY_S)
            if rec["stream"] and not eof.done():
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
                for i in range(CHUNKS):
                    delta = {"role": "assistant", "content": f"w{i} "} if i == 0 else {"content": f"w{i} "}
                    chunk = {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    await asyncio.wait([eof], timeout=PACE_S)
                    if eof.done():
                        break
                else:
                    end = {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                    writer.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
                    rec["completed"] = True
            elif not rec["stream"]:
                await asyncio.wait([eof], timeout=PLAIN_DELAY_S)
                if not eof.done():
                    reply = json.dumps({"id": "up", "object": "chat.completion", "created": 0, "model": body["model"],
                                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "late"},
                                                     "finish_reason": "stop"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(reply), reply))
                    rec["completed"] = True
            if eof.done():
                rec["closed"] = time.monotonic()
            else:
                await writer.drain()
        finally:
            eof.cancel()
            writer.close()

    def wait_closed(self, call: dict, within_s: float) -> float | None:
        deadline = time.monotonic() + within_s
        while call["closed"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return call["closed"]


class Errors(logging.Handler):
    """ERROR records (tracebacks included) of the server's and uvicorn's loggers, meanwhile."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


models = serve_fixtures.one_router


@pytest.fixture
def served(models):
    """The app under uvicorn in this process, its workers on a SlowUpstream; yields (url, upstream, service)."""
    from fugu_pipeline.route.promoted import PromotedRouter

    errors = Errors()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "fugu_pipeline")]
    for lg in loggers:
        lg.addHandler(errors)
    with SlowUpstream() as up:
        app = create_app(PromotedRouter(models, device="cpu"), stub_workers_config(up.url), batch_window_ms=1)
        srv = ServerThread(app)
        try:
            yield srv.url, up, app.state.fugu, errors
        finally:
            srv.stop()
            for lg in loggers:
                lg.removeHandler(errors)


def test_a_client_that_leaves_a_stream_closes_the_worker_call(served):
    url, up, svc, errors = served
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with c.chat.completions.create(model="fugu-lite", messages=ask("tell me a long story"), stream=True) as s:
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                break  # the first words of the answer: leave
    call = up.calls[-1]
    closed = up.wait_closed(call, within_s=60)
    assert closed is not None and not call["completed"], "the worker kept streaming to nobody"

    # before the first byte: the worker is still thinking when the client gives up
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=0.75)
    with pytest.raises(openai.APITimeoutError):
        for _ in c.chat.completions.create(model="fugu-lite", messages=ask("think first, then tell"), stream=True):
            pass
    call = up.calls[-1]
    closed = up.wait_closed(call, within_s=60)
    assert closed is not None and not call["completed"], "the worker call ran on after the client had gone"
    assert len(up.calls) == 2  # and no fallback to another worker
    _assert_counted_and_quiet(url, errors, requests=2, disconnected=2)


def test_a_client_that_gives_up_on_a_plain_request_cancels_the_worker_call(served):
    url, up, svc, errors = served
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=0.75)
    with pytest.raises(openai.APITimeoutError):
        c.chat.completions.create(model="fugu-lite", messages=ask("think long and hard"))
    call = up.calls[-1]
    closed = up.wait_closed(call, within_s=60)
    assert closed is not None and not call["completed"], "the worker call ran on after the client had gone"
    assert len(up.calls) == 1  # and no fallback to another worker

    # a client that leaves halfway through sending its request: nothing to cancel, nothing to log
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 5000\r\n\r\n{\"model\": \"fugu-lite\", ")
        time.sleep(0.3)
    time.sleep(0.3)
    _assert_counted_and_quiet(url, errors, requests=1, disconnected=1)


def _assert_counted_and_quiet(url: str, errors: Errors, requests: int, disconnected: int) -> None:
    counts = httpx.get(url + "/health", timeout=10).json()["counts"]
    assert counts["disconnected"] == disconnected and counts["requests"] == requests, counts
    assert not errors.records, [r.getMessage() for r in errors.records]


def sse_events(r: httpx.Response, on_content=None) -> list:
    """The `data:` events of a streamed reply, parsed (`[DONE]` as the string); `on_content()` is
    called once, at the first chunk with content."""
    events = []
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        events.append(data if data == "[DONE]" else json.loads(data))
        if on_content is not None and isinstance(events[-1], dict) and any(
                (ch.get("delta") or {}).get("content") for ch in events[-1].get("choices") or []):
            on_content()
            on_content = None
    return events


def assert_not_a_silent_cut(events: list) -> dict:
    """The stream ended in [DONE] after a finish_reason or an error event; returns that last event."""
    assert events and events[-1] == "[DONE]", f"the stream was cut: it ended with {events[-1:]!r}"
    last = events[-2]
    assert "error" in last or any(ch.get("finish_reason") for ch in last.get("choices") or []), last
    return last


def test_shutdown_ends_streams_in_flight_with_an_error_event_and_refuses_new_requests(served):
    url, up, svc, errors = served
    body = {"model": "fugu-lite", "messages": ask("tell me a long story"), "stream": True}
    plain: dict = {}

    def plain_request():
        plain["r"] = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30)

    th = threading.Thread(target=plain_request)
    th.start()
    deadline = time.monotonic() + 10
    while not up.calls and time.monotonic() < deadline:  # the plain request's worker call is under way
        time.sleep(0.01)
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        t = {}

        def shut_down():
            t["stop"] = time.monotonic()
            svc.begin_shutdown(1.0)
            refused = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
            assert httpx.get(url + "/health", timeout=10).status_code == 503

        events = sse_events(r, on_content=shut_down)
    ended = time.monotonic()
    th.join(timeout=10)
    last = assert_not_a_silent_cut(events)
    assert last["error"]["code"] == "server_shutting_down" and ended - t["stop"] > 0.9  # after the 1 s grace
    assert plain["r"].status_code == 503 and plain["r"].json()["error"]["code"] == "server_shutting_down"
    assert len(up.calls) == 2  # the plain request's worker call and the stream's, both closed unfinished
    for call in up.calls:
        assert up.wait_closed(call, within_s=60) is not None and not call["completed"]
    assert not errors.records, [r.getMessage() for r in errors.records]


@pytest.mark.slow
def test_sigterm_under_fugu_lite_serve_never_cuts_a_stream_silently(models, tmp_path):
    with SlowUpstream() as up:
        workers = tmp_path / "workers.yaml"
        workers.write_text(yaml.safe_dump(stub_workers_config(up.url).model_dump(mode="json", exclude_none=True)))
        log = tmp_path / "serve.log"
        proc, url = start(["--models-dir", str(models), "--workers", str(workers), "--device", "cpu",
                           "--shutdown-grace-s", "1"], log)
        try:
            body = {"model": "fugu-lite", "messages": ask("tell me a long story"), "stream": True}
            t = {}

            def sigterm():
                t["stop"] = time.monotonic()
                proc.send_signal(signal.SIGTERM)

            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                events = sse_events(r, on_content=sigterm)
            ended = time.monotonic()
            code = proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = log.read_text()
        last = assert_not_a_silent_cut(events)
        assert last["error"]["code"] == "server_shutting_down", last
        print(f"the stream ended {ended - t['stop']:.1f}s after SIGTERM (grace 1 s)")
        assert code in (0, -signal.SIGTERM), text[-3000:]
        assert up.wait_closed(up.calls[-1], within_s=60) is not None and not up.calls[-1]["completed"]
        assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]
