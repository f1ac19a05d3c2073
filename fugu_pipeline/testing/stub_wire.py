"""The stub LLM server's wire pieces (`stub_llm.py`): an SSE stream of one answer, an error body, a
reply cut mid-way, pacing, and the role a session request names."""

from __future__ import annotations

import asyncio
import json
import re

from starlette.responses import JSONResponse, Response

_ROLE_LINE = re.compile(r"^Role:\s*(Thinker|Worker|Verifier)\b", re.IGNORECASE | re.MULTILINE)


class Cut(Response):
    """A reply cut mid-way: its headers (with the whole body's Content-Length) and half its body,
    then the connection closes (uvicorn closes it when a response ends short)."""

    def __init__(self, whole: Response):
        super().__init__(whole.body, media_type=whole.media_type)

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True})


def session_role(messages: list) -> str | None:
    """The role a multi-turn session request names in its system message (`Role: Verifier`)."""
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "system":
            match = _ROLE_LINE.search(str(m.get("content", "")))
            if match:
                return match.group(1).lower()
    return None


def error_body(status: int, message: str, headers: dict | None = None, metadata: dict | None = None) -> JSONResponse:
    err: dict = {"code": status, "message": message}
    if metadata:
        err["metadata"] = metadata
    return JSONResponse({"error": err}, status_code=status, headers=headers)


async def paced(events: list[str], delay: float):
    for i, e in enumerate(events):
        if i:
            await asyncio.sleep(delay)
        yield e


def sse_events(head: dict, answer: str, finish: str, usage: dict | None, openrouter: bool,
         calls: list[dict] | None = None) -> list[str]:
    """The SSE events of one streamed answer, in OpenRouter or plain OpenAI style; tool calls as
    OpenAI streams them (the module docstring)."""
    def chunk(delta: dict, finish_reason: str | None = None, **extra) -> str:
        obj = {**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
        return f"data: {json.dumps(obj)}\n\n"

    out = [": OPENROUTER PROCESSING\n\n"] if openrouter else []
    out.append(chunk({"role": "assistant", "content": None if calls else ""}))
    step = max(1, len(answer) // 3)
    out += [chunk({"content": answer[i:i + step]}) for i in range(0, len(answer), step)]
    for i, c in enumerate(calls or ()):
        args = c["function"]["arguments"]
        out.append(chunk({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                          "function": {"name": c["function"]["name"], "arguments": ""}}]}))
        cut = max(1, -(-len(args) // 3))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": args[k:k + cut]}}]})
                for k in range(0, len(args), cut)]
    if openrouter and usage is not None:
        out.append(chunk({}, finish, usage=usage))  # OpenRouter: usage (with cost) in the last chunk
    else:
        out.append(chunk({}, finish))
        if usage is not None:  # OpenAI include_usage: a final chunk with no choices
            out.append(f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n")
    out.append("data: [DONE]\n\n")
    return out
