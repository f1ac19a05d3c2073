"""How well the picked option fits the question, as the frozen encoder reads them: `option_fit`.

A multiple-choice reply names an option; whether that option is the right one shows only when the
question and the option are read together, which a linear verifier over separately encoded prompt
and reply vectors cannot do. This statistic does the one product it needs: the cosine of the
question's encoder vector with the picked option's, less the largest cosine with any other option
(positive: the pick is the option nearest the question; 0 when the prompt lists no options, the
reply picks none of them, or there is no reply).

On CommonsenseQA (five options, three chain-of-thought workers, 1,221 prompts, all-MiniLM-L6-v2),
the option nearest the question is the right one 40% of the time (chance: 20%); the statistic alone
separates right replies from wrong ones at an AUC of 0.58 to 0.63 per worker, and the verifier's
out-of-fold AUC goes from 0.604 to 0.629 with it (`benchmarks/verifier_cross.py`). Where the options
are long outputs to judge (LLMBar) or there are none (code), it changes nothing.

The question is the prompt's text before its list of options (within the last `OPTIONS_TAIL`
characters that `answer_checks.prompt_options` reads, at most `STEM_CHARS` of it). Texts are encoded
by the caller's `encode` (training: the content-addressed cache under the encoder's reply settings;
serving: the same encoder's `encode_texts`), each distinct text once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fugu_pipeline.policies.cascade.answer_checks import OPTIONS_TAIL, picked_option, prompt_options, without_label

ENCODED_STATS = ("option_fit",)  # the reply statistics computed with the encoder, not from the text alone
STEM_CHARS = 2000


def question_stem(prompt: str, options: dict[str, str]) -> str:
    """The prompt's text before its list of options: up to the earliest of the options' last places
    in the tail `prompt_options` reads, less that option's label (at most `STEM_CHARS` characters);
    "" when none is found."""
    tail = prompt[-OPTIONS_TAIL:]
    places = [tail.rfind(v) for v in options.values() if v]
    places = [p for p in places if p >= 0]
    if not places:
        return ""
    return without_label(tail[:min(places)])[-STEM_CHARS:].strip()


def option_fit(cells: list[tuple[str | None, str | None, str]], encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """`option_fit` of (reply, final answer, prompt) cells, (n,) float32 (module docstring)."""
    out = np.zeros(len(cells), np.float32)
    parsed: dict[str, tuple[str, dict[str, str]]] = {}
    picks: list[tuple[int, str, str]] = []
    for k, (reply, final, prompt) in enumerate(cells):
        if reply is None:
            continue
        if prompt not in parsed:
            opts = prompt_options(prompt)
            parsed[prompt] = (question_stem(prompt, opts) if opts else "", opts)
        stem, opts = parsed[prompt]
        pick = picked_option(opts, final) if stem else None
        if pick is not None:
            picks.append((k, prompt, pick))
    if not picks:
        return out
    index: dict[str, int] = {}
    for prompt in {p for _, p, _ in picks}:
        stem, opts = parsed[prompt]
        for text in (stem, *opts.values()):
            index.setdefault(text or "(empty)", len(index))
    vecs = np.asarray(encode(list(index)), np.float32)
    vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    fits: dict[str, dict[str, float]] = {}
    for k, prompt, pick in picks:
        if prompt not in fits:
            stem, opts = parsed[prompt]
            q = vecs[index[stem]]
            fits[prompt] = {letter: float(vecs[index[text or "(empty)"]] @ q) for letter, text in opts.items()}
        cos = fits[prompt]
        out[k] = cos[pick] - max(v for letter, v in cos.items() if letter != pick)
    return out
