"""How a mock worker plays the multi-turn roles (Thinker, Worker, Verifier), offline and
deterministically.

A role request is recognised by what a real worker would also see: the system message names the
role (`Role: Verifier`), the user message says the turn (`This is turn 3 of at most 5.`) and holds
the transcript so far as blocks headed `[Turn k · Role · worker-id]` (the session package writes
that format; this module only reads it). A request without a role line is a one-step call and
keeps the one-step behaviour of `mock.py`.

Every draw depends only on (worker, task, role, seed) and how many times this worker has already
played this role in the session (which the turn's transcript fixes), so a session replays exactly,
and two sessions that differ only in an extra turn elsewhere see the same draws (common random
numbers: a Worker's first attempt is the same draw whether or not a Thinker spoke first; the plan
only moves the bar it has to clear):
- Thinker: writes a plan, never an answer. The plan is good with probability
  `roles.plan_quality[domain]` (default: the worker's strength for the task's domain); a good plan
  carries the marker `[mock-plan good]`.
- Worker: answers correctly with probability strength + `roles.plan_boost[domain]` when a good
  plan is in the transcript it is shown, + `roles.revise_boost[domain]` when its request hands it a
  Verifier's objection to the latest answer (the `Latest verdict:` paragraph a REVISE produces),
  clipped to [0, 1]; wrong answers are really wrong.
- Verifier: checks the latest Worker answer against the task's reference. A wrong answer is
  flagged (`VERDICT: REVISE: <objection>`) with probability `roles.verify_catch[domain]` (default:
  its strength), a right one with probability `roles.verify_false_alarm`; otherwise `VERDICT:
  ACCEPT`. Nothing to check yet: REVISE.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.config import MockBehaviour

ROLE_LINE = re.compile(r"^Role:\s*(Thinker|Worker|Verifier)\b", re.IGNORECASE | re.MULTILINE)
TURN_LINE = re.compile(r"This is turn (\d+) of at most \d+", re.IGNORECASE)
OBJECTION = re.compile(r"^Latest verdict \(turn \d[^)\n]*\): REVISE\b", re.MULTILINE)  # one line, as the transcript writes it
BLOCK = re.compile(r"^\[Turn (\d+) · (Thinker|Worker|Verifier) · ([^\]\n]+)\]\n", re.MULTILINE)
GOOD_PLAN = "[mock-plan good]"
WEAK_PLAN = "[mock-plan weak]"


def unit(*parts: str) -> float:
    """A deterministic number in [0, 1) from strings."""
    h = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


@dataclass
class RoleRequest:
    role: str  # thinker | worker | verifier
    turn: int
    blocks: list[tuple[str, str, str]]  # (role, worker, text) of the earlier turns, oldest first
    task_text: str = ""  # the user message before the first turn block
    objection: bool = False  # the request hands this Worker a Verifier's objection (a retry after REVISE)


def parse_role_request(messages: list[dict]) -> RoleRequest | None:
    """The role request in these messages, or None for a one-step call."""
    system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    m = ROLE_LINE.search(system)
    if m is None:
        return None
    user = str(messages[-1].get("content", "")) if messages else ""
    t = TURN_LINE.search(user)
    heads = list(BLOCK.finditer(user))
    blocks = []
    o = OBJECTION.search(user)
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else (t.start() if t and t.start() > h.end() else len(user))
        if o is not None and h.end() <= o.start() < end:
            end = o.start()
        blocks.append((h.group(2).lower(), h.group(3).strip(), user[h.end():end].strip()))
    task_text = user[: heads[0].start()] if heads else user[: t.start()] if t else user
    return RoleRequest(role=m.group(1).lower(), turn=int(t.group(1)) if t else len(blocks) + 1, blocks=blocks,
                       task_text=task_text, objection=o is not None)


def role_answer(req: RoleRequest, behaviour: "MockBehaviour", worker_id: str, task: "Task | None", seed: int,
                correct_answer, wrong_answer) -> str:
    """The text a mock worker with `behaviour` writes for this role request. `correct_answer(task)`
    and `wrong_answer(task)` are the mock's one-step answers (shared with `mock.py`)."""
    domain = task.domain if task is not None else "general"
    tid = task.task_id if task is not None else hashlib.sha256(req.task_text.encode()).hexdigest()[:12]
    attempt = 1 + sum(r == req.role and w == worker_id for r, w, _ in req.blocks)
    key = (worker_id, tid, req.role, str(attempt), str(seed))
    strength = behaviour.strengths.get(domain, behaviour.default_strength)
    if req.role == "thinker":
        good = unit("plan", *key) < behaviour.roles.plan_quality.get(domain, strength)
        return ("Plan: restate what is asked, split it into small steps, do each step carefully, and check "
                "the result against the question before answering. " + (GOOD_PLAN if good else WEAK_PLAN))
    if req.role == "worker":
        planned = any(r == "thinker" and GOOD_PLAN in text for r, _, text in req.blocks)
        p = strength + (behaviour.roles.plan_boost.get(domain, 0.0) if planned else 0.0)
        p += behaviour.roles.revise_boost.get(domain, 0.0) if req.objection else 0.0
        if task is None:
            return f"[{worker_id}] Working on it. Final answer: see above"
        correct = unit("correct", *key) < min(max(p, 0.0), 1.0)
        return "Working through it step by step.\n" + (correct_answer(task) if correct else wrong_answer(task))
    answers = [text for r, _, text in req.blocks if r == "worker"]
    if not answers:
        return "There is no answer in the transcript to check yet.\nVERDICT: REVISE"
    right = task is None or answers[-1].rstrip().endswith(correct_answer(task).rstrip())
    catch = behaviour.roles.verify_catch.get(domain, strength)
    flag = unit("verify", *key) < (behaviour.roles.verify_false_alarm if right else catch)
    if flag:
        got = answers[-1].strip().splitlines()[-1][-80:] if answers[-1].strip() else "(empty)"
        return (f"I re-did the work and the latest answer ({got}) does not hold up.\n"
                "VERDICT: REVISE: the final value is wrong; redo the calculation step by step and check each step.")
    return "I checked the latest answer step by step and it holds.\nVERDICT: ACCEPT"
