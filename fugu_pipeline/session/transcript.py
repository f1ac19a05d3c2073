"""The transcript of a session, written out twice: as the messages a worker receives for its turn
(a bounded window), and as the text the coordinator's encoder reads before each pick.

A turn block is `[Turn k · Role · worker-id]` on its own line, then the turn's text.

**What a worker sees (the window).** Workers get their role's system prompt (`roles.py`), then one
user message: the task, the transcript so far as a window, and `This is turn k of at most n.`
The window holds every turn's header line (so a worker knows who did what; at most `max_turns`
short lines) but the TEXT of only these turns:
- the latest Thinker turn (the plan in force),
- the latest Worker turn (the latest answer),
- the latest Verifier turn (the latest verdict),
- the last `WINDOW_TAIL_TURNS` turns (the bounded tail);
every other turn's text is replaced by `OMITTED`, and every shown text is cut to
`WINDOW_TURN_CHARS` characters (its beginning and its end are kept: a verdict or a final answer
sits at the end). When the latest Verifier said REVISE after the latest answer, a Worker is also
given the Verifier's objection in a `Latest verdict:` paragraph and asked to correct the answer:
that is how a REVISE changes what happens next. So a worker's request is bounded by the task,
four turn texts and the header lines, however long the session (`window_info()` states it; the
coordinator's manifest and the trajectory store's context carry it). The mock pool reads exactly
this format (`workers/mock_roles.py`).

**What the coordinator reads** is `HeadInput`: the task part, the turns part and a one-line state
summary kept apart, so that a transcript longer than the encoder's window is cut from the front of
the turns and never loses the task or the state (`featurize.py`). The state line (domain, turns so
far, the last turn's role and verdict, whether an answer is on record) sits right before the
head-input marker, where the encoder's pooled position reads it best. The marker that ends the
encoder's text is part of the feature contract's prompt template (`HEAD_TEMPLATE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fugu_pipeline.session.records import TurnRecord
from fugu_pipeline.session.roles import ROLE_NAMES, ROLE_PROMPTS, objection

TRANSCRIPT_VERSION = "transcript-v2"  # bump when the rendering changes: it changes the head's features
HEAD_MARKER = "\n\n### Coordinator: pick the next model and its role."
HEAD_TEMPLATE = "{prompt}" + HEAD_MARKER  # the roles head's EncoderSettings.prompt_template
CUT_MARK = "[... earlier turns cut to fit the encoder window ...]\n"
WINDOW_TAIL_TURNS = 2  # the last turns whose text a worker always sees
WINDOW_TURN_CHARS = 4000  # the most characters of one turn's text a worker sees
OMITTED = "(text omitted: outside the window)"
VERDICT_LINE = "Latest verdict"  # the paragraph that hands a Worker the Verifier's objection


def window_info() -> dict:
    """The window every worker request is cut to (module docstring), as the manifest records it."""
    return {"tail_turns": WINDOW_TAIL_TURNS, "turn_chars": WINDOW_TURN_CHARS,
            "always": ["task", "latest_thinker", "latest_worker", "latest_verifier", "every_turn_header"]}


@dataclass(frozen=True)
class HeadInput:
    """What the coordinator reads: the task, the turns so far (cut from the front if needed), the state."""

    task: str
    turns: str = ""
    state: str = ""

    def text(self) -> str:
        return self.task + ("\n\n" + self.turns if self.turns else "") + ("\n\n" + self.state if self.state else "")


def turn_block(t: TurnRecord, text: str | None = None) -> str:
    who = t.served_by or t.chosen_worker
    head = f"[Turn {t.index} · {ROLE_NAMES[t.role]} · {who}]\n"
    if t.status != "ok":
        return head + "(no answer: every worker failed for this turn)"
    return head + (t.text or "").strip() if text is None else head + text


def transcript_text(turns: list[TurnRecord]) -> str:
    return "\n\n".join(turn_block(t) for t in turns)


def state_line(domain: str | None, turns: list[TurnRecord]) -> str:
    """One line the head reads last: domain, turns so far, the last turn's role and verdict, and
    whether some turn already holds an answer."""
    last = turns[-1] if turns else None
    if last is None:
        what = "none"
    elif last.status != "ok":
        what = f"{ROLE_NAMES[last.role]} failed"
    else:
        what = ROLE_NAMES[last.role] + (f" {last.verdict.upper()}" if last.verdict else "")
    answered = any(t.status == "ok" and t.role != "verifier" and t.extractable for t in turns)
    return (f"State: domain {domain or 'general'}; {len(turns)} turn(s) so far; last turn {what}; "
            f"answer on record: {'yes' if answered else 'no'}.")


def head_input(prompt: str, domain: str | None, turns: list[TurnRecord]) -> HeadInput:
    return HeadInput(task=f"Task ({domain or 'general'}):\n{prompt.strip()}", turns=transcript_text(turns),
                     state=state_line(domain, turns))


def cut_text(text: str, limit: int = WINDOW_TURN_CHARS) -> str:
    """`text` within `limit` characters: its first quarter and its last three quarters of the room."""
    text = (text or "").strip()
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def _latest(turns: list[TurnRecord], role: str) -> TurnRecord | None:
    return next((t for t in reversed(turns) if t.role == role), None)


def pending_objection(turns: list[TurnRecord]) -> TurnRecord | None:
    """The latest Verifier turn when it said REVISE after the latest Worker answer, else None."""
    v, w = _latest(turns, "verifier"), _latest(turns, "worker")
    if v is None or v.verdict != "revise" or w is None or w.index > v.index:
        return None
    return v


def window_text(turns: list[TurnRecord]) -> str:
    """Every turn's header; the texts of the latest Thinker, Worker and Verifier turns and of the
    last WINDOW_TAIL_TURNS turns, each cut to WINDOW_TURN_CHARS (module docstring)."""
    keep = {t.index for t in turns[-WINDOW_TAIL_TURNS:]} if WINDOW_TAIL_TURNS else set()
    for role in ("thinker", "worker", "verifier"):
        t = _latest(turns, role)
        if t is not None:
            keep.add(t.index)
    return "\n\n".join(turn_block(t, cut_text(t.text or "") if t.index in keep else OMITTED) for t in turns)


def worker_messages(prompt: str, turns: list[TurnRecord], role: str, index: int, max_turns: int,
                    system_prompt: str | None = None) -> list[dict[str, str]]:
    """The messages a worker receives for turn `index` in `role` (the window: module docstring)."""
    system = ROLE_PROMPTS[role] if not system_prompt else ROLE_PROMPTS[role] + "\n\n" + system_prompt
    done = [t for t in turns if t.status == "ok"]
    user = f"Task:\n{prompt.strip()}\n\n"
    if done:
        user += "Transcript so far:\n" + window_text(done) + "\n\n"
    v = pending_objection(done) if role == "worker" else None
    if v is not None:
        user += (f"{VERDICT_LINE} (turn {v.index} · {v.served_by}): REVISE. The Verifier's objection:\n"
                 f"{cut_text(objection(v.text), WINDOW_TURN_CHARS // 4)}\n"
                 "Answer again, correcting what the Verifier objected to.\n\n")
    user += f"This is turn {index} of at most {max_turns}."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
