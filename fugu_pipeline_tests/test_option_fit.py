"""`option_fit`: how well the picked option fits the question, as the encoder reads them; the same
value offline (through the cache) and live (the serving encoder), and what it lets a verifier tell."""

from __future__ import annotations

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.answer_checks import prompt_options
from fugu_pipeline.policies.cascade.answer_features import STATS, TEXT_STATS, reply_statistics
from fugu_pipeline.policies.cascade.option_fit import option_fit, question_stem

WORDS = ("fruit", "tool", "animal", "colour", "apple", "hammer", "horse", "green", "chair", "stone")


def bag_of_words(texts: list[str]) -> np.ndarray:
    """A stand-in encoder: which of `WORDS` a text holds (a kind and its example share a column)."""
    pairs = {"apple": "fruit", "hammer": "tool", "horse": "animal", "green": "colour"}
    out = np.zeros((len(texts), len(WORDS) + 1))
    for i, t in enumerate(texts):
        for w in t.lower().replace("?", " ").split():
            if w in WORDS:
                out[i, WORDS.index(pairs.get(w, w))] += 1
        out[i, -1] = 0.1  # never all zero
    return out


PROMPT = "Which of these is a fruit?\nA. hammer\nB. apple\nC. horse\nD. green\nAnswer with the letter."


def test_the_picked_option_nearest_the_question_scores_above_the_others():
    assert prompt_options(PROMPT) == {"A": "hammer", "B": "apple", "C": "horse", "D": "green"}
    assert question_stem(PROMPT, prompt_options(PROMPT)) == "Which of these is a fruit?"
    seen: list[list[str]] = []

    def encode(texts):
        seen.append(list(texts))
        return bag_of_words(texts)

    cells = [("It is B.", "B", PROMPT), ("A", "A", PROMPT), ("apple", "apple", PROMPT),  # a pick by its text
             ("E", "E", PROMPT), ("?", None, PROMPT), (None, None, PROMPT), ("12", "12", "What is 3 * 4?")]
    got = option_fit(cells, encode)
    assert got[0] > 0.5 and got[2] == pytest.approx(got[0])  # the fruit: nearest the question, by a margin
    assert got[1] < -0.5  # the hammer: the fruit is nearer
    assert not got[3:].any()  # not an option, no answer, no reply, no options listed: 0
    assert len(seen) == 1 and len(seen[0]) == len(set(seen[0])) == 5  # each distinct text encoded once


def test_options_set_out_as_blocks_are_read_with_their_question():
    prompt = "Which output names a tool?\n\n# Output (a):\nA hammer.\n\n# Output (b):\nA green horse.\n\n# Decision:"
    assert question_stem(prompt, prompt_options(prompt)) == "Which output names a tool?"
    a, b = option_fit([("Output (a)", "A", prompt), ("Output (b)", "B", prompt)], bag_of_words)
    assert a > 0 > b and a == pytest.approx(-b)


def test_the_encoded_statistic_is_asked_of_the_encoder_and_the_text_ones_of_the_cache(tmp_path):
    cells = [("It is B.", "B", PROMPT), ("A", "A", PROMPT)]
    both = reply_statistics(cells, STATS, bag_of_words, tmp_path)
    assert both.shape == (2, len(STATS))
    assert np.array_equal(both[:, :len(TEXT_STATS)], reply_statistics(cells, TEXT_STATS, None, tmp_path))
    assert np.allclose(both[:, STATS.index("option_fit")], option_fit(cells, bag_of_words))
    with pytest.raises(ValueError, match="option_fit needs the encoder"):
        reply_statistics(cells, STATS, None, tmp_path)


def test_offline_and_live_read_the_same_value(tmp_path):
    """Training reads the texts through the content-addressed cache (`embed_answers`); serving asks the
    loaded encoder (`encode_texts`, as `route` does). The tiny encoder: both give the same column."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.policies.cascade.answer_features import embed_answers
    from fugu_pipeline.policies.cascade.cross_encoder_use import reply_stats

    settings = EncoderSettings(model="tiny", device="cpu", dtype="float32")
    replies = [("It is B.", "B"), ("A", "A"), ("D, green", "D"), ("no idea", None)]
    offline = reply_statistics([(r, f, PROMPT) for r, f in replies], STATS,
                               lambda texts: embed_answers(texts, settings, tmp_path), tmp_path)
    enc = Encoder.load(settings)
    try:
        live = reply_stats(PROMPT, replies, STATS, None, enc.encode_texts)
    finally:
        enc.close()
    col = STATS.index("option_fit")
    assert np.count_nonzero(offline[:, col]) == 3 and offline[3, col] == 0.0
    assert np.allclose(offline, live, atol=1e-5)


def test_a_verifier_tells_right_from_wrong_picks_only_with_it():
    """Replies that look alike and differ only in whether the picked option fits the question: the
    text statistics see nothing, `option_fit` separates them, out of fold."""
    from fugu_pipeline.policies.cascade.verifier import VerifierInputs, auc, oof_scores
    from fugu_pipeline.train.selection import fold_ids

    rng = np.random.default_rng(0)
    kinds = {"fruit": "apple", "tool": "hammer", "animal": "horse", "colour": "green"}
    cells, right = [], []
    for i in range(240):
        kind = list(kinds)[i % 4]
        letters = rng.permutation(4)
        opts = [kinds[k] for k in kinds]
        order = [opts[j] for j in letters]
        prompt = f"Which of these is a {kind}? (case {i})\n" + "\n".join(f"{'ABCD'[k]}. {o}" for k, o in enumerate(order))
        ok = bool(rng.random() < 0.6)
        pick = order.index(kinds[kind]) if ok else int(rng.choice([k for k in range(4) if order[k] != kinds[kind]]))
        cells.append((f"The answer is {'ABCD'[pick]}.", "ABCD"[pick], prompt))
        right.append(float(ok))
    right = np.array(right)
    stats = reply_statistics(cells, STATS, bag_of_words)
    folds = fold_ids([f"t{i}" for i in range(len(cells))])

    def oof_auc(names):
        cols = [STATS.index(s) for s in names]
        inp = VerifierInputs(prompt=np.zeros((len(cells), 1), np.float32), answer=stats[:, None, cols],
                             has=np.ones((len(cells), 1), bool), target=right[:, None], stat_names=tuple(names))
        scores, _, _ = oof_scores(inp, folds, l2_grid=(0.01,), input_sets=("stats",))
        return auc(scores[:, 0], right >= 0.5)

    assert oof_auc(TEXT_STATS) < 0.65
    assert oof_auc(STATS) > 0.95


@pytest.mark.slow  # builds a checkpoint with the tiny encoder
def test_a_served_cascade_encodes_a_question_and_its_options_once(tmp_path):
    """Each step of a cascade reads the paid replies again; the question's and options' vectors are
    the router's to remember, and a remembered vector is the encoder's own."""
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint

    router = load_router(build_cascade_checkpoint(tmp_path / "models", tmp_path / "cache", n=30), device="cpu")
    assert "option_fit" in router.head.answer_stats
    seen: list[list[str]] = []
    encode = router.encoder.encode_texts

    def counted(texts):
        seen.append(list(texts))
        return encode(texts)

    router.encoder.encode_texts = counted
    first = router.verify(PROMPT, None, [("alpha", "It is B.", "B")])
    asked = [t for call in seen for t in call]
    assert "Which of these is a fruit?" in asked and "apple" in asked
    seen.clear()
    second = router.verify(PROMPT, None, [("alpha", "It is B.", "B"), ("beta", "A", "A")])
    asked = [t for call in seen for t in call]
    assert "Which of these is a fruit?" not in asked and "apple" not in asked  # remembered
    assert second[0] == pytest.approx(first[0], abs=1e-6)
    assert np.allclose(router._encode_remembered(["apple"]), encode(["apple"]), atol=1e-6)


def test_training_loads_the_encoder_once_for_replies_and_options_and_not_when_cached(tmp_path, monkeypatch):
    """`answer_inputs` encodes the replies and `option_fit`'s questions and options with one encoder:
    loaded once on an empty cache, not at all on a full one."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.policies.cascade.fit import answer_inputs
    from fugu_pipeline_tests.test_verifier_context import _mc_matrix

    data, grid = _mc_matrix(n=24)
    settings = EncoderSettings(model="tiny", device="cpu", dtype="float32")
    loads = []
    real = Encoder.load.__func__

    def counted(cls, *a, **k):
        loads.append(a)
        return real(cls, *a, **k)

    monkeypatch.setattr(Encoder, "load", classmethod(counted))
    first = answer_inputs(data, grid, settings, tmp_path, stat_names=STATS)
    assert len(loads) == 1
    col = first.answer[:, :, first.answer.shape[2] - len(STATS) + STATS.index("option_fit")]
    assert np.count_nonzero(col[first.has]) > 0  # the options were read and encoded
    again = answer_inputs(data, grid, settings, tmp_path, stat_names=STATS)
    assert len(loads) == 1 and np.allclose(again.answer, first.answer)
