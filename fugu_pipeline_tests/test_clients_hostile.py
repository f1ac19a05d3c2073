"""HTTP workers against a hostile upstream on 127.0.0.1 (the stub's "raw" fault): malformed 200
replies, bad usage numbers, lone surrogates, a stream that stays open after [DONE], a flood, wrong
metadata types, and Ctrl-C during `fugu-lite generate`. Bad upstream data fails the cell (naming the worker)
or is retried; it never crashes the batch and never becomes a wrong stored value."""

import asyncio
import json
import math

import pytest

from fugu_pipeline.cli.main import main as cli_main
from fugu_pipeline.collect.partition import collect_partition
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.budget import BudgetLedger
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import Completion, WorkerCallError
from fugu_pipeline.workers.http import make_http_client

MODEL = "test/model-a"
KEY = "sk-or-v1-" + "cd" * 20
DONE = "data: [DONE]\n\n"
ANSWER = "The answer is 4"


def make_tasks(n: int = 3) -> list[Task]:
    return [Task(task_id=f"t{i}", prompt=f"What is {i} plus 1000?", domain="math", reference_answer=str(1000 + i),
                 grader={"type": "numeric"}) for i in range(n)]


def config_for(stub: StubLLMServer, kind: str = "openrouter", worker: dict | None = None, **over) -> WorkersConfig:
    w = {"id": "a", "kind": kind, "model": MODEL, "max_concurrency": 2,
         "base_url": stub.openrouter_url if kind == "openrouter" else stub.openai_url, **(worker or {})}
    raw = {"workers": [w], "read_timeout_s": 1.0, "connect_timeout_s": 1.0, "timeout_s": 8.0, "max_attempts": 3}
    return WorkersConfig.model_validate({**raw, **over})


def client_for(cfg: WorkersConfig, **kw):
    return make_http_client(cfg.worker("a"), cfg, backoff_s=0.01, **kw)


def collect(tasks, cfg, store, stream=True, **kw):
    return asyncio.run(collect_partition(tasks, "b1", "a", cfg, store, client=client_for(cfg, stream=stream), **kw))


def reply(content, finish="stop", model=MODEL, **extra) -> str:
    return json.dumps({"id": "x", "model": model, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}], **extra})


def ev(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"


def delta(text, finish=None, **extra) -> dict:
    return {"model": MODEL, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    with StubLLMServer() as s:
        s.add_model(MODEL, prompt=1e-6, completion=2e-6)
        for t in make_tasks(12):
            s.set_answer(t.prompt, f"The answer is {t.reference_answer}")
        yield s


# --------------------------------------------------------------------------- malformed 200 replies

MALFORMED = {
    "message_is_a_string": dict(body=json.dumps({"choices": [{"message": ANSWER, "finish_reason": "stop"}]})),
    "text_part_not_a_string": dict(body=reply([{"type": "text", "text": 5}])),
    "sse_choice_is_a_string": dict(events=[ev({"choices": [ANSWER]}), DONE]),
    "sse_delta_is_a_string": dict(events=[ev({"choices": [{"delta": ANSWER, "finish_reason": "stop"}]}), DONE]),
    "sse_choices_is_a_number": dict(events=[ev({"choices": 5}), DONE]),
    "gzip_that_is_not_gzip": dict(body="this is not gzip at all", headers={"Content-Encoding": "gzip"}),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_reply_fails_its_cell_not_the_run(stub, tmp_path, name):
    tasks = make_tasks(3)
    stub.set_fault("raw", prompt=tasks[0].prompt, **MALFORMED[name])
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub), store)
    assert (stats.n_ok, stats.n_failed) == (2, 1)
    rec = store.read("b1", "a")["t0"]
    assert rec.status == "failed" and "worker a" in rec.error
    assert rec.attempts == 3  # a provider glitch: retried like any malformed reply


def test_an_unexpected_exception_becomes_a_failed_cell(tmp_path):
    """The backstop: whatever a worker raises fails that cell, named by type; the rest run on."""
    class Flaky:
        worker_id = "a"

        async def complete(self, messages, task=None):
            if "0 plus" in messages[-1]["content"]:
                raise AttributeError("'str' object has no attribute 'get' sk-or-v1-" + "ef" * 20)
            return Completion(answer="The answer is 1001", cost_usd=0.0)

        async def aclose(self):
            pass

    cfg = WorkersConfig.model_validate({"workers": [{"id": "a", "kind": "mock"}]})
    store = ResponseStore(tmp_path)
    stats = asyncio.run(collect_partition(make_tasks(2), "b1", "a", cfg, store, client=Flaky()))
    assert (stats.n_ok, stats.n_failed) == (1, 1)
    rec = store.read("b1", "a")["t0"]
    assert rec.status == "failed" and "AttributeError" in rec.error and "worker a" in rec.error
    assert "efefef" not in rec.error  # scrubbed like every other error


@pytest.mark.parametrize("name", ["sse_delta_is_a_string", "sse_choices_is_a_number", "gzip_that_is_not_gzip",
                                  "message_is_a_string"])
def test_open_stream_turns_a_malformed_reply_into_a_worker_error(stub, name):
    stub.set_fault("raw", **MALFORMED[name])
    cfg = config_for(stub, kind="openai_compatible")

    async def go():
        c = client_for(cfg)
        try:
            await c.open_stream([{"role": "user", "content": "hi"}])
        finally:
            await c.aclose()

    with pytest.raises(WorkerCallError, match="worker a"):
        asyncio.run(go())


# --------------------------------------------------------------------------- usage numbers and cost


def raw_usage(**usage) -> str:
    """A reply whose usage holds JSON numbers Python's json cannot write (1e999 is read as inf)."""
    body = reply(ANSWER, usage={k: f"@{k}@" for k in usage})
    for k, v in usage.items():
        body = body.replace(f'"@{k}@"', v)
    return body


@pytest.mark.parametrize("prompt_tokens", ["NaN", "1e999", "-1e999", "-1000000", "Infinity", "1e30", "20000001"])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_token_counts_are_unknown_not_a_crash(stub, tmp_path, prompt_tokens, stream):
    tasks = make_tasks(2)
    body = raw_usage(prompt_tokens=prompt_tokens, completion_tokens="3")
    if stream:
        usage_chunk = '{"choices": [], "usage": {"prompt_tokens": %s, "completion_tokens": 3}}' % prompt_tokens
        stub.set_fault("raw", prompt=tasks[0].prompt, events=[ev(delta(ANSWER, "stop")), ev(usage_chunk), DONE])
    else:
        stub.set_fault("raw", prompt=tasks[0].prompt, body=body)
    cfg = config_for(stub, kind="openai_compatible", worker={"price_in_per_mtok": 1.0, "price_out_per_mtok": 2.0})
    store = ResponseStore(tmp_path)
    stats = collect(tasks, cfg, store, stream=stream)
    assert (stats.n_ok, stats.n_failed) == (2, 0)
    rec = store.read("b1", "a")["t0"]  # the stored cell loads again, and its answer is kept
    assert rec.answer == ANSWER and rec.prompt_tokens is None and rec.completion_tokens == 3
    assert (rec.cost_usd, rec.cost_source) == (0.0, "none")


@pytest.mark.parametrize("cost", ["NaN", "Infinity", "-Infinity", "-100.0", "1e999"])
def test_bad_usage_cost_falls_back_to_the_catalog(stub, tmp_path, cost):
    from fugu_pipeline.workers.catalog import fetch_catalog

    tasks = make_tasks(2)
    stub.set_fault("raw", prompt=tasks[0].prompt, body=raw_usage(prompt_tokens="10", completion_tokens="3", cost=cost))
    cat = fetch_catalog(stub.openrouter_url)
    cfg = config_for(stub)
    store = ResponseStore(tmp_path)
    stats = asyncio.run(collect_partition(tasks, "b1", "a", cfg, store, client=client_for(cfg, stream=False, catalog=cat)))
    assert stats.n_ok == 2 and math.isfinite(stats.cost_usd)
    rec = store.read("b1", "a")["t0"]
    assert rec.cost_source == "catalog" and rec.cost_usd == pytest.approx(10 * 1e-6 + 3 * 2e-6)


def test_a_nan_cost_does_not_disable_the_budget_guard(stub, tmp_path):
    """Every reply reports cost NaN and nothing else prices it: each call counts at its worst case,
    so a budget meant for 3 calls admits 3, not all 10."""
    tasks = make_tasks(10)
    stub.set_fault("raw", body=raw_usage(prompt_tokens="10", completion_tokens="3", cost="NaN"))
    cfg = config_for(stub, worker={"max_price_in_per_mtok": 1.0, "max_price_out_per_mtok": 1.0, "max_tokens": 1000,
                                   "max_concurrency": 1})
    one_call = (len(tasks[0].prompt) / 3 + 32) * 1e-6 + 1000 * 1e-6
    store = ResponseStore(tmp_path)
    stats = collect(tasks, cfg, store, stream=False, max_usd=3.5 * one_call)
    assert stats.n_called == 3 and stats.stopped and "budget guard" in stats.stopped
    assert all(r.cost_usd == 0.0 and r.cost_source == "none" for r in store.read("b1", "a").values())


def test_the_ledger_never_settles_a_non_finite_or_negative_amount():
    async def go(cost):
        led = BudgetLedger(1.0)
        async with led._cond:
            est = led._admit(0.25, "call", "")
        await led.settle(est, cost)
        return led.spent, led.max_seen

    for bad in (float("nan"), float("inf"), -5.0):
        spent, seen = asyncio.run(go(bad))
        assert (spent, seen) == (0.25, 0.25), bad  # unknown: the reserved worst case is kept
    assert asyncio.run(go(0.1)) == (0.1, 0.1)


# --------------------------------------------------------------------------- lone surrogates


def test_a_lone_surrogate_in_an_answer_is_replaced(stub, tmp_path):
    tasks = make_tasks(2)
    stub.set_fault("raw", prompt=tasks[0].prompt, body=reply("The answer is 4 \ud83d", model="m\udc00x"))
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub), store)
    assert (stats.n_ok, stats.n_failed) == (2, 0)
    rec = store.read("b1", "a")["t0"]
    assert rec.answer == "The answer is 4 \ufffd" and rec.served_model == "m\ufffdx"


def test_an_emoji_split_across_two_chunks_is_joined(stub, tmp_path):
    tasks = make_tasks(2)
    events = [ev(delta("The answer is 4 \ud83d")), ev(delta("\ude00", "stop")), DONE]
    stub.set_fault("raw", prompt=tasks[0].prompt, events=events)
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub), store)
    assert (stats.n_ok, stats.n_failed) == (2, 0)
    assert store.read("b1", "a")["t0"].answer == "The answer is 4 \U0001f600"


def test_the_relayed_stream_emits_no_lone_surrogate(stub):
    events = [ev(delta("The answer is 4 \ud83d")), ev(delta("\ude00 and \udc00 too \ud83d")), ev(delta("", "stop")), DONE]
    stub.set_fault("raw", events=events)
    cfg = config_for(stub, kind="openai_compatible")

    async def go():
        c = client_for(cfg)
        s = await c.open_stream([{"role": "user", "content": "hi"}])
        try:
            return [ch async for ch in s]
        finally:
            await s.aclose()
            await c.aclose()

    chunks = asyncio.run(go())
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    text.encode("utf-8")  # no lone surrogate left
    assert text == "The answer is 4 \U0001f600 and \ufffd too "


# --------------------------------------------------------------------------- the end of a stream


@pytest.mark.parametrize("repeat", [": ping\n\n", None], ids=["pings", "silent"])
def test_the_answer_is_returned_at_done(stub, tmp_path, repeat):
    """An upstream that keeps the connection open after [DONE] (pinging, or silent) does not cost
    the answer: it is returned at once, after one attempt."""
    events = [ev(delta(ANSWER, "stop")), DONE]
    stub.set_fault("raw", events=events, repeat=repeat or "", repeat_every_s=0.3 if repeat else 3600)
    cfg = config_for(stub, read_timeout_s=1.0, timeout_s=4.0)
    comp = asyncio.run(client_for(cfg).complete([{"role": "user", "content": "hi"}]))
    assert comp.answer == ANSWER and comp.attempts == 1  # waiting on past [DONE] ends in the 1 s read timeout or the 4 s deadline


def test_the_relayed_stream_ends_at_done(stub):
    stub.set_fault("raw", events=[ev(delta(ANSWER, "stop")), DONE], repeat=": ping\n\n", repeat_every_s=0.2)
    cfg = config_for(stub, kind="openai_compatible", read_timeout_s=1.0, timeout_s=4.0)

    async def go():
        c = client_for(cfg)
        s = await c.open_stream([{"role": "user", "content": "hi"}])
        try:
            return await asyncio.wait_for(_drain(s), 3.0)
        finally:
            await s.aclose()
            await c.aclose()

    assert asyncio.run(go()) == 1


async def _drain(s) -> int:
    return len([ch async for ch in s])


# --------------------------------------------------------------------------- finish_reason, metadata


def test_finish_reason_error_in_a_json_reply_is_retried(stub, tmp_path):
    tasks = make_tasks(3)
    stub.set_fault("raw", prompt=tasks[0].prompt, times=1, body=reply("The answer is", finish="error"))
    stub.set_fault("raw", prompt=tasks[1].prompt, body=reply("The answer is", finish="error"))
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub), store, stream=False)
    assert (stats.n_ok, stats.n_failed) == (2, 1)
    recs = store.read("b1", "a")
    assert recs["t0"].status == "ok" and recs["t0"].attempts == 2 and recs["t0"].answer == "The answer is 1000"
    assert recs["t1"].status == "failed" and "finish_reason=error" in recs["t1"].error


@pytest.mark.parametrize("stream", [False, True])
def test_metadata_of_the_wrong_type_is_dropped_and_the_answer_kept(stub, tmp_path, stream):
    tasks = make_tasks(2)
    if stream:
        events = [ev({"model": 5, "provider": ["x"], "choices": [{"delta": {"content": ANSWER}, "finish_reason": 3}]}), DONE]
        stub.set_fault("raw", prompt=tasks[0].prompt, events=events)
    else:
        stub.set_fault("raw", prompt=tasks[0].prompt, body=reply(ANSWER, finish=3, model=5, provider={"a": 1}))
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub), store, stream=stream)
    assert (stats.n_ok, stats.n_failed) == (2, 0)
    rec = store.read("b1", "a")["t0"]
    assert (rec.answer, rec.served_model, rec.finish_reason, rec.provider) == (ANSWER, None, None, None)


# --------------------------------------------------------------------------- reply size


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_over_max_reply_bytes_fails_without_retry(stub, tmp_path, stream):
    tasks = make_tasks(2)
    if stream:
        stub.set_fault("raw", prompt=tasks[0].prompt, events=[], repeat=ev(delta("y" * 60000)), repeat_every_s=0.0)
    else:
        stub.set_fault("raw", prompt=tasks[0].prompt, body=reply("The answer is 4 " + "x" * 3_000_000))
    store = ResponseStore(tmp_path)
    stats = collect(tasks, config_for(stub, max_reply_bytes=1_000_000), store, stream=stream)
    assert (stats.n_ok, stats.n_failed) == (1, 1)
    rec = store.read("b1", "a")["t0"]
    assert "max_reply_bytes" in rec.error and "worker a" in rec.error and rec.attempts == 1
    assert stub.calls[(MODEL, tasks[0].prompt)] == 1


def test_max_reply_bytes_has_a_sane_default():
    cfg = WorkersConfig.model_validate({"workers": [{"id": "a", "kind": "mock"}]})
    assert 4_000_000 <= cfg.max_reply_bytes <= 64_000_000


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_generate_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    import fugu_pipeline.collect.partition as partition

    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(partition, "collect_partition", interrupted)
    monkeypatch.chdir(tmp_path)  # the ledger (data/ledger/, relative to the project) is checked before any call
    (tmp_path / "w.yaml").write_text(json.dumps({"workers": [{"id": "a", "kind": "mock"}]}))
    (tmp_path / "t.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in make_tasks(2)))
    rc = cli_main(["generate", "--workers", str(tmp_path / "w.yaml"), "--tasks", str(tmp_path / "t.jsonl"),
                   "--output", str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err
    assert rc == 130 and "interrupted" in err and "--resume" in err and "Traceback" not in err
