"""OpenAI tool calling through `fugu-lite serve`, the way agents use it: the official `openai` client
on loopback, the real app under uvicorn, stub workers on 127.0.0.1 of which only `beta` supports
tools. A request with `tools` was refused with a 400; now it goes to a worker that supports tools,
its `tool_calls` come back (plain, and streamed as fragments), and the tool's result is answered.
Bad shapes get an OpenAI-shaped 400 naming the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline.testing.tool_round_trip import ARGUMENTS, QUESTION, TOOLS, round_trip
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import assert_openai_error

stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub


def _config(base_url: str, tools: set[str]) -> WorkersConfig:
    config = stub_workers_config(base_url)
    return config.model_copy(update={"workers": [w.model_copy(update={"supports_tools": w.id in tools})
                                                 for w in config.workers]})


@pytest.fixture(scope="module")
def server(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), _config(stub.openai_url, {"beta"})))
    yield srv
    srv.stop()


@pytest.fixture
def client(server, stub):
    for name, args in ARGUMENTS.items():
        stub.set_tool_arguments(name, args)
    stub.reset_counts()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    stub.parallel_tools = 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_sdk_tool_round_trip_goes_to_the_worker_that_supports_tools(client, stub, stream):
    stub.parallel_tools = 2  # two calls at once: the stream's deltas carry two indexes
    out = round_trip(client, stream=stream, tool_choice="auto")
    first, second = out["first"], out["second"]
    assert first["finish_reason"] == "tool_calls" and first["content"] is None
    assert first["tool_calls"] == [
        {"id": "call_0_get_weather", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS["get_weather"]}},
        {"id": "call_1_get_time", "type": "function", "function": {"name": "get_time", "arguments": ARGUMENTS["get_time"]}}]
    assert second["finish_reason"] == "stop" and second["content"] == "echo: 14:05" and not second.get("tool_calls")
    for info in out["fugu"]:
        assert info["served_by"] == "beta"
        assert {s["worker"] for s in info["skipped"]} <= {"alpha", "gamma"}
        assert all(s["code"] == "tools_unsupported" for s in info["skipped"])
    sent = stub.chat_requests()
    assert [r.body["model"] for r in sent] == ["stub/beta", "stub/beta"]  # no other worker was called
    assert all(r.body["tools"] == TOOLS and r.body["tool_choice"] == "auto" for r in sent[:1])
    assert sent[1].body["tools"] == TOOLS
    assert sent[1].body["messages"] == out["messages"]  # the assistant's tool_calls and the tool results, unchanged
    if stream:  # each fragment as the worker sent it: index, id, name, then the arguments in pieces
        frags = out["fragments"]
        assert [f["index"] for f in frags] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert frags[0] == {"index": 0, "id": "call_0_get_weather", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}
        assert "".join(f["function"]["arguments"] for f in frags if f["index"] == 1) == ARGUMENTS["get_time"]


def test_tool_choice_and_parallel_tool_calls_reach_the_worker_unchanged(client, stub):
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}],
                                       tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]
    body = stub.chat_requests()[-1].body
    assert body["tool_choice"] == choice and body["parallel_tool_calls"] is False and body["tools"] == TOOLS


def test_a_multi_turn_request_with_tools_is_served_one_step_and_says_so(client):
    r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}],
                                       tools=TOOLS, extra_body={"fugu_mode": "multi_turn"})
    info = r.model_extra["fugu_lite"]
    assert r.choices[0].finish_reason == "tool_calls" and info["served_by"] == "beta"
    assert any(note.startswith("fugu_mode:") for note in info["ignored"])


def test_without_a_worker_that_supports_tools_a_tools_request_is_a_400(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), _config(stub.openai_url, set())))
    try:
        stub.reset_counts()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as exc:
            c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": QUESTION}], tools=TOOLS)
        err = exc.value.response.json()["error"]
        assert err["code"] == "tools_not_supported" and err["param"] == "tools" and "supports_tools" in err["message"]
        assert stub.chat_requests() == []
        plain = c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}])
        assert plain.choices[0].message.content == "echo: hi"  # a request without tools is served as before
    finally:
        srv.stop()


def test_mock_workers_call_a_tool_then_answer_its_result(models, tmp_path):
    config = WorkersConfig.model_validate({"workers": [
        {"id": "alpha", "kind": "mock", "supports_tools": False}, {"id": "beta", "kind": "mock"},
        {"id": "gamma", "kind": "mock", "supports_tools": False}]})
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), config))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        runs = [round_trip(c, stream=s) for s in (False, False, True)]
        calls = [r["first"]["tool_calls"] for r in runs]
        assert calls[0] == calls[1] == calls[2] and len(calls[0]) == 1  # deterministic, plain or streamed
        call = calls[0][0]
        assert call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": QUESTION[:40]}, separators=(",", ":"))}
        assert runs[0]["second"]["content"] == "[beta] From the tool result: 18 C and sunny"
    finally:
        srv.stop()


USER = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BAD = {  # body fields -> the param the 400 names
    "tools a dict": ({"tools": {"type": "function"}}, "tools"),
    "tools empty": ({"tools": []}, "tools"),
    "tool type custom": ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    "tool without function": ({"tools": [{"type": "function"}]}, "tools[0].function"),
    "tool name with a space": ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
                               "tools[0].function.name"),
    "tool name 65 long": ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name"),
    "parameters a string": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
                            "tools[0].function.parameters"),
    "129 tools": ({"tools": [TOOL] * 129}, "tools"),
    "tool_choice without tools": ({"tool_choice": "auto"}, "tool_choice"),
    "tool_choice unknown word": ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice"),
    "tool_choice names no tool": ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
                                  "tool_choice"),
    "parallel_tool_calls a string": ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    "parallel_tool_calls without tools": ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    "deprecated functions": ({"functions": [{"name": "f"}]}, "functions"),
    "tool message without tool_call_id": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                                        {"role": "tool", "content": "1"}]}, "messages[2].tool_call_id"),
    "tool message answering no call": ({"messages": [USER, {"role": "tool", "tool_call_id": "c1", "content": "1"}]},
                                       "messages[1].tool_call_id"),
    "tool message with another id": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                                   {"role": "tool", "tool_call_id": "c2", "content": "1"}]},
                                     "messages[2].tool_call_id"),
    "tool message without content": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                                   {"role": "tool", "tool_call_id": "c1"}]}, "messages[2].content"),
    "arguments an object": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "f", "arguments": {}}}]}, {"role": "tool", "tool_call_id": "c1", "content": "1"}]},
        "messages[1].tool_calls[0].function"),
    "tool_calls empty": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": []}]},
                         "messages[1].tool_calls"),
    "a call left unanswered": ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, USER]},
                               "messages[2]"),
    "the last message an unanswered call": ({"messages": [USER, {"role": "assistant", "content": None,
                                                                 "tool_calls": [CALL]}]}, "messages[1]"),
}


def test_bad_tool_shapes_get_a_400_naming_the_field_before_any_worker_is_called(server, stub):
    stub.reset_counts()
    for name, (fields, param) in BAD.items():
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "fugu-lite", "messages": [USER], **fields},
                       timeout=30)
        err = assert_openai_error(r, 400)
        assert err["param"] == param, (name, err)
    assert stub.chat_requests() == []
