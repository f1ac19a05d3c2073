"""Budget mode as a user runs it: `train-sft` (a quality head) writes the budget calibration beside
the checkpoint; `evaluate`, `route` and `serve` take a cap (a share of the strongest worker's cost
or USD per 1,000 requests); a cap nothing meets on validation is refused with the field named.
The evaluate report also groups by tag and by domain, with cost, and compares the router with the
best fixed worker on the same metric."""

import json
import random

import numpy as np
import pytest

from fugu_pipeline_tests.cli_project import run, write_inputs

WORKERS = ["a", "b", "c"]
PRICE = [0.2e-6, 1e-6, 5e-6]  # USD per prompt token


def rows(n: int = 240) -> list[dict]:
    rng = random.Random(0)
    words = "solve compute integral matrix python list prove derivative train hours value sum".split()
    out = []
    for i in range(n):
        d = ("math", "code")[i % 2]
        q = " ".join(rng.choice(words) for _ in range(rng.randint(3, 80)))
        hard = "integral" in q or "prove" in q
        quality = [0.0 if hard else 1.0, 0.0 if hard and d == "math" else 1.0, 1.0]
        tokens = -(-len(q) // 4)
        out.append({"task_id": f"t{i:03d}", "prompt": q, "domain": d, "worker_ids": WORKERS, "quality": quality,
                    "split": ("train", "train", "train", "val", "test")[i % 5],
                    "cost_usd": [tokens * p for p in PRICE], "tags": ["id" if i % 7 else "ood"]})
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("budget")
    common = write_inputs(work, rows())
    (work / "sft.yaml").write_text("head: quality\nepochs: 30\n")
    code, out = run("train-sft", *common, "--encoder", "tiny", "--config", str(work / "sft.yaml"), "--prompt-rules", "off",
                    "--output", str(work / "models"))
    assert code == 0
    ckpt = out.strip().splitlines()[-1]
    return work, ckpt, common


def test_train_writes_the_calibration_and_evaluate_reports_the_operating_point(trained, capsys):
    work, ckpt, common = trained
    cal = json.loads((work / ckpt / "budget.json").read_text())
    assert cal["reference_worker"] == "c" and cal["n_val"] == 48
    code, out = run("evaluate", "--checkpoint", ckpt, *common, "--budget-share", "0.5")
    assert code == 0, capsys.readouterr().err
    assert "chosen on 48 validation rows for the cap 50% of the strongest worker's cost" in out
    assert "router Pareto points" in out and "best single worker within the cap (chosen on train)" in out
    rep = json.loads((work / ckpt / "reports" / "test.json").read_text())
    op = rep["budget"]["operating_point"]
    assert op["met_on_validation"] and op["validation"]["share"] <= 0.5
    assert {w["name"] for w in rep["budget"]["workers"]} == set(WORKERS)
    assert (work / ckpt / "reports" / "test_budget.png").stat().st_size > 1000
    # groups: per domain and per tag, with cost; "best fixed" on the metric shown (quality here)
    assert ("per tag (quality; best fixed = c, chosen on train; a tag's figures averaged over its rows, and over its "
            "domains (macro: each domain's mean, then their mean); cost in $ per 1,000 requests)") in out
    assert {r["tag"] for r in rep["per_tag"]} == {"id", "ood"} and "router_cost_usd" in rep["per_tag"][0]
    assert rep["best_fixed_quality_worker"] == "c"
    # evaluating on other data calibrates for that report only: budget.json keeps the training data's
    before = (work / ckpt / "budget.json").read_bytes()
    (work / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()[:-10]))
    other = [a if a != str(work / "r.jsonl") else str(work / "other.jsonl") for a in common]
    code, _ = run("evaluate", "--checkpoint", ckpt, *other, "--budget-share", "0.5", "--output", str(work / "o.json"))
    assert code == 0 and "for this report only" in capsys.readouterr().err
    assert (work / ckpt / "budget.json").read_bytes() == before


def test_route_takes_a_cap_and_refuses_one_nothing_meets(trained, capsys):
    work, ckpt, _ = trained
    code, out = run("route", "--checkpoint", ckpt, "--prompt", "compute the sum of a list", "--domain", "code",
                    "--device", "cpu", "--budget-share", "0.5")
    assert code == 0
    d = json.loads(out)
    assert d["budget"]["reference_worker"] == "c" and d["budget"]["met_on_validation"] and d["worker"] in WORKERS
    code, _ = run("route", "--checkpoint", ckpt, "--prompt", "x", "--device", "cpu", "--budget-share", "0.0001")
    err = capsys.readouterr().err
    assert code == 2 and "budget share 0.0001: no operating point meets this cap on the calibration" in err
    assert "Raise the cap to at least" in err and "Traceback" not in err
    code, _ = run("route", "--checkpoint", ckpt, "--prompt", "x", "--device", "cpu", "--budget-share", "0.5",
                  "--cost-weight", "1")
    assert code == 2 and "not both" in capsys.readouterr().err
    code, _ = run("route", "--checkpoint", ckpt, "--prompt", "x", "--device", "cpu", "--budget-share", "-1")
    assert code == 2 and "budget" in capsys.readouterr().err


def test_ask_shows_the_operating_point_it_routed_at(trained, capsys):
    work, ckpt, _ = trained
    (work / "mock.yaml").write_text("workers:\n" + "".join(f"  - id: {w}\n    kind: mock\n" for w in WORKERS))
    code, out = run("ask", "--checkpoint", ckpt, "--workers", str(work / "mock.yaml"), "--prompt", "compute a sum",
                    "--domain", "code", "--device", "cpu", "--budget-share", "0.5")
    assert code == 0, capsys.readouterr().err
    shown = json.loads(out[out.index("{"):])["fugu_lite"]
    assert shown["budget"]["met_on_validation"] and shown["budget"]["reference_worker"] == "c"
    assert shown["budget"]["lambda"] >= 0 and "50%" in shown["budget"]["cap"]


def test_serve_takes_fugu_budget(trained):
    from starlette.testclient import TestClient

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import BudgetUnavailable, Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _ = trained
    router = Router.load(work / ckpt, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}} for w in WORKERS]})
    with pytest.raises(BudgetUnavailable, match="budget share 0.0001"):
        create_app(router, cfg, default_budget=Budget(share=1e-4))  # refused at start, not per request
    app = create_app(router, cfg, default_budget=Budget(share=0.5))
    msg = [{"role": "user", "content": "compute the sum of a list"}]
    with TestClient(app, base_url="http://127.0.0.1") as tc:  # a name the server answers (serve/hosts.py)
        r = tc.post("/v1/chat/completions", json={"messages": msg, "fugu_budget": {"share": 0.3}})
        assert r.status_code == 200, r.text
        assert "30%" in r.json()["fugu_lite"]["budget"]["cap"]
        r = tc.post("/v1/chat/completions", json={"messages": msg})  # the server's default cap
        assert "50%" in r.json()["fugu_lite"]["budget"]["cap"]
        r = tc.post("/v1/chat/completions", json={"messages": msg, "fugu_budget": {"share": -1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "fugu_budget"
        r = tc.post("/v1/chat/completions", json={"messages": msg, "fugu_budget": {"usd_per_1k": 1e-9}})
        assert r.status_code == 400 and r.json()["error"]["code"] == "budget_unavailable"
        assert "budget usd_per_1k 1e-09" in r.json()["error"]["message"]
    router.close()


def test_serve_follows_each_caps_spend_across_requests(trained):
    """The official client against `serve` on 127.0.0.1: a head under a cap routes at a λ that
    follows the spend of the requests routed under the same cap before it (`route/follow.py`): one
    follower per cap, counting across requests, concurrent ones included; the first request of a
    cap gets the cap's target; the caps a router keeps a follower for are bounded."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import openai

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.follow import MAX_FOLLOWERS, TARGET, curve_index, effective_cap
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _ = trained
    router = Router.load(work / ckpt, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}} for w in WORKERS]})
    srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)

        def ask(share: float, text: str = "compute the sum of a list") -> dict:
            r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": text}],
                                               extra_body={"fugu_budget": {"share": share}})
            info = r.model_extra["fugu_lite"]
            paid[share].append(info["cost_usd"])
            return info["budget"]

        seen, paid = {0.3: [], 0.5: []}, {0.3: [], 0.5: []}
        for share in (0.3, 0.5, 0.3, 0.3, 0.5):
            seen[share].append(ask(share))
        with ThreadPoolExecutor(8) as pool:  # at once: every request counted once
            list(pool.map(lambda k: ask(0.5, f"prove the integral {k}"), range(16)))
        last = ask(0.5)
        scraped = httpx.get(srv.url + "/metrics", timeout=30).text  # what an operator watches
    finally:
        srv.stop()
    cap = router.calibration.cap_usd(Budget(share=0.3))
    assert [b["follow"]["requests"] for b in seen[0.3]] == [1, 2, 3] and [b["follow"]["requests"] for b in seen[0.5]] == [1, 2]
    assert last["follow"]["requests"] == 2 + 16 + 1
    from prometheus_client.parser import text_string_to_metric_families

    got = {(f.name, tuple(sorted(x.labels.items()))): x.value for f in text_string_to_metric_families(scraped)
           for x in f.samples if f.name.startswith("fugu_cap_")}
    for share, n in ((0.3, 3), (0.5, 19)):
        key = (("cap_usd", f"{router.calibration.cap_usd(Budget(share=share)):.6g}"), ("checkpoint", router.tag), ("group", ""))
        assert got[("fugu_cap_requests", key)] == n, got
    # each reply settled its follower: the spend it follows is what the calls cost, not the expected cost
    assert got[("fugu_cap_running_mean_usd", key)] == pytest.approx(np.mean(paid[0.5])) and len(got) == 4
    assert last["follow"]["running_mean_usd"] != pytest.approx(np.mean(paid[0.5]))  # at routing: its expected cost counted
    first = seen[0.3][0]
    assert first["follow"]["effective_cap_usd"] == pytest.approx(TARGET * cap) and first["follow"]["cap_usd"] == pytest.approx(cap)
    assert first["follow"]["running_mean_usd"] == pytest.approx(first["expected_cost_usd"])
    assert [b["follow"]["effective_cap_usd"] for b in seen[0.3][1:]] == pytest.approx(
        [effective_cap(cap, k, sum(paid[0.3][:k])) for k in (1, 2)])
    lams, costs = router.calibration.curve_arrays()  # λ: the curve's first point within the effective cap
    assert first["lambda"] == lams[curve_index(costs, TARGET * cap)]
    for i in range(MAX_FOLLOWERS + 3):
        router.follower(Budget(usd_per_1k=1.0 + i))
    assert len(router._followers) == MAX_FOLLOWERS and round((MAX_FOLLOWERS + 2.0) / 1000, 15) in router._followers
    router.close()


def test_a_streamed_reply_settles_its_cap_and_an_unpriced_one_keeps_the_expected_cost(trained, monkeypatch):
    """Workers on a real OpenRouter-style stub on 127.0.0.1 (each reply bills `usage.cost`), then on
    its plain OpenAI-style route (no cost, no price: the cost is unknown). A streamed reply settles
    its cap's follower with the cost it reported at the end of the stream, as a plain reply does;
    a reply whose cost is unknown leaves the expected cost recorded at routing."""
    import openai

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.testing.stub_llm import StubLLMServer
    from fugu_pipeline.workers.config import WorkersConfig

    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + "ab" * 20)
    work, ckpt, _ = trained
    with StubLLMServer() as stub:
        for priced, url in ((True, stub.openrouter_url), (False, stub.openai_url)):
            router = Router.load(work / ckpt, device="cpu")
            kind = "openrouter" if priced else "openai_compatible"
            cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": kind, "model": f"m/{w}", "base_url": url}
                                                            for w in WORKERS]})
            srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
                body = {"fugu_budget": {"share": 0.4}}
                plain = client.chat.completions.create(model="fugu-lite", extra_body=body, messages=[
                    {"role": "user", "content": "compute the sum of a list"}]).model_extra["fugu_lite"]
                final = None
                for chunk in client.chat.completions.create(model="fugu-lite", stream=True, extra_body=body, messages=[
                        {"role": "user", "content": "prove the integral of x " * 20}]):
                    final = (chunk.model_extra or {}).get("fugu_lite") or final
            finally:
                srv.stop()
            state = router.follower(Budget(share=0.4)).state()
            router.close()
            assert state["requests"] == 2
            if priced:
                assert plain["cost_source"] == final["cost_source"] == "usage" and final["cost_usd"] > 0
                assert state["running_mean_usd"] * 2 == pytest.approx(plain["cost_usd"] + final["cost_usd"])
            else:  # unknown cost: what was recorded at routing, the expected cost of each route
                assert plain["cost_source"] == final["cost_source"] == "none"
                assert state["running_mean_usd"] * 2 == pytest.approx(plain["budget"]["expected_cost_usd"]
                                                                      + final["budget"]["expected_cost_usd"])
                assert state["running_mean_usd"] > 0


def test_a_reply_settles_the_router_that_routed_it_after_a_reload(trained):
    """A new router (a promotion) arrives between a request's route and its reply: the reply's cost
    settles the follower of the router that routed it, and the new router's spend stays untouched."""
    import openai

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _ = trained
    old, new = Router.load(work / ckpt, device="cpu"), Router.load(work / ckpt, device="cpu")
    current = [old]
    routed = old.route_batch

    def route_then_promote(*a, **k):  # the next router arrives while this request's worker is called
        out = routed(*a, **k)
        current[0] = new
        return out

    old.route_batch = route_then_promote
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}} for w in WORKERS]})
    srv = ServerThread(create_app(lambda: current[0], cfg, batch_window_ms=5))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        info = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": "sum a list"}],
                                              extra_body={"fugu_budget": {"share": 0.4}}).model_extra["fugu_lite"]
    finally:
        srv.stop()
    assert current[0] is new and info["cost_usd"] != pytest.approx(info["budget"]["expected_cost_usd"])
    assert old.follower(Budget(share=0.4)).state()["running_mean_usd"] == pytest.approx(info["cost_usd"])
    assert new.follower(Budget(share=0.4)).state()["requests"] == 0
    old.close()
    new.close()


def test_a_fault_counting_a_reply_s_cost_still_serves_the_reply(trained, monkeypatch, caplog):
    """The reply is paid for when its cost is counted: a fault in the count is logged, and the reply
    (plain or streamed) still reaches the client whole."""
    from starlette.testclient import TestClient

    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _ = trained
    router = Router.load(work / ckpt, device="cpu")

    def broken(*a, **k):
        raise RuntimeError("the count broke")

    monkeypatch.setattr(Router, "record_spend", broken)
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock"} for w in WORKERS]})
    body = {"messages": [{"role": "user", "content": "sum a list"}], "fugu_budget": {"share": 0.4}}
    with TestClient(create_app(router, cfg), base_url="http://127.0.0.1") as tc:
        plain = tc.post("/v1/chat/completions", json=body)
        streamed = tc.post("/v1/chat/completions", json={**body, "stream": True})
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"]
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert '"finish_reason":"stop"' in streamed.text.replace(" ", "")
    assert sum("could not be counted in its cap's spend" in r.getMessage() for r in caplog.records) == 2
    router.close()


def test_evaluate_routes_a_cap_as_the_router_serves_it(trained, capsys):
    """What serves is what `evaluate` reports: the held-out prompts routed by the loaded router in
    traffic order, one batch, land on the workers the report's operating point counts."""
    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.follow import traffic_order
    from fugu_pipeline.route.router import Router

    work, ckpt, common = trained
    code, _ = run("evaluate", "--checkpoint", ckpt, *common, "--budget-share", "0.5")
    assert code == 0, capsys.readouterr().err
    op = json.loads((work / ckpt / "reports" / "test.json").read_text())["budget"]["operating_point"]
    test = [r for r in rows() if r["split"] == "test"]
    test = [test[k] for k in traffic_order([r["task_id"] for r in test])]
    router = Router.load(work / ckpt, device="cpu")
    got = router.route_batch([r["prompt"] for r in test], [r["domain"] for r in test], budget=Budget(share=0.5))
    router.close()
    served = {w: sum(d.worker_id == w for d in got) for w in WORKERS}
    assert served == op["test"]["route_distribution"]
    assert op["followed"]["lambda_min"] <= min(d.extra["budget"]["lambda"] for d in got)


def test_serve_says_whose_budget_or_field_a_refusal_is(trained, monkeypatch):
    # The server's default cap, refused after a reload, was answered as the client's fugu_budget
    # (a 400 for a field the client never sent); every other router refusal was labelled
    # fugu_allowed_workers / unknown_worker, whatever it was about.
    from starlette.testclient import TestClient

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import BudgetUnavailable, Router, RouterError
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.workers.config import WorkersConfig

    work, ckpt, _ = trained
    router = Router.load(work / ckpt, device="cpu")
    cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "mock", "mock": {"cost_usd": 0.001}} for w in WORKERS]})
    app = create_app(router, cfg, default_budget=Budget(share=0.5))

    def unable(*a, **k):
        raise BudgetUnavailable("this checkpoint has no budget calibration")

    msg = [{"role": "user", "content": "compute the sum of a list"}]
    with TestClient(app, base_url="http://127.0.0.1") as tc:  # a name the server answers (serve/hosts.py)
        monkeypatch.setattr(Router, "budget_scores", unable)
        r = tc.post("/v1/chat/completions", json={"messages": msg})
        err = r.json()["error"]
        assert r.status_code == 503 and (err["type"], err["code"], err["param"]) == ("server_error", "budget_unavailable", None)
        assert err["message"].startswith("this server's default budget cannot be honoured")
        r = tc.post("/v1/chat/completions", json={"messages": msg, "fugu_budget": {"share": 0.3}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "fugu_budget"

        def not_finite(*a, **k):
            raise RouterError("the head's scores are not finite for this request", code="unroutable_request")

        monkeypatch.setattr(Router, "route_batch", not_finite)
        r = tc.post("/v1/chat/completions", json={"messages": msg, "fugu_cost_weight": 0.5})
        err = r.json()["error"]
        assert r.status_code == 400 and (err["param"], err["code"]) == (None, "unroutable_request"), err
    router.close()


def test_a_reply_reporting_a_bogus_huge_cost_holds_the_cap_down_for_a_while_not_for_good(trained, monkeypatch):
    """A hostile OpenRouter-style server bills a million dollars for one reply (`usage.cost`, finite
    and non-negative, so it is taken as the reply's cost): the cap's follower counts that request at
    most 50 caps' worth, so its effective cap comes back once later requests pay it back, where
    counting the million would hold it at its floor until the router reloads."""
    import openai

    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.follow import LOW, MAX_ONE
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.testing.stub_llm import StubLLMServer
    from fugu_pipeline.workers.config import WorkersConfig

    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + "ab" * 20)
    work, ckpt, _ = trained
    with StubLLMServer() as stub:
        monkeypatch.setattr(stub, "_cost", lambda model, pt, ct: 1e6)
        router = Router.load(work / ckpt, device="cpu")
        cfg = WorkersConfig.model_validate({"workers": [{"id": w, "kind": "openrouter", "model": f"m/{w}",
                                                         "base_url": stub.openrouter_url} for w in WORKERS]})
        srv = ServerThread(create_app(router, cfg, batch_window_ms=5))
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
            got = client.chat.completions.create(model="fugu-lite", extra_body={"fugu_budget": {"share": 0.4}}, messages=[
                {"role": "user", "content": "compute the sum of a list"}]).model_extra["fugu_lite"]
        finally:
            srv.stop()
        follower = router.follower(Budget(share=0.4))
        router.close()
    assert got["cost_usd"] == 1e6 and got["cost_source"] == "usage"  # the reply says what it was billed
    state = follower.state()
    assert state["requests"] == 1
    assert state["running_mean_usd"] <= got["budget"]["expected_cost_usd"] + MAX_ONE * follower.cap
    assert follower.effective() == pytest.approx(LOW * follower.cap)  # held down at first ...
    for _ in range(200):  # ... then requests at half the cap pay it back
        follower.record(0.5 * follower.cap)
    assert follower.effective() > 0.9 * follower.cap
