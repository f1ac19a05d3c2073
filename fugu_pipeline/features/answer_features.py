"""What a verifier reads of a reply: the frozen encoder's features of its text, and a few statistics.

The encoder features go through the same content-addressed cache as prompt features
(`cache.embed_prompts`), under the encoder's settings with the template `{prompt}` and no prompt
rules (the reply is read as it is: the text is its final answer, a blank line, then the reply's
last `TAIL_CHARS` characters, where the reasoning ends). A reply is encoded once per encoder
fingerprint, whichever cascade or verifier asks.

The statistics (`answer_stats`, `STATS` names them) are general signs of a doubtful reply: its
length, whether a final answer can be read at all, whether that answer merely repeats a number of
the prompt, hedging words, and how many of the arithmetic steps written as `a op b = c` hold.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from fugu_pipeline.features.settings import EncoderSettings

TAIL_CHARS = 400
ANSWER_TEXT_FORMAT = "final+tail400"  # recorded in a cascade's checkpoint: serving must build the same text
STATS = ("log_chars", "log_lines", "readable", "in_prompt", "digit_share", "hedges", "equations", "equations_hold",
         "final_repeats", "integer")
_HEDGE = re.compile(r"\b(?:maybe|perhaps|not sure|unsure|i think|i believe|approximately|roughly|sorry|cannot|can't|"
                    r"unclear|might be|possibly|guess)\b", re.IGNORECASE)
_EQ = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d[\d,]*(?:\.\d+)?)\s*=\s*(-?\d[\d,]*(?:\.\d+)?)")
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def answer_text(reply: str, final: str | None) -> str:
    """The text the encoder reads for one reply."""
    return f"{final or '(no final answer)'}\n\n{reply[-TAIL_CHARS:]}"


def answer_settings(settings: EncoderSettings) -> EncoderSettings:
    """The prompt encoder's settings reading a reply as it is (no template, no prompt rules)."""
    return settings.model_copy(update={"prompt_template": "{prompt}", "prompt_rules": None})


def _num(tok: str) -> float | None:
    try:
        return float(tok.replace(",", ""))
    except ValueError:
        return None


def _equations(reply: str) -> tuple[int, int]:
    n = held = 0
    for a, op, b, c in _EQ.findall(reply[-20_000:]):
        x, y, z = _num(a), _num(b), _num(c)
        if x is None or y is None or z is None:
            continue
        n += 1
        try:
            got = {"+": x + y, "-": x - y, "*": x * y, "x": x * y, "×": x * y, "/": x / y if y else math.nan,
                   "÷": x / y if y else math.nan}[op]
        except OverflowError:
            continue
        held += bool(math.isfinite(got) and abs(got - z) <= 1e-6 * max(1.0, abs(z)) + 0.01)
    return n, held


def answer_stats(reply: str | None, final: str | None, prompt: str) -> np.ndarray:
    """The statistics of one reply (`STATS`, in that order); all zero for no reply."""
    if reply is None:
        return np.zeros(len(STATS), dtype=np.float32)
    n_eq, held = _equations(reply)
    prompt_numbers = {_num(t) for t in _NUM.findall(prompt)}
    final_num = _num(final) if final else None
    digits = sum(c.isdigit() for c in reply)
    return np.array([
        math.log1p(len(reply)), math.log1p(reply.count("\n")), float(final is not None),
        float(final is not None and (final_num in prompt_numbers if final_num is not None else final.lower() in prompt.lower())),
        digits / max(1, len(reply)), math.log1p(len(_HEDGE.findall(reply))), math.log1p(n_eq),
        held / n_eq if n_eq else 1.0, math.log1p(reply.count(final) if final else 0),
        float(final_num is not None and final_num == int(final_num) if final_num is not None and math.isfinite(final_num) else 0),
    ], dtype=np.float32)


def embed_answers(texts: list[str], settings: EncoderSettings, cache_root: str | Path, *, progress=None) -> np.ndarray:
    """Encoder features (n, D) of these answer texts (`answer_text`), through the cache. Serving
    reads the same vectors with the prompt encoder's `encode_texts(texts)` (the template and the
    prompt rules only shape a prompt's text)."""
    from fugu_pipeline.features.cache import embed_prompts
    from fugu_pipeline.features.encoder import LazyEncoder

    lazy = LazyEncoder(answer_settings(settings))
    try:
        return embed_prompts(texts, None, lazy, cache_root, progress=progress).vectors
    finally:
        lazy.close()
