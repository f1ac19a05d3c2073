"""How a mock worker answers a request with `tools` (OpenAI function calling), deterministically.

- The request carries `tools` and its last message is not a tool result: the reply calls one tool
  (the one `tool_choice` names, else the first), `finish_reason` "tool_calls", no text. Its
  arguments fill the tool's required parameters (all its parameters when none is required) by
  JSON type: a string gets the last user message's first 40 characters (an enum its first value),
  a number or integer 1, a boolean true, an array [], an object {}. The call id hashes (worker,
  tool, arguments), so the same request gets the same call.
- The last message is a tool result (`role: tool`): a text answer that quotes it.
- `tool_choice: "none"`, or no tools: the ordinary mock answer.
"""

from __future__ import annotations

import hashlib
import json

from fugu_pipeline.tasks.messages import content_text, routed_text

_BY_TYPE = {"number": 1, "integer": 1, "boolean": True, "array": [], "object": {}}


def wants_tool_call(messages: list[dict], params: dict | None) -> bool:
    params = params or {}
    return bool(params.get("tools")) and params.get("tool_choice") != "none" and messages[-1].get("role") != "tool"


def answers_tool_result(messages: list[dict]) -> bool:
    return messages[-1].get("role") == "tool"


def tool_call(worker_id: str, messages: list[dict], params: dict) -> dict:
    """The one tool call a mock worker makes (module docstring), in the OpenAI shape."""
    tools = [t for t in params["tools"] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    choice = params.get("tool_choice")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    fn = next((t["function"] for t in tools if t["function"].get("name") == named), tools[0]["function"])
    schema = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [k for k in schema.get("required") or [] if isinstance(k, str)] or list(props)
    text = routed_text(messages)[:40]
    args = {}
    for name in required:
        p = props.get(name) if isinstance(props.get(name), dict) else {}
        if isinstance(p.get("enum"), list) and p["enum"]:
            args[name] = p["enum"][0]
        else:
            args[name] = _BY_TYPE.get(p.get("type"), text)
    arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256("\x1f".join((worker_id, str(fn.get("name")), arguments)).encode()).hexdigest()[:24]
    return {"id": f"call_{digest}", "type": "function", "function": {"name": fn.get("name"), "arguments": arguments}}


def tool_result_answer(worker_id: str, messages: list[dict]) -> str:
    return f"[{worker_id}] From the tool result: {content_text(messages[-1].get('content'))[:80]}"
