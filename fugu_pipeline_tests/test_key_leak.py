"""An upstream that quotes the API key in its error text must not leak any part of it.

Error text is cut (to `DETAIL_CHARS`, `RAW_CHARS`) before it becomes a message. Cutting before
scrubbing split a key that straddled the cut: the half before the cut no longer matched the key,
so it passed the scrubber into the CLI output, the Dagster event log, compute logs, response files
and the server's 502 body. The tests put a fake key (built at run time: no key-shaped literal in
the source) at every offset around every cut, then run the real `responses` asset through Dagster
against the loopback stub, which quotes the key it received in its error bodies.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import dagster as dg
import httpx
import pytest

from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline.workers.contract import WorkerCallError
from fugu_pipeline.workers.http import make_http_client
from fugu_pipeline.workers.replies import DETAIL_CHARS, RAW_CHARS, UpstreamErrors
from fugu_pipeline.workers.retry import Retryable

SHAPES = {
    # an OpenRouter-shaped key: also matched by the generic `sk-...` pattern
    "openrouter": lambda: "sk-" + "or-v1-" + secrets.token_hex(32),
    # a local server's key (vLLM --api-key): only the exact-key replacement protects it
    "local": lambda: "loc" + secrets.token_hex(20),
}


def leaked(text: str, key: str, n: int = 8) -> list[str]:
    """Every n-character piece of the key's secret part that occurs in `text`."""
    secret = key[9:] if key.startswith("sk-or-v1-") else key[3:]
    return sorted({secret[i:i + n] for i in range(len(secret) - n + 1) if secret[i:i + n] in text})


def offsets(cut: int, key: str, lead: int = 0) -> range:
    """Key start positions from wholly before the cut, through every straddle, to wholly after."""
    return range(max(0, cut - lead - len(key) - 2), cut - lead + 3)


def raised(fn) -> str:
    with pytest.raises((WorkerCallError, Retryable)) as err:
        fn()
    return str(err.value)


ERRORS = UpstreamErrors("worker w, model m at stub", "m", "FAKE_KEY_ENV", True)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("status", [400, 401, 403, 500])
def test_key_is_scrubbed_before_any_cut_at_every_offset(shape, status):
    key = SHAPES[shape]()
    checked = 0
    for at in offsets(DETAIL_CHARS, key):  # a plain-text (non-JSON) error body
        body = "." * at + key + " was refused"
        msg = raised(lambda: ERRORS.raise_status(status, {}, body, key))
        assert not leaked(msg, key), (at, msg)
        checked += 1
    for at in offsets(DETAIL_CHARS, key):  # OpenAI-style {"error": {"message": ...}}
        body = json.dumps({"error": {"message": "." * at + key + " is invalid", "code": status}})
        msg = raised(lambda: ERRORS.raise_status(status, {}, body, key))
        assert not leaked(msg, key), (at, msg)
        checked += 1
    lead = len("Provider returned error (")  # OpenRouter's metadata.raw, cut to RAW_CHARS
    for at in offsets(RAW_CHARS, key):
        body = json.dumps({"error": {"message": "Provider returned error", "code": status,
                                     "metadata": {"raw": "." * at + key + " is not a valid key"}}})
        msg = raised(lambda: ERRORS.raise_status(status, {}, body, key))
        assert not leaked(msg, key), (at, msg)
        checked += 1
    for at in offsets(DETAIL_CHARS, key, lead):  # {"error": "plain string"}
        msg = raised(lambda: ERRORS.raise_status(status, {}, json.dumps({"error": "." * at + key}), key))
        assert not leaked(msg, key), (at, msg)
        checked += 1
    for at in offsets(DETAIL_CHARS, key):  # an error inside an HTTP 200 body or stream chunk
        msg = raised(lambda: ERRORS.raise_embedded({"code": "bad_request", "message": "." * at + key}, key))
        assert not leaked(msg, key), (at, msg)
        checked += 1
    assert checked >= 5 * (len(key) + 4)


@pytest.mark.parametrize("shape", SHAPES)
def test_connection_error_text_is_scrubbed_before_the_cut(shape):
    key = SHAPES[shape]()
    cfg = WorkersConfig.model_validate({"workers": [{"id": "w", "kind": "openai_compatible", "model": "m",
                                                     "base_url": "http://127.0.0.1:9/v1"}]})
    client = make_http_client(cfg.worker("w"), cfg, api_key=key)
    lead = len("connection error: ConnectError: ")
    for at in offsets(DETAIL_CHARS, key, lead):
        err = client._transport_errors(httpx.ConnectError("." * at + key + " refused"), key)
        assert not leaked(str(err), key), (at, str(err))


# --------------------------------------------------------------------------- through the real asset


def write_project(root: Path, base_url: str, env: str) -> None:
    (root / "configs").mkdir(parents=True)
    cfg = {"workers": [{"id": "local", "kind": "openai_compatible", "model": "stub/local", "base_url": base_url,
                        "api_key_env": env, "max_concurrency": 2}],
           "max_attempts": 2, "timeout_s": 20, "read_timeout_s": 5, "connect_timeout_s": 2}
    (root / "configs" / "workers.json").write_text(json.dumps(cfg))
    bench = root / "data" / "benchgen"
    bench.mkdir(parents=True)
    for batch, n in (("b1", 8), ("b2", 2)):
        rows = [{"task_id": f"{batch}-t{i}", "prompt": f"Batch {batch} question {i}: what is {i} plus 1000?",
                 "domain": "math", "reference_answer": str(1000 + i), "grader": {"type": "numeric"}}
                for i in range(n)]
        (bench / f"{batch}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_key_never_leaks_through_the_responses_asset(tmp_path, monkeypatch):
    key = SHAPES["local"]()  # the hard case: no pattern knows its shape
    env = "FUGU_TEST_LOCAL_KEY"
    monkeypatch.setenv(env, key)
    with StubLLMServer(require_key=key) as stub:
        for i in range(8):
            stub.set_answer(f"Batch b1 question {i}: what is {i} plus 1000?", f"The answer is {1000 + i}")
        q = "Batch b1 question {}"
        # the key straddling the 300-character cut of error.message, at several offsets, as 400 and 500
        for i, at in enumerate([DETAIL_CHARS - len(key) + 1, DETAIL_CHARS - len(key) // 2, DETAIL_CHARS - 1]):
            stub.set_fault("http", status=400, prompt=q.format(i), echo_key_at=at)
        stub.set_fault("http", status=500, prompt=q.format(3), echo_key_at=DETAIL_CHARS - 7)
        # ... and straddling the 150-character cut of OpenRouter's error.metadata.raw
        stub.set_fault("http", status=400, prompt=q.format(4), echo_key_at=RAW_CHARS - len("Provider: (") - 20,
                       echo_key_in="raw")
        # b2: a 401 that quotes the key stops the run (FatalWorkerError -> dg.Failure)
        stub.set_fault("http", status=401, prompt="Batch b2", echo_key_at=DETAIL_CHARS - len(key) // 3)
        write_project(tmp_path, stub.openai_url, env)
        defs = build_defs(str(tmp_path), "configs/workers.json")
        job = defs.resolve_implicit_global_asset_job_def()
        (tmp_path / "dagster_home").mkdir()
        instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "dagster_home"))
        instance.add_dynamic_partitions("task_batches", ["b1", "b2"])
        instance.add_dynamic_partitions("workers", ["local"])
        runs = []
        for batch in ("b1", "b2"):
            runs.append(job.execute_in_process(
                instance=instance, asset_selection=[dg.AssetKey("responses")], raise_on_error=False,
                partition_key=dg.MultiPartitionKey({"batch": batch, "worker": "local"})))
        hits = [f.hits for f in stub.faults]
        quoted = [r for r in stub.chat_requests() if r.headers.get("authorization") == f"Bearer {key}"]
    assert runs[0].success and not runs[1].success
    assert all(h >= 1 for h in hits) and quoted  # the stub did receive the key and quote it back

    recs = [json.loads(x) for x in (tmp_path / "data" / "responses" / "b1" / "local.jsonl").read_text().splitlines()]
    failed = [r for r in recs if r["status"] == "failed"]
    assert len(failed) == 5 and sum("[redacted]" in r["error"] for r in failed) >= 3, [r["error"][-120:] for r in failed]
    assert sum(r["status"] == "ok" for r in recs) == 3

    texts = []
    for run in runs:
        for ev in instance.all_logs(run.run_id):
            texts += [str(ev), repr(ev)]
        for ev in run.all_events:
            if ev.event_type_value == "STEP_FAILURE":
                texts.append(str(ev.event_specific_data.error))  # the exception the user sees
    assert any("unauthorized" in t for t in texts) and any("[redacted]" in t for t in texts)
    assert not [t for t in texts if leaked(t, key)]

    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    logs = [p for p in files if "dagster_home" in str(p) and p.suffix in (".out", ".err", ".complete", ".db")]
    assert logs, "expected Dagster storage and compute logs to search"
    bad = [str(p) for p in files if leaked(p.read_bytes().decode("latin-1"), key)]
    assert bad == []
