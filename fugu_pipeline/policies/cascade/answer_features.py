"""What a verifier reads of a reply: the frozen encoder's features of its text, and a few statistics.

The encoder features go through the same content-addressed cache as prompt features
(`cache.embed_prompts`), under the encoder's settings with the template `{prompt}` and no prompt
rules (the reply is read as it is: the text is its final answer, a blank line, then the reply's
last `TAIL_CHARS` characters, where the reasoning ends). A reply is encoded once per encoder
fingerprint, whichever cascade or verifier asks.

The statistics (`answer_stats`, `STATS` names them) are general signs of a doubtful reply: its
length, whether a final answer can be read at all, whether that answer merely repeats a number of
the prompt, hedging words, how many steps written as `a op b = c` hold (`STATS_V1`, the first
set), and the checks of `answer_checks.py` (the reply's own arithmetic recomputed, whether the final
answer was computed, conflicting or hedged final answers, text after the answer, the prompt's
numbers left unused, self-corrections, loops), and the final answer read among the prompt's options
(`answer_checks.OPTION_STATS`: multiple choice). A cascade checkpoint records the names it was
trained on (one saved without them read `STATS_V1`), so serving builds the same columns.
`cached_answer_stats` keeps them content-addressed beside the encoder features.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable

import numpy as np

from fugu_pipeline.policies.cascade.answer_checks import CHECK_STATS, OPTION_STATS, check_stats, option_stats
from fugu_pipeline.policies.cascade.code_examples import EXECUTED_STATS, examples_stats
from fugu_pipeline.policies.cascade.option_fit import ENCODED_STATS, option_fit
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.tasks.final_answer import READ_CHARS

TAIL_CHARS = 400
ANSWER_TEXT_FORMAT = "final+tail400"  # recorded in a cascade's checkpoint: serving must build the same text
STATS_V1 = ("log_chars", "log_lines", "readable", "in_prompt", "digit_share", "hedges", "equations", "equations_hold",
            "final_repeats", "integer")
STATS_V2 = STATS_V1 + CHECK_STATS  # the statistics before the options were read
# the statistics before options set out as blocks were read and the picked option's length beside the
# others' (`option_rel_chars`): a checkpoint that records these names reads the options as it was
# trained to, without blocks
STATS_V3 = STATS_V2 + OPTION_STATS[:5]
TEXT_STATS = STATS_V2 + OPTION_STATS  # every statistic read from the text alone (the cache holds these)
# and how well the picked option fits the question (`option_fit.py`), and whether code passes the
# prompt's own examples (`code_examples.py`)
STATS = TEXT_STATS + ENCODED_STATS + EXECUTED_STATS
BLOCKS_READ_WITH = "option_rel_chars"  # a checkpoint that reads this statistic reads options set out as blocks
# the cache directory of the statistics: a change to how any of them is computed takes a new name
# (v4: as a checkpoint of `STATS_V3` reads them, kept for those; v5: options set out as blocks read, the
# picked option's relative length)
STATS_CACHE = "answer-stats-v5"
STATS_CACHE_V3 = "answer-stats-v4"
_HEDGE = re.compile(r"\b(?:maybe|perhaps|not sure|unsure|i think|i believe|approximately|roughly|sorry|cannot|can't|"
                    r"unclear|might be|possibly|guess)\b", re.IGNORECASE)
_EQ = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d[\d,]*(?:\.\d+)?)\s*=\s*(-?\d[\d,]*(?:\.\d+)?)")
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def trained_stats(run_examples: bool = True) -> tuple[str, ...]:
    """The statistics a new cascade is trained on: every one, less the code's runs on the prompt's
    examples where `cascade.run_examples` is false (then code is never run, in training or serving)."""
    return STATS if run_examples else tuple(n for n in STATS if n not in EXECUTED_STATS)


def reads_blocks(names) -> bool:
    """Whether statistics `names` (a checkpoint's) read options set out as blocks: they hold
    `BLOCKS_READ_WITH`, or no statistic of the options at all (then how they are read does not matter)."""
    return BLOCKS_READ_WITH in names or not set(names) & set(OPTION_STATS)


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


_EQ_START = re.compile(r"-?\d")
_RUN = re.compile(r"[\d,]*")


def _equation_matches(text: str):
    """The equations a finditer of `_EQ` finds, each start tried once: a start inside a run of
    digits and commas reads the same number's tail, which cannot match where the run's first digit
    did not, so a failed start skips its run (searched from every digit, n digits cost n^2)."""
    pos = 0
    while (s := _EQ_START.search(text, pos)) is not None:
        m = _EQ.match(text, s.start())
        if m is not None:
            yield m
            pos = m.end()
        else:
            pos = _RUN.match(text, s.end()).end()


def _equations(reply: str) -> tuple[int, int]:
    n = held = 0
    for a, op, b, c in (m.groups() for m in _equation_matches(reply[-20_000:])):
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


def answer_stats(reply: str | None, final: str | None, prompt: str, names: tuple[str, ...] | list[str] = TEXT_STATS,
                 blocks: bool | None = None) -> np.ndarray:
    """The statistics `names` (default `TEXT_STATS`: those read from the text alone) of one reply, in
    that order; all zero for no reply. Options set out as blocks are read where `blocks`, by default
    where `reads_blocks(names)` (a checkpoint trained before they were read records names without
    `BLOCKS_READ_WITH`, and is served the values it was trained on; a caller that asks for a few of a
    checkpoint's statistics says which it has). `reply_statistics` adds those the encoder computes."""
    _known(names, TEXT_STATS)
    full = np.concatenate([_stats_v1(reply, final, prompt), check_stats(reply, final, prompt),
                           option_stats(reply, final, prompt, reads_blocks(names) if blocks is None else blocks)])
    return full[[TEXT_STATS.index(n) for n in names]]


def _known(names, computed) -> None:
    unknown = [n for n in names if n not in computed]
    if unknown:
        how = (f"; {[n for n in unknown if n in ENCODED_STATS]} need the encoder (`reply_statistics`)"
               if set(unknown) & set(ENCODED_STATS) else "")
        raise ValueError(f"unknown reply statistic(s) {unknown}; known: {list(STATS)}{how}")


def reply_statistics(cells: list[tuple[str | None, str | None, str]], names: tuple[str, ...] | list[str],
                     encode: Callable[[list[str]], np.ndarray] | None, cache_root: str | Path | None = None,
                     executed: np.ndarray | None = None) -> np.ndarray:
    """The statistics `names` of (reply, final answer, prompt) cells, (N, len(names)), in that order:
    those read from the text through `cached_answer_stats` (no `cache_root`: computed), those of the
    encoder (`ENCODED_STATS`) with `encode` (texts -> vectors: the reply encoder's, as `embed_answers`
    or a live encoder's `encode_texts`), and the code's run on the prompt's examples
    (`EXECUTED_STATS`, in the sandbox, kept under the cache root too; `executed`: those already run,
    `examples_stats` of the same cells). One path for training, evaluation and serving."""
    _known(names, STATS)
    names = list(names)
    text = [n for n in names if n in TEXT_STATS]
    out = np.zeros((len(cells), len(names)), np.float32)
    if text:
        out[:, [names.index(n) for n in text]] = cached_answer_stats(cells, cache_root, text)
    if "option_fit" in names and cells:
        if encode is None:
            raise ValueError("the reply statistic option_fit needs the encoder, and none was given")
        out[:, names.index("option_fit")] = option_fit(cells, encode)
    ran = [n for n in EXECUTED_STATS if n in names]
    if ran and cells:
        got = examples_stats(cells, cache_root) if executed is None else executed
        out[:, [names.index(n) for n in ran]] = got[:, [EXECUTED_STATS.index(n) for n in ran]]
    return out


def cached_answer_stats(cells: list[tuple[str | None, str | None, str]], cache_root: str | Path | None,
                        names: tuple[str, ...] | list[str] = TEXT_STATS) -> np.ndarray:
    """`answer_stats` of (reply, final answer, prompt) triples, (N, len(names)), through the content-
    addressed cache under `<cache_root>/answer-stats-v5/` (key: the sha256 of prompt, reply and final
    answer; every statistic is stored, `names` picks the columns); names that read the options
    without blocks (`reads_blocks`: a checkpoint of `STATS_V3`) through `answer-stats-v4/`, which
    holds those, computed so. No cache root: computed."""
    from fugu_pipeline.features.cache import EmbeddingCache
    from fugu_pipeline.hashing import sha256_text

    stored = TEXT_STATS if reads_blocks(names) else STATS_V3
    _known(names, stored)
    cols = [stored.index(n) for n in names]
    if not cells:
        return np.zeros((0, len(cols)), np.float32)
    if cache_root is None:
        return np.stack([answer_stats(r, f, p, stored) for r, f, p in cells])[:, cols]
    cache = EmbeddingCache(cache_root, STATS_CACHE if stored is TEXT_STATS else STATS_CACHE_V3)
    keys = [sha256_text(f"{p}\x00{'' if r is None else r}\x00{'' if f is None else f}\x00{int(r is None)}") for r, f, p in cells]
    found, vectors = cache.get_many(keys)
    if vectors.shape[1] not in (0, len(stored)):
        raise ValueError(f"reply-statistics cache {cache.dir} holds {vectors.shape[1]} columns, not {len(stored)}; "
                         "delete that directory to rebuild it")
    out = np.zeros((len(cells), len(stored)), np.float32)
    if found.any():
        out[found] = vectors[found]
    missing = np.flatnonzero(~found)
    if len(missing):
        out[missing] = np.stack([answer_stats(*cells[i], stored) for i in missing])
        cache.put_many([keys[i] for i in missing], out[missing])
    return out[:, cols]


def _stats_v1(reply: str | None, final: str | None, prompt: str) -> np.ndarray:
    """The first set of statistics (`STATS_V1`), computed as checkpoints saved before the checks read them."""
    if reply is None:
        return np.zeros(len(STATS_V1), dtype=np.float32)
    n_eq, held = _equations(reply)
    prompt_numbers = {_num(t) for t in _NUM.findall(prompt[-READ_CHARS:])}
    final_num = _num(final) if final else None
    # counted a slice at a time: no single call holds the interpreter for a whole 16 MB reply
    digits = sum(sum(map(str.isdigit, reply[i:i + READ_CHARS])) for i in range(0, len(reply), READ_CHARS))
    return np.array([
        math.log1p(len(reply)), math.log1p(reply.count("\n")), float(final is not None),
        float(final is not None and (final_num in prompt_numbers if final_num is not None else final.lower() in prompt.lower())),
        digits / max(1, len(reply)), math.log1p(len(_HEDGE.findall(reply[-READ_CHARS:]))), math.log1p(n_eq),
        held / n_eq if n_eq else 1.0, math.log1p(reply.count(final) if final else 0),
        float(final_num is not None and final_num == int(final_num) if final_num is not None and math.isfinite(final_num) else 0),
    ], dtype=np.float32)


def embed_answers(texts: list[str], settings: EncoderSettings, cache_root: str | Path, *, progress=None,
                  lazy=None) -> np.ndarray:
    """Encoder features (n, D) of these answer texts (`answer_text`), through the cache. Serving
    reads the same vectors with the prompt encoder's `encode_texts(texts)` (the template and the
    prompt rules only shape a prompt's text). `lazy`: the caller's `LazyEncoder` of
    `answer_settings(settings)`, loaded at most once over its calls (the caller closes it)."""
    from fugu_pipeline.features.cache import embed_prompts
    from fugu_pipeline.features.encoder import LazyEncoder

    own = lazy is None
    lazy = LazyEncoder(answer_settings(settings)) if own else lazy
    try:
        return embed_prompts(texts, None, lazy, cache_root, progress=progress).vectors
    finally:
        if own:
            lazy.close()
