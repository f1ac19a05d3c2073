"""Every worker failure kind on every serving path, through the official `openai` client: the fault
matrix the serving tests assert and `benchmarks/fault_matrix.py` prints.

Paths: one-step, cascade and multi-turn, each plain and streamed. Faults (`FAULTS`): the stub LLM
server (`stub_llm.py`) answers the faulted workers with it, or for `connect` their `base_url` is a
port that refuses connections (`serving.refusing_url`). Modes: `one` faults the worker that answers
the request when nothing fails (the route's first choice); `all` faults every worker.

Each cell runs on a server of its own (no state carried from cell to cell, a worker cooldown
included): a clean request (which worker answers, and the connection it used), the faulted request,
then a clean request again on the same client, which must be answered over the same connection
(unless the faulted request was a stream that began: the openai client closes a stream's
connection itself when the stream ends). The outcome (`Outcome`) is one of
- `fallback`: a 200 served by another worker, the faulted one listed among the fallback errors;
- `502`: an OpenAI-shaped 502 whose message names every faulted worker;
- `stream_error`: a stream that had begun ends with an error event naming the worker (a one-step
  stream cut after its first content: the client already has part of the answer);
- anything else (a 500 above all) is a failure of the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from fugu_pipeline.testing.serving import WORKERS, ServerThread, refusing_url, stub_workers_config

PATHS = ("one_step", "one_step_stream", "cascade", "cascade_stream", "multi_turn", "multi_turn_stream")
FAULTS = {  # name -> stub.set_fault arguments (None: the worker's port refuses connections)
    "connect": None,
    "timeout": {"kind": "timeout", "sleep_s": 3.0},
    "408": {"kind": "http", "status": 408},
    "429": {"kind": "http", "status": 429},
    "429 Retry-After": {"kind": "http", "status": 429, "retry_after": "7"},
    "500": {"kind": "http", "status": 500},
    "502": {"kind": "http", "status": 502},
    "503": {"kind": "http", "status": 503},
    "504": {"kind": "http", "status": 504},
    "401": {"kind": "http", "status": 401},
    "402": {"kind": "http", "status": 402},
    "403": {"kind": "http", "status": 403},
    "error in a 200": {"kind": "error_in_200", "code": 500},
    "malformed body": {"kind": "malformed_json"},
    "cut mid-way": {"kind": "stream_cut"},
    "empty reply": {"kind": "empty_answer"},
}
MODES = ("one", "all")
PROMPT = "What is 3 + 4?"
ROLE_REPLIES = {"thinker": "Plan: add the two numbers.", "worker": "3 + 4 = 7.\nFinal answer: 7",
                "verifier": "Checked.\nVERDICT: ACCEPT"}
SCRIPT = [("alpha", "thinker"), ("beta", "worker"), ("gamma", "verifier")]


@dataclass
class Outcome:
    kind: str  # fallback, 502, stream_error, or what else came back ("500", "200 from the faulted worker", ...)
    status: int | None = None
    served_by: str | None = None
    named: list[str] = field(default_factory=list)  # workers the error or the fallback list names
    error_kinds: list[str] = field(default_factory=list)  # the faulted workers' fugu_worker_errors_total kinds
    reused_connection: bool | None = None  # the next request went over the same connection (None: a stream that
    # began, whose connection the openai client closes itself once the stream ends)
    next_status: int | None = None  # the HTTP status of the next clean request on the same client
    detail: str = ""

    def cell(self) -> str:
        said = {"fallback": f"fallback -> {self.served_by}", "502": "502 naming " + ", ".join(self.named),
                "stream_error": "stream error event naming " + ", ".join(self.named)}.get(self.kind, self.kind)
        kinds = f" [{', '.join(self.error_kinds)}]" if self.error_kinds else ""
        return said + kinds


def expected(path: str, fault: str, mode: str) -> str:
    """The outcome a cell must have (the module docstring)."""
    if path == "one_step_stream" and fault == "cut mid-way":
        return "stream_error"
    return "fallback" if mode == "one" else "502"


class FaultMatrix:
    """The routers and the stub for the cells; `run(path, fault, mode)` runs one."""

    def __init__(self, create_app, stub, one_step, cascade, coordinator):
        self.create_app, self.stub = create_app, stub
        self.routers = {"one_step": one_step, "cascade": cascade, "multi_turn": one_step}
        self.coordinator = coordinator
        self._first: dict[str, str] = {}

    @classmethod
    def build(cls, create_app, stub, root: Path) -> "FaultMatrix":
        """Train the three routers under `root` (a few seconds each with the tiny encoder); `create_app`
        is `fugu_pipeline.serve.create_app` (passed in: `testing` does not import the server)."""
        from fugu_pipeline.policies.registry import load_router
        from fugu_pipeline.policies.coordinator.route import RolesCoordinator
        from fugu_pipeline.route.router import Router
        from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
        from fugu_pipeline.testing.roles_serving import imitation_checkpoint
        from fugu_pipeline.testing.serving import build_checkpoints

        one = build_checkpoints(root / "one", seeds=(0,), epochs=5)[0]
        cascade = build_cascade_checkpoint(root / "cascade", root / "emb")
        roles = imitation_checkpoint(root / "roles", list(WORKERS), SCRIPT, [(PROMPT, "math")], ROLE_REPLIES)
        return cls(create_app, stub, Router.load(one, device="cpu"), load_router(cascade, device="cpu"),
                   RolesCoordinator.load(roles, device="cpu"))

    def run(self, path: str, fault: str, mode: str) -> Outcome:
        kind = path.removesuffix("_stream")
        stream = path.endswith("_stream")
        faulted = list(WORKERS) if mode == "all" else None
        config = stub_workers_config(self.stub.openai_url, timeout_s=10.0, read_timeout_s=0.5)
        self.stub.clear_faults()
        for role, text in ROLE_REPLIES.items():
            self.stub.set_role_reply(role, text)
        faulted = faulted or [self._first_choice(kind, config)]
        with refusing_url() as dead:
            if fault == "connect":
                workers = [w.model_copy(update={"base_url": dead}) if w.id in faulted else w for w in config.workers]
                config = config.model_copy(update={"workers": workers})
            return self._run(kind, stream, fault, faulted, config)

    def _run(self, kind: str, stream: bool, fault: str, faulted: list[str], config) -> Outcome:
        app = self.create_app(self.routers[kind], config, batch_window_ms=1, auth_cooldown_s=0,
                         roles=self.coordinator if kind == "multi_turn" else None)
        srv = ServerThread(app)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        try:
            _ask(client, kind, stream)  # the connection the client keeps
            if FAULTS[fault] is not None:
                for wid in faulted:
                    self.stub.set_fault(model=WORKERS[wid], **FAULTS[fault])
            out, port = _outcome(client, kind, stream, faulted)
            out.error_kinds = _error_kinds(srv.url, faulted)
            self.stub.clear_faults()
            _, out.next_status, after_port = _ask(client, kind, stream)
            out.reused_connection = None if port is None else port == after_port
            return out
        finally:
            client.close()
            srv.stop()
            self.stub.clear_faults()

    def _first_choice(self, kind: str, config) -> str:
        """The worker that answers `PROMPT` on this path when nothing fails."""
        if kind not in self._first:
            srv = ServerThread(self.create_app(self.routers[kind], config, batch_window_ms=1,
                                          roles=self.coordinator if kind == "multi_turn" else None))
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
                info, status, _ = _ask(client, kind, False)
                if info is None:
                    raise RuntimeError(f"{kind}: a request with no fault got HTTP {status}")
                self._first[kind] = info["served_by"]
            finally:
                srv.stop()
        return self._first[kind]


def _body(kind: str) -> dict:
    extra = {"fugu_mode": "multi_turn", "domain": "math"} if kind == "multi_turn" else {"domain": "math"}
    return {"model": "fugu-lite", "messages": [{"role": "user", "content": PROMPT}], "extra_body": extra}


def _port(response: httpx.Response) -> int | None:
    stream = response.extensions.get("network_stream")
    addr = stream.get_extra_info("client_addr") if stream is not None else None
    return addr[1] if addr else None


def _ask(client: openai.OpenAI, kind: str, stream: bool) -> tuple[dict | None, int | None, int | None]:
    """(the reply's fugu_lite or None, its HTTP status, the local port of its connection)."""
    try:
        raw = client.chat.completions.with_raw_response.create(stream=stream, **_body(kind))
    except openai.APIStatusError as exc:
        return None, exc.status_code, _port(exc.response)
    except openai.APIConnectionError:
        return None, None, None
    port = _port(raw.http_response)
    reply = raw.parse()
    if not stream:
        return reply.model_extra["fugu_lite"], raw.status_code, port
    infos = [c.model_extra["fugu_lite"] for c in reply if c.model_extra and c.model_extra.get("fugu_lite")]
    return infos[-1], raw.status_code, port


def _outcome(client: openai.OpenAI, kind: str, stream: bool, faulted: list[str]) -> tuple[Outcome, int | None]:
    try:
        raw = client.chat.completions.with_raw_response.create(stream=stream, **_body(kind))
    except openai.APIStatusError as exc:
        port = _port(exc.response)
        msg = exc.response.json().get("error", {}).get("message", "") if exc.response.content else ""
        named = [w for w in faulted if w in msg]
        if exc.status_code == 502 and named == faulted:
            return Outcome("502", 502, named=named, detail=msg[:300]), port
        return Outcome(str(exc.status_code), exc.status_code, named=named, detail=msg[:300]), port
    except openai.APIConnectionError as exc:
        return Outcome("no answer", detail=str(exc)), -1
    port = None if stream else _port(raw.http_response)
    try:
        if stream:
            chunks = list(raw.parse())
            info = [c.model_extra["fugu_lite"] for c in chunks if c.model_extra and c.model_extra.get("fugu_lite")][-1]
        else:
            info = raw.parse().model_extra["fugu_lite"]
    except openai.APIError as exc:  # an error event inside a stream that had begun
        msg = str(exc.message)
        named = [w for w in faulted if w in msg]
        return Outcome("stream_error" if named else "stream error naming no faulted worker", 200, named=named,
                       detail=msg[:300]), None
    errors = list(info.get("fallback_errors") or []) + [e for t in info.get("turns") or [] for e in t["fallback_errors"]]
    named = sorted({e["worker"] for e in errors} & set(faulted))
    served = info.get("served_by")
    ok = served not in faulted and named == sorted(faulted)
    return Outcome("fallback" if ok else f"200 served by {served}", 200, served, named,
                   detail="; ".join(f"{e['worker']}: {e['error']}"[:120] for e in errors)), port


def _error_kinds(url: str, faulted: list[str]) -> list[str]:
    """The kinds under which the faulted workers' errors were counted (`/metrics`)."""
    r = httpx.get(url + "/metrics", timeout=10)
    if r.status_code != 200:  # a server without /metrics
        return []
    text = r.text
    kinds = set()
    for family in text_string_to_metric_families(text):
        if family.name == "fugu_worker_errors":
            kinds |= {s.labels["kind"] for s in family.samples
                      if s.name.endswith("_total") and s.labels["worker"] in faulted and s.value > 0}
    return sorted(kinds)


def run_all(matrix: FaultMatrix, paths=PATHS, faults=tuple(FAULTS), modes=MODES, log=print) -> dict:
    """Every cell: {(path, fault, mode): Outcome}."""
    out = {}
    for path in paths:
        for fault in faults:
            for mode in modes:
                t = time.perf_counter()
                out[path, fault, mode] = o = matrix.run(path, fault, mode)
                log(f"  {path:18s} {fault:16s} {mode:3s} {o.cell()}  ({time.perf_counter() - t:.1f} s)")
    return out


def table(cells: dict, mode: str) -> str:
    """A markdown table, faults down, paths across, for one mode."""
    paths = [p for p in PATHS if any(k[0] == p and k[2] == mode for k in cells)]
    faults = [f for f in FAULTS if any(k[1] == f and k[2] == mode for k in cells)]
    lines = ["| fault | " + " | ".join(p.replace("_", " ") for p in paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for f in faults:
        lines.append(f"| {f} | " + " | ".join(cells[p, f, mode].cell() if (p, f, mode) in cells else "" for p in paths) + " |")
    return "\n".join(lines)
