"""The verifier's general checks of a reply (policies/cascade/answer_checks.py): the reply's own arithmetic
recomputed, and the other signs of a doubtful answer; cached by content; recorded by name in a
saved cascade so serving builds the same columns."""

from __future__ import annotations

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.answer_checks import CHECK_STATS, arithmetic_steps, check_stats
from fugu_pipeline.policies.cascade.answer_features import STATS, STATS_V1, TEXT_STATS, answer_stats, cached_answer_stats
from fugu_pipeline.tasks.final_answer import extract
from fugu_pipeline.train.selection import fold_ids
from fugu_pipeline.policies.cascade.verifier import VerifierInputs, auc, oof_scores


def _holds(reply: str) -> list[bool]:
    return [ok for _, _, ok in arithmetic_steps(reply)]


@pytest.mark.parametrize("reply, want", [
    ("Together they have 20 + 80 + 160 = <<20+80+160=260>>260 sheep.", [True, True]),
    ("Alex weighs 4 * 125 - 2 = 500 - 2 = 498 pounds.", [True, True]),
    ("The women are 84 \\* (9/14) = <<84*(9/14)=48>>48.", [False, False]),  # 84 * 9/14 is 54
    ("3 x 60 = 180 meters, and 1,200 + 800 = 2,000.", [True, True]),
    ("each got 8 / 3 = <<8/3=2.6666666666666665>>2.67 gallons", [True, True]),  # rounded as shown
    ("the fee is 0.2 * 100 = 20%, so $20 x 20/100 = $4", [True, True]),
    ("So 12 + 7 = 21 apples.", [False]),
    ("Let x = 5, then 2x = 10.", []),  # algebra, not arithmetic: not counted
    ("180 meters/session * 3 sessions/week = 540 meters", []),  # units between the numbers: not read
    ("2 ^ 10 = 1024 and 9 ** 9 ** 9 = 1", [True]),  # a power too large to check is skipped
    ("1 + " * 60 + "1 = 61", []),  # longer than what is read: not judged on its tail
])
def test_the_reply_s_own_arithmetic_is_recomputed(reply, want):
    assert _holds(reply) == want


def test_the_checks_read_a_doubtful_answer_and_are_neutral_where_they_do_not_apply():
    prompt = "Tom has 3 boxes of 12 eggs and breaks 5. How many are left?"
    good = "3 * 12 = 36 eggs. 36 - 5 = 31 left.\n#### 31"
    bad = "3 * 12 = 38 eggs. Wait, actually the answer is 33.\n#### 38 or 33\n\nQuestion: another one"
    g = dict(zip(CHECK_STATS, check_stats(good, extract(good, "number"), prompt)))
    b = dict(zip(CHECK_STATS, check_stats(bad, extract(bad, "number"), prompt)))
    assert g["arith_wrong"] == 0 and g["arith_any_wrong"] == 0 and g["final_is_result"] == 1
    assert b["arith_any_wrong"] == 1 and b["self_corrections"] > 0 and b["answers_disagree"] == 1
    assert b["tail_after_final"] > g["tail_after_final"] and b["final_line_numbers"] > g["final_line_numbers"]
    assert g["prompt_numbers_used"] == 1.0 and b["prompt_numbers_used"] < 1.0  # the 5 broken eggs are never used
    # a multiple-choice reply to a prompt without numbers: every check at its neutral value
    mc = dict(zip(CHECK_STATS, check_stats("The answer is (B).", "B", "Which gas do plants take in?")))
    assert mc["arith_steps"] == mc["arith_wrong"] == mc["final_is_result"] == mc["answers_disagree"] == 0
    assert mc["prompt_numbers_used"] == 1.0 and mc["repeated_lines"] == 0
    assert not check_stats(None, None, prompt).any()


def test_reply_statistics_are_cached_by_content_and_picked_by_name(tmp_path, monkeypatch):
    import fugu_pipeline.policies.cascade.answer_features as af

    cells = [("2 + 2 = 5. #### 5", "5", "What is 2 + 2?"), ("The answer is B", "B", "Pick one"), (None, None, "x")]
    first = cached_answer_stats(cells, tmp_path)
    assert first.shape == (3, len(TEXT_STATS))
    assert np.allclose(first, np.stack([answer_stats(*c) for c in cells]))

    def boom(*a, **k):
        raise AssertionError("a cached reply was computed again")

    monkeypatch.setattr(af, "answer_stats", boom)
    again = cached_answer_stats(cells, tmp_path, STATS_V1)
    assert np.array_equal(again, first[:, :len(STATS_V1)])
    with pytest.raises(AssertionError, match="computed again"):  # another reply is not in the cache
        cached_answer_stats([("1 + 1 = 2", "2", "What is 1 + 1?")], tmp_path)


def test_an_unknown_statistic_is_named():
    with pytest.raises(ValueError, match="no_such_stat"):
        answer_stats("1", "1", "p", ["log_chars", "no_such_stat"])
    with pytest.raises(ValueError, match=r"\['option_fit'\] need the encoder"):  # not read from the text alone
        answer_stats("1", "1", "p", STATS)


def _math_replies(n: int, seed: int = 0):
    """Worked replies in one format where only the arithmetic tells a right answer from a wrong one:
    a wrong reply slips in its last step (as a weak model does), the rest looks the same."""
    rng = np.random.default_rng(seed)
    prompts, replies, right = [], [], []
    for i in range(n):
        a, b, c = (int(x) for x in rng.integers(2, 60, 3))
        ok = bool(rng.random() < 0.6)
        total = a + b + c
        shown = total if ok else total + int(rng.integers(1, 9))
        prompts.append(f"Ann has {a} apples, Bo has {b} and Cy has {c}. How many apples in all? (case {i})")
        replies.append(f"Ann and Bo have {a} + {b} = {a + b} apples.\nWith Cy: {a} + {b} + {c} = {shown} apples.\n#### {shown}")
        right.append(float(ok))
    return prompts, replies, np.array(right)


@pytest.mark.slow  # 20 logistic fits
def test_the_verifier_tells_a_wrong_calculation_from_a_right_one():
    """The first reply statistics (`STATS_V1`) read a chain `a + b + c = d` as `b + c = d` and cannot
    tell these replies apart; the recomputed arithmetic can, out of fold."""
    n = 300
    prompts, replies, right = _math_replies(n)
    stats = np.stack([answer_stats(r, extract(r, "number"), p) for r, p in zip(replies, prompts)])
    folds = fold_ids([f"t{i}" for i in range(n)])

    def oof_auc(names):
        cols = [TEXT_STATS.index(s) for s in names]
        inp = VerifierInputs(prompt=np.zeros((n, 1), np.float32), answer=stats[:, None, cols], has=np.ones((n, 1), bool),
                             target=right[:, None], stat_names=tuple(names))
        scores, _, figures = oof_scores(inp, folds, l2_grid=(0.01,), input_sets=("stats",))
        assert figures["oof_auc_by_worker"][0] == pytest.approx(figures["oof_auc"], abs=1e-4)
        return auc(scores[:, 0], right >= 0.5)

    before, after = oof_auc(STATS_V1), oof_auc(TEXT_STATS)
    assert before < 0.65, before
    assert after > 0.95, after


@pytest.mark.slow  # builds a checkpoint with the tiny encoder
def test_a_saved_cascade_records_its_statistics_and_an_older_one_reads_the_first_ten(tmp_path):
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
    from fugu_pipeline.policies.cascade.head import CascadeHead
    from fugu_pipeline.train.checkpoints import load_checkpoint

    path = build_cascade_checkpoint(tmp_path / "models", tmp_path / "cache", n=30)
    ckpt = load_checkpoint(path)
    assert ckpt.manifest.head_params["answer_stats"] == list(STATS)
    assert ckpt.head.answer_stats == STATS
    router = load_router(path, device="cpu")
    good, bad = "5 + 6 = 11. #### 11", "5 + 6 = 12. #### 12"
    s = router.verify("What is 5 + 6?", None, [("alpha", good, "11"), ("alpha", bad, "12"), ("beta", None, None)])
    assert s[2] is None and all(0.0 <= x <= 1.0 for x in s[:2])
    # a checkpoint written before the statistics were named: the first ten, and it says so
    old = CascadeHead(4, 3, {"default": {"steps": [{"workers": ["a"]}]}}, answer_dim=10)
    assert old.answer_stats == STATS_V1
    with pytest.raises(ValueError, match="does not compute"):
        CascadeHead(4, 3, {"default": {"steps": [{"workers": ["a"]}]}}, answer_dim=12, answer_stats=["log_chars", "mood"])


def test_a_few_shot_reply_s_last_answer_line_is_its_final_answer():
    """Few-shot "Q: ... A: X" replies (BIG-Bench's date task in the answer-consistency cascade study)
    commit to their last "A:" line; two replies that reason differently but end on the same line agree."""
    one = "Explain: Yesterday was April 30, 2021, so today is 05/01/2021.\nA: 05/01/2021"
    two = "Explain: Today is one day after April 30, 2021.\nA: 05/01/2021"
    assert extract(one, "text") == extract(two, "text") == "05/01/2021"
    assert extract("The answer is Paris.\nA: London", "text") == "paris"  # an explicit "answer is" still wins
    assert extract("no marker at all", "text") == "no marker at all"
