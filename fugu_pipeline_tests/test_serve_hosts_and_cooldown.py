"""Two ways the server was used against itself, tested through the official `openai` client on a
loopback server with stub workers on 127.0.0.1:

- DNS rebinding: a page on evil.example makes its name resolve to 127.0.0.1 and talks to the
  token-less loopback server; the browser still sends `Host: evil.example`, which was accepted.
  Only the names the server is bound to (and `--allowed-host` names) are answered now.
- A worker whose key is refused (401) was called again on every request before the fallback;
  now it is kept out for `auth_cooldown_s`, and `/health` says so.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import yaml

from fugu_pipeline.route.promoted import PromotedRouter
from fugu_pipeline.serve import create_app
from fugu_pipeline.serve.hosts import HostPolicy, host_name
from fugu_pipeline.testing.serving import WORKERS, ServerThread, stub_workers_config
from fugu_pipeline_tests import serve_fixtures
from fugu_pipeline_tests.serve_fixtures import ask, start, stop


stub = serve_fixtures.stub
models = serve_fixtures.one_router
clean_stub = serve_fixtures.clean_stub


# --------------------------------------------------------------------------- Host header


def test_a_foreign_host_header_is_refused_by_a_tokenless_loopback_server(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url)))
    port = srv.url.rsplit(":", 1)[1]
    try:
        stub.reset_counts()
        rebound = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                                default_headers={"Host": f"evil.example:{port}"})
        with pytest.raises(openai.BadRequestError) as exc:
            rebound.chat.completions.create(model="fugu-lite", messages=ask("spend the budget"))
        err = exc.value.response.json()["error"]
        assert err["code"] == "host_not_allowed" and "evil.example" in err["message"] and "--allowed-host" in err["message"]
        assert set(err) == {"message", "type", "param", "code"}
        with pytest.raises(openai.BadRequestError):
            rebound.models.list()
        assert httpx.get(srv.url + "/health", headers={"Host": "evil.example"}).status_code == 400
        assert stub.chat_requests() == []  # no worker was called
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST.:{port}", "[::1]:" + port):
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                              default_headers={"Host": host})
            assert c.chat.completions.create(model="fugu-lite", messages=ask("hi")).choices[0].message.content == "echo: hi"
    finally:
        srv.stop()


def test_an_allowed_host_setting_admits_that_name(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url),
                                  allowed_hosts=["router.internal", "*.corp.example"]))
    try:
        for host, ok in (("router.internal", True), ("api.corp.example", True), ("corp.example.evil", False),
                         ("evil.example", False)):
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30,
                              default_headers={"Host": host})
            if ok:
                assert c.chat.completions.create(model="fugu-lite", messages=ask("hi")).choices[0].message.content
            else:
                with pytest.raises(openai.BadRequestError):
                    c.chat.completions.create(model="fugu-lite", messages=ask("hi"))
    finally:
        srv.stop()


def test_the_host_names_a_binding_answers():
    loop = HostPolicy("127.0.0.1")
    assert all(loop.allows(h) for h in ("127.0.0.1:8080", "localhost", "[::1]:8080", None))
    assert not any(loop.allows(h) for h in ("evil.example", "127.0.0.1.evil.example", "10.0.0.5", "", "a b", "[::1"))
    lan = HostPolicy("192.168.1.5", ["router.lan"])
    assert lan.allows("192.168.1.5:8080") and lan.allows("router.lan") and not lan.allows("localhost")
    anywhere = HostPolicy("0.0.0.0")
    assert anywhere.allows("10.1.2.3:80") and anywhere.allows("[fe80::1]") and anywhere.allows("localhost")
    assert not anywhere.allows("evil.example")
    assert HostPolicy("127.0.0.1", ["*"]).allows("anything.example")
    assert host_name("Example.COM.:443") == "example.com" and host_name("x:y") is None


@pytest.mark.slow
def test_fugu_lite_serve_takes_the_allowed_hosts_and_limits_flags(models, stub, tmp_path):
    """As a user runs it: `fugu-lite serve --allowed-host ...` in a subprocess."""
    (tmp_path / "workers.yaml").write_text(yaml.safe_dump(
        stub_workers_config(stub.openai_url).model_dump(mode="json", exclude_none=True)))
    log = tmp_path / "serve.log"
    proc, url = start(["--models-dir", str(models), "--workers", str(tmp_path / "workers.yaml"), "--device", "cpu",
                       "--allowed-host", "router.internal", "--allowed-host", "*.corp.example",
                       "--max-json-values", "300", "--auth-cooldown-s", "7"], log)
    try:
        for host, status in (("router.internal", 200), ("a.corp.example:80", 200), ("evil.example", 400)):
            assert httpx.get(url + "/health", headers={"Host": host}, timeout=10).status_code == status, host
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["limits"]["max_json_values"] == 300 and health["limits"]["auth_cooldown_s"] == 7
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as exc:
            c.chat.completions.create(model="fugu-lite", messages=ask("hi"), extra_body={"x": list(range(400))})
        assert exc.value.status_code == 413
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert "answers the host names" in text and "router.internal" in text and "refused a request for Host" in text


# --------------------------------------------------------------------------- 401 cooldown


def test_a_worker_that_answers_401_is_kept_out_for_a_while_and_health_says_so(models, stub):
    srv = ServerThread(create_app(PromotedRouter(models, device="cpu"), stub_workers_config(stub.openai_url),
                                  auth_cooldown_s=1.5))
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        first = c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?"))
        primary = first.model_extra["fugu_lite"]["chosen_worker"]
        model = WORKERS[primary]
        stub.set_fault("http", status=401, model=model, message="User not found.")
        stub.reset_counts()

        def calls() -> int:
            return sum(n for (m, _), n in stub.calls.items() if m == model)

        r1 = c.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("What is 2 times 3?"))
        info1 = r1.parse().model_extra["fugu_lite"]
        assert calls() == 1 and info1["served_by"] != primary and info1["fallback_errors"][0]["status"] == 401
        health = httpx.get(srv.url + "/health").json()
        kept = next(w for w in health["workers"] if w["id"] == primary)["kept_out"]
        assert health["kept_out"] == [primary] and kept["status"] == 401 and 0 < kept["seconds_left"] <= 1.5
        assert all(w["kept_out"] is None for w in health["workers"] if w["id"] != primary)

        for stream in (False, True):  # kept out: not called, listed, and the reply says one call was made
            r = c.chat.completions.with_raw_response.create(model="fugu-lite", messages=ask("What is 2 times 3?"),
                                                           stream=stream)
            info = (list(r.parse())[0] if stream else r.parse()).model_extra["fugu_lite"]
            assert calls() == 1, stream
            assert info["fallback_errors"][0]["worker"] == primary and "kept out" in info["fallback_errors"][0]["error"]
            assert info["attempts"] == 1 and r.headers["x-fugu-attempts"] == "1"

        time.sleep(1.6)  # the cooldown runs out: the next request tries it again
        c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?"))
        assert calls() == 2
        stub.clear_faults()
        time.sleep(1.6)
        again = c.chat.completions.create(model="fugu-lite", messages=ask("What is 2 times 3?"))
        assert again.model_extra["fugu_lite"]["served_by"] == primary and calls() == 3
        assert httpx.get(srv.url + "/health").json()["kept_out"] == []
    finally:
        srv.stop()
