"""A default `fugu-lite train` does each piece of work once per distinct input: every prompt text is
encoded once per setting (the layer settings share one forward pass, the stripped prompts a second
one over the texts the rules changed), and a head family whose inputs no feature variant changes is
fitted once, not once per variant: the domain prior reads no features (one set of out-of-fold fits
for the four variants: prompts as they are or stripped, two layer settings), ridge on the lexical
block reads the same 16 statistics under both layer settings (one set per prompt text). The
predictions kept are the ones a refit gives, so what is chosen does not change: the selection
with predictions kept is the selection with every family refitted, figure for figure."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from collections import Counter

import numpy as np
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.features.encoder import Encoder
from fugu_pipeline.policies.oneshot import families

FOLDS = 5
SHARED_LINE = "Reply with one number and nothing else, please."
HEADS = """folds: 5
heads:
  domain_prior: {m: [5, 20]}
  knn: {k: [10, 30], prior_weight: [0, 20], same_domain_bonus: [0]}
  ridge: {alpha: [10, 1000], inputs: [all, lexical]}
  ensemble: {rounds: 5}
"""


def rows(n: int = 160) -> list[dict]:
    """Two domains; every math prompt ends with the same instruction line (the prompt rules strip
    it); the dear worker is right more often on prompts with big numbers."""
    rnd = random.Random(0)
    out = []
    for i in range(n):
        a, b = rnd.randint(2, 10 ** rnd.randint(1, 4)), rnd.randint(2, 999)
        if i % 2:
            d, p = "math", f"Add {a} and {b}, then subtract {b % 17}.\n{SHARED_LINE}"
        else:
            d, p = "code", f"Write a Python function number {i} that sorts a list of {a} items by key {b}."
        big = a > 500
        q = [int(rnd.random() < (0.4 if big else 0.8)), int(rnd.random() < 0.85)]
        out.append({"task_id": f"t{i:03d}", "prompt": p, "domain": d, "split": ("train", "train", "train", "val", "test")[i % 5],
                    "worker_ids": ["cheap", "dear"], "quality": q, "cost_usd": [0.0002, 0.004], "latency_s": [1.0, 3.0]})
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One `fugu-lite train` (two layer settings, prompt rules auto) with every encode and family fit counted."""
    work = tmp_path_factory.mktemp("train-reuse")
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (work / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.05\n  latency_weight: 0.0\n")
    (work / "heads.yaml").write_text(HEADS)
    encoded: list[str] = []
    fits: Counter = Counter()
    mp = pytest.MonkeyPatch()
    encode = Encoder.encode_texts
    mp.setattr(Encoder, "encode_texts", lambda self, texts: (encoded.extend(texts), encode(self, texts))[1])
    for cls in (families.PriorFamily, families.KNNFamily, families.RidgeFamily):
        def counted(self, fd, tr, te, domains, _orig=cls.predict_grid):
            for inputs in sorted({p.get("inputs", "") for _, p in self.grid(fd)}):
                fits[(self.kind, inputs)] += 1
            return _orig(self, fd, tr, te, domains)
        mp.setattr(cls, "predict_grid", counted)
    argv = ["train", "--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--config", str(work / "heads.yaml"),
            "--encoder", "tiny", "--device", "cpu", "--dtype", "float32", "--layer-sets", "-1", "-1 1",
            "--prompt-rules", "auto", "--cache-dir", str(work / "emb"), "--work-dir", str(work / "w"),
            "--output", str(work / "m")]
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        mp.undo()
    assert code == 0, err.getvalue()[-3000:]
    return work, encoded, fits, err.getvalue()


def test_four_feature_variants_are_fitted(trained):
    _, _, _, err = trained
    assert len(re.findall(r"prompt rules on validation: as they are", err)) == 2, err  # per layer setting
    assert "features: layers" in err and "kept (the best validation figure of 2)" in err


def test_each_prompt_text_is_encoded_once_per_setting(trained):
    """No text goes through the encoder twice: the plain prompts once (both layer settings in one
    pass), the stripped ones once, and only those the rules changed."""
    _, encoded, _, _ = trained
    texts = [r["prompt"] for r in rows()]
    stripped = [p.replace("\n" + SHARED_LINE, "") for p in texts]
    assert len(encoded) == len(set(encoded))
    assert set(encoded) == set(texts) | set(stripped)
    assert len(encoded) == len(set(texts)) + sum(s != p for s, p in zip(stripped, texts))


def test_a_family_is_fitted_once_per_distinct_input(trained):
    """Out-of-fold fits per family: the domain prior once for the four variants (it reads no
    features), ridge on the lexical block once per prompt text (the layers do not change it), kNN
    and ridge on all columns once per variant (each variant changes what they read). Before,
    every family was fitted for each of the four variants."""
    _, _, fits, _ = trained
    assert fits[("domain_prior", "")] == FOLDS
    assert fits[("ridge", "lexical")] == 2 * FOLDS
    assert fits[("ridge", "all")] == 4 * FOLDS
    assert fits[("knn", "")] == 4 * FOLDS


def test_kept_predictions_choose_what_refitting_every_family_chooses(trained):
    """The same feature choice through `fit_choosing_features`, once with the predictions kept
    across variants and once with every family refitted per variant (the behaviour before): the
    same variant, rule, selected head, best head per kind, ensemble, and every candidate's figures
    and predictions, bit for bit."""
    from fugu_pipeline.config_files import load_config
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig
    from fugu_pipeline.policies.oneshot.fit import select_heads
    from fugu_pipeline.policies.oneshot.reuse import PredictionMemo
    from fugu_pipeline.train.feature_choice import fit_choosing_features

    work, _, _, _ = trained
    db = next((work / "w").glob("*.duckdb"))
    cfg = load_config(work / "heads.yaml", TrainSetConfig)
    base = EncoderSettings(model="tiny", device="cpu", dtype="float32", lexical=True)
    load = lambda s: load_routing_data(db, LazyEncoder(s), work / "emb")[0]  # noqa: E731  (all cached)
    memo = PredictionMemo()
    runs = []
    for fit in (lambda d: select_heads(d, cfg, lambda m: None, False, memo), lambda d: select_heads(d, cfg, lambda m: None)):
        runs.append(fit_choosing_features(base, load, fit, score=lambda sel: sel[0].val_score, prompt_rules="auto",
                                          layer_sets=[[-1], [-1, 1]], log=lambda m: None))
    assert memo.kept > 0 and memo.fitted > 0  # something was kept: the comparison is not of two refits
    (kept, _, rec_kept), (refit, _, rec_refit) = runs
    assert rec_kept == rec_refit
    a, b = kept[0], refit[0]
    assert (a.rule, a.selected, a.selected_kind, a.best_per_kind, a.reason) == \
        (b.rule, b.selected, b.selected_kind, b.best_per_kind, b.reason)
    same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731  (NaN equals NaN)
    assert same(a.rule_check, b.rule_check) and same(a.ensemble_check, b.ensemble_check)
    assert (a.ensemble is None) == (b.ensemble is None)
    if a.ensemble is not None:
        assert (a.ensemble["name"], a.ensemble["counts"]) == (b.ensemble["name"], b.ensemble["counts"])
        assert same(a.ensemble["figures"], b.ensemble["figures"]) and np.array_equal(a.ensemble["scores"], b.ensemble["scores"])
    assert [c.name for c in a.candidates] == [c.name for c in b.candidates]
    for ca, cb in zip(a.candidates, b.candidates):
        assert same(ca.figures, cb.figures) and ca.params == cb.params
        assert np.array_equal(ca.scores, cb.scores)
        assert (ca.quality is None) == (cb.quality is None)
        assert ca.quality is None or np.array_equal(ca.quality, cb.quality)


def test_a_memo_keeps_nothing_it_cannot_name_and_hands_back_copies():
    from fugu_pipeline.policies.oneshot.reuse import PredictionMemo

    memo = PredictionMemo()
    calls = []
    preds = lambda: (calls.append(1), {"x": (np.zeros(3), np.ones(3))})[1]  # noqa: E731
    memo.get(None, preds)
    memo.get(None, preds)
    assert len(calls) == 2 and memo.kept == 0  # unnamed inputs: always computed
    first, kept = memo.get(["a", np.arange(3)], preds)
    again, kept_again = memo.get(["a", np.arange(3)], preds)
    other, kept_other = memo.get(["a", np.arange(3).astype(np.float64)], preds)  # same values, another dtype
    assert (kept, kept_again, kept_other) == (False, True, False) and len(calls) == 4
    again["x"][1][:] = 7  # what was handed back is the caller's own
    assert np.array_equal(memo.get(["a", np.arange(3)], preds)[0]["x"][1], np.ones(3))
