"""Request bodies that cost the server work out of proportion: many small JSON values, parsed on
the serving loop. Through the official `openai` client on a loopback server (raw httpx where a
client cannot send the body at all), stub workers on 127.0.0.1.

A 2 MB body of small values took 1.6 s of server CPU to parse with Python's hooked parser, on the
event loop, so every other client waited; now bodies are parsed by orjson, off the loop when
large, and a body holding more values than `max_json_values` is refused with a 413 naming the
limit. How much one such client moves the others' latency is measured in
`benchmarks/bench_serve.py` (speed belongs to benchmarks); here: the limit, where the parsing
runs, and that every earlier refusal still holds when the body is large.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import app as app_module
from fugu_pipeline.serve import create_app
from fugu_pipeline.serve.json_body import DEFAULT_MAX_JSON_VALUES, INLINE_BYTES, BodyError, load_json
from fugu_pipeline.testing.serving import ServerThread, stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import BAD_BODIES, ask

TOKEN = "limits-test-token"


stub = serve_fixtures.stub
models = serve_fixtures.one_router


@pytest.fixture(scope="module")
def server(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url),
                                  api_token=TOKEN, max_body_bytes=4 << 20, batch_window_ms=5, max_json_values=500))
    yield srv.url
    srv.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


def test_a_body_of_many_small_values_gets_a_413_naming_the_limit(server, stub):
    stub.reset_counts()
    with pytest.raises(openai.APIStatusError) as exc:
        client(server).chat.completions.create(model="fugu-lite", messages=ask("hi"),
                                               extra_body={"x": [0] * 1_000_000})  # 2 MB of small values
    assert exc.value.status_code == 413
    err = exc.value.response.json()["error"]
    assert err["code"] == "too_many_json_values" and err["type"] == "invalid_request_error"
    assert "500 values" in err["message"] and "--max-json-values" in err["message"], err
    assert stub.chat_requests() == []  # refused before any worker call


def test_the_value_limit_counts_every_value_at_any_depth(server):
    # {"model", "messages": [{"role", "content"}], "x": [...]}: 1 + 1 + 1 + 1 + 1 + 1 + 1 + len(x) values
    base = 7
    c = client(server)
    ok = c.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("hi"),
                                                     extra_body={"x": [[1]] * ((500 - base) // 2)})
    assert ok.status_code == 200
    with pytest.raises(openai.APIStatusError) as exc:
        c.chat.completions.create(model="fugu-lite", messages=ask("hi"), extra_body={"x": [[1]] * ((500 - base) // 2 + 1)})
    assert exc.value.status_code == 413


def test_a_large_body_is_parsed_off_the_serving_loop(server, monkeypatch):
    seen = []
    real = app_module.parse_chat_request

    def spy(raw, *a, **kw):
        try:
            asyncio.get_running_loop()
            seen.append("the serving loop")
        except RuntimeError:
            seen.append("a thread without a loop")
        return real(raw, *a, **kw)

    monkeypatch.setattr(app_module, "parse_chat_request", spy)
    big = "lorem ipsum dolor sit amet " * (4 * INLINE_BYTES // 27)
    r = client(server).chat.completions.create(model="fugu-lite", messages=ask(big))
    assert r.choices[0].message.content.startswith("echo: lorem ipsum")
    assert seen == ["a thread without a loop"]


def _padded(body: str | bytes) -> bytes:
    """The same body with a long first field, so it is larger than INLINE_BYTES (parsed on a thread)."""
    raw = body if isinstance(body, bytes) else body.encode()
    if not raw.startswith(b"{") or raw.startswith(b"{}"):
        return raw
    return b'{"pad": "' + b"p" * (2 * INLINE_BYTES) + b'", ' + raw[1:]


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_every_refusal_still_holds_for_a_large_body(server, name):
    raw = _padded(BAD_BODIES[name])
    r = httpx.post(server + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert r.status_code == 400, (name, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    if "surrogate" in name:  # named by its field, as for a small body (a top-level key: the body itself)
        assert err["code"] == "invalid_unicode" and "surrogate" in err["message"], err
        assert err["param"] == {"lone surrogate in a key": None, "lone surrogate in a system message": "messages[0].content",
                                "lone surrogate in a text part": "messages[0].content[0].text"}[name], err


def test_strict_json_rules_name_the_place():
    cases = {  # body -> (status, words in the message, param)
        b'{"a": [1, NaN]}': (400, "NaN is not valid JSON", None),
        b'{"a": -Infinity}': (400, "Infinity is not valid JSON", None),
        b'{"a": 1e999}': (400, "out of range", None),
        b'{"a": [0, 9223372036854775808]}': (400, "the integer at a[1] is out of range", "a[1]"),
        b'{"a": {"b": "\\udc00"}}': (400, "a.b holds text that is not valid Unicode", "a.b"),
        b'{"a": "\xff"}': (400, "not valid UTF-8", None),
        b"[" * 70 + b"]" * 70: (400, "nests deeper than 64 levels", "[0]" * 65),
        b"[" * 200_000 + b"]" * 200_000: (400, "nests deeper than 64 levels", None),  # orjson stops at 1,024
        b"[" + b"0," * 30 + b"0]": (413, "more than 30 values", None),
    }
    for raw, (status, words, param) in cases.items():
        with pytest.raises(BodyError) as e:
            load_json(raw, max_values=30 if status == 413 else DEFAULT_MAX_JSON_VALUES)
        assert (e.value.status, e.value.param) == (status, param) and words in e.value.message, (raw[:40], e.value)
    assert load_json(b'{"a": [1, 2.5, "\\ud83d\\ude00", null, true]}') == {"a": [1, 2.5, "\U0001F600", None, True]}
    assert DEFAULT_MAX_JSON_VALUES >= 10_000  # thousands of chat messages


def test_a_multi_turn_mode_is_read_from_the_parsed_body(server):
    """`fugu_mode` used to be read by parsing the body a second time on the serving loop."""
    with pytest.raises(openai.BadRequestError) as exc:
        client(server).chat.completions.create(model="fugu-lite", messages=ask("hi"), extra_body={"fugu_mode": "both"})
    assert exc.value.response.json()["error"]["param"] == "fugu_mode"
    with pytest.raises(openai.BadRequestError) as exc:  # no coordinator is loaded on this server
        client(server).chat.completions.create(model="fugu-lite", messages=ask("hi"),
                                               extra_body={"fugu_mode": "multi_turn"})
    assert "coordinator" in json.dumps(exc.value.response.json())
