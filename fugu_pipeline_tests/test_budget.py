"""The budget guard as a user meets it: `fugu-lite generate` with a paid (OpenRouter-kind) worker
against a stub server on 127.0.0.1 and `max_usd_per_run` set. Without a catalog, the worst case of a
call comes from the worker's configured maximum prices; a worker that nothing prices is refused
before any call, naming the worker and the setting."""

import json
from pathlib import Path

import pytest
import yaml

from fugu_pipeline.cli import main
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.budget import cost_ceiling
from fugu_pipeline.workers.config import WorkersConfig

MODEL = "test/priced-model"
PRICE_IN, PRICE_OUT = 1e-5, 2e-5  # USD per token, what the stub bills in usage.cost


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + "cd" * 20)
    with StubLLMServer() as s:
        s.add_model(MODEL, prompt=PRICE_IN, completion=PRICE_OUT)
        yield s


def tasks() -> list[dict]:
    return [{"task_id": f"t{i}", "prompt": f"What is {i} plus 1000?", "domain": "math", "split": "train",
             "reference_answer": str(1000 + i), "grader": {"type": "numeric"}} for i in range(6)]


def setup(tmp_path, stub, budget: float, **worker) -> tuple[str, str, WorkersConfig]:
    raw = {"max_usd_per_run": budget, "max_attempts": 1,
           "workers": [{"id": "paid", "kind": "openrouter", "model": MODEL, "base_url": stub.openrouter_url,
                        "max_tokens": 200, "max_concurrency": 1, **worker},
                       {"id": "free", "kind": "mock"}]}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks()))
    return str(tmp_path / "w.yaml"), str(tmp_path / "t.jsonl"), WorkersConfig.model_validate(raw)


def generate(w, t, out) -> int:
    ledger = str(Path(out).with_name("costs.jsonl"))  # the test's folder, not the working directory's data/ledger
    return main(["generate", "--workers", w, "--tasks", t, "--output", out, "--ledger", ledger])


def test_an_unpriced_paid_worker_under_a_budget_is_refused_before_any_call(tmp_path, stub, capsys):
    w, t, _ = setup(tmp_path, stub, budget=1.0)
    assert generate(w, t, str(tmp_path / "r.jsonl")) == 2
    err = capsys.readouterr().err
    assert "worker 'paid'" in err and "max_price_in_per_mtok" in err and "max_usd_per_run" in err
    assert "Traceback" not in err and stub.chat_requests() == []


def test_the_worst_case_comes_from_the_configured_maximum_prices(tmp_path, stub, capsys):
    # the configured maximum equals what the stub bills: each call reserves prompt + 200 answer tokens
    prices = {"max_price_in_per_mtok": PRICE_IN * 1e6, "max_price_out_per_mtok": PRICE_OUT * 1e6}
    w, t, cfg = setup(tmp_path, stub, budget=0.003, **prices)
    worst = cost_ceiling(cfg.worker("paid"), Task.model_validate(tasks()[0]))
    assert worst == pytest.approx((len("What is 0 plus 1000?") / 3 + 32) * PRICE_IN + 200 * PRICE_OUT)
    # a budget under one worst case (but above several real calls): not one call is made
    assert generate(w, t, str(tmp_path / "r.jsonl")) == 2
    out = capsys.readouterr()
    assert f"could cost up to ${worst:.4f}" in out.out + out.err and stub.chat_requests() == []
    # a budget that covers the worst case of a call: every cell is collected, the spend stays under it
    w, t, _ = setup(tmp_path, stub, budget=0.05, **prices)
    assert generate(w, t, str(tmp_path / "r2.jsonl")) == 0
    rows = [json.loads(x) for x in (tmp_path / "r2.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len(stub.chat_requests()) == 6
    spent = sum(r["cost_usd"][0] for r in rows)
    assert 0 < spent <= 0.05


def test_half_a_price_is_a_config_error():
    with pytest.raises(ValueError, match="max_price_in_per_mtok and max_price_out_per_mtok"):
        WorkersConfig.model_validate({"workers": [{"id": "p", "kind": "openrouter", "model": "m", "max_price_in_per_mtok": 1}]})
