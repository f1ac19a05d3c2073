"""A router trained on imported routing data routes by the data's worker ids (model names such as
`WizardLM/WizardLM-13B-V1.2`, which a worker YAML id cannot hold). A configured worker lists such
an id under `aliases` and answers its routes: through the server with the official `openai`
client on loopback, and through `fugu-lite ask`."""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.serve import create_app
from fugu_pipeline.serve.app import load_router_provider
from fugu_pipeline.testing.serving import ServerThread
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.test_import_long import melt
from fugu_pipeline_tests.test_import_table import MODELS, routerbench_like

NAMES = {"wizard": MODELS[0], "claude": MODELS[1], "gpt4": MODELS[2]}  # configured id -> the data's id


def config(base_url: str, aliases: bool = True) -> WorkersConfig:
    return WorkersConfig.model_validate({"workers": [
        {"id": wid, "kind": "openai_compatible", "base_url": base_url, "model": f"stub/{wid}",
         **({"aliases": [data_id]} if aliases else {})} for wid, data_id in NAMES.items()],
        "timeout_s": 10.0, "connect_timeout_s": 2.0, "read_timeout_s": 5.0})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("aliases")
    shutil.copytree(REPO / "configs", root / "configs")
    melt(routerbench_like(150)).write_parquet(root / "calls.parquet")
    at = lambda name: str(root / name)  # noqa: E731
    assert main(["import", "long", at("calls.parquet"), "--output", at("r.jsonl"), "--id-column", "sample_id",
                 "--domain-column", "eval_name", "--cost-column", "cost", "--ledger", at("costs.jsonl")]) == 0
    assert main(["train", "--data", at("r.jsonl"), "--workers", at("configs/reward.quality.yaml"), "--encoder", "tiny",
                 "--output", at("models"), "--layer-sets", "off", "--work-dir", at("imports"), "--cache-dir", at("emb")]) == 0
    return next(p.parent for p in (root / "models").glob("knn/*/manifest.json"))


def test_a_router_trained_on_imported_ids_is_served_by_the_workers_that_alias_them(checkpoint):
    with StubLLMServer() as stub:
        router = load_router_provider(checkpoint, device="cpu")
        assert set(router.worker_ids) == set(MODELS)
        with pytest.raises(ValueError, match="list each routed id under the aliases"):
            create_app(router, config(stub.openai_url, aliases=False))
        srv = ServerThread(create_app(router, config(stub.openai_url)))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
            by_name = {v: k for k, v in NAMES.items()}
            for prompt, domain in (("[gsm8k] question 4?", "gsm8k"), ("[mbpp] question 5?", "mbpp")):
                r = client.chat.completions.create(model="fugu", messages=[{"role": "user", "content": prompt}],
                                                   extra_body={"domain": domain})
                info = r.model_extra["fugu_lite"]
                assert info["chosen_worker"] in MODELS and info["served_by"] == by_name[info["chosen_worker"]]
                assert stub.chat_requests()[-1].body["model"] == f"stub/{info['served_by']}"
            # fugu_allowed_workers may name the configured worker; the router restricts to its alias
            r = client.chat.completions.create(model="fugu", messages=[{"role": "user", "content": "hello"}],
                                               extra_body={"fugu_allowed_workers": ["claude"]})
            assert r.model_extra["fugu_lite"]["chosen_worker"] == NAMES["claude"]
            assert r.model_extra["fugu_lite"]["served_by"] == "claude"
            health = httpx.get(srv.url + "/health", timeout=10).json()
            assert {w["id"]: w["routed"] for w in health["workers"]} == {k: True for k in NAMES}
        finally:
            srv.stop()


def test_ask_calls_the_aliased_worker(checkpoint, tmp_path, capsys):
    import yaml

    cfg = {"workers": [{"id": wid, "kind": "mock", "aliases": [data_id], "mock": {"default_strength": 1.0}}
                       for wid, data_id in NAMES.items()]}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert main(["ask", "--checkpoint", str(checkpoint), "--workers", str(tmp_path / "w.yaml"), "--encoder", "tiny",
                 "--device", "cpu", "--domain", "gsm8k", "--prompt", "[gsm8k] question 4?"]) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out[out.index("{"):])["fugu_lite"]
    assert shown["chosen"] in MODELS and shown["served_by"] == {v: k for k, v in NAMES.items()}[shown["chosen"]]
    # --allowed may name the configured worker: ask and route restrict the router to its alias
    for cmd in ("ask", "route"):
        assert main([cmd, "--checkpoint", str(checkpoint), "--workers", str(tmp_path / "w.yaml"), "--encoder", "tiny",
                     "--device", "cpu", "--prompt", "[gsm8k] question 4?", "--allowed", "claude"]) == 0
        out = capsys.readouterr().out
        shown = json.loads(out[out.index("{"):])
        if cmd == "ask":
            assert (shown["fugu_lite"]["served_by"], shown["fugu_lite"]["chosen"]) == ("claude", NAMES["claude"])
        else:
            assert shown["worker"] == NAMES["claude"]
    # without --workers, route knows only the router's ids, and says which
    assert main(["route", "--checkpoint", str(checkpoint), "--encoder", "tiny", "--device", "cpu",
                 "--prompt", "hello", "--allowed", "claude"]) == 2
    assert "claude" in capsys.readouterr().err
    # a worker config that lacks a routed worker (one was removed from the YAML) is refused by ask and
    # by route, before anything is called, as serve refuses it: the router's pick could not be called
    two = [{"id": wid, "kind": "mock", "aliases": [data_id]} for wid, data_id in NAMES.items() if wid != "gpt4"]
    for cfg in ({"workers": [{"id": "other", "kind": "mock"}]}, {"workers": two}):
        (tmp_path / "w.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
        for cmd in ("ask", "route"):
            assert main([cmd, "--checkpoint", str(checkpoint), "--workers", str(tmp_path / "w.yaml"), "--encoder", "tiny",
                         "--device", "cpu", "--prompt", "hello"]) == 2
            err = capsys.readouterr().err
            assert "the worker config does not define" in err and NAMES["gpt4"] in err and "w.yaml" in err, err


def test_aliases_are_checked_where_the_worker_config_is_read():
    base = {"kind": "mock"}
    with pytest.raises(ValueError, match="alias"):
        WorkersConfig.model_validate({"workers": [{**base, "id": "a", "aliases": ["org/m"]}, {**base, "id": "b", "aliases": ["org/m"]}]})
    with pytest.raises(ValueError, match="alias"):
        WorkersConfig.model_validate({"workers": [{**base, "id": "a"}, {**base, "id": "b", "aliases": ["a"]}]})
    with pytest.raises(ValueError, match="should match pattern"):
        WorkersConfig.model_validate({"workers": [{**base, "id": "a", "aliases": ['x"; DROP TABLE t; --']}]})
    with pytest.raises(ValueError, match="should match pattern"):
        WorkersConfig.model_validate({"workers": [{**base, "id": "a", "aliases": ["../../etc/passwd"]}]})
    ok = WorkersConfig.model_validate({"workers": [{**base, "id": "a", "aliases": ["org/m:free"]}, {**base, "id": "b"}]})
    assert ok.worker("org/m:free").id == "a" and ok.knows("org/m:free") and not ok.knows("org/other")
    with pytest.raises(KeyError, match="aliases"):
        ok.worker("org/other")
