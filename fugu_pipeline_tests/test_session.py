"""The multi-turn session loop the way it runs: real HTTP workers on the loopback stub
server (replies by role), the mock pool with role behaviour, the tiny encoder for the window. Bad
input never crashes a session and never loses a turn already paid for."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fugu_pipeline.features.parity import batch_invariance
from fugu_pipeline.session.callers import ClientCaller, SessionBudget
from fugu_pipeline.session.loop import SessionSpec, run_sessions
from fugu_pipeline.session.policy import FixedPolicy, LinearRolesPolicy, pick
from fugu_pipeline.session.roles import ROLES, extractable_answer, parse_verdict
from fugu_pipeline.session.transcript import CUT_MARK, HEAD_MARKER, HEAD_TEMPLATE, HeadInput
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.testing.serving import WORKERS, stub_workers_config
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline.workers.http import make_http_client

from .conftest import REPO
from .parity_checks import assert_vector_parity

IDS = list(WORKERS)  # alpha, beta, gamma -> stub/alpha, ...
TASK = Task(task_id="t1", prompt="What is 6 times 7?", domain="math", reference_answer="42",
            grader={"type": "numeric"}, split="test")


class Scripted:
    """(worker, role) per turn, the last one repeated."""

    featurizer = None
    max_turns = None

    def __init__(self, *plan: tuple[str, str], worker_ids=IDS):
        self.plan, self.worker_ids, self.name = plan, list(worker_ids), "scripted:" + ",".join(f"{w}/{r}" for w, r in plan)

    def distributions(self, steps):
        pw, pr = np.zeros((len(steps), len(self.worker_ids))), np.zeros((len(steps), 3))
        for i, s in enumerate(steps):
            w, r = self.plan[min(len(s.turns), len(self.plan) - 1)]
            pw[i, self.worker_ids.index(w)] = 0.6
            pw[i] += 0.2 * (pw[i] == 0)  # the rest share the remainder: the fallback order is the list order
            pr[i, ROLES.index(r)] = 1.0
        return pw, pr


@pytest.fixture(scope="module")
def stub():
    with StubLLMServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _reset(stub):
    yield
    stub.clear_faults()
    stub.role_replies.clear()
    stub.answers.clear()


def http_caller(stub, max_tokens: int | None = None, **over) -> ClientCaller:
    config = stub_workers_config(stub.openai_url, max_attempts=1, **over)
    if max_tokens is not None:
        config = config.model_copy(update={"workers": [w.model_copy(update={"max_tokens": max_tokens}) for w in config.workers]})
    clients = {w.id: make_http_client(w, config, stream=False, backoff_s=0.01) for w in config.workers}
    return ClientCaller(clients, {w.id: w for w in config.workers}, own=True)


def run(specs, caller, **kw):
    async def go():
        try:
            return await run_sessions(specs, caller, **kw)
        finally:
            await caller.aclose()

    return asyncio.run(go())


# --------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize("text, want", [
    ("Checked.\nVERDICT: ACCEPT", "accept"),
    ("**Verdict:** accept", "accept"),
    ("VERDICT: REVISE the second step", "revise"),
    ("VERDICT: ACCEPT ... on reflection VERDICT: REVISE", "revise"),  # both: the last one counts
    ("VERDICT: REVISE, no wait. VERDICT: ACCEPT", "accept"),
    ("La respuesta es correcta. VEREDICTO: ACEPTAR", "revise"),  # another language: no verdict
    ("Das ist richtig. URTEIL: AKZEPTIEREN", "revise"),
    ("VERDICT: ACCEPTED", "revise"),  # not one of the two words
    ("", "revise"),
    (None, "revise"),
])
def test_verdict_last_match_wins_and_none_means_revise(text, want):
    assert parse_verdict(text)[0] == want


def test_extractable_answer_depends_on_role_and_grader():
    assert extractable_answer("Final answer: 42", "worker", "numeric")
    assert not extractable_answer("I could not work it out.", "worker", "numeric")
    assert extractable_answer("Paris", "worker", "contains")
    assert not extractable_answer("   ", "worker", "contains")
    assert not extractable_answer("Final answer: 42", "verifier", "numeric")  # never from a Verifier
    assert not extractable_answer("Step 1: multiply 6 by 7.", "thinker", "numeric")  # a plan is not an answer
    assert extractable_answer("The answer is \\boxed{42}", "thinker", "numeric")  # unless it explicitly commits


def test_pick_greedy_sampled_and_masked():
    pw, pr = np.array([0.2, 0.5, 0.3]), np.array([0.1, 0.1, 0.8])
    g = pick(pw, pr, greedy=True)
    assert (g.worker, g.role, g.ranking) == (1, 2, [1, 2, 0])
    assert pick(pw, pr, greedy=False, u_worker=0.1, u_role=0.05).worker == 0  # inverse CDF: same u, same pick
    assert pick(pw, pr, greedy=False, u_worker=0.95, u_role=0.05).worker == 2
    m = pick(pw, pr, greedy=True, allowed=np.array([True, False, True]))
    assert m.worker == 2 and 1 not in m.ranking


# --------------------------------------------------------------------------- stop rules and the committed answer


def test_fixed_worker_policy_is_one_step(stub):
    stub.set_role_reply("worker", "Final answer: 42")
    tr = run([SessionSpec.for_task(FixedPolicy(IDS, "beta"), TASK)], http_caller(stub))[0]
    assert [(t.role, t.served_by) for t in tr.turns] == [("worker", "beta")]
    assert tr.stop_reason == "max_turns" and tr.quality == 1.0 and tr.committed_turn == 1
    assert tr.cost_usd > 0 and tr.turns[0].prompt_tokens and tr.turns[0].latency_s > 0


def test_worker_again_after_an_answer_commits_it_without_a_call(stub):
    stub.set_role_reply("worker", "Final answer: 42")
    tr = run([SessionSpec.for_task(Scripted(("alpha", "worker")), TASK)], http_caller(stub))[0]
    assert tr.stop_reason == "committed" and len(tr.turns) == 1 and tr.n_calls == 1
    assert sum(n for (m, r), n in stub.role_calls.items() if r == "worker") >= 1


def test_accept_stops_only_after_a_worker_answer(stub):
    stub.set_role_reply("verifier", "Fine.\nVERDICT: ACCEPT")
    stub.set_role_reply("thinker", "Plan: multiply.")
    stub.set_role_reply("worker", "6 x 7 = 42. Final answer: 42")
    pol = Scripted(("alpha", "thinker"), ("gamma", "verifier"), ("beta", "worker"), ("gamma", "verifier"))
    tr = run([SessionSpec.for_task(pol, TASK)], http_caller(stub))[0]
    assert [t.role for t in tr.turns] == ["thinker", "verifier", "worker", "verifier"]
    assert tr.turns[1].verdict == "accept"  # an ACCEPT with no answer yet does not stop the session
    assert tr.stop_reason == "accepted" and tr.committed_turn == 3 and tr.quality == 1.0


def test_committed_answer_is_the_last_non_verifier_turn_with_an_extractable_answer(stub):
    replies = iter(["Final answer: 42", "Hmm, I am not sure any more."])
    stub.set_role_reply("worker", lambda model, prompt: next(replies))
    stub.set_role_reply("verifier", "VERDICT: REVISE")
    pol = Scripted(("alpha", "worker"), ("gamma", "verifier"), ("beta", "worker"), ("gamma", "verifier"))
    tr = run([SessionSpec.for_task(pol, TASK)], http_caller(stub), max_turns=4)[0]
    assert tr.turns[2].extractable is False and tr.committed_turn == 1
    assert tr.answer == "Final answer: 42" and tr.quality == 1.0 and tr.stop_reason == "max_turns"


# --------------------------------------------------------------------------- bad input


def _verify_session(stub, verifier_reply: str):
    stub.set_role_reply("worker", "Final answer: 41")
    stub.set_role_reply("verifier", verifier_reply)
    pol = Scripted(("alpha", "worker"), ("gamma", "verifier"), ("beta", "worker"), ("gamma", "verifier"), ("beta", "worker"))
    return run([SessionSpec.for_task(pol, TASK)], http_caller(stub))[0]


def test_verifier_that_never_says_a_verdict_counts_as_revise(stub):
    tr = _verify_session(stub, "The arithmetic seems plausible to me.")
    assert [t.verdict for t in tr.turns if t.role == "verifier"] == ["revise", "revise"]
    assert "no verdict" in tr.turns[1].verdict_detail
    assert tr.stop_reason == "max_turns" and len(tr.turns) == 5 and tr.quality == 0.0


def test_verifier_that_says_both_verdicts_the_last_one_counts(stub):
    tr = _verify_session(stub, "VERDICT: REVISE ... rechecked, it is right. VERDICT: ACCEPT")
    assert tr.turns[1].verdict == "accept" and "disagree" in tr.turns[1].verdict_detail
    assert tr.stop_reason == "accepted" and len(tr.turns) == 2


def test_verifier_answering_in_another_language_counts_as_revise(stub):
    tr = _verify_session(stub, "La respuesta es correcta.\nVEREDICTO: ACEPTAR")
    assert tr.turns[1].verdict == "revise" and tr.stop_reason == "max_turns"


def test_worker_with_no_extractable_answer_on_every_turn(stub):
    stub.set_role_reply("worker", "I would rather not say.")
    tr = run([SessionSpec.for_task(Scripted(("alpha", "worker")), TASK)], http_caller(stub))[0]
    assert len(tr.turns) == 5 and all(t.status == "ok" and not t.extractable for t in tr.turns)
    assert tr.stop_reason == "max_turns" and tr.answer is None and tr.committed_turn is None
    assert tr.quality == 0.0 and tr.grade_detail == "no extractable answer in any turn" and tr.status == "ok"
    assert tr.cost_usd == pytest.approx(sum(t.cost_usd for t in tr.turns)) and tr.cost_usd > 0


def test_worker_failing_mid_session_falls_back_and_the_turn_is_recorded(stub):
    stub.set_role_reply("worker", "Final answer: 42")
    stub.set_role_reply("verifier", "VERDICT: REVISE")
    stub.set_fault("http", status=503, model="stub/gamma", prompt="This is turn 2")  # gamma fails its verifier turn
    pol = Scripted(("alpha", "worker"), ("gamma", "verifier"), ("alpha", "worker"))
    tr = run([SessionSpec.for_task(pol, TASK)], http_caller(stub))[0]
    t2 = tr.turns[1]
    assert t2.chosen_worker == "gamma" and t2.served_by != "gamma" and t2.status == "ok" and t2.attempts == 2
    assert t2.fallback_errors[0]["worker"] == "gamma" and t2.fallback_errors[0]["status"] == 503
    assert tr.turns[0].cost_usd > 0 and tr.stop_reason == "committed" and tr.quality == 1.0


def test_fatal_worker_is_taken_out_of_the_run_and_others_carry_on(stub):
    stub.set_role_reply("worker", "Final answer: 42")
    stub.set_fault("http", status=401, model="stub/alpha")
    caller = http_caller(stub)
    tr = run([SessionSpec.for_task(Scripted(("alpha", "worker")), TASK)], caller)[0]
    assert "alpha" in caller.dead and tr.turns[0].fallback_errors[0]["fatal"] is True
    assert tr.turns[0].served_by == "beta" and tr.quality == 1.0


def test_every_worker_failing_keeps_the_paid_turns_and_the_answer_so_far(stub):
    stub.set_role_reply("worker", "Final answer: 42")
    stub.set_fault("http", status=500, prompt="This is turn 2")
    pol = Scripted(("alpha", "worker"), ("gamma", "verifier"))
    tr = run([SessionSpec.for_task(pol, TASK)], http_caller(stub))[0]
    assert tr.stop_reason == "all_workers_failed" and len(tr.turns) == 2
    assert tr.turns[1].status == "failed" and len(tr.turns[1].fallback_errors) == 3
    assert tr.turns[0].cost_usd > 0 and tr.committed_turn == 1 and tr.quality == 1.0 and tr.status == "ok"


def test_budget_guard_stops_between_turns_and_keeps_what_was_paid(stub):
    from types import SimpleNamespace

    from fugu_pipeline.session.transcript import worker_messages
    from fugu_pipeline.workers.budget import cost_ceiling

    stub.set_role_reply("worker", "I am not sure.")  # never extractable: the session wants all 5 turns
    caller = http_caller(stub, max_tokens=1)  # the stub ignores max_tokens; it keeps the worst case near the real cost
    first = "\n".join(m["content"] for m in worker_messages(TASK.prompt, [], "worker", 1, 5))
    budget = SessionBudget(3.2 * cost_ceiling(caller.spec("alpha"), SimpleNamespace(prompt=first)))
    tr = run([SessionSpec.for_task(Scripted(("alpha", "worker")), TASK)], caller, budget=budget)[0]
    assert tr.status == "budget" and tr.stop_reason == "budget" and "budget guard" in tr.error
    assert 1 <= len(tr.turns) < 5 and all(t.cost_usd > 0 and t.status == "ok" for t in tr.turns)
    assert budget.spent == pytest.approx(sum(t.cost_usd for t in tr.turns)) and budget.spent <= budget.budget
    assert tr.cost_usd == pytest.approx(budget.spent)  # every paid turn is in the record


# --------------------------------------------------------------------------- the mock pool's roles


def test_mock_roles_are_deterministic_per_task_worker_role_turn_seed():
    config = load_workers_config(REPO / "configs" / "workers.mock-roles.yaml")
    tasks = [Task.model_validate(r) for r in roles_batch(20)]
    pol = Scripted(("planner", "thinker"), ("fast-solver", "worker"), ("checker", "verifier"), ("fast-solver", "worker"),
                   worker_ids=config.worker_ids)
    specs = lambda seed: [SessionSpec.for_task(pol, t, seed=seed) for t in tasks]  # noqa: E731
    a = run(specs(1), ClientCaller.from_config(config))
    b = run(specs(1), ClientCaller.from_config(config))
    c = run(specs(2), ClientCaller.from_config(config))
    text = lambda trs: [[t.text for t in tr.turns] for tr in trs]  # noqa: E731
    assert text(a) == text(b) and text(a) != text(c)
    assert {t.turns[2].verdict for t in a} <= {"accept", "revise"}


def test_delegation_helps_on_multistep_and_only_costs_on_lookup():
    """The two task families really are what they claim, before any learning: a plan-work-check
    script beats every worker alone on multistep, and buys nothing but turns on lookup."""
    config = load_workers_config(REPO / "configs" / "workers.mock-roles.yaml")
    tasks = [Task.model_validate(r) for r in roles_batch(150)]
    script = Scripted(("planner", "thinker"), ("fast-solver", "worker"), ("checker", "verifier"),
                      ("fast-solver", "worker"), ("checker", "verifier"), worker_ids=config.worker_ids)
    acc = {}
    for name, pol in [("script", script)] + [(w, FixedPolicy(config.worker_ids, w)) for w in config.worker_ids]:
        trs = run([SessionSpec.for_task(pol, t) for t in tasks], ClientCaller.from_config(config))
        for dom in ("multistep", "lookup"):
            sel = [t for t in trs if t.domain == dom]
            acc[name, dom] = (np.mean([t.quality for t in sel]), np.mean([t.n_turns for t in sel]))
    best_alone = {dom: max(acc[w, dom][0] for w in config.worker_ids) for dom in ("multistep", "lookup")}
    assert acc["script", "multistep"][0] > best_alone["multistep"] + 0.3
    assert acc["script", "lookup"][0] <= best_alone["lookup"] + 0.04 and acc["script", "lookup"][1] > 2


# --------------------------------------------------------------------------- the encoder window


@pytest.fixture(scope="module")
def featurizer():
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.session.featurize import TranscriptFeaturizer

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", pooling="position", token_position=-2,
                                       prompt_template=HEAD_TEMPLATE, max_length=96))
    yield TranscriptFeaturizer(enc)
    enc.close()


def test_transcript_longer_than_the_window_is_cut_from_the_front_and_keeps_the_task(featurizer):
    task = "Task (math):\nWhat is 6 times 7?"
    turns = "\n\n".join(f"[Turn {k} · Worker · alpha]\nstep {k}: " + "carry the digits " * 20 for k in range(1, 6))
    turns += "\n\n[Turn 6 · Verifier · gamma]\nVERDICT: REVISE"
    text, n = featurizer.fit(HeadInput(task, turns))
    assert n <= 96 and featurizer.cut >= 1
    assert text.startswith(task) and CUT_MARK.strip() in text and text.endswith(HEAD_MARKER)
    assert "[Turn 1 ·" not in text and "VERDICT: REVISE" in text  # the oldest turns go, the latest stay
    huge, _ = featurizer.fit(HeadInput("Task (math):\n" + "a very long question " * 200, turns))
    assert huge.startswith("Task (math):\na very") and "task cut" in huge and huge.endswith(HEAD_MARKER)
    assert featurizer.features([HeadInput(task, turns)]).shape == (1, featurizer.dim)


def test_long_replies_do_not_break_a_session(stub, featurizer):
    stub.set_role_reply("worker", "Let me think. " * 400 + "Final answer: 42")
    stub.set_role_reply("verifier", "Checked every line. " * 300 + "VERDICT: REVISE")
    w = np.zeros((len(IDS) + 3, featurizer.dim), np.float32)
    w[len(IDS) + ROLES.index("verifier")] = 1.0  # roles: prefer the verifier from the second turn on
    pol = LinearRolesPolicy(w, IDS, featurizer)
    tr = run([SessionSpec.for_task(pol, TASK)], http_caller(stub))[0]
    assert tr.status == "ok" and len(tr.turns) >= 1 and featurizer.cut >= 1


def test_vectors_do_not_depend_on_which_transcripts_share_the_batch(featurizer):
    inputs = [HeadInput(f"Task (math):\nq{i} " + "x " * (i * 3), f"[Turn 1 · Worker · alpha]\n{i}") for i in range(12)]
    """Within the tolerance, and bit for bit where this machine's kernels give it."""
    together = featurizer.features(inputs)
    featurizer._cache.clear()
    alone = np.stack([featurizer.features([x])[0] for x in inputs])
    by_width: dict[int, list[list[int]]] = {}
    for seq in featurizer.token_ids(inputs):  # the forward passes `features` made: one per padded width
        by_width.setdefault(featurizer.bucket(len(seq)), []).append(seq)
    probe = lambda: batch_invariance(featurizer._forward, [(seqs, w) for w, seqs in by_width.items()])  # noqa: E731
    assert_vector_parity(alone, together, featurizer.encoder.resolved_dtype, probe)


def test_token_ids_are_the_ids_of_the_text_fit_makes_in_one_call_or_many(featurizer):
    """`token_ids` tokenizes the texts that fit in one call and sends only a transcript over the
    window through `fit`: the ids are those of each input's fitted text, tokenized alone."""
    turns = "\n\n".join(f"[Turn {k} · Worker · alpha]\nstep {k}: " + "carry the digits " * 20 for k in range(1, 6))
    inputs = [HeadInput("Task (math):\nWhat is 6 times 7?", ""), HeadInput("Task (math):\n" + "y " * 60, ""),
              HeadInput("Task (math):\nq", turns), HeadInput("Task (code):\n" + "a very long question " * 200, turns),
              HeadInput("", "")]
    alone = [featurizer._tokens(featurizer.fit(inp)[0]) for inp in inputs]
    assert featurizer.token_ids(inputs) == alone and featurizer.token_ids([]) == []
    assert all(0 < len(x) <= featurizer.max_length for x in alone) and len(alone[3]) > len(alone[0])
