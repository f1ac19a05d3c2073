"""The verifier beyond arithmetic and the wider cascade search: a multiple-choice reply read with its
options and with the other cheap replies already paid for; plans with three cheap steps or three
workers at once, found under a cap; the out-of-fold frontier (only non-dominated points, plotted);
a served cascade whose verifier reads the replies of its parallel step together."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.answer_checks import CHECK_STATS
from fugu_pipeline.policies.cascade.answer_features import STATS, STATS_V1, TEXT_STATS
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.matrix.answers import AnswerGrid
from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.tasks.final_answer import extract
from fugu_pipeline.policies.cascade.fit import answer_inputs
from fugu_pipeline.policies.cascade.policy import answer_codes
from fugu_pipeline.policies.cascade.search import CascadeSearch, Grid, candidate_plans, search
from fugu_pipeline.train.selection import fold_ids
from fugu_pipeline.policies.cascade.verifier import auc, oof_scores

CHEAP = ["c1", "c2", "c3"]
ARITHMETIC = STATS_V1 + CHECK_STATS  # the reply statistics before the options and the paid replies were read


def _mc_matrix(n: int = 240, seed: int = 0, blocks: bool = False):
    """Four-option questions; three cheap workers right 60% of the time and a strong one 95%. A right
    reply and a wrong one read the same ("The answer is (X)."), so a reply alone tells nothing; right
    replies agree with each other, wrong ones mostly do not, and some wrong ones pick a
    letter the question does not list (half of the wrong ones). `blocks`: each option set out under
    a line naming it (`Option A:`, its text below) instead of on one line."""
    rng = np.random.default_rng(seed)
    ids = [*CHEAP, "strong"]
    quality = (rng.random((n, 4)) < [0.6, 0.6, 0.6, 0.95]).astype(float)
    prompts, text, final = [], np.empty((n, 4), object), np.empty((n, 4), object)
    for i in range(n):
        gold = "ABCD"[i % 4]
        opts = [f"alpha {i}", f"beta {i}", f"gamma {i}", f"delta {i}"]
        listed = "".join(f"\nOption {x}:\n{o}\n" if blocks else f"\n{x}. {o}" for x, o in zip("ABCD", opts))
        prompts.append(f"Question {i}: which one?{listed}\nAnswer:")
        for j in range(4):
            wrong = [x for x in "ABCD" if x != gold]
            pick = gold if quality[i, j] else ("E" if rng.random() < 0.5 else wrong[rng.integers(0, 3)])
            text[i, j] = f"The answer is ({pick})."
            final[i, j] = extract(text[i, j], "choice")
    cost = np.tile([1e-4, 1e-4, 1e-4, 1e-2], (n, 1))
    u = UtilityConfig(cost_weight=0.0, latency_weight=0.0)
    data = RoutingData(task_ids=[f"q{i}" for i in range(n)], prompts=prompts, domains=["mc"] * n,
                       splits=np.array(["train"] * n), worker_ids=ids, features=rng.normal(size=(n, 4)).astype(np.float32),
                       utility=quality, contract=FeatureContract(encoder_id="x", dim=4), quality=quality, cost_usd=cost,
                       latency_s=np.zeros((n, 4)), utility_config=u)
    grid = AnswerGrid(data.task_ids, ids, text, ["choice"] * n, final, "mc")
    return data, grid


def test_only_the_new_features_tell_right_from_wrong_multiple_choice_replies(tmp_path):
    """With the statistics the arithmetic checks give (`ARITHMETIC`) a cheap reply alone scores at chance;
    read with its options and with the other cheap replies paid for, right and wrong ones separate."""
    from fugu_pipeline.policies.cascade.verifier_context import fit_context

    data, grid = _mc_matrix()
    folds = fold_ids(data.task_ids, 5, 0)
    old = answer_inputs(data, grid, None, tmp_path, encode=False, stat_names=ARITHMETIC)
    s_old, _, _ = oof_scores(old, folds)
    right = data.quality[:, 0] >= 0.5
    assert auc(s_old[:, 0], right) < 0.65  # a reply alone: nothing to read
    new = answer_inputs(data, grid, None, tmp_path, encode=False, stat_names=TEXT_STATS)
    s_new, _, _ = oof_scores(new, folds)
    ctx = fit_context(new, s_new, answer_codes(grid.final), folds)
    alone, paid_two, paid_three = ctx.at([0])[:, 0], ctx.at([0, 1])[:, 0], ctx.at([0, 1, 2])[:, 0]
    assert auc(alone, right) > 0.6  # the option check alone: an unlisted letter is wrong
    assert auc(paid_two, right) > 0.8 and auc(paid_three, right) > auc(paid_two, right) - 0.02
    assert auc(paid_three, right) > auc(s_old[:, 0], right) + 0.25


def test_context_scores_read_only_the_replies_paid_for():
    """A reply's score at a point of a plan does not move when an unpaid worker's reply changes."""
    from fugu_pipeline.policies.cascade.verifier_context import fit_context

    data, grid = _mc_matrix(n=160, seed=1)
    folds = fold_ids(data.task_ids, 4, 0)
    inp = answer_inputs(data, grid, None, None, encode=False, stat_names=TEXT_STATS)
    base, _, _ = oof_scores(inp, folds, input_sets=("stats",))
    codes = answer_codes(grid.final)
    ctx = fit_context(inp, base, codes, folds)
    before = ctx.at([0, 1]).copy()
    ctx.codes[:, 2] = 99  # the third cheap worker now agrees with nobody: unpaid, so nothing changes
    ctx._cache.clear()
    assert np.allclose(before, ctx.at([0, 1]), equal_nan=True)
    assert not np.allclose(ctx.at([0, 1, 2])[:, 0], before[:, 0])


def _majority_grid(n: int = 300, seed: int = 0) -> tuple[Grid, np.ndarray]:
    """Three cheap workers (cost 1) where two of three are right on 85% of the rows (which one is
    wrong rotates; wrong answers differ) and all are wrong on the rest; a strong worker (cost 100) is
    always right. Only asking all three (at once, or one after another) and escalating when no two
    agree is both accurate and cheap."""
    rng = np.random.default_rng(seed)
    ids = [*CHEAP, "strong"]
    quality = np.zeros((n, 4))
    quality[:, 3] = 1
    finals = np.empty((n, 4), object)
    for i in range(n):
        hard = rng.random() < 0.15
        off = i % 3
        for j in range(3):
            quality[i, j] = 0.0 if hard or j == off else 1.0
        for j in range(4):
            finals[i, j] = "gold" if quality[i, j] else f"wrong-{j}-{rng.integers(0, 9)}"
    codes = answer_codes(finals)
    g = Grid(ids, codes, np.full((n, 4), np.nan), quality, np.array([1.0, 1.0, 1.0, 100.0]), np.zeros(4),
             UtilityConfig(cost_weight=0.0, latency_weight=0.0))
    return g, np.arange(n)


def test_a_search_under_a_cap_finds_the_three_cheap_worker_plan_no_two_step_plan_matches():
    g, rows = _majority_grid()
    cap = 0.2 * 100.0
    cfg = CascadeSearch(thresholds=4, finals=2, cheap=3)
    choice = search(g, rows, cfg, cap)
    cheap_called = [w for w in choice.plan.workers if w in CHEAP]
    assert len(cheap_called) == 3 and choice.quality > 0.99 and choice.cost <= cap
    two = [p for p in candidate_plans(g, rows, cfg) if len([w for w in p.workers if w in CHEAP]) <= 2]
    best_two = max(float(g.run(p, rows)[0].mean()) for p in two if float(g.run(p, rows)[1].mean()) <= cap)
    assert best_two < choice.quality - 0.1
    assert choice.considered <= cfg.max_plans


def test_the_search_is_bounded_by_max_plans():
    g, rows = _majority_grid(n=60)
    g.scores = np.random.default_rng(0).random(g.quality.shape)
    assert sum(1 for _ in candidate_plans(g, rows, CascadeSearch())) > 25
    assert sum(1 for _ in candidate_plans(g, rows, CascadeSearch(max_plans=25))) == 25


def test_the_frontier_lists_only_non_dominated_points_and_is_plotted(tmp_path):
    from fugu_pipeline.policies.cascade.frontier_plot import plot_frontier
    from fugu_pipeline.evaluate.plots import stored_key
    from fugu_pipeline.policies.cascade.frontier import frontier_lines, non_dominated, oof_frontier

    pts = [{"cost_usd": c, "quality": q, "share": c / 10, "cost_share": c / 10, "plan": f"p{k}"}
           for k, (c, q) in enumerate([(1, 0.5), (2, 0.7), (2, 0.6), (3, 0.7), (4, 0.9), (5, 0.85), (0.5, 0.5)])]
    front = non_dominated(pts)
    assert [(p["cost_usd"], p["quality"]) for p in front] == [(0.5, 0.5), (2, 0.7), (4, 0.9)]
    g, rows = _majority_grid(n=200)
    folds = np.arange(len(rows)) % 4
    out = oof_frontier(lambda r: g, rows, folds, CascadeSearch(thresholds=3, finals=1, cheap=3))
    fr = out["frontier"]
    assert fr and all(not (o["cost_usd"] <= p["cost_usd"] and o["quality"] >= p["quality"] and o is not p)
                      for p in fr for o in out["levels"] if (o["cost_usd"], o["quality"]) != (p["cost_usd"], p["quality"]))
    assert [p["cost_usd"] for p in fr] == sorted(p["cost_usd"] for p in fr)
    lines = frontier_lines(out)
    assert len(lines) == 2 + len(fr) and "$ per 1,000" in lines[1]
    png = plot_frontier(out, tmp_path / "frontier.png")
    from PIL import Image

    with Image.open(png) as im:
        assert im.size[0] <= 660 and im.size[1] <= 420  # fits the Dagster UI's Markdown dialog
    key = stored_key(png)
    assert key and plot_frontier(out, png) == png and stored_key(png) == key  # drawn once per content


def test_a_served_parallel_step_is_read_together_and_stops_on_agreement(tmp_path):
    """The served cascade calls [alpha, beta] at once and its verifier reads each reply with the
    other: agreeing replies pass the threshold and gamma is never called; disagreeing ones do not."""
    from fugu_pipeline.policies.cascade.route import run_cascade
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
    from fugu_pipeline.workers.contract import Completion

    plan = {"default": {"steps": [{"workers": ["alpha", "beta"], "verify": 0.9}, {"workers": ["gamma"]}]}}
    path = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", n=90, context=True, plan=plan)
    router = load_router(path, device="cpu")
    assert router.head.context  # saved and loaded with the checkpoint

    def ask(replies: dict):
        called = []

        async def call(w):
            called.append(w)
            return Completion(answer=replies[w], cost_usd=0.001)

        prompt = "What is 3 + 4?"
        dec = router.route_batch([prompt])[0]
        return asyncio.run(run_cascade(router, prompt, None, dec, call)), called

    run, called = ask({"alpha": "3 + 4 = 7. #### 7", "beta": "3 + 4 = 7. #### 7", "gamma": "#### 7"})
    assert called == ["alpha", "beta"] and run.served_by in ("alpha", "beta") and run.stopped.startswith("step 1")
    agree = run.steps[0].verifier
    run, called = ask({"alpha": "3 + 4 = 8. #### 8", "beta": "3 + 4 = 9. #### 9", "gamma": "3 + 4 = 7. #### 7"})
    assert called == ["alpha", "beta", "gamma"] and run.served_by == "gamma"
    assert min(agree.values()) > max(run.steps[0].verifier.values())


@pytest.mark.parametrize("prompt, final, valid", [
    ("Q?\nA. one\nB. two\nC. three", "B", 1.0), ("Q?\nA. one\nB. two\nC. three", "E", 0.0),
    ("Q? Answer Choices: (a) shirt (b) inkwell (c) blotter", "C", 1.0), ("What is 3 + 4?", "7", 1.0)])
def test_a_final_answer_is_read_among_the_prompts_options(prompt, final, valid):
    from fugu_pipeline.policies.cascade.answer_checks import OPTION_STATS, option_stats

    got = dict(zip(OPTION_STATS, option_stats(f"The answer is {final}.", final, prompt)))
    assert got["option_valid"] == valid and (got["options_listed"] > 0) == ("?\n" in prompt or "(a)" in prompt)


JUDGE = ("Select the Output (a) or Output (b) that is better. End with \"Therefore, Output (a) is better.\"\n\n"
         "# Instruction:\nList two fruits.\n\n# Output (a):\nA. apple\nB. pear (both sweet)\n\n"
         "# Output (b):\nHere are two fruits that many people enjoy every day: apple and pear.\n\n"
         "# Decision (end with the verdict):")


def test_options_set_out_as_blocks_are_read_with_their_whole_text():
    """A pairwise judge's prompt sets each output under a line naming it; the outputs' own lettered
    lines and parentheses are part of their text, not options of their own."""
    from fugu_pipeline.policies.cascade.answer_checks import prompt_options

    assert prompt_options(JUDGE) == {"A": "A. apple\nB. pear (both sweet)",
                                     "B": "Here are two fruits that many people enjoy every day: apple and pear."}
    assert prompt_options("Response A\nyes\n\nResponse B\nno\n") == {"A": "yes", "B": "no"}
    assert prompt_options("**Option A:**\nred\n**Option B:**\nblue") == {"A": "red", "B": "blue"}
    # one block is not a list; a list must run A, B, ... in order: read as before
    assert prompt_options("# Output (b):\nno\n\nQ?\nA. one\nB. two") == {"A": "one", "B": "two"}
    assert prompt_options("Answer A\nfirst\nAnswer C\nthird") == {}


def test_the_picked_options_length_is_read_beside_the_others():
    """`option_rel_chars`: the log length of the picked option less the mean of the others', so a
    judge that picks the longer output reads above 0, the shorter below, the same size; 0 when the
    final answer is no option, or the prompt lists none."""
    from fugu_pipeline.policies.cascade.answer_checks import OPTION_STATS, option_stats

    def rel(final, prompt=JUDGE):
        return dict(zip(OPTION_STATS, option_stats(f"Therefore, Output ({final.lower()}) is better.", final,
                                                   prompt)))["option_rel_chars"]

    longer, shorter = rel("B"), rel("A")
    assert longer > 0.3 and np.isclose(shorter, -longer)
    assert rel("C") == 0.0 and rel("B", "Which fruit is red?") == 0.0
    inline = "Q? Answer Choices: (a) fig (b) watermelon (c) kiwi"
    assert rel("B", inline) > 0 > rel("A", inline)


@pytest.mark.parametrize("blocks, names", [(False, "TEXT_STATS"), (True, "TEXT_STATS"), (True, "STATS_V3")])
def test_a_saved_context_verifier_scores_offline_as_it_does_live(blocks, names):
    """The checkpoint's context model read offline (every row at once) and live (one request, its
    paid replies) gives the same score: with options on lines or set out as blocks, and for a
    checkpoint trained before blocks were read (`STATS_V3`), which is served options read as then."""
    from fugu_pipeline.policies.cascade import answer_features
    from fugu_pipeline.policies.cascade.verifier_context import context_of_head, fit_context

    data, grid = _mc_matrix(n=120, seed=2, blocks=blocks)
    folds = fold_ids(data.task_ids, 4, 0)
    inp = answer_inputs(data, grid, None, None, encode=False, stat_names=getattr(answer_features, names))
    base, _, _ = oof_scores(inp, folds, input_sets=("stats",))
    codes = answer_codes(grid.final)
    saved = fit_context(inp, base, codes, folds).final.to_json()
    offline = context_of_head(saved, base, codes, inp)
    from fugu_pipeline.policies.cascade.verifier_context import ContextModel

    model = ContextModel.from_json(saved)
    seen = set()
    for i in range(0, 120, 17):
        paid = [0, 2, 1]
        keys = [model.bucket_of(grid.text[i, j], grid.final[i, j], data.prompts[i]) for j in paid]  # as `route` reads them
        seen |= set(keys)
        live = model.score_live(paid, [grid.final[i, j] for j in paid], [base[i, j] for j in paid], keys, 4, [1, 2])
        assert np.allclose(live, offline.at(paid)[i, [2, 1]], atol=1e-5)
    # a letter the question does not list reads as no option where the options are read (blocks
    # read by a checkpoint trained to; lines always), and as "no options listed" where they are not
    lettered = {k.split(",")[1] for k in seen}
    assert lettered == ({"1"} if (blocks and names == "STATS_V3") else {"0", "1"}), seen


def test_a_checkpoint_trained_before_blocks_were_read_reads_its_statistics_as_then(tmp_path):
    """Names without `option_rel_chars` (a checkpoint of `STATS_V3`) read options as before blocks
    were read, through the cache that holds them so (`answer-stats-v4/`); the current names read the
    blocks, through `answer-stats-v5/`. One prompt: the instruction's own "(a) or Output (b) now"
    is what the old reader takes for the options."""
    from fugu_pipeline.policies.cascade.answer_features import STATS_V3, answer_stats, cached_answer_stats

    prompt = "Pick Output (a) or Output (b) now.\n\n# Output (a):\nyes\n\n# Output (b):\nno way\n\n# Decision:"
    reply = "Output (b) says no way, so: Therefore, Output (b) is better"
    at = STATS.index("option_text_in_reply")
    assert answer_stats(reply, "B", prompt)[at] == 1.0  # "no way", output (b)'s text, is in the reply
    assert answer_stats(reply, "B", prompt, STATS_V3)[STATS_V3.index("option_text_in_reply")] == 0.0  # "now" is not
    cells = [(reply, "B", prompt), ("Therefore, Output (a) is better", "A", prompt)]
    for names, folder, width in ((STATS_V3, "answer-stats-v4", len(STATS_V3)), (TEXT_STATS, "answer-stats-v5", len(TEXT_STATS))):
        for _ in range(2):  # computed, then read back from the cache
            got = cached_answer_stats(cells, tmp_path, names)
            assert np.array_equal(got, np.stack([answer_stats(*c, names) for c in cells]))
        assert (tmp_path / folder).is_dir() and got.shape == (2, width)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer-stats-v4", "answer-stats-v5"]
