"""The OpenAI SDK's tool round trip against `fugu-lite serve`, as an agent makes it: a request with
`tools` -> the assistant's `tool_calls` -> the client runs the tool and sends its result -> the final
answer. Plain and streamed; the tests assert on it, and `scripts/tool_round_trip.py` prints its
transcript against a server on loopback.
"""

from __future__ import annotations

import json
from collections.abc import Callable

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]
ARGUMENTS = {"get_weather": '{"city": "Paris"}', "get_time": '{"city": "Paris"}'}
RESULTS = {"get_weather": "18 C and sunny", "get_time": "14:05"}
QUESTION = "What is the weather in Paris right now, and what time is it there?"


def _ask(client, messages: list[dict], stream: bool, extra: dict) -> tuple[dict, dict, list]:
    """(assistant message as a dict, fugu_lite, the streamed tool-call fragments) of one request."""
    if not stream:
        r = client.chat.completions.create(model="fugu-lite", messages=messages, stream=False, **extra)
        msg = r.choices[0].message.model_dump(exclude_none=True)
        msg.setdefault("content", None)
        return {**msg, "finish_reason": r.choices[0].finish_reason}, r.model_extra["fugu_lite"], []
    calls: dict[int, dict] = {}
    text, finish, info, fragments = "", None, {}, []
    for chunk in client.chat.completions.create(model="fugu-lite", messages=messages, stream=True, **extra):
        info = chunk.model_extra.get("fugu_lite") or info
        for c in chunk.choices:
            finish = c.finish_reason or finish
            text += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                fragments.append(d.model_dump(exclude_none=True))
                call = calls.setdefault(d.index, {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
                call["id"] = d.id or call["id"]
                if d.function is not None:
                    call["function"]["name"] += d.function.name or ""
                    call["function"]["arguments"] += d.function.arguments or ""
    msg = {"role": "assistant", "content": text or None, "finish_reason": finish}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg, info, fragments


def round_trip(client, *, stream: bool, tool_choice=None, say: Callable[[str], None] = lambda s: None) -> dict:
    """One round trip (module docstring). Returns the two replies, their `fugu_lite`, the
    messages sent the second time and (streamed) the tool-call fragments the client received."""
    extra = {"tools": TOOLS, **({"tool_choice": tool_choice} if tool_choice is not None else {})}
    messages = [{"role": "user", "content": QUESTION}]
    say(f"client -> fugu-lite ({'streamed' if stream else 'plain'}): user: {QUESTION!r}, tools: "
        f"{[t['function']['name'] for t in TOOLS]}" + (f", tool_choice: {json.dumps(tool_choice)}" if tool_choice else ""))
    first, info1, fragments = _ask(client, messages, stream, extra)
    say(f"fugu-lite -> client: finish_reason={first['finish_reason']!r}, served_by={info1.get('served_by')!r}, "
        f"skipped={[s['worker'] for s in info1.get('skipped', [])]}")
    for f in fragments:
        say(f"    streamed tool_calls delta: {json.dumps(f)}")
    for call in first.get("tool_calls") or []:
        say(f"    tool call {call['id']}: {call['function']['name']}({call['function']['arguments']})")
    assistant = {"role": "assistant", "content": first["content"], "tool_calls": first.get("tool_calls")}
    results = [{"role": "tool", "tool_call_id": c["id"], "content": RESULTS[c["function"]["name"]]}
               for c in first.get("tool_calls") or []]
    messages2 = [*messages, assistant, *results]
    for r in results:
        say(f"client runs the tool and sends back: tool {r['tool_call_id']}: {r['content']!r}")
    second, info2, _ = _ask(client, messages2, stream, {"tools": TOOLS})
    say(f"fugu-lite -> client: finish_reason={second['finish_reason']!r}, served_by={info2.get('served_by')!r}, "
        f"content={second['content']!r}")
    return {"first": first, "second": second, "fugu": [info1, info2], "messages": messages2, "fragments": fragments}
