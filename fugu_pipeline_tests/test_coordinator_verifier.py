"""A Verifier that changes the outcome, and what a worker sees of a session:
- an ACCEPT after ANY committed answer stops the session (a Thinker that commits `\\boxed{42}` too);
- a REVISE hands the Verifier's objection to the next Worker turn;
- on the mock pool's `checking` family a retry handed the objection succeeds far more often, so a
  Worker -> Verifier -> Worker script beats answering alone there, and does not on `lookup`;
- workers see a bounded window of the transcript (task, latest plan, answer and verdict, a tail).
No encoder: scripted policies over the real session loop."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from fugu_pipeline.session.callers import ClientCaller
from fugu_pipeline.session.loop import SessionSpec, run_sessions
from fugu_pipeline.session.policy import Step
from fugu_pipeline.session.roles import ROLES
from fugu_pipeline.session.transcript import OMITTED, WINDOW_TURN_CHARS, worker_messages
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.workers.config import load_workers_config
from fugu_pipeline.workers.contract import Completion

from .conftest import REPO

TASK = Task.model_validate({"task_id": "t1", "prompt": "What is 6 times 7?", "domain": "math", "reference_answer": "42",
                            "grader": {"type": "numeric"}, "split": "test"})


class Script:
    """Plays `script[k]` = (worker, role) at turn k + 1."""

    featurizer = None
    max_turns = None

    def __init__(self, worker_ids: list[str], script: list[tuple[str, str]], name: str = "script"):
        self.worker_ids, self.script, self.name = list(worker_ids), script, name

    def distributions(self, steps: list[Step]):
        pw = np.zeros((len(steps), len(self.worker_ids)))
        pr = np.zeros((len(steps), len(ROLES)))
        for i, s in enumerate(steps):
            w, r = self.script[min(len(s.turns), len(self.script) - 1)]
            pw[i, self.worker_ids.index(w)] = 1.0
            pr[i, ROLES.index(r)] = 1.0
        return pw, pr


class RoleReplies:
    """A caller answering by the role named in the system message; records every request."""

    def __init__(self, replies: dict):
        self.worker_ids, self.dead, self.replies, self.requests = ["a", "b"], {}, replies, []

    def spec(self, worker_id):
        return None

    async def call(self, worker_id, messages, *, task, seed):
        role = re.search(r"Role: (\w+)", messages[0]["content"]).group(1).lower()
        self.requests.append((role, messages))
        reply = self.replies[role]
        return Completion(answer=reply(messages) if callable(reply) else reply, cost_usd=0.001)


def run(policy, caller, task=TASK, **kw):
    return asyncio.run(run_sessions([SessionSpec.for_task(policy, task, **kw)], caller))[0]


def test_a_thinker_that_commits_then_an_accept_stops_the_session():
    # before: ACCEPT stopped only after a WORKER answer, so a Thinker's \boxed{42} then ACCEPT ran
    # Verifier turns up to turn 5 (4 wasted calls)
    caller = RoleReplies({"thinker": "6 x 7 is 42, so \\boxed{42}", "verifier": "Right.\nVERDICT: ACCEPT",
                          "worker": "Final answer: 42"})
    tr = run(Script(["a", "b"], [("a", "thinker"), ("b", "verifier")]), caller)
    assert [t.role for t in tr.turns] == ["thinker", "verifier"]
    assert tr.stop_reason == "accepted" and tr.committed_turn == 1 and tr.quality == 1.0
    assert len(caller.requests) == 2


def test_a_revise_hands_the_verifiers_objection_to_the_next_worker():
    answers = iter(["Final answer: 41", "Final answer: 42"])
    caller = RoleReplies({"worker": lambda m: next(answers),
                          "verifier": "6 x 7 is not 41.\nVERDICT: REVISE: the product is off by one, multiply again",
                          "thinker": "plan"})
    tr = run(Script(["a", "b"], [("a", "worker"), ("b", "verifier"), ("a", "worker"), ("a", "worker")]), caller)
    assert [t.role for t in tr.turns] == ["worker", "verifier", "worker"] and tr.stop_reason == "committed"
    assert tr.answer == "Final answer: 42" and tr.quality == 1.0
    first, retry = [m[1]["content"] for r, m in caller.requests if r == "worker"]
    assert "Latest verdict" not in first
    assert "Latest verdict (turn 2 · b): REVISE" in retry and "the product is off by one, multiply again" in retry


def test_workers_see_a_bounded_window_of_a_long_session():
    """20 turns of 10,000-character texts: a worker's request holds every header but only the texts
    of the latest plan, answer and verdict and of the last turns, each cut."""
    from fugu_pipeline.session.records import TurnRecord

    long = "x" * 10_000
    roles = ["thinker", "worker", "verifier", "worker"] * 5
    turns = [TurnRecord(index=k + 1, role=r, chosen_worker="a", served_by="a",
                        text=f"turn {k + 1} " + long + (" VERDICT: REVISE" if r == "verifier" else ""),
                        verdict="revise" if r == "verifier" else None) for k, r in enumerate(roles)]
    sizes = []
    for n in (4, 10, 20):
        msgs = worker_messages("What is 6 times 7?", turns[:n], "worker", n + 1, 30)
        sizes.append(len(msgs[1]["content"]))
        assert all(f"[Turn {k} ·" in msgs[1]["content"] for k in range(1, n + 1))  # every header
    text = worker_messages("What is 6 times 7?", turns, "worker", 21, 30)[1]["content"]
    assert text.count(OMITTED) == 20 - 3  # shown: latest thinker (17), verifier (19), worker (20); the tail is 19, 20
    assert "turn 17 " in text and "turn 1 " not in text
    assert sizes[-1] < 5 * WINDOW_TURN_CHARS + 2000  # bounded, not 20 x 10,000 characters
    assert sizes[-1] - sizes[1] < 1000  # growing by header lines only


# --------------------------------------------------------------------------- the mock pool's checking family


@pytest.fixture(scope="module")
def pool():
    return load_workers_config(REPO / "configs" / "workers.mock-roles.yaml")


def accuracy(config, policy, tasks, seeds=2) -> tuple[float, list]:
    async def go():
        caller = ClientCaller.from_config(config)
        try:
            specs = [SessionSpec.for_task(policy, t, seed=s) for t in tasks for s in range(seeds)]
            return await run_sessions(specs, caller)
        finally:
            await caller.aclose()

    trs = asyncio.run(go())
    return float(np.mean([t.quality for t in trs])), trs


def test_checking_pays_on_the_checking_family_and_only_costs_on_lookup(pool):
    tasks = [Task.model_validate(r) for r in roles_batch(60)]
    ids = pool.worker_ids
    alone = Script(ids, [("fast-solver", "worker"), ("fast-solver", "worker")], "alone")
    checked = Script(ids, [("fast-solver", "worker"), ("checker", "verifier"), ("fast-solver", "worker"),
                           ("fast-solver", "worker")], "checked")
    checking = [t for t in tasks if t.domain == "checking"]
    lookup = [t for t in tasks if t.domain == "lookup"]
    a_alone, _ = accuracy(pool, alone, checking)
    a_checked, trs = accuracy(pool, checked, checking)
    assert a_alone < 0.7 and a_checked > a_alone + 0.25  # Workers are wrong often; the check and retry fix most
    revised = [t for t in trs if len(t.turns) == 3 and t.turns[1].verdict == "revise"]
    retry_right = np.mean([t.quality for t in revised])
    assert len(revised) > 10 and retry_right > 0.8  # a Worker handed the objection gets the retry right
    l_alone, _ = accuracy(pool, alone, lookup)
    l_checked, ltrs = accuracy(pool, checked, lookup)
    assert abs(l_checked - l_alone) < 0.05  # on lookup a check changes nothing but the bill
    assert np.mean([t.cost_usd for t in ltrs]) > 1.5 * 0.001


def test_the_retry_boost_needs_the_objection(pool):
    """The mock Worker's retry is better only when its request carries the Verifier's objection:
    the same retry without it (an old-style transcript) draws at the plain strength."""
    from fugu_pipeline.workers.mock_roles import parse_role_request

    base = [{"role": "system", "content": "Role: Worker"},
            {"role": "user", "content": "Task:\nq\n\nTranscript so far:\n[Turn 1 · Worker · a]\nFinal answer: 1\n\n"
                                        "[Turn 2 · Verifier · b]\nVERDICT: REVISE: off\n\nThis is turn 3 of at most 5."}]
    assert not parse_role_request(base).objection
    with_it = [base[0], {"role": "user", "content": base[1]["content"].replace(
        "This is turn", "Latest verdict (turn 2 · b): REVISE. The Verifier's objection:\noff\n"
                        "Answer again, correcting what the Verifier objected to.\n\nThis is turn")}]
    req = parse_role_request(with_it)
    assert req.objection and [b[0] for b in req.blocks] == ["worker", "verifier"]
    assert "Latest verdict" not in req.blocks[-1][2]
