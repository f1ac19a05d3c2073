"""A cascade's live term: the contest's live sample run as the cascade serves (`policies/cascade/live.py`),
against the stub LLM server on 127.0.0.1, with the real tiny encoder and the serving loop.

Before: a cascade on either side of the contest left the live term out for both heads ("no live run
of a cascade in the contest yet"), so a cascade was judged only on the replies recorded when the
matrix was built, never on what its workers answer today."""

from __future__ import annotations

from collections import Counter

import pytest

from fugu_pipeline.evaluate.live import LiveBudgetExceeded, OneCallEvaluator
from fugu_pipeline.evaluate.live_store import LiveStore
from fugu_pipeline.ledger import CostLedger, read_entries
from fugu_pipeline.policies.cascade.live import CascadeLive, store_key
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
from fugu_pipeline.testing.serving import WORKERS, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.contract import FatalWorkerError

# per task: what alpha, beta (the first step, at once) and gamma (the second) answer, and the
# workers the plan `[alpha, beta] stop if 2 agree or verifier >= 0.99 -> [gamma]` calls
CASES = {
    "agree-right": (("7", "7", "7"), 2, 1.0),  # the first step agrees on the right answer: stop
    "disagree": (("8", "7", "7"), 3, 1.0),  # the first step disagrees: gamma answers
    "agree-wrong": (("9", "9", "7"), 2, 0.0),  # the first step agrees on a wrong answer: stop, graded 0
}


def task(name: str, k: int) -> Task:
    return Task(task_id=name, prompt=f"What is {k} + {7 - k}? ({name})", domain="general", reference_answer="7",
                grader={"type": "numeric"})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade-live")
    ckpt = build_cascade_checkpoint(root / "models", root / "emb")
    with StubLLMServer() as stub:
        yield root, ckpt, stub


@pytest.fixture
def run(world, tmp_path):
    """(the stub, the tasks, a function that evaluates them live with a fresh evaluator on one
    store and ledger under tmp_path, the ledger's path)."""
    from fugu_pipeline.policies.cascade.route import CascadeRouter

    root, ckpt, stub = world
    stub.clear_faults()
    stub.reset_counts()
    tasks = [task(name, k) for k, name in enumerate(CASES, start=1)]
    for t, (replies, _, _) in zip(tasks, CASES.values()):
        for wid, value in zip(WORKERS, replies):
            stub.set_answer(t.prompt, f"Adding them gives {value}. #### {value}", model=WORKERS[wid])
    ledger = tmp_path / "costs.jsonl"
    head = ckpt.name

    def evaluate(max_usd=None, seed=0, concurrency=4):
        ev = OneCallEvaluator(stub_workers_config(stub.openai_url), max_usd=max_usd, concurrency=concurrency,
                              store=LiveStore(tmp_path / "live", "ctx"), ledger=CostLedger(ledger))
        router = CascadeRouter.load(ckpt, device="cpu")
        try:
            return CascadeLive(ev).evaluate(router, head, tasks, seed)
        finally:
            router.close()

    return stub, tasks, evaluate, ledger


def calls_per_prompt(stub) -> Counter:
    return Counter(r.body["messages"][-1]["content"] for r in stub.chat_requests())


def test_each_task_runs_the_plan_as_served_graded_and_paid_once_in_the_ledger(run):
    stub, tasks, evaluate, ledger = run
    got = evaluate()
    made = calls_per_prompt(stub)
    for t, out, (_, calls, quality) in zip(tasks, got, CASES.values()):
        assert (out.calls, out.turns, out.quality, out.error) == (calls, calls, quality, None), (t.task_id, out)
        assert made[t.prompt] == calls, (t.task_id, made)
    lines = [e for e in read_entries(ledger) if e.kind == "live"]
    assert Counter(e.task_id for e in lines) == {t.task_id: c for t, (_, c, _) in zip(tasks, CASES.values())}
    assert len({e.call for e in lines}) == len(lines)  # one line a call, none counted twice
    for t, out in zip(tasks, got):
        paid = sum(e.cost_usd for e in lines if e.task_id == t.task_id)
        assert paid > 0 and out.cost_usd == pytest.approx(paid, rel=1e-9)


def test_a_second_judgement_reads_the_store_and_calls_nothing(run, tmp_path):
    stub, tasks, evaluate, ledger = run
    first = evaluate()
    stub.reset_counts()
    before = len(read_entries(ledger))
    again = evaluate()
    assert stub.chat_requests() == [] and len(read_entries(ledger)) == before
    assert [(o.quality, o.calls, o.cost_usd) for o in again] == [(o.quality, o.calls, o.cost_usd) for o in first]
    stored = [line for line in (tmp_path / "live" / "ctx.jsonl").read_text().splitlines() if line]
    assert len(stored) == len(tasks) and all(store_key("") in line for line in stored)
    evaluate(seed=1)  # another seed is another outcome: the plan runs again
    assert sum(calls_per_prompt(stub).values()) == sum(c for _, c, _ in CASES.values())


def test_a_worker_that_refuses_the_key_or_a_spend_past_max_usd_stops_it_and_nothing_is_stored(run, tmp_path):
    stub, tasks, evaluate, ledger = run
    stub.set_fault("http", status=401, model=WORKERS["beta"])
    with pytest.raises(FatalWorkerError):
        evaluate(concurrency=1)  # one task at a time: its step's two calls both end before the 401 stops the run
    stub.clear_faults()
    with pytest.raises(LiveBudgetExceeded, match="max_usd_per_run"):
        evaluate(max_usd=1e-9)
    assert not (tmp_path / "live" / "ctx.jsonl").exists()
    lines = [e for e in read_entries(ledger) if e.kind == "live"]
    assert sum(stub.successes.values()) == 1  # alpha answered the first task before beta's 401 stopped the run
    assert len(lines) == 1 and lines[0].worker_id == "alpha"  # paid once; the refused call voided


def test_calls_in_flight_when_a_401_stops_the_run_are_counted_at_their_worst_case(run, tmp_path):
    """Three tasks at once: beta's 401 on the first stops the run while alpha's calls for the other
    two are in flight (the server holds them). Those are neither dropped nor voided: each is counted
    at its worst case as its task is cancelled, so every call the server saw has one line."""
    stub, tasks, evaluate, ledger = run
    first, *others = tasks
    stub.set_fault("http", status=401, model=WORKERS["beta"], prompt=first.prompt)
    for t in others:
        stub.set_fault("timeout", model=WORKERS["alpha"], prompt=t.prompt, sleep_s=3.0)
    with pytest.raises(FatalWorkerError):
        evaluate()
    stub.clear_faults()
    lines = [e for e in read_entries(ledger) if e.kind == "live"]
    seen = Counter((r.body["model"], r.body["messages"][-1]["content"]) for r in stub.chat_requests())
    paid = Counter((WORKERS[e.worker_id], next(t.prompt for t in tasks if t.task_id == e.task_id)) for e in lines)
    assert paid == seen - Counter({(WORKERS["beta"], first.prompt): 1}), (paid, seen)  # the 401 voided, nothing else
    worst = {(e.worker_id, e.task_id) for e in lines if e.worst_case}
    assert {("alpha", t.task_id) for t in others} <= worst and ("alpha", first.task_id) not in worst


def test_a_capped_cascade_follows_its_spend_over_the_live_sample_as_it_does_serving(world, tmp_path):
    """Each task is routed when its turn comes, as a request is: a cascade trained under a cap
    starts on its most accurate point within the cap (the strong worker alone) and, its calls priced
    far above the cap, moves to the cheaper point as its follower counts what they cost."""
    from fugu_pipeline.policies.cascade.route import CascadeRouter

    root, _, stub = world
    stub.clear_faults()
    stub.reset_counts()
    ckpt = build_cascade_checkpoint(root / "capped", root / "emb", cap_usd=6e-3)
    tasks = [task(f"capped-{k}", k % 7) for k in range(6)]
    for t in tasks:
        for model in WORKERS.values():
            stub.set_answer(t.prompt, "It is 7. #### 7", model=model)
    config = stub_workers_config(stub.openai_url)
    for w in config.workers:
        w.price_in_per_mtok, w.price_out_per_mtok = 2000.0, 4000.0
    router = CascadeRouter.load(ckpt, device="cpu")
    try:
        got = CascadeLive(OneCallEvaluator(config, concurrency=1)).evaluate(router, ckpt.name, tasks)
        guard = next(s for s in router.spend_states() if s.get("requests"))
    finally:
        router.close()
    first_called = [next(r.body["model"] for r in stub.chat_requests() if r.body["messages"][-1]["content"] == t.prompt)
                    for t in tasks]
    assert first_called[0] == WORKERS["gamma"] and first_called[-1] != WORKERS["gamma"], first_called
    assert guard["requests"] == len(tasks) and all(o.quality == 1.0 for o in got)
    assert guard["running_mean_usd"] == pytest.approx(sum(o.cost_usd for o in got) / len(tasks))


def test_a_cascade_that_cannot_be_loaded_to_run_live_is_said_before_any_call(world):
    """The contest asks every head whether it can run live before any head's live call: a cascade
    whose encoder cannot be loaded answers there, in one line, so the other head's calls are not
    spent for a live term that will be left out for both."""
    from types import SimpleNamespace

    from fugu_pipeline.evaluate.contest import Entrant, LiveUnavailable
    from fugu_pipeline.features.settings import EncoderLoadError
    from fugu_pipeline.policies.cascade.contest import CascadeScorer

    _, ckpt, _ = world
    loads = []

    def cannot(path, **kw):
        loads.append((path, kw))
        raise EncoderLoadError("encoder /models/gone: no such directory")

    features = SimpleNamespace(settings=SimpleNamespace(device="cpu", dtype="float32", model="/models/gone"))
    scorer = CascadeScorer(features, answers=None, load_router=cannot)
    entrant = Entrant(str(ckpt), "cascade", ckpt.name, None, None)
    with pytest.raises(LiveUnavailable, match=f"cascade .*{ckpt.name}.* cannot be loaded to run live: encoder /models/gone"):
        scorer.check_live(entrant)
    assert loads == [(str(ckpt), {"device": "cpu", "dtype": "float32", "encoder": "/models/gone"})]


def test_a_judge_that_refuses_the_key_after_an_answer_leaves_the_answer_paid(world, tmp_path):
    """One-call live term, a task graded by an LLM judge: the worker answers, then the judge answers
    401. The run stops (the key is refused), the worker's answered call keeps its line (before: the
    call was voided, as if nothing had been billed), and the judge's call has none."""
    from fugu_pipeline.evaluate.live import LivePolicy

    _, _, stub = world
    stub.clear_faults()
    stub.reset_counts()
    judge = {"id": "judge", "kind": "openai_compatible", "model": "stub/judge", "base_url": stub.openai_url,
             "price_in_per_mtok": 1.0, "price_out_per_mtok": 2.0}
    config = stub_workers_config(stub.openai_url, judge=judge)
    stub.set_fault("http", status=401, model="stub/judge")
    t = Task(task_id="judged", prompt="Describe the sea in one line.", domain="general", reference_answer="blue",
             grader={"type": "llm_judge", "rubric": "Is it about the sea?"})
    ledger = tmp_path / "costs.jsonl"
    ev = OneCallEvaluator(config, ledger=CostLedger(ledger))
    with pytest.raises(FatalWorkerError):
        ev.evaluate(LivePolicy("head", "", {"judged": "alpha"}, head="h"), [t])
    lines = read_entries(ledger)
    assert [(e.kind, e.worker_id, e.worst_case) for e in lines] == [("live", "alpha", False)] and lines[0].cost_usd > 0


def test_a_cascade_loaded_for_a_live_run_that_never_came_is_let_go(world):
    """`check_live` loads the cascade before any call; when the other head's live run stops the
    term first, the contest's `end_live` closes it (before: it stayed loaded, encoder and all)."""
    from types import SimpleNamespace

    from fugu_pipeline.evaluate.contest import Entrant
    from fugu_pipeline.policies.cascade.contest import CascadeScorer

    _, ckpt, _ = world
    closed = []
    loaded = SimpleNamespace(close=lambda: closed.append(ckpt.name))
    scorer = CascadeScorer(SimpleNamespace(settings=None), answers=None, load_router=lambda path, **kw: loaded)
    entrant = Entrant(str(ckpt), "cascade", ckpt.name, None, None)
    scorer.check_live(entrant)
    scorer.check_live(entrant)  # loaded once, kept for its live run
    assert closed == []
    scorer.end_live()
    scorer.end_live()
    assert closed == [ckpt.name]

