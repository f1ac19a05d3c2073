"""What a route reports is named for what it is, and a flag the head cannot use is refused.

- `scores` + `score_kind`: a policy head's probabilities (`policy_probability`, they sum to 1), a
  quality predictor's predicted utility (`predicted_utility`), or predicted quality − λ·cost
  (`predicted_quality_minus_cost`, under a cost weight or a budget). `probabilities` is there only
  where it is a policy's; in Python, reading it off a utility head's decision warns (deprecated).
- `route --cost-weight` on a head without a cost term (every kind `fugu-lite train` saves) used to give
  the route of no flag, silently: it is refused, naming the head kind and the budget flags.
- The server reports the same fields through the official `openai` client.
"""

import json

import numpy as np
import openai
import pytest

from fugu_pipeline_tests.test_budget_cli import WORKERS, run
from fugu_pipeline_tests.test_budget_cli import rows as budget_rows

HEADS = """heads:
  domain_prior: {m: [5]}
  knn: {k: [10], prior_weight: [0], same_domain_bonus: [0]}
  ensemble: {rounds: 3}
"""
PROMPT = "solve the integral of the matrix sum"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A knn and a domain-prior head (`fugu-lite train`), a policy head and a quality head (`train-sft`)."""
    work = tmp_path_factory.mktemp("route-scores")
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in budget_rows()))
    (work / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (work / "heads.yaml").write_text(HEADS)
    (work / "quality.yaml").write_text("head: quality\nepochs: 10\n")
    (work / "policy.yaml").write_text("epochs: 10\n")
    common = ["--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--device", "cpu", "--encoder", "tiny",
              "--cache-dir", str(work / "emb"), "--work-dir", str(work / "imports"), "--prompt-rules", "off"]
    code, _ = run("train", *common, "--config", str(work / "heads.yaml"), "--layer-sets", "off",
                  "--output", str(work / "models"))
    assert code == 0
    for name in ("quality", "policy"):
        code, out = run("train-sft", *common, "--config", str(work / f"{name}.yaml"), "--output", str(work / name))
        assert code == 0
    ckpt = {kind: str(next((work / "models" / kind).iterdir())) for kind in ("knn", "domain_prior")}
    ckpt["quality"] = str(next((work / "quality" / "sft").iterdir()))
    ckpt["policy"] = str(next((work / "policy" / "sft").iterdir()))
    return ckpt


def route(ckpt: str, *extra) -> tuple[int, dict]:
    code, out = run("route", "--checkpoint", ckpt, "--prompt", PROMPT, "--domain", "math", "--device", "cpu", *extra)
    return code, (json.loads(out) if code == 0 else {})


@pytest.mark.parametrize("kind", ["knn", "domain_prior"])
def test_a_cost_weight_the_head_cannot_use_is_refused_not_ignored(trained, kind, capsys):
    code, _ = route(trained[kind], "--cost-weight", "50")
    err = capsys.readouterr().err
    assert code == 2, "the route of no flag was given as if the cost weight had been applied"
    assert f"--cost-weight: head kind {kind!r} has no cost term" in err and "--cap share=" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # what the message points to works on the same checkpoint
    code, d = route(trained[kind], "--cap", "share=0.5")
    assert code == 0 and d["score_kind"] == "predicted_quality_minus_cost" and d["budget"]["met_on_validation"]


def test_a_policy_head_refuses_a_cost_weight_and_says_it_has_no_quality(trained, capsys):
    code, _ = route(trained["policy"], "--cost-weight", "50")
    err = capsys.readouterr().err
    assert code == 2 and "head kind 'layernorm_linear' is a policy" in err


def test_a_quality_head_takes_the_cost_weight_and_it_moves_the_scores(trained):
    free = route(trained["quality"], "--cost-weight", "0")[1]
    dear = route(trained["quality"], "--cost-weight", "1000")[1]
    assert free["score_kind"] == dear["score_kind"] == "predicted_quality_minus_cost"
    assert dear["worker"] == "a"  # the cheapest, once cost dominates
    assert free["scores"] != dear["scores"] and "probabilities" not in dear


@pytest.mark.parametrize("kind", ["knn", "domain_prior", "quality"])
def test_a_utility_head_reports_its_predicted_utility_not_a_softmax(trained, kind):
    from fugu_pipeline.route.router import Router

    code, d = route(trained[kind], "--no-default-budget")  # the head's plain route (not its default operating point)
    assert code == 0 and d["score_kind"] == "predicted_utility" and "probabilities" not in d
    router = Router.load(trained[kind], device="cpu")
    want = router.scores([PROMPT], ["math"])[0]  # the head's own predicted utility per worker
    assert [d["scores"][w] for w in WORKERS] == pytest.approx(want.tolist(), abs=1e-6)
    assert d["worker"] == WORKERS[int(np.argmax(want))] and d["ranking"][0] == d["worker"]
    if kind != "quality":  # `fugu-lite train` saved a default operating point: with no flag, its scores are named so
        code, d = route(trained[kind])
        assert code == 0 and d["budget"]["default"] and d["score_kind"] in ("predicted_quality_minus_cost", "predicted_utility")
    decision = router.route(PROMPT, "math", default_point=False)
    with pytest.warns(DeprecationWarning, match="read RouteDecision.scores"):
        old = decision.probabilities  # kept for old callers: the softmax it always was
    assert sum(old.values()) == pytest.approx(1.0) and max(old, key=old.get) == decision.worker_id


def test_a_policy_head_reports_its_probabilities_under_both_names(trained, recwarn):
    from fugu_pipeline.route.router import Router

    code, d = route(trained["policy"])
    assert code == 0 and d["score_kind"] == "policy_probability"
    assert d["probabilities"] == d["scores"] and sum(d["scores"].values()) == pytest.approx(1.0, abs=1e-6)
    decision = Router.load(trained["policy"], device="cpu").route(PROMPT, "math")
    assert decision.probabilities == decision.scores and not [w for w in recwarn if w.category is DeprecationWarning]


def test_the_server_names_the_scores_too(trained, tmp_path):
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve import create_app
    from fugu_pipeline.testing.serving import ServerThread
    from fugu_pipeline.testing.stub_llm import StubLLMServer
    from fugu_pipeline.workers.config import WorkersConfig

    with StubLLMServer() as stub:
        config = WorkersConfig.model_validate({"workers": [
            {"id": w, "kind": "openai_compatible", "model": f"m-{w}", "base_url": stub.openai_url} for w in WORKERS]})
        for kind, want in (("knn", "predicted_utility"), ("policy", "policy_probability")):
            srv = ServerThread(create_app(Router.load(trained[kind], device="cpu"), config, default_point=False))
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
                r = client.chat.completions.create(model="fugu-lite", messages=[{"role": "user", "content": PROMPT}],
                                                   extra_body={"domain": "math"})
                info = r.model_extra["fugu_lite"]
                assert info["score_kind"] == want and set(info["scores"]) == set(WORKERS)
                assert ("probabilities" in info) == (want == "policy_probability")
                if kind == "knn":  # sent to a head without a cost term: listed as ignored, with why
                    r = client.chat.completions.create(model="fugu-lite", extra_body={"fugu_cost_weight": 5.0},
                                                       messages=[{"role": "user", "content": PROMPT}])
                    assert any(i.startswith("fugu_cost_weight") for i in r.model_extra["fugu_lite"]["ignored"])
            finally:
                srv.stop()
