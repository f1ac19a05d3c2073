"""The transcript of a session, written out twice: as the messages a worker receives for its turn,
and as the text the coordinator's encoder reads before each pick.

A turn block is `[Turn k · Role · worker-id]` on its own line, then the turn's text. Workers get
their role's system prompt (`roles.py`), then one user message: the task, the transcript so far,
and `This is turn k of at most n.` The mock pool reads exactly this (`workers/mock_roles.py`).

The coordinator reads `HeadInput`: the task part and the turns part kept apart, so that a
transcript longer than the encoder's window is cut from the front of the turns and never loses
the task (`featurize.py`). The head-input marker that ends the encoder's text is part of the
feature contract's prompt template (`HEAD_TEMPLATE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fugu_pipeline.session.records import TurnRecord
from fugu_pipeline.session.roles import ROLE_NAMES, ROLE_PROMPTS

TRANSCRIPT_VERSION = "transcript-v1"  # bump when the rendering changes: it changes the head's features
HEAD_MARKER = "\n\n### Coordinator: pick the next model and its role."
HEAD_TEMPLATE = "{prompt}" + HEAD_MARKER  # the roles head's EncoderSettings.prompt_template
CUT_MARK = "[... earlier turns cut to fit the encoder window ...]\n"


@dataclass(frozen=True)
class HeadInput:
    """What the coordinator reads: the task, then the turns so far (cut from the front if needed)."""

    task: str
    turns: str = ""

    def text(self) -> str:
        return self.task + ("\n\n" + self.turns if self.turns else "")


def turn_block(t: TurnRecord) -> str:
    who = t.served_by or t.chosen_worker
    head = f"[Turn {t.index} · {ROLE_NAMES[t.role]} · {who}]\n"
    if t.status != "ok":
        return head + "(no answer: every worker failed for this turn)"
    return head + (t.text or "").strip()


def transcript_text(turns: list[TurnRecord]) -> str:
    return "\n\n".join(turn_block(t) for t in turns)


def head_input(prompt: str, domain: str | None, turns: list[TurnRecord]) -> HeadInput:
    return HeadInput(task=f"Task ({domain or 'general'}):\n{prompt.strip()}", turns=transcript_text(turns))


def worker_messages(prompt: str, turns: list[TurnRecord], role: str, index: int, max_turns: int,
                    system_prompt: str | None = None) -> list[dict[str, str]]:
    """The messages a worker receives for turn `index` in `role`."""
    system = ROLE_PROMPTS[role] if not system_prompt else ROLE_PROMPTS[role] + "\n\n" + system_prompt
    done = [t for t in turns if t.status == "ok"]
    user = f"Task:\n{prompt.strip()}\n\n"
    if done:
        user += "Transcript so far:\n" + transcript_text(done) + "\n\n"
    user += f"This is turn {index} of at most {max_turns}."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
