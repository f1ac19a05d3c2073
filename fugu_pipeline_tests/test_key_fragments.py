"""A piece of a configured key that an upstream echoes (many providers show a rejected key's last
characters) must not reach the response files, the reward matrix, a 502 body or the server log.

The scrubber used to replace only the whole key (and key-shaped strings): a local server's key
quoted by its last 40 characters passed it untouched. Now any run of `FRAGMENT_CHARS` (12) or more
characters of a configured key is replaced. The keys are built at run time (no key-shaped literal
in the source) in a shape no pattern knows, so only the fragment rule can catch them.
"""

from __future__ import annotations

import json
import logging
import secrets

import openai
import pytest

from fugu_pipeline.api_keys import FRAGMENT_CHARS, scrub_secrets
from fugu_pipeline.collect.partition import collect_partition_sync
from fugu_pipeline.collect.store import ResponseStore
from fugu_pipeline.matrix.build import build, from_collection
from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.tasks.loading import load_tasks
from fugu_pipeline.testing.serving import WORKERS, ServerThread, build_checkpoints, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.config import WorkersConfig


def local_key() -> str:
    return "loc" + secrets.token_hex(24)  # 51 characters no key pattern knows


def pieces(key: str, n: int = FRAGMENT_CHARS) -> set[str]:
    return {key[i:i + n] for i in range(len(key) - n + 1)}


def leaked(text: str, key: str) -> list[str]:
    return sorted(p for p in pieces(key) if p in text)


def test_any_run_of_twelve_characters_of_a_key_is_scrubbed():
    key = local_key()
    for n in range(FRAGMENT_CHARS, len(key) + 1):
        for start in (0, len(key) - n, (len(key) - n) // 2):
            frag = key[start:start + n]
            out = scrub_secrets(f"Incorrect API key provided: ...{frag}. You can find your key at ...", key)
            assert not leaked(out, key) and "[redacted]" in out, (n, start, out)
    # two fragments next to each other, in JSON-escaped text, and one split over a line break
    both = scrub_secrets(f"{key[-20:]}{key[:15]} / {json.dumps(key[5:30])} / {key[10:25]}\n{key[25:40]}", key)
    assert not leaked(both, key), both
    # shorter runs and text that only shares the key's alphabet stay as they are
    assert scrub_secrets(f"id {key[:FRAGMENT_CHARS - 1]} ok", key) == f"id {key[:FRAGMENT_CHARS - 1]} ok"
    assert scrub_secrets("The answer is 1234567890123456", key) == "The answer is 1234567890123456"


def write_batch(root, n: int = 6) -> list:
    bench = root / "data" / "benchgen"
    bench.mkdir(parents=True)
    rows = [{"task_id": f"t{i}", "prompt": f"Question {i}: what is {i} plus 1000?", "domain": "math",
             "reference_answer": str(1000 + i), "grader": {"type": "numeric"}} for i in range(n)]
    (bench / "b1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_tasks(bench / "b1.jsonl")


def test_an_echoed_key_tail_never_reaches_the_response_files_or_the_matrix(tmp_path, monkeypatch):
    key = local_key()
    monkeypatch.setenv("FUGU_TEST_FRAGMENT_KEY", key)
    tasks = write_batch(tmp_path)
    with StubLLMServer(require_key=key) as stub:
        stub.set_fault("http", status=400, prompt="Question 0", echo_key_at=0, echo_key_tail=40)
        stub.set_fault("http", status=422, prompt="Question 1", echo_key_at=250, echo_key_tail=40)
        stub.set_fault("http", status=500, prompt="Question 2", echo_key_at=3, echo_key_tail=len(key) - 2)
        stub.set_fault("http", status=400, prompt="Question 3", echo_key_at=0, echo_key_tail=30, echo_key_in="raw")
        cfg = WorkersConfig.model_validate({
            "workers": [{"id": "local", "kind": "openai_compatible", "model": "stub/local", "base_url": stub.openai_url,
                         "api_key_env": "FUGU_TEST_FRAGMENT_KEY"}],
            "max_attempts": 2, "timeout_s": 20, "read_timeout_s": 5, "connect_timeout_s": 2})
        store = ResponseStore(tmp_path / "data" / "responses")
        stats = collect_partition_sync(tasks, "b1", "local", cfg, store)
        assert all(f.hits for f in stub.faults)
    assert stats.n_failed == 4 and stats.n_ok == 2
    build(from_collection(tmp_path / "data" / "benchgen", store, cfg), tmp_path / "data" / "reward_matrix.duckdb")
    errors = [json.loads(x)["error"] for x in (tmp_path / "data" / "responses" / "b1" / "local.jsonl").read_text().splitlines()]
    assert sum("[redacted]" in (e or "") for e in errors) == 4, errors
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".duckdb" for p in files)
    assert [str(p) for p in files if leaked(p.read_bytes().decode("latin-1"), key)] == []


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    build_checkpoints(models, seeds=(0,))
    return models


def test_an_echoed_key_tail_never_reaches_the_502_body_or_the_server_log(models, caplog, monkeypatch):
    key = local_key()
    monkeypatch.setenv("FUGU_TEST_FRAGMENT_KEY", key)
    with StubLLMServer(require_key=key) as s:
        cfg = stub_workers_config(s.openai_url)
        for w in cfg.workers:
            w.api_key_env = "FUGU_TEST_FRAGMENT_KEY"
        for i, model in enumerate(WORKERS.values()):  # a 400, a 500 and a 401, each quoting the key's end
            s.set_fault("http", status=[400, 500, 401][i], model=model, echo_key_at=5 * i, echo_key_tail=40 - 5 * i)
        srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), cfg))
        try:
            with caplog.at_level(logging.INFO):
                c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
                with pytest.raises(openai.APIStatusError) as exc:
                    c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hello"}])
        finally:
            srv.stop()
        assert all(f.hits for f in s.faults)
    assert exc.value.status_code == 502
    body = exc.value.response.text
    assert body.count("[redacted]") >= 3, body
    assert leaked(body, key) == [] and leaked(caplog.text, key) == []
