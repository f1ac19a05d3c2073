"""`fugu-lite serve` as a user runs it: a subprocess on a loopback port, stub workers on loopback,
the official `openai` client. Checks the flags the log tells users to pass (`--token`) and the
serving defaults (`--torch-threads`)."""

from __future__ import annotations


import httpx
import openai
import pytest
import yaml

from fugu_pipeline.testing.serving import build_checkpoints, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.serve_fixtures import start, stop


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_cli")
    build_checkpoints(root / "models", seeds=(0,))
    with StubLLMServer() as stub:
        (root / "workers.yaml").write_text(yaml.safe_dump(
            stub_workers_config(stub.openai_url).model_dump(mode="json", exclude_none=True)))
        yield root


@pytest.mark.slow
def test_serve_with_token_and_torch_threads_flags(setup):
    log = setup / "serve.log"
    proc, url = start(["--models-dir", str(setup / "models"), "--workers", str(setup / "workers.yaml"),
                       "--device", "cpu", "--token", "cli-secret-token", "--torch-threads", "1"], log)
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=30).chat.completions.create(
                model="fugu-lite", messages=[{"role": "user", "content": "hi"}])
        c = openai.OpenAI(base_url=url + "/v1", api_key="cli-secret-token", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "What is 2+2?"}])
        assert r.choices[0].message.content == "echo: What is 2+2?"
        assert httpx.post(url + "/v1/chat/completions", content=b"{}", timeout=10,
                          headers={"Authorization": "Bearer cli-secret-token", "Content-Type": "text/plain"}
                          ).status_code == 415
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert "torch threads 1" in text and "auth bearer token" in text
    assert "cli-secret-token" not in text


@pytest.mark.slow
def test_serve_defaults_to_one_torch_thread_and_takes_the_token_from_the_environment(setup):
    log = setup / "serve-env.log"
    proc, url = start(["--models-dir", str(setup / "models"), "--workers", str(setup / "workers.yaml"),
                       "--device", "cpu", "--dtype", "float32"], log, env={"FUGU_SERVE_TOKEN": "env-token"})
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="env-token", max_retries=0, timeout=30)
        assert c.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "hi"}]).choices
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert "torch threads 1" in text and "(float32)" in text and "auth bearer token" in text


def test_route_and_ask_refuse_an_undecodable_prompt_without_a_traceback(setup, capsys):
    from fugu_pipeline.cli import main

    prompt = b"what is \xff?".decode("utf-8", "surrogateescape")  # what argv holds for invalid UTF-8
    assert main(["route", "--models-dir", str(setup / "models"), "--prompt", prompt, "--device", "cpu"]) == 2
    assert main(["ask", "--models-dir", str(setup / "models"), "--workers", str(setup / "workers.yaml"),
                 "--prompt", prompt, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("not valid UTF-8") == 2 and "Traceback" not in err
