"""The shapes of OpenAI function calling in a chat-completions request, checked as OpenAI checks them.

- `tools`: 1 to 128 objects `{"type": "function", "function": {"name", "description"?,
  "parameters"?, "strict"?}}`; a name is 1-64 letters, digits, `_` or `-`; `parameters` a JSON
  Schema object.
- `tool_choice`: "none", "auto", "required" or `{"type": "function", "function": {"name"}}`
  naming one of the tools; `parallel_tool_calls`: true or false. Both only with `tools`.
- An assistant message's `tool_calls`: a non-empty list of `{"id", "type": "function",
  "function": {"name", "arguments"}}` (`arguments` a string: JSON as the model wrote it); its
  `content` may then be null. A `tool` message: a string `tool_call_id` and content (a string or
  text parts) answering a call of the assistant message it follows (only tool messages between),
  and every call of that message is answered before the next message of another role.
- The deprecated `functions` / `function_call` are refused: send `tools`.

A bad shape raises `BadField(param, message)`, which the protocol answers with an OpenAI-shaped 400
naming the field. Everything is passed to the worker as the client sent it.
"""

from __future__ import annotations

import re
from typing import Any

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")


class BadField(ValueError):
    def __init__(self, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param, self.message, self.code = param, message, code


def _name_ok(v: Any) -> bool:
    return isinstance(v, str) and _NAME.fullmatch(v) is not None


def check_tools(body: dict) -> list[str] | None:
    """The tool names of a request's `tools` (None when it sends none), its `tool_choice` and
    `parallel_tool_calls` checked; BadField otherwise."""
    for old in ("functions", "function_call"):
        if body.get(old) is not None:
            raise BadField(old, f"'{old}' (the deprecated form of function calling) is not supported: send 'tools' "
                           "and 'tool_choice'", "unsupported_parameter")
    tools = body.get("tools")
    names = None if tools is None else _tool_names(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        if names is None:
            raise BadField("tool_choice", "'tool_choice' is only allowed when 'tools' are specified")
        _check_choice(choice, names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise BadField("parallel_tool_calls", "'parallel_tool_calls' must be true or false", "invalid_type")
        if names is None:
            raise BadField("parallel_tool_calls", "'parallel_tool_calls' is only allowed when 'tools' are specified")
    return names


def _tool_names(tools: Any) -> list[str]:
    if not isinstance(tools, list) or not tools:
        raise BadField("tools", "'tools' must be a non-empty list of {\"type\": \"function\", \"function\": {...}} "
                       "objects", "invalid_type" if not isinstance(tools, list) else "invalid_value")
    if len(tools) > MAX_TOOLS:
        raise BadField("tools", f"'tools' holds {len(tools)} tools; at most {MAX_TOOLS} are allowed")
    names = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadField(where, f"'{where}' must be an object", "invalid_type")
        if t.get("type") != "function":
            raise BadField(f"{where}.type", f"'{where}.type' must be \"function\", got {repr(t.get('type'))[:40]}")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise BadField(f"{where}.function", f"'{where}.function' must be an object with a 'name'", "invalid_type")
        if not _name_ok(fn.get("name")):
            raise BadField(f"{where}.function.name", f"'{where}.function.name' must be 1 to 64 letters, digits, "
                           f"underscores or dashes, got {repr(fn.get('name'))[:80]}")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise BadField(f"{where}.function.description", f"'{where}.function.description' must be a string",
                           "invalid_type")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise BadField(f"{where}.function.parameters", f"'{where}.function.parameters' must be a JSON Schema "
                           "object", "invalid_type")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise BadField(f"{where}.function.strict", f"'{where}.function.strict' must be true or false", "invalid_type")
        names.append(fn["name"])
    return names


def _check_choice(choice: Any, names: list[str]) -> None:
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise BadField("tool_choice", f"'tool_choice' must be one of {list(TOOL_CHOICES)} or "
                           f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {choice[:40]!r}")
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(fn, dict) \
            or not isinstance(fn.get("name"), str):
        raise BadField("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}", "invalid_type")
    if fn["name"] not in names:
        raise BadField("tool_choice", f"'tool_choice' names function {fn['name'][:64]!r}, which is not among "
                       f"'tools' ({', '.join(names[:10])})")


def check_tool_messages(messages: list[dict]) -> bool:
    """Check the tool calls and tool results of `messages` (each already an object with a string
    role, content a string, a list of parts or null); True when there are any."""
    open_calls: list[str] | None = None  # ids of the last assistant tool calls not answered yet
    any_tools = False
    for i, m in enumerate(messages):
        role = m["role"]
        if open_calls and role != "tool":
            raise BadField(f"messages[{i}]", f"messages[{i - 1}] is followed by a {role!r} message while tool call(s) "
                           f"{open_calls[:5]} have no 'tool' message answering them: an assistant message with "
                           "'tool_calls' must be followed by one tool message per call")
        if role == "assistant" and m.get("tool_calls") is not None:
            open_calls = _check_calls(i, m["tool_calls"])
            any_tools = True
        elif role == "assistant":
            open_calls = None
        if m.get("tool_calls") is not None and role != "assistant":
            raise BadField(f"messages[{i}].tool_calls", f"messages[{i}].tool_calls belongs on an 'assistant' message, "
                           f"not a {role!r} one")
        if m.get("tool_call_id") is not None and role != "tool":
            raise BadField(f"messages[{i}].tool_call_id", f"messages[{i}].tool_call_id belongs on a 'tool' message, "
                           f"not a {role!r} one")
        if role == "tool":
            any_tools = True
            open_calls = _check_result(i, m, open_calls)
    if open_calls:
        raise BadField(f"messages[{len(messages) - 1}]", f"tool call(s) {open_calls[:5]} of the last assistant message "
                       "have no 'tool' message answering them: send one tool message per call")
    return any_tools


def _check_calls(i: int, calls: Any) -> list[str]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise BadField(where, f"{where} must be a non-empty list of {{id, type, function}} objects",
                       "invalid_type" if not isinstance(calls, list) else "invalid_value")
    ids = []
    for j, c in enumerate(calls):
        at = f"{where}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or not isinstance(c.get("id"), str) or not c["id"]:
            raise BadField(at, f"{at} must be an object with a non-empty string 'id'", "invalid_type")
        if c.get("type") != "function":
            raise BadField(f"{at}.type", f"{at}.type must be \"function\", got {repr(c.get('type'))[:40]}")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise BadField(f"{at}.function", f"{at}.function must be an object with a string 'name' and a string "
                           "'arguments' (the JSON the model wrote, as a string)", "invalid_type")
        ids.append(c["id"])
    return ids


def _check_result(i: int, m: dict, open_calls: list[str] | None) -> list[str]:
    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str):
        raise BadField(f"messages[{i}].tool_call_id", f"messages[{i}] has role 'tool' and needs a string "
                       "'tool_call_id' (the id of the call it answers)", "missing_required_parameter"
                       if call_id is None else "invalid_type")
    if m.get("content") is None:
        raise BadField(f"messages[{i}].content", f"messages[{i}] has role 'tool' and needs 'content' (the tool's "
                       "result as text)", "missing_required_parameter")
    if open_calls is None or call_id not in open_calls:
        raise BadField(f"messages[{i}].tool_call_id", f"messages[{i}] answers tool call {call_id[:64]!r}, which is not "
                       "an unanswered call of the assistant message before it: a tool message must follow the "
                       "assistant message whose 'tool_calls' hold its id")
    return [c for c in open_calls if c != call_id]
