"""Every worker failure kind on every serving path maps to one outcome, never a 500: a fallback to
the next worker (or step, or turn), a 502 naming the workers, or (a one-step stream cut after its
first content) an error event naming the worker. Through the official `openai` client against the
real app under uvicorn, the workers a stub LLM server on 127.0.0.1 (`testing/fault_matrix.py`).

What users met before: a worker answering 401, 402 or 403 made the cascade path answer 500
`internal server error: FatalWorkerError` (a traceback in the log), and the server then closed the
connection, so the client's next request on it was reset. The matrix asserts both: the outcome, and
that the client's next request is answered over the same connection.

`python benchmarks/fault_matrix.py` prints the whole table."""

from __future__ import annotations

import pytest

from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.fault_matrix import FAULTS, MODES, PATHS, FaultMatrix, expected
from fugu_pipeline.testing.stub_llm import StubLLMServer


COUNTED_AS = {"connect": "connect", "timeout": "timeout", "error in a 200": "error_in_200", "malformed body": "malformed",
              "cut mid-way": "cut", "empty reply": "empty_answer"}  # else http_<the status>


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    with StubLLMServer() as stub:
        yield FaultMatrix.build(create_app, stub, tmp_path_factory.mktemp("fault-matrix"))


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("path", PATHS)
def test_a_worker_failure_is_a_fallback_or_a_502_never_a_500(matrix, path, fault):
    for mode in MODES:
        out = matrix.run(path, fault, mode)
        where = f"{path}, {fault}, {mode} worker(s) faulted: {out.cell()} ({out.detail})"
        assert out.status != 500, where
        assert out.kind == expected(path, fault, mode), where
        kind = "stream_cut" if expected(path, fault, mode) == "stream_error" else COUNTED_AS.get(
            fault, "http_" + fault.split()[0])
        assert out.error_kinds == [kind], f"{where}: /metrics counted the failure as {out.error_kinds}"
        # nothing listens where the workers are; or every worker asked to be left alone for 7 s
        # (Retry-After), which the server honours: a 502 naming them, not a call
        still_down = mode == "all" and fault in ("connect", "429 Retry-After")
        assert out.next_status == (502 if still_down else 200), f"{where}: the next request got {out.next_status}"
        if out.reused_connection is not None:  # None: a stream that began, whose connection the client closes
            assert out.reused_connection, f"{where}: the next request needed a new connection"


def test_the_refusing_port_stays_refusing_and_no_server_can_take_it():
    """Before: the `connect` cells' port was bound and closed at once, so it was free again; under a
    loaded suite another test's server took it, and the faulted worker timed out instead of
    refusing (the cell then counted `timeout`, not `connect`)."""
    import socket
    from urllib.parse import urlsplit

    from fugu_pipeline.testing.serving import refusing_url

    with refusing_url() as url:
        port = urlsplit(url).port
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # the port is held for the whole block
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
