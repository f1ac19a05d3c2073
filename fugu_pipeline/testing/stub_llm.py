"""A real HTTP server on 127.0.0.1 that speaks the OpenAI / OpenRouter chat protocol, for tests.

    with StubLLMServer(latency_s=0.05) as s:
        s.openrouter_url            # http://127.0.0.1:<port>/api/v1  (OpenRouter style: usage.cost, provider)
        s.openai_url                # http://127.0.0.1:<port>/v1      (plain OpenAI style: no cost)
        s.set_answer("What is 2+2?", "The answer is 4")
        s.set_fault("http", status=503, model="m/x", times=2)   # first 2 calls of m/x get a 503
        s.set_price("m/x", prompt=2e-6)                          # the catalog at GET /api/v1/models
        ...
        s.set_role_reply("verifier", "Looks right.\nVERDICT: ACCEPT")   # multi-turn sessions: by role
        s.set_role_reply("worker", lambda model, prompt: "Final answer: 4", model="m/x")
        s.calls[("m/x", "What is 2+2?")]       # every chat request, faulted ones included
        s.successes[("m/x", "What is 2+2?")]   # requests that got an answer
        s.requests[-1].headers, s.requests[-1].body

Routes: POST {/v1,/api/v1}/chat/completions (JSON or SSE with `stream: true`), GET
{/v1,/api/v1}/models. Fault kinds (`set_fault`): "http" (any status, `retry_after`, `echo_auth`
echoes the Authorization header into the error body, `echo_key_at=N` puts the bare bearer token it
received at character N of `error.message` (`echo_key_in="raw"`: of `error.metadata.raw`), as a
provider that quotes a rejected key does, or only its last `echo_key_tail` characters, as one that
shows the end of a key does; `metadata` for OpenRouter error metadata),
"timeout" (stall `sleep_s`, then a 504; no answer counted), "malformed_json", "error_in_200" (`code`),
"empty_answer" (`finish_reason`), "no_choices", "stream_cut" (a streamed answer's content, then the
connection closes: no finish_reason, no [DONE]; a plain answer: half its body, then the connection
closes), and "raw" for a hostile upstream: `body` sent as it
is (with `headers`, `media_type`), or, given `events`, those SSE strings as a stream, then `repeat`
(if set) every `repeat_every_s` seconds until the client goes away (pings after [DONE], a flood). A fault matches by `model` and by `prompt`
(a substring of the last message); `times=N` fails only the first N matching calls.
A streamed answer goes out in one write unless `chunk_delay_s` > 0 paces its events.
Multi-turn session requests name their role in the system message (`Role: Verifier`, see
`session/roles.py`); `set_role_reply(role, text_or_fn, model=None)` answers them by role (a
verdict, no verdict, both, another language, ...), before `set_answer` and `answer_fn`;
`role_calls[(model, role)]` counts them.

Tools: a request with `tools` (not `tool_choice: "none"`, last message not a `tool` result) gets
tool calls (null content, finish_reason "tool_calls"): the tool `tool_choice` names, else the first
`parallel_tools` (1), with `set_tool_arguments(name, json_text)`'s arguments ("{}") and id
`call_<i>_<name>`; streamed, index/id/name in one delta, then the arguments in three fragments.

Run it alone (for benchmarks and recipes): `python -m fugu_pipeline.testing.stub_llm --latency 0.1
[--role-reply 'worker=Final answer: 42' ...]` prints its base URL and serves until killed (`\\n` in a
reply is a line break).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fugu_pipeline.testing.stub_wire import Cut, error_body, paced, session_role, sse_events

FAULT_KINDS = ("http", "timeout", "malformed_json", "error_in_200", "empty_answer", "no_choices", "stream_cut", "raw")


@dataclass
class Fault:
    kind: str
    model: str | None = None
    prompt: str | None = None
    times: int | None = None
    status: int = 503
    retry_after: str | None = None
    sleep_s: float = 5.0
    code: int | str = 503
    message: str | None = None
    finish_reason: str = "stop"
    echo_auth: bool = False
    echo_key_at: int | None = None
    echo_key_in: str = "message"  # or "raw": error.metadata.raw
    echo_key_tail: int | None = None  # quote only the key's last N characters
    metadata: dict | None = None
    body: str | bytes = ""  # "raw": the reply body, sent as it is
    media_type: str = "application/json"
    headers: dict | None = None
    events: list[str] | None = None  # "raw": stream these SSE strings instead of `body`
    repeat: str | None = None  # "raw": then send this every `repeat_every_s` seconds, forever
    repeat_every_s: float = 1.0
    hits: int = 0

    def matches(self, model: str, prompt: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.model is None or self.model == model) and (self.prompt is None or self.prompt in prompt)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None
    at: float = field(default_factory=time.monotonic)


def _model_entry(model_id: str, prompt: float, completion: float, context_length: int = 32768,
                 supported_parameters: list[str] | None = None, name: str | None = None) -> dict:
    return {
        "id": model_id, "name": name or model_id, "created": 1700000000, "object": "model",
        "context_length": context_length,
        "pricing": {"prompt": f"{prompt:.10g}", "completion": f"{completion:.10g}", "request": "0", "image": "0"},
        "supported_parameters": supported_parameters or ["max_tokens", "temperature", "stop"],
        "expiration_date": None,
    }


class StubLLMServer:
    """See the module docstring. Thread-safe: tests change faults and the catalog while it serves."""

    def __init__(self, *, latency_s: float = 0.0, require_key: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, provider: str = "StubProvider"):
        self.latency_s = latency_s
        self.require_key = require_key
        self.provider = provider
        self.host, self._port = host, port
        self.calls: Counter = Counter()
        self.successes: Counter = Counter()
        self.requests: list[RecordedRequest] = []
        self.answers: dict[tuple[str | None, str], str] = {}
        self.answer_fn = None  # optional callable(model, prompt) -> str
        self.role_replies: dict[tuple[str | None, str], object] = {}  # (model, role) -> str | callable(model, prompt)
        self.role_calls: Counter = Counter()
        self.served_model: dict[str, str] = {}
        self.model_latency: dict[str, float] = {}
        self.catalog: dict[str, dict] = {}
        self.faults: list[Fault] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.record_requests = True
        self.chunk_delay_s = 0.0  # > 0: stream the SSE events one by one with this pause between them
        self.parallel_tools = 1  # how many tools a request with tools calls at once (module docstring)
        self.tool_arguments: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/api/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/api/v1/models", self._models, methods=["GET"]),
        ])

    # ------------------------------------------------------------------ control

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._port}"

    @property
    def openrouter_url(self) -> str:
        return self.base_url + "/api/v1"

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"

    def set_fault(self, kind: str, *, model: str | None = None, prompt: str | None = None,
                  times: int | None = None, **params) -> Fault:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
        f = Fault(kind=kind, model=model, prompt=prompt, times=times, **params)
        with self._lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def set_latency(self, seconds: float, model: str | None = None) -> None:
        if model is None:
            self.latency_s = seconds
        else:
            self.model_latency[model] = seconds

    def set_answer(self, prompt: str, answer: str, model: str | None = None) -> None:
        """The answer to `prompt` (the last message's exact text), for one model or all."""
        self.answers[(model, prompt)] = answer

    def set_role_reply(self, role: str, reply, model: str | None = None) -> None:
        """The reply to every multi-turn request in `role` (thinker, worker, verifier), for one model
        or all: a string, or a callable(model, prompt) -> str."""
        self.role_replies[(model, role.lower())] = reply

    def set_tool_arguments(self, name: str, arguments: str) -> None:
        """The arguments (JSON text) of every call of tool `name`."""
        self.tool_arguments[name] = arguments

    def _tool_calls(self, body: dict) -> list[dict] | None:
        tools = [t["function"]["name"] for t in body.get("tools") or [] if isinstance(t, dict)
                 and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)]
        msgs = body.get("messages") or [{}]
        choice = body.get("tool_choice")
        if not tools or choice == "none" or msgs[-1].get("role") == "tool":
            return None
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        names = [named] if named else tools[:self.parallel_tools]
        return [{"id": f"call_{i}_{n}", "type": "function",
                 "function": {"name": n, "arguments": self.tool_arguments.get(n, "{}")}} for i, n in enumerate(names)]

    def add_model(self, model_id: str, prompt: float = 1e-6, completion: float = 2e-6, **kw) -> None:
        """Add a catalog entry; prices are USD per token."""
        with self._lock:
            self.catalog[model_id] = _model_entry(model_id, prompt, completion, **kw)

    def set_price(self, model_id: str, prompt: float | None = None, completion: float | None = None) -> None:
        with self._lock:
            p = self.catalog[model_id]["pricing"]
            if prompt is not None:
                p["prompt"] = f"{prompt:.10g}"
            if completion is not None:
                p["completion"] = f"{completion:.10g}"

    def remove_model(self, model_id: str) -> None:
        with self._lock:
            self.catalog.pop(model_id, None)

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()
            self.successes.clear()
            self.requests.clear()

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "StubLLMServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(2048)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                backlog=2048, timeout_graceful_shutdown=1, timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="stub-llm-server")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("stub LLM server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> "StubLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ handlers

    def _record(self, request: Request, body: dict | None) -> None:
        if self.record_requests:
            rec = RecordedRequest(request.method, request.url.path, dict(request.headers), body)
            with self._lock:
                self.requests.append(rec)

    async def _models(self, request: Request) -> Response:
        self._record(request, None)
        with self._lock:
            data = json.loads(json.dumps(list(self.catalog.values())))
        return JSONResponse({"data": data})

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return error_body(400, "request body is not JSON")
        self._record(request, body)
        openrouter = request.url.path.startswith("/api/")
        model = str(body.get("model", ""))
        msgs = body.get("messages") or []
        prompt = str(msgs[-1].get("content", "")) if msgs else ""
        role = session_role(msgs)
        with self._lock:
            self.calls[(model, prompt)] += 1
            if role is not None:
                self.role_calls[(model, role)] += 1
            fault = next((f for f in self.faults if f.matches(model, prompt)), None)
            if fault is not None:
                fault.hits += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            auth = request.headers.get("authorization", "")
            if self.require_key is not None and auth != f"Bearer {self.require_key}":
                return error_body(401, "No auth credentials found" if not auth else "User not found.")
            return await self._answer(body, model, prompt, fault, openrouter, auth, role)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _answer(self, body: dict, model: str, prompt: str, fault: Fault | None, openrouter: bool,
                      auth: str, role: str | None = None) -> Response:
        if fault is not None and fault.kind == "timeout":  # stall, then give up: never an answer
            await asyncio.sleep(fault.sleep_s)
            return error_body(504, f"stub stalled for {fault.sleep_s:g}s")
        delay = self.model_latency.get(model, self.latency_s)
        if delay:
            await asyncio.sleep(delay)
        if fault is not None and fault.kind == "http":
            msg = fault.message or f"stub fault {fault.status}"
            if fault.echo_auth:
                msg += f" (received Authorization: {auth})"
            metadata = fault.metadata
            if fault.echo_key_at is not None:
                token = auth.partition(" ")[2]
                if fault.echo_key_tail is not None:
                    token = token[-fault.echo_key_tail:]
                quoted = "." * fault.echo_key_at + token + " is not a valid key for this server"
                if fault.echo_key_in == "raw":
                    metadata = {**(metadata or {}), "raw": quoted}
                else:
                    msg = quoted
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else None
            return error_body(fault.status, msg, headers=headers, metadata=metadata)
        if fault is not None and fault.kind == "raw":
            if fault.events is None:
                return Response(fault.body, media_type=fault.media_type, headers=fault.headers)
            return StreamingResponse(_raw_events(fault), media_type="text/event-stream", headers=fault.headers)
        stream = bool(body.get("stream"))
        if fault is not None and fault.kind in ("malformed_json", "error_in_200"):
            text = ('{"id": "gen-1", "choices": [{"message": ' if fault.kind == "malformed_json" else
                    json.dumps({"error": {"code": fault.code, "message": fault.message or "stub error in a 200 body"}}))
            if stream:
                return Response(f"data: {text}\n\n", media_type="text/event-stream")
            return Response(text, media_type="application/json")
        if fault is not None and fault.kind == "no_choices":
            return JSONResponse({"id": "gen-1", "model": model, "choices": []})

        calls = self._tool_calls(body) if fault is None else None
        answer = "" if calls or (fault is not None and fault.kind == "empty_answer") else \
            self._answer_text(model, prompt, role)
        finish = fault.finish_reason if fault is not None else "tool_calls" if calls else "stop"
        served = self.served_model.get(model, model)
        in_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages") or [])
        usage = {"prompt_tokens": max(1, in_chars // 4), "completion_tokens": max(1, len(answer or json.dumps(calls)) // 4)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if openrouter:
            usage["cost"] = self._cost(model, usage["prompt_tokens"], usage["completion_tokens"])
        if answer or calls:
            with self._lock:
                self.successes[(model, prompt)] += 1
        head = {"id": "gen-stub", "object": "chat.completion", "created": int(time.time()), "model": served}
        if openrouter:
            head["provider"] = self.provider
        if not stream:
            message = {"role": "assistant", "content": answer or None, "tool_calls": calls} if calls else \
                {"role": "assistant", "content": answer}
            whole = JSONResponse({**head, "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                                  "usage": usage})
            return Cut(whole) if fault is not None and fault.kind == "stream_cut" else whole
        include_usage = openrouter or bool((body.get("stream_options") or {}).get("include_usage"))
        events = sse_events(head, answer, finish, usage if include_usage else None, openrouter, calls)
        if fault is not None and fault.kind == "stream_cut":
            events = [e for e in events if '"finish_reason": null' in e]  # the content only: cut before the end
        if not self.chunk_delay_s:  # one write: cheap enough to serve hundreds of calls a second
            return Response("".join(events), media_type="text/event-stream")
        return StreamingResponse(paced(events, self.chunk_delay_s), media_type="text/event-stream")

    def _answer_text(self, model: str, prompt: str, role: str | None = None) -> str:
        if role is not None:
            r = self.role_replies.get((model, role), self.role_replies.get((None, role)))
            if r is not None:
                return r(model, prompt) if callable(r) else str(r)
        a = self.answers.get((model, prompt)) or self.answers.get((None, prompt))
        if a is not None:
            return a
        if self.answer_fn is not None:
            return self.answer_fn(model, prompt)
        return f"echo: {prompt[:200]}"

    def _cost(self, model: str, pt: int, ct: int) -> float:
        with self._lock:
            entry = self.catalog.get(model)
        if entry is None:
            return round(pt * 1e-6 + ct * 2e-6, 12)
        return round(pt * float(entry["pricing"]["prompt"]) + ct * float(entry["pricing"]["completion"]), 12)


async def _raw_events(fault: Fault):
    for e in fault.events or []:
        yield e
    while fault.repeat is not None:
        await asyncio.sleep(fault.repeat_every_s)
        yield fault.repeat


def role_replies(items: list[str]) -> dict[str, str]:
    """`--role-reply ROLE=TEXT` items as {role: text} (`\\n` in TEXT is a line break)."""
    out = {}
    for item in items:
        role, sep, text = item.partition("=")
        if not sep or role.strip().lower() not in ("thinker", "worker", "verifier"):
            raise ValueError(f"--role-reply {item!r}: write ROLE=TEXT with ROLE thinker, worker or verifier")
        out[role.strip().lower()] = text.replace("\\n", "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve the stub LLM server until killed.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before every answer")
    ap.add_argument("--role-reply", action="append", default=[], metavar="ROLE=TEXT",
                    help="the reply to multi-turn requests of a role (thinker, worker, verifier); repeatable")
    args = ap.parse_args()
    try:
        replies = role_replies(args.role_reply)
    except ValueError as exc:
        ap.error(str(exc))
    s = StubLLMServer(latency_s=args.latency, port=args.port)
    for role, text in replies.items():
        s.set_role_reply(role, text)
    s.record_requests = False  # a long benchmark would otherwise keep every request in memory
    s.start()
    print(s.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        s.stop()


if __name__ == "__main__":
    main()
