"""Real HTTP workers against a stub server on 127.0.0.1: faults, fatal errors, key hygiene, the
catalog and the catalog-change sensor. No test reaches beyond 127.0.0.1."""


import asyncio
import email.utils
import json
import os
import secrets
import time

import dagster as dg
import pytest

from fugu_pipeline.api_keys import load_env_file, scrub_secrets
from fugu_pipeline.collect.partition import collect_partition, collect_partition_sync
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.defs.catalog import (
    FINGERPRINT_TAG,
    OpenRouterResource,
    catalog_change_sensor,
    openrouter_catalog,
)
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.catalog import (
    CatalogSnapshot,
    diff_snapshots,
    fetch_catalog,
    format_rows,
    list_models,
    load_latest,
    load_retired,
    save_snapshot,
    snapshot_from_api,
)
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import FatalWorkerError, WorkerCallError
from fugu_pipeline.workers.http import make_http_client
from fugu_pipeline.workers.retry import parse_retry_after

MODEL = "test/model-a"
KEY = "sk-or-v1-" + "ab" * 20


def make_tasks(n: int = 6) -> list[Task]:
    return [Task(task_id=f"t{i}", prompt=f"What is {i} plus 1000?", domain="math", reference_answer=str(1000 + i),
                 grader={"type": "numeric"}) for i in range(n)]


def config_for(stub: StubLLMServer, *, concurrency: int = 4, kind: str = "openrouter", **over) -> WorkersConfig:
    w = {"id": "a", "kind": kind, "model": MODEL, "max_concurrency": concurrency,
         "base_url": stub.openrouter_url if kind == "openrouter" else stub.openai_url}
    raw = {"workers": [w], "read_timeout_s": 0.8, "connect_timeout_s": 1.0, "timeout_s": 10.0, "max_attempts": 3}
    return WorkersConfig.model_validate({**raw, **over})


def client_for(cfg: WorkersConfig, worker: str = "a", **kw):
    return make_http_client(cfg.worker(worker), cfg, backoff_s=0.01, **kw)


def collect(tasks, cfg, store, **kw):
    return asyncio.run(collect_partition(tasks, "b1", "a", cfg, store, client=client_for(cfg), **kw))


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    with StubLLMServer() as s:
        s.add_model(MODEL, prompt=1e-6, completion=2e-6)
        for t in make_tasks(12):
            s.set_answer(t.prompt, f"The answer is {t.reference_answer}")
        yield s


# --------------------------------------------------------------------------- fault matrix

FAULTS = {
    "429": (dict(kind="http", status=429, retry_after="0.05"), "HTTP 429"),
    "500": (dict(kind="http", status=500), "HTTP 500"),
    "502": (dict(kind="http", status=502), "HTTP 502"),
    "503": (dict(kind="http", status=503), "HTTP 503"),
    "timeout": (dict(kind="timeout", sleep_s=1.5), "ReadTimeout"),
    "malformed_json": (dict(kind="malformed_json"), "malformed JSON"),
    "error_in_200": (dict(kind="error_in_200", code=503), "code 503"),
    "empty_answer": (dict(kind="empty_answer"), "empty answer"),
}
CASES = [(name, True) for name in FAULTS] + [(n, False) for n in ("malformed_json", "error_in_200", "empty_answer", "503")]


@pytest.mark.parametrize("name,stream", CASES, ids=[f"{n}-{'sse' if s else 'json'}" for n, s in CASES])
def test_fault_matrix(stub, tmp_path, name, stream):
    """t0 fails once then succeeds, t1 fails every time; the partition finishes either way, no
    successful cell is called twice, and a re-run calls only the failed cell."""
    fault, expected = FAULTS[name]
    tasks = make_tasks(6)
    stub.set_fault(prompt=tasks[0].prompt, times=1, **fault)
    stub.set_fault(prompt=tasks[1].prompt, **fault)
    cfg = config_for(stub)
    store = ResponseStore(tmp_path / "responses")

    stats = asyncio.run(collect_partition(tasks, "b1", "a", cfg, store, client=client_for(cfg, stream=stream)))

    assert (stats.n_ok, stats.n_failed, stats.stopped) == (5, 1, None)
    recs = store.read("b1", "a")
    assert recs["t0"].status == "ok" and recs["t0"].attempts == 2 and recs["t0"].quality == 1.0
    assert recs["t1"].status == "failed" and expected in recs["t1"].error and recs["t1"].attempts == 3
    assert all(recs[f"t{i}"].status == "ok" and recs[f"t{i}"].attempts == 1 for i in range(2, 6))
    assert stub.calls[(MODEL, tasks[1].prompt)] == 3
    assert stub.calls[(MODEL, tasks[0].prompt)] == 2
    assert all(stub.calls[(MODEL, t.prompt)] == 1 for t in tasks[2:])
    assert all(n == 1 for n in stub.successes.values()) and len(stub.successes) == 5

    stub.clear_faults()
    stub.reset_counts()
    stats = asyncio.run(collect_partition(tasks, "b1", "a", cfg, store, client=client_for(cfg, stream=stream)))
    assert (stats.n_called, stats.n_ok, stats.n_already_done) == (1, 1, 5)
    assert dict(stub.calls) == {(MODEL, tasks[1].prompt): 1}
    assert all(r.status == "ok" for r in store.read("b1", "a").values())


def test_empty_answer_at_token_limit_is_not_retried(stub, tmp_path):
    tasks = make_tasks(2)
    stub.set_fault("empty_answer", prompt=tasks[0].prompt, finish_reason="length")
    cfg = config_for(stub)
    stats = collect(tasks, cfg, ResponseStore(tmp_path))
    assert (stats.n_ok, stats.n_failed) == (1, 1)
    assert stub.calls[(MODEL, tasks[0].prompt)] == 1
    assert "raise max_tokens" in ResponseStore(tmp_path).read("b1", "a")["t0"].error


def test_error_in_200_with_a_client_error_code_fails_without_retry(stub, tmp_path):
    tasks = make_tasks(1)
    stub.set_fault("error_in_200", code=400, message="bad parameter")
    stats = collect(tasks, config_for(stub), ResponseStore(tmp_path))
    assert stats.n_failed == 1 and stub.calls[(MODEL, tasks[0].prompt)] == 1


def test_overall_deadline_bounds_a_cell(stub, tmp_path):
    stub.set_fault("timeout", sleep_s=2.0)
    cfg = config_for(stub, read_timeout_s=5.0, timeout_s=0.5, max_attempts=5)
    with pytest.raises(WorkerCallError, match="timeout_s=0.5"):
        asyncio.run(client_for(cfg).complete([{"role": "user", "content": "hi"}]))
    assert stub.calls[(MODEL, "hi")] <= 1  # the deadline ended the first attempt: none of the 5 retried it


# --------------------------------------------------------------------------- fatal errors


@pytest.mark.parametrize("status,hint", [(401, "OPENROUTER_API_KEY"), (402, "add credits"), (403, "forbidden")])
def test_fatal_status_stops_the_run(stub, tmp_path, status, hint):
    tasks = make_tasks(6)
    stub.set_fault("http", status=status, prompt=tasks[2].prompt)
    cfg = config_for(stub, concurrency=1)
    store = ResponseStore(tmp_path)
    with pytest.raises(FatalWorkerError, match=hint) as err:
        collect(tasks, cfg, store)
    assert err.value.status == status
    assert [stub.calls[(MODEL, t.prompt)] for t in tasks] == [1, 1, 1, 0, 0, 0]
    assert sorted(store.read("b1", "a")) == ["t0", "t1"]  # finished cells stay stored


def test_fatal_status_with_concurrency_starts_no_pending_call(stub, tmp_path):
    stub.set_fault("http", status=402)
    stub.set_latency(0.1)
    with pytest.raises(FatalWorkerError, match="credits"):
        collect(make_tasks(12), config_for(stub, concurrency=3), ResponseStore(tmp_path))
    assert sum(stub.calls.values()) <= 3


def test_missing_key_is_fatal_and_says_where_to_put_it(stub, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY")
    with pytest.raises(FatalWorkerError, match=r"OPENROUTER_API_KEY.*\.env"):
        collect(make_tasks(3), config_for(stub), ResponseStore(tmp_path))
    assert not stub.calls


def test_moderation_403_fails_only_that_cell(stub, tmp_path):
    tasks = make_tasks(3)
    stub.set_fault("http", status=403, prompt=tasks[0].prompt, metadata={"reasons": ["violence"], "flagged_input": "x"})
    stats = collect(tasks, config_for(stub), ResponseStore(tmp_path))
    assert (stats.n_ok, stats.n_failed) == (2, 1)


# --------------------------------------------------------------------------- the key never leaks


def test_key_never_written(stub, tmp_path, monkeypatch):
    key = "sk-or-v1-" + secrets.token_hex(20)
    monkeypatch.setenv("OPENROUTER_API_KEY", key)
    stub.require_key = key
    tasks = make_tasks(4)
    stub.set_fault("http", status=500, prompt=tasks[1].prompt, echo_auth=True)
    stub.set_fault("http", status=400, prompt=tasks[2].prompt, echo_auth=True, message=f"bad key {key}")
    (tmp_path / "models").mkdir()
    (tmp_path / "configs").mkdir()
    cfg = config_for(stub)
    (tmp_path / "configs" / "workers.json").write_text(cfg.model_dump_json())
    pipeline = PipelineResource(project_dir=str(tmp_path), workers_config="configs/workers.json")
    resources = {"openrouter": OpenRouterResource(api_key=dg.EnvVar("OPENROUTER_API_KEY"), base_url=stub.openrouter_url),
                 "pipeline": pipeline}
    errors: list[str] = []

    @dg.asset
    def small_responses(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> None:
        store = ResponseStore(pipeline.paths.responses)
        stats = collect_partition_sync(tasks, "b1", "a", cfg, store)
        context.log.info(f"stats {stats.as_dict()}")
        for rec in store.read("b1", "a").values():
            context.log.info(f"{rec.task_id}: {rec.status} {rec.error}")
        print("stdout:", stats.as_dict())

    @dg.asset
    def fatal_responses(pipeline: PipelineResource) -> None:
        stub.set_fault("http", status=401, echo_auth=True)
        try:
            collect_partition_sync(make_tasks(6)[4:], "b2", "a", cfg, ResponseStore(pipeline.paths.responses))
        except FatalWorkerError as exc:
            errors.append(str(exc))
            raise dg.Failure(description=str(exc)) from None

    (tmp_path / "dagster_home").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster_home"))
    ok = dg.materialize([openrouter_catalog, small_responses], resources=resources, instance=instance)
    bad = dg.materialize([fatal_responses], resources=resources, instance=instance, raise_on_error=False)
    assert ok.success and not bad.success and errors and "OPENROUTER_API_KEY" in errors[0]
    recs = ResponseStore(tmp_path / "data" / "responses").read("b1", "a")
    assert recs["t1"].status == "failed" and "[redacted]" in recs["t1"].error
    assert recs["t0"].status == "ok"
    catalog_req = [r for r in stub.requests if r.path.endswith("/models")][0]
    assert catalog_req.headers["authorization"] == f"Bearer {key}"  # sent as a header, and only there
    assert all(key not in json.dumps(r.body) for r in stub.chat_requests())

    texts = [str(e) for e in errors]
    for run in (ok, bad):
        texts += [str(ev) for ev in instance.all_logs(run.run_id)]
        texts.append(json.dumps(instance.get_run_by_id(run.run_id).run_config, default=str))
    assert any("unauthorized" in t for t in texts[1:])  # the failure did reach the event log
    assert not any(key in t for t in texts)
    secret = key.encode()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("dagster_home" in str(p) for p in files) and any(p.suffix == ".jsonl" for p in files)
    assert any(b"stdout:" in p.read_bytes() for p in files if "dagster_home" in str(p))  # captured logs searched
    leaked = [str(p) for p in files if secret in p.read_bytes()]
    assert leaked == []


def test_load_env_file_never_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("FUGU_TEST_SET", "from-env")
    monkeypatch.delenv("FUGU_TEST_NEW", raising=False)
    (tmp_path / ".env").write_text("FUGU_TEST_SET=from-file\nFUGU_TEST_NEW=new\n")
    assert load_env_file(tmp_path / ".env")
    assert os.environ["FUGU_TEST_SET"] == "from-env" and os.environ["FUGU_TEST_NEW"] == "new"
    monkeypatch.delenv("FUGU_TEST_NEW")


def test_scrub_secrets():
    fake = "sk-or-v1-" + "0123456789" + "abcdef"  # built at run time: no key-shaped literal in the source
    text = f'Authorization: Bearer abc.def-123 {{"api_key": "xyz123"}} {fake} and MYSECRET'
    out = scrub_secrets(text, "MYSECRET")
    for s in ("abc.def-123", "xyz123", fake, "MYSECRET"):
        assert s not in out


def test_a_key_echoed_encoded_is_scrubbed_too():
    """An upstream that echoes the request URL or a form body sends the key back percent-encoded
    (either case of hex), form-encoded or JSON-escaped: none of these forms may pass."""
    key = "k3y/with+odd=chars&\"quote\\ and space"
    echoes = [
        "GET https://up.example/v1?key=k3y%2Fwith%2Bodd%3Dchars%26%22quote%5C%20and%20space failed",
        "GET https://up.example/v1?key=k3y%2fwith%2bodd%3dchars%26%22quote%5c%20and%20space failed",
        "body: key=k3y%2Fwith%2Bodd%3Dchars%26%22quote%5C+and+space",
        '{"error": {"message": "bad key k3y/with+odd=chars&\\"quote\\\\ and space"}}',
    ]
    for text in echoes:
        out = scrub_secrets(text, key)
        assert "k3y" not in out and "odd" not in out, (text, out)


# --------------------------------------------------------------------------- protocol details


def test_retry_after_is_honoured(stub):
    cfg = config_for(stub, timeout_s=20.0)
    stub.set_fault("http", status=429, retry_after="1", times=1)
    t = time.monotonic()
    done = asyncio.run(client_for(cfg).complete([{"role": "user", "content": "hi"}]))
    assert time.monotonic() - t >= 1.0 and done.attempts == 2

    stub.set_fault("http", status=503, retry_after=email.utils.formatdate(time.time() + 2, usegmt=True), times=1)
    t = time.monotonic()
    asyncio.run(client_for(cfg).complete([{"role": "user", "content": "hi"}]))
    assert time.monotonic() - t >= 0.9  # the date has whole seconds: 1 < wait <= 2


def test_retry_after_beyond_the_deadline_fails_at_once(stub):
    stub.set_fault("http", status=429, retry_after="60")
    with pytest.raises(WorkerCallError, match="the next attempt would start after the overall deadline") as exc:
        asyncio.run(client_for(config_for(stub, timeout_s=5.0)).complete([{"role": "user", "content": "hi"}]))
    assert exc.value.attempts == 1  # at once, without waiting: not the 60 s the server asked for, nor the 5 s deadline


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = time.time()
    assert 9 < parse_retry_after(email.utils.formatdate(now + 10, usegmt=True), now=now) <= 10  # whole seconds
    assert parse_retry_after(email.utils.formatdate(now - 10, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize("stream", [True, False])
def test_openrouter_only_fields_go_only_to_openrouter(stub, monkeypatch, stream):
    monkeypatch.setenv("LOCAL_KEY", "local-secret-1234")
    cfg = WorkersConfig.model_validate({"workers": [
        {"id": "or", "kind": "openrouter", "model": MODEL, "base_url": stub.openrouter_url,
         "provider": {"order": ["X"]}, "reasoning": {"effort": "low"}},
        {"id": "loc", "kind": "openai_compatible", "model": "local-m", "base_url": stub.openai_url,
         "api_key_env": "LOCAL_KEY", "price_in_per_mtok": 1.0, "price_out_per_mtok": 2.0},
    ]})
    msgs = [{"role": "user", "content": "What is 1 plus 1000?"}]
    a = asyncio.run(client_for(cfg, "or", stream=stream).complete(msgs))
    b = asyncio.run(client_for(cfg, "loc", stream=stream).complete(msgs))
    r_or, r_loc = stub.chat_requests()
    assert r_or.body["usage"] == {"include": True} and r_or.body["provider"] and r_or.body["reasoning"]
    assert r_or.headers["x-title"] == "fugu-lite"
    assert not {"usage", "provider", "reasoning"} & set(r_loc.body)
    assert not {"x-title", "http-referer"} & set(r_loc.headers)
    assert r_loc.headers["authorization"] == "Bearer local-secret-1234"
    assert ("stream_options" in r_loc.body) == stream and "stream_options" not in r_or.body
    assert (a.cost_source, b.cost_source) == ("usage", "configured")
    assert a.provider == "StubProvider" and b.provider is None
    assert a.served_model == MODEL and a.requested_model == MODEL and a.prompt_tokens and a.completion_tokens
    assert (a.ttft_s is not None) == stream and a.answer == "The answer is 1001"
    assert b.cost_usd == pytest.approx((b.prompt_tokens * 1.0 + b.completion_tokens * 2.0) / 1e6)


def test_catalog_cost_when_usage_has_none(stub):
    """An OpenRouter-kind worker behind a server that reports tokens but no cost: catalog price."""
    cfg = WorkersConfig.model_validate({"workers": [
        {"id": "a", "kind": "openrouter", "model": MODEL, "base_url": stub.openai_url}]})
    snap = fetch_catalog(stub.openrouter_url)
    done = asyncio.run(client_for(cfg, catalog=snap, stream=False).complete([{"role": "user", "content": "hello"}]))
    assert done.cost_source == "catalog"
    assert done.cost_usd == pytest.approx(done.prompt_tokens * 1e-6 + done.completion_tokens * 2e-6)
    bare = asyncio.run(client_for(cfg, stream=False).complete([{"role": "user", "content": "hello"}]))
    assert (bare.cost_source, bare.cost_usd) == ("none", 0.0)


def test_stub_serves_many_concurrent_connections(stub):
    stub.set_latency(0.3)
    cfg = config_for(stub, timeout_s=10.0, read_timeout_s=5.0)

    async def run():
        c = client_for(cfg)
        try:
            return await asyncio.gather(*(c.complete([{"role": "user", "content": f"q{i}"}]) for i in range(40)))
        finally:
            await c.aclose()

    assert len(asyncio.run(run())) == 40
    assert stub.max_in_flight >= 32  # served at once, not one after another


# --------------------------------------------------------------------------- catalog


def _api(models: dict[str, dict]) -> dict:
    return {"data": [{"id": k, **v} for k, v in models.items()]}


def test_snapshot_fingerprints_diff_and_listing(tmp_path):
    base = {"q/a": {"name": "Qwen A", "pricing": {"prompt": "0.000001", "completion": "0.000002"}, "context_length": 8192},
            "q/b": {"name": "Qwen B", "pricing": {"prompt": "0", "completion": "0"}},
            "o/auto": {"pricing": {"prompt": "-1", "completion": "-1"}}}
    old = snapshot_from_api(_api(base))
    same = snapshot_from_api(_api({**base, "q/a": {**base["q/a"], "pricing": {**base["q/a"]["pricing"], "web_search": "0"}}}))
    assert same.fingerprint("q/a") == old.fingerprint("q/a")  # a new zero price field is no change
    new = snapshot_from_api(_api({"q/a": {**base["q/a"], "pricing": {"prompt": "0.000003", "completion": "0.000002"}},
                                  "x/c": {}}))
    d = diff_snapshots(old, new, {"wa": "q/a", "wb": "q/b"})
    assert d.changed == {"wa": (old.fingerprint("q/a"), new.fingerprint("q/a"))}
    assert d.retired == ["wb"] and d.added == ["x/c"] and d.removed == ["o/auto", "q/b"]
    assert diff_snapshots(None, new, {"wa": "q/a"}).changed == {}
    assert new.price_per_token("q/a") == (3e-6, 2e-6) and old.price_per_token("o/auto") is None

    save_snapshot(old, tmp_path)
    save_snapshot(old.model_copy(update={"fetched_at": "2030-01-01T00:00:00+00:00"}), tmp_path)
    assert len(list((tmp_path / "history").iterdir())) == 1  # history only on change
    save_snapshot(new, tmp_path)
    assert len(list((tmp_path / "history").iterdir())) == 2
    assert load_latest(tmp_path).models.keys() == new.models.keys()

    rows = list_models(old, contains="qwen", limit=1)
    assert [r["id"] for r in rows] == ["q/a"] and rows[0]["in_per_mtok"] == "1"
    assert "q/a" in format_rows(rows)


def test_catalog_asset_and_retired_marker(stub, tmp_path):
    (tmp_path / "w.json").write_text(json.dumps({"workers": [
        {"id": "a", "kind": "openrouter", "model": MODEL}, {"id": "gone", "kind": "openrouter", "model": "x/gone"}]}))
    res = dg.materialize([openrouter_catalog], resources={
        "openrouter": OpenRouterResource(base_url=stub.openrouter_url),
        "pipeline": PipelineResource(project_dir=str(tmp_path), workers_config="w.json")})
    meta = res.asset_materializations_for_node("openrouter_catalog")[0].metadata
    assert meta["model_count"].value == 1 and meta["retired_workers"].value == ["gone"]
    assert isinstance(load_latest(tmp_path / "data" / "catalog"), CatalogSnapshot)
    assert load_retired(tmp_path / "data" / "catalog")["gone"]["model"] == "x/gone"


def test_resource_from_env_without_key_still_loads(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    assert OpenRouterResource.from_env().api_key is None
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-x")
    assert OpenRouterResource.from_env().api_key is not None


# --------------------------------------------------------------------------- the sensor


def test_catalog_change_sensor(stub, tmp_path):
    stub.add_model("test/model-b")
    (tmp_path / "w.json").write_text(json.dumps({"workers": [
        {"id": "a", "kind": "openrouter", "model": MODEL},
        {"id": "b", "kind": "openrouter", "model": "test/model-b"},
        {"id": "m", "kind": "mock"}]}))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("task_batches", ["b1", "b2"])
    instance.add_dynamic_partitions("workers", ["a", "b", "m"])
    resources = {"openrouter": OpenRouterResource(base_url=stub.openrouter_url),
                 "pipeline": PipelineResource(project_dir=str(tmp_path), workers_config="w.json")}
    folder = tmp_path / "data" / "catalog"

    def tick(cursor):
        return catalog_change_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))

    first = tick(None)  # no baseline yet: nothing to re-collect
    assert not first.run_requests and first.cursor

    stub.set_price(MODEL, prompt=5e-6)
    changed = tick(first.cursor)
    new_fp = load_latest(folder).fingerprint(MODEL)
    keys = sorted((r.partition_key.keys_by_dimension["batch"], r.partition_key.keys_by_dimension["worker"])
                  for r in changed.run_requests)
    assert keys == [("b1", "a"), ("b2", "a")]
    assert all(r.tags[FINGERPRINT_TAG] == new_fp and new_fp in r.run_key for r in changed.run_requests)
    assert all(r.asset_selection == [dg.AssetKey("responses")] for r in changed.run_requests)
    assert len({r.run_key for r in changed.run_requests}) == 2

    assert not tick(changed.cursor).run_requests  # no change since: nothing
    assert not tick(None).run_requests  # a lost cursor falls back to the stored snapshot

    stub.remove_model("test/model-b")
    retired = tick(changed.cursor)
    assert not retired.run_requests and "b" in retired.skip_reason.skip_message
    assert list(load_retired(folder)) == ["b"]


def test_sensor_skips_when_the_catalog_is_unreachable(tmp_path):
    (tmp_path / "w.json").write_text(json.dumps({"workers": [{"id": "a", "kind": "openrouter", "model": MODEL}]}))
    resources = {"openrouter": OpenRouterResource(base_url="http://127.0.0.1:9/api/v1", timeout_s=1.0),
                 "pipeline": PipelineResource(project_dir=str(tmp_path), workers_config="w.json")}
    ctx = dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), cursor='{"models": {}}', resources=resources)
    res = catalog_change_sensor(ctx)
    assert not res.run_requests and "not fetched" in res.skip_reason.skip_message and res.cursor == '{"models": {}}'
