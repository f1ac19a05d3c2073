"""The cross-encoder verifier: a pair keeps the end of the question and of the reply; every pair is
scored by a model that never saw its fold (a model that memorises its training pairs shows it); the
verifier keeps the column only when it lowers its out-of-fold log-loss; `auto` falls back in one
line; a saved cascade reads its cross-encoder live as offline and refuses a changed one. A tiny BERT
built here stands in for the encoder (no network)."""

from __future__ import annotations

import json

from types import SimpleNamespace

import numpy as np
import pytest

from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.cross_encoder import CROSS_FILE, CROSS_STAT, CrossEncoderConfig, cross_fit, load_base, tokenize
from fugu_pipeline.policies.cascade.cross_encoder_use import (
    CrossColumn,
    cross_encoder_files,
    cross_encoder_step,
    load_model,
    verifier_oof,
)
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.policies.cascade.verifier import auc
from fugu_pipeline_tests import cascade_fixture
from fugu_pipeline_tests.cross_encoder_fixture import tiny_bert

WORDS = [f"zq{k}x{v}" for k, v in enumerate(np.random.default_rng(7).integers(10**5, size=120))]  # one unseen word per memorisation pair
SERVE_PROMPTS = [f"What is {i} + {i % 7}?" for i in range(60)]
SERVE_REPLIES = [f"{i} + {i % 7} = {i + i % 7 + d}. #### {i + i % 7 + d}" for i in range(60) for d in range(4)]
CORPUS = ([f"question {w} pick one" for w in WORDS] + [f"the answer is {w}" for w in WORDS] + SERVE_PROMPTS + SERVE_REPLIES
          + ["Which of these is a fruit? (A) hammer (B) apple (C) river (D) cloud. The answer is (B) apple."])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"), CORPUS, hidden=64)


def _cfg(tiny, **kw) -> CrossEncoderConfig:
    return CrossEncoderConfig(model=str(tiny), device="cpu", threads=1, **{"train_layers": 2, **kw})


def test_a_pair_keeps_the_end_of_the_question_and_of_the_reply(tiny):
    base = load_base(str(tiny), "cpu")
    prompt = "pick one " * 40 + "Which of these is a fruit? (A) hammer (B) apple (C) river (D) cloud."
    reply = "the answer is " * 40 + "The answer is (B) apple."
    ids, types = tokenize(base, [prompt], [reply], 32)[0]
    text = base.tokenizer.decode(ids)
    assert len(ids) == 32 and text.startswith("[CLS]") and text.count("[SEP]") == 2
    first, second = text.removeprefix("[CLS]").split("[SEP]")[:2]
    assert first.strip().endswith("( d ) cloud.") and second.strip().endswith("the answer is ( b ) apple.")
    assert "pick one pick one pick one" not in first  # the start of the long question was cut, not its end
    assert abs((np.asarray(types) == 0).sum() - (np.asarray(types) == 1).sum()) <= 1  # both long: the budget halves


def test_cross_fitting_never_scores_a_pair_with_a_model_trained_on_it(tiny):
    """Random labels on pairs that each hold a word of their own: a model trained on a pair memorises
    it (AUC near 1 on its own training pairs), so a pair scored by such a model would show it; out
    of fold there is nothing to learn (AUC near 0.5)."""
    from fugu_pipeline.policies.cascade.cross_encoder import frozen_states, logits, train_top

    y = np.random.default_rng(1).integers(0, 2, len(WORDS)).astype(float)
    prompts, replies = [f"question {w} pick one" for w in WORDS], [f"the answer is {w}" for w in WORDS]
    folds = np.arange(len(WORDS)) % 5
    cfg = _cfg(tiny, epochs=40, lr=3e-3, head_lr=1e-2, batch_size=20, folds=2)
    base = load_base(str(tiny), "cpu")
    fit = cross_fit(base, prompts, replies, y, folds, cfg, seed=0, log=lambda m: None)
    assert auc(fit.raw, y >= 0.5) < 0.75, f"out-of-fold AUC {auc(fit.raw, y >= 0.5):.3f} on random labels"
    for g, trained in fit.trained_on.items():  # no scored pair among its model's training pairs; folds whole
        assert not set(trained) & set(np.flatnonzero(fit.groups == g))
    assert all(len(set(fit.groups[folds == f])) == 1 for f in range(5))
    states = frozen_states(base, tokenize(base, prompts, replies, cfg.max_length), cfg.train_layers)
    own = train_top(base, states, y, np.arange(len(y)), cfg, seed=1)  # the same fit, scoring its training pairs
    assert auc(logits(base, own, states, np.arange(len(y))), y >= 0.5) > 0.9


def test_the_verifier_keeps_the_column_only_when_it_clearly_lowers_the_out_of_fold_log_loss():
    data, grid, inputs = cascade_fixture.make(n=300, signal=0.3)
    folds, rng = np.arange(300) % 5, np.random.default_rng(2)
    fit = SimpleNamespace(seconds=1.0, figures={"pairs": 900}, cfg=CrossEncoderConfig())
    lines = []
    telling = CrossColumn(1.0 * (2 * inputs.target - 1) + rng.normal(size=inputs.target.shape), fit)
    _, _, fig, used, kept = verifier_oof(inputs, folds, telling, lines.append)
    assert kept is fit and used.stat_names[-1] == CROSS_STAT and fig["cross_encoder"]["used"]
    assert fig["oof_auc"] > fig["cross_encoder"]["without"]["oof_auc"] + 0.05 and ": kept (" in lines[-1]
    dear = SimpleNamespace(seconds=1.0, figures={}, cfg=CrossEncoderConfig(min_gain=1.0))  # a gain below the least kept
    assert verifier_oof(inputs, folds, CrossColumn(telling.values, dear), lines.append)[4] is None
    assert "left out, no clear gain" in lines[-1] and "least kept 1)" in lines[-1]
    noise = CrossColumn(rng.normal(size=inputs.target.shape), fit)
    _, _, fig, used, kept = verifier_oof(inputs, folds, noise, lines.append)
    assert kept is None and used is inputs and not fig["cross_encoder"]["used"] and "left out, no clear gain" in lines[-1]


def test_auto_falls_back_in_one_line_and_on_refuses_a_missing_encoder(tiny, tmp_path):
    from fugu_pipeline.features.routing_data import TrainingDataError

    data, grid, _ = cascade_fixture.make(n=60)
    rows, folds = np.arange(60), np.arange(60) % 5
    lines = []
    step = cross_encoder_step(CascadeConfig(cross_encoder_fit=_cfg(tiny, min_pairs=1000)), data, grid, 0, lines.append)
    assert step(rows, folds) is None
    assert lines == ["cascade: cross-encoder not used: 180 (prompt, reply) pairs on the non-test rows, fewer than "
                     "cascade.cross_encoder_fit.min_pairs (1000); set cascade.cross_encoder: on to use it anyway; the "
                     "verifier reads what it read without it"]
    missing = CrossEncoderConfig(model=str(tmp_path / "no-such-model"))
    lines.clear()
    assert cross_encoder_step(CascadeConfig(cross_encoder_fit=missing), data, grid, 0, lines.append) is None
    assert len(lines) == 1 and "cannot be loaded" in lines[0] and "no-such-model" in lines[0]
    with pytest.raises(TrainingDataError, match="cascade.cross_encoder is on.*no-such-model"):
        cross_encoder_step(CascadeConfig(cross_encoder="on", cross_encoder_fit=missing), data, grid, 0, lines.append)
    assert cross_encoder_step(CascadeConfig(cross_encoder="off", cross_encoder_fit=missing), data, grid) is None


def test_auto_leaves_out_a_fit_that_would_take_longer_than_allowed_and_on_fits_it(tiny):
    """Timed on a sample's pass through the frozen layers, before the whole pass and any fine-tune:
    under `auto` a fit estimated over `max_minutes` is not used, in one line naming the setting; `on`
    fits it whatever it takes, and the estimate is said before the fine-tunes."""
    data, grid, _ = cascade_fixture.make(n=60)
    rows, folds = np.arange(60), np.arange(60) % 5
    lines = []
    tight = _cfg(tiny, train_layers=1, epochs=1, folds=2, min_pairs=1, max_minutes=1e-9)  # a layer left frozen to time
    assert cross_encoder_step(CascadeConfig(cross_encoder_fit=tight), data, grid, 0, lines.append)(rows, folds) is None
    said = [x for x in lines if "not used" in x]
    assert len(said) == 1 and said[0].startswith("cascade: cross-encoder not used: its fine-tunes would take about ")
    assert "more than cascade.cross_encoder_fit.max_minutes (1e-09)" in said[0] and "train where a GPU is" in said[0]
    assert "(timed on 180 of its 180 pairs through the frozen layers: about " in said[0]
    assert not any("pairs tokenised and through the frozen layers in" in x for x in lines)  # left out before the whole pass
    lines.clear()
    got = cross_encoder_step(CascadeConfig(cross_encoder="on", cross_encoder_fit=tight), data, grid, 0, lines.append)(rows, folds)
    assert isinstance(got, CrossColumn) and not any("not used" in x for x in lines)
    assert any("the fine-tunes will take about" in x for x in lines)
    loose = _cfg(tiny, train_layers=1, epochs=1, folds=2, min_pairs=1, max_minutes=None)
    assert isinstance(cross_encoder_step(CascadeConfig(cross_encoder_fit=loose), data, grid, 0)(rows, folds), CrossColumn)


def test_the_fit_estimate_is_the_frozen_pass_scaled_by_the_layers_epochs_and_folds():
    """Two measured fits on this CPU (MiniLM, top 2 of 6 layers, 6 epochs, 5 folds): the estimate of
    the cross-fit's four fold-units (the final model's fifth left out) is within 5% of each."""
    from fugu_pipeline.policies.cascade.cross_encoder import fit_estimate

    cfg = CrossEncoderConfig(train_layers=2, epochs=6, folds=5)
    for frozen_s, measured_s in ((11, 499), (27, 1183)):
        assert abs(fit_estimate(frozen_s, 4, cfg) * 4 / 5 - measured_s) <= 0.05 * measured_s
    assert fit_estimate(11, 0, cfg) is None  # every layer fine-tuned: nothing frozen to time


def test_two_fits_with_one_seed_give_the_same_scores_and_another_seed_others(tiny):
    prompts, replies = SERVE_PROMPTS[:30], [f"{i} + {i % 7} = {i + i % 7}. #### {i + i % 7}" for i in range(30)]
    y = (np.arange(30) % 3 == 0).astype(float)
    base, cfg = load_base(str(tiny), "cpu"), _cfg(tiny, epochs=2, folds=2)
    a, b, c = (cross_fit(base, prompts, replies, y, np.arange(30) % 5, cfg, seed=s, log=lambda m: None).raw for s in (0, 0, 1))
    assert np.array_equal(a, b) and not np.allclose(a, c)


def test_a_bare_yaml_on_or_off_is_the_word_not_a_boolean(tmp_path):
    from fugu_pipeline.config_files import load_config
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig

    (tmp_path / "train.yaml").write_text("cascade:\n  enabled: on\n  cross_encoder: off\n")
    cc = load_config(tmp_path / "train.yaml", TrainSetConfig).cascade
    assert (cc.enabled, cc.cross_encoder) == ("on", "off")


@pytest.fixture(scope="module")
def final(tiny):
    """A cross-encoder fitted on the serving prompts' replies (right: the sum; wrong: off by one or more)."""
    prompts = [SERVE_PROMPTS[k // 4] for k in range(len(SERVE_REPLIES))]
    y = np.array([float(k % 4 == 0) for k in range(len(SERVE_REPLIES))])
    cfg = _cfg(tiny, epochs=2, folds=2)
    return cross_fit(load_base(str(tiny), "cpu"), prompts, SERVE_REPLIES, y, np.arange(len(y)) % 5, cfg,
                     log=lambda m: None).final()


def test_a_saved_cross_encoder_loads_as_it_was_and_refuses_a_changed_file_or_another_encoder(tiny, final, tmp_path):
    params, write = cross_encoder_files(final)
    contract = params["cross_encoder"]
    write(tmp_path)
    prompts, replies = ["What is 3 + 3?", "What is 9 + 2?"], ["3 + 3 = 6. #### 6", "9 + 2 = 12. #### 12"]
    assert np.allclose(load_model(tmp_path, contract).score(prompts, replies), final.score(prompts, replies), atol=1e-5)
    other = tiny_bert(tmp_path / "other", CORPUS, seed=1, hidden=64)
    with pytest.raises(CheckpointError, match="fine-tuned from .* with identity .* but that encoder here is"):
        load_model(tmp_path, {**contract, "model": str(other)})
    with pytest.raises(CheckpointError, match="truncation 'head-only'"):
        load_model(tmp_path, {**contract, "truncation": "head-only"})
    (tmp_path / CROSS_FILE).write_bytes((tmp_path / CROSS_FILE).read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="does not match the manifest's cross_encoder.sha256"):
        load_model(tmp_path, contract)
    (tmp_path / CROSS_FILE).unlink()
    with pytest.raises(CheckpointError, match="cross_encoder.safetensors is missing"):
        load_model(tmp_path, contract)


def test_a_served_cascade_reads_its_cross_encoder_as_offline_scoring_does(final, tmp_path):
    """The checkpoint's verifier reads the cross-encoder's column: live (`CascadeRouter.verify`, one
    request's replies) and offline (`with_saved_cross` over the recorded replies) give the same
    scores; a pack refuses it (it would travel without its weights file); a changed weights file is
    refused when the router loads."""
    from fugu_pipeline.policies.cascade.evaluate import load_cascade, verifier_scores
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.matrix.answers import AnswerGrid
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.tasks.final_answer import extract
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint
    from fugu_pipeline.policies.cascade.cross_encoder_use import with_saved_cross
    from fugu_pipeline.policies.cascade.fit import answer_inputs

    path = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", cross=final)
    ckpt = load_cascade(path)
    assert ckpt.head.answer_stats[-1] == CROSS_STAT and ckpt.head.cross_encoder["sha256"]
    router = load_router(path, device="cpu")
    prompts = ["What is 4 + 4?", "What is 12 + 5?"]
    replies = np.array([["4 + 4 = 8. #### 8", "4 + 4 = 9. #### 9", "#### 8"],
                        ["12 + 5 = 17. #### 17", "12 + 5 = 18. #### 18", "12 + 5 = 17. #### 17"]], dtype=object)
    finals = np.vectorize(lambda r: extract(r, "number"), otypes=[object])(replies)
    workers = ckpt.manifest.worker_ids
    live = [router.verify(p, "general", [(w, replies[i, j], finals[i, j]) for j, w in enumerate(workers)])
            for i, p in enumerate(prompts)]
    settings = EncoderSettings(model="tiny", device="cpu", dtype="float32")
    enc = Encoder.load(settings)
    data = SimpleNamespace(task_ids=["a", "b"], prompts=prompts, worker_ids=workers, features=enc.encode(prompts, None),
                           quality=None, dim=enc.dim)
    enc.close()
    grid = AnswerGrid(["a", "b"], workers, replies, ["number"] * 2, finals, "t")
    plain = [n for n in ckpt.head.answer_stats if n != CROSS_STAT]
    inputs = with_saved_cross(ckpt, data, grid, answer_inputs(data, grid, settings, tmp_path / "emb", stat_names=plain))
    assert np.allclose(verifier_scores(ckpt.head, inputs), np.array(live, float), atol=1e-5)
    assert len({round(s, 6) for s in live[0]}) == 3  # the replies are told apart
    # a pack carries the cross-encoder beside the weights, signed with them; the pack folder serves
    # the same scores; a cross-encoder changed in the pack after signing is named by the signature
    # gate, and one missing by preflight's files gate
    from fugu_pipeline.evaluate.contest_entry import signature_check
    from fugu_pipeline.evaluate.gates import GateConfig
    from fugu_pipeline.evaluate.preflight import preflight
    from fugu_pipeline.train.exchange import pack
    from fugu_pipeline.train.signing import accept_key, new_key_pair

    private, public = new_key_pair()
    host = tmp_path / "host"
    accept_key(host, "alice", public)
    packed = pack(path, tmp_path / "pack", submitter="alice", signing_key=private)
    assert (packed / CROSS_FILE).read_bytes() == (path / CROSS_FILE).read_bytes()
    gate, signer, _ = signature_check(packed, host, GateConfig())
    assert gate.ok and signer[0] == "alice" and CROSS_FILE in json.loads((packed / "signature.json").read_text())["files"]
    served = load_router(packed, device="cpu")
    again = [served.verify(p, "general", [(w, replies[i, j], finals[i, j]) for j, w in enumerate(workers)])
             for i, p in enumerate(prompts)]
    served.close()
    assert np.allclose(np.array(again, float), np.array(live, float), atol=1e-6)
    blob = (packed / CROSS_FILE).read_bytes()
    (packed / CROSS_FILE).write_bytes(blob[:-4] + b"\0\0\0\0")
    gate, _, _ = signature_check(packed, host, GateConfig())
    assert not gate.ok and f"{CROSS_FILE} changed after signing" in gate.reason, gate.reason
    (packed / CROSS_FILE).unlink()
    files = [g for g in preflight(packed, host, GateConfig()).gates if g.name == "files"]
    assert any(not g.ok and f"missing {CROSS_FILE} (the manifest names it)" in g.reason for g in files), files
    (path / CROSS_FILE).write_bytes(b"changed")
    with pytest.raises(CheckpointError, match="does not match the manifest's sha256 for it"):
        pack(path, tmp_path / "pack2")
    from fugu_pipeline.policies.cascade.cross_encoder_use import _LOADED

    _LOADED.clear()
    with pytest.raises(CheckpointError, match="cross_encoder.sha256"):
        load_router(path, device="cpu")


def test_auto_layers_and_epochs_follow_the_device():
    """`auto`: the top 2 layers on a CPU, every layer on a GPU, for 6 epochs (2 underfit on a CPU: the
    synthetic four-option set read at AUC 0.600 against 0.967); a number given is kept on both."""
    from fugu_pipeline.policies.cascade.cross_encoder import resolved

    cpu, gpu = resolved(CrossEncoderConfig(), "cpu"), resolved(CrossEncoderConfig(), "cuda:0")
    assert (cpu.train_layers, cpu.epochs) == (2, 6) and (gpu.train_layers, gpu.epochs) == (64, 6)
    mine = CrossEncoderConfig(train_layers=1, epochs=3)
    assert (resolved(mine, "cuda").train_layers, resolved(mine, "cpu").epochs) == (1, 3)
