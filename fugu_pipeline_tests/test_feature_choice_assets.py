"""The assets choose features as `fugu-lite train` does, and every checkpoint is scored and served
on its own features.

`router_heads` takes `layer_sets` and `prompt_rules` (config; `fugu-lite pipeline --layer-sets`),
calls the same core as the command line (`train/feature_choice.py:fit_choosing_features`), and so
saves the same heads byte for byte. A head whose contract differs from the pipeline's encoder
settings (other layers) is evaluated, promoted and served on its own features; a king on other
features is still scored in the contest instead of being skipped.
"""

from __future__ import annotations

import json
import re

import dagster as dg
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.defs.assemble import build_defs
from fugu_pipeline.features.parity import encoder_batch_invariance
from fugu_pipeline_tests.conftest import ONE_POINT_HEADS, short_training
from fugu_pipeline_tests.parity_checks import assert_vector_parity

NOT_HEADS = {"sft", "rl", "es", "triage", "roles", "cascade"}  # models/<kind>/ folders of no one-step head of the set


@pytest.fixture
def proj(project, monkeypatch):
    # the shipped head set on 3 folds (features: the shipped choice); no cascade: these
    # tests are about the one-step heads' features (models/cascade/ is left out of every comparison)
    short_training(project, cascade=False)
    monkeypatch.chdir(project)
    monkeypatch.setenv("DAGSTER_HOME", str(project))
    return project


def manifests(folder):
    return {p.parent: json.loads(p.read_text()) for p in folder.glob("*/*/manifest.json") if p.parent.parent.name != "promoted"}


def layers_of(manifest) -> list[int]:
    layer = manifest["feature_contract"]["layer"]
    return layer if isinstance(layer, list) else [layer]


def materialize(proj, keys: list[str], heads_config: dict | None = None) -> None:
    """Materialize `keys` of the project's definitions on its own instance (DAGSTER_HOME, the
    fixture's), as the UI's launchpad would: one run, `heads_config` as router_heads' run config.
    The steps before them come from the main job run earlier (their outputs in the instance's
    storage); SFT, RL and CMA-ES, which these tests check nothing of, are not retrained."""
    defs = build_defs(str(proj), None, "tiny")
    with dg.DagsterInstance.get() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey(k) for k in keys],
            run_config={"ops": {"router_heads": {"config": heads_config}}} if heads_config else None)
    assert res.success


@pytest.mark.slow
def test_router_heads_chooses_layer_sets_like_fugu_lite_train(proj, capsys):
    # the matrix and its embeddings by the main job, then router_heads with the layer settings as its
    # config (what `fugu-lite pipeline --layer-sets` passes it; the flag itself is the next test's)
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", "task_embeddings"]) == 0
    materialize(proj, ["router_heads"], {"layer_sets": ["-1", "-1 1"]})
    asset = {p: m for p, m in manifests(proj / "models").items() if p.parent.name not in NOT_HEADS}
    assert asset
    for m in asset.values():  # the choice is recorded in every head of the set
        choice = m["metrics"]["layer_choice"]
        assert set(choice["val_score"]) == {"layers [-1]", "layers [-1, 1]"}
        assert layers_of(m) == json.loads(choice["chosen"].removeprefix("layers "))
    capsys.readouterr()
    assert main(["train", "--data", "data/reward_matrix.duckdb", "--encoder", "tiny", "--device", "cpu",
                 "--layer-sets", "-1", "-1 1", "--output", "cli-models"]) == 0
    cli = {p: m for p, m in manifests(proj / "cli-models").items() if p.parent.name not in NOT_HEADS}
    assert cli
    by_name = {p.name: p for p in asset}
    for path, m in cli.items():  # same core, same settings: the same heads, byte for byte
        twin = by_name[path.name]
        assert (path / "head.safetensors").read_bytes() == (twin / "head.safetensors").read_bytes()
        for key in ("created_at", "wall_s"):
            m.pop(key), asset[twin].pop(key)
        assert m == asset[twin]
        # and the same budget calibration beside each quality head (serve --budget-share reads it)
        assert (path / "budget.json").exists() == (twin / "budget.json").exists()
        if (path / "budget.json").exists():
            assert (path / "budget.json").read_bytes() == (twin / "budget.json").read_bytes()
    assert any((p / "budget.json").exists() for p in asset)


@pytest.mark.slow
def test_a_head_on_other_layers_is_evaluated_promoted_and_served_on_its_own_features(proj, capsys):
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.train.pointer import pointer_target, read_pointer

    # one-step heads only (a cascade reads answers, not features: it could take the router slot here)
    assert "enabled: 'off'" in (proj / "configs" / "train.yaml").read_text()  # the fixture's: no cascade
    # one setting, other than the encoder resource's (layer -1): the heads' contract differs from the pipeline's
    # up to the promotion (the triage head after it is checked by its own tests)
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--layer-sets", "-1 1",
                 "--stop-after", "promoted_router"]) == 0
    out = capsys.readouterr().out
    heads = [p for p in manifests(proj / "models") if p.parent.name not in NOT_HEADS]
    assert heads and all(layers_of(json.loads((p / "manifest.json").read_text())) == [-1, 1] for p in heads)
    # each head's report was written on its own features (the pipeline's would not even load into it)
    selected = next(p for p in heads if (p / "reports" / "test.json").exists())
    rep = json.loads((selected / "reports" / "test.json").read_text())
    assert rep["router_utility"] > rep["best_fixed_utility"]
    assert "heads: router" in out
    pointer = read_pointer(proj / "models")
    assert pointer is not None, out
    king = pointer_target(proj / "models", pointer)
    history = [json.loads(line) for line in (proj / "models" / "promoted" / "history.jsonl").read_text().splitlines()]
    decided = history[-1]
    assert any(r.startswith("PASS feature contract: the serving encoder computes") for r in decided["reasons"]), decided

    # serving computes the king's own features: the vectors its training read from the cache
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.route.router import encoder_settings_for
    from fugu_pipeline.train.checkpoints import load_checkpoint

    manifest = load_checkpoint(king).manifest
    assert layers_of(json.loads((king / "manifest.json").read_text())) == [-1, 1]
    cached, _ = load_routing_data(proj / "data" / "reward_matrix.duckdb",
                                  LazyEncoder(encoder_settings_for(manifest.feature_contract, "cpu", manifest.metrics["feature_dtype"])),
                                  proj / "data" / "embeddings")
    test = cached.split("test")
    router = Router.load(king, device="cpu")
    try:
        served = router.encoder.encode(test.prompts, list(test.domains))
        texts = router.encoder.settings.format(test.prompts, list(test.domains))
        assert_vector_parity(served, test.features, router.encoder.resolved_dtype,
                             lambda: encoder_batch_invariance(router.encoder, texts))
        routes = [d.worker_id for d in router.route_batch(test.prompts, list(test.domains))]
        # the asset wrote the budget calibration beside it: the promoted head routes under a cap
        from fugu_pipeline.route.budget import Budget

        # (in dollars: the mock pool's strongest worker by pooled quality is its cheap generalist)
        capped = router.route_batch(test.prompts[:8], list(test.domains[:8]), budget=Budget(usd_per_1k=5.0))
        assert all(d.worker_id in manifest.worker_ids for d in capped)
    finally:
        router.close()
    assert set(routes) <= set(manifest.worker_ids)

    # `fugu-lite evaluate` of a head on the pipeline's features scores that king on its own features too
    sft = next((proj / "models" / "sft").iterdir())
    assert main(["evaluate", "--checkpoint", str(sft), "--data", "data/reward_matrix.duckdb", "--device", "cpu",
                 "--models-dir", "models", "--output", "sft-report.json"]) == 0
    composite = json.loads((proj / "sft-report.json").read_text())["composite"]
    assert composite["king"] is not None and "other features" not in composite["king_note"], composite["king_note"]

    # a later run on the pipeline's own features: the king (layers [-1, 1]) is scored in the contest,
    # on its features, not skipped as "other features"
    (proj / "configs" / "promotion.yaml").write_text("gates:\n  rate_limit_s: 0\n")  # a second attempt today
    # (the heads, the cascade that competes with them, their reports and the promotion: the SFT, RL and
    # CMA-ES challengers are the first run's)
    capsys.readouterr()
    materialize(proj, ["router_heads", "router_cascade", "eval_report_heads", "eval_report_cascade", "promoted_router"])
    last = [json.loads(line) for line in (proj / "models" / "promoted" / "history.jsonl").read_text().splitlines()][-1]
    text = "\n".join(last["reasons"])
    assert "other features" not in text and "cannot be scored" not in text, text
    assert last.get("contest") and last["contest"]["king"] is not None, last


@pytest.mark.slow
def test_bad_layer_sets_are_refused_before_any_work(proj, capsys):
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--layer-sets", "-1", "top"]) == 2
    assert "--layer-sets 'top'" in capsys.readouterr().err
    assert not (proj / "data" / "reward_matrix.duckdb").exists()  # refused before the graph ran
    # through the launchpad: the asset's config, a Failure that names the field
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", "task_embeddings"]) == 0
    defs = build_defs(str(proj), None, "tiny")
    with dg.instance_for_test() as instance:
        res = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance, asset_selection=[dg.AssetKey("router_heads")], raise_on_error=False,
            run_config={"ops": {"router_heads": {"config": {"layer_sets": ["-1", ""]}}}})
    assert not res.success
    failure = next(e for e in res.all_events if e.is_step_failure)
    assert "layer_sets an empty setting" in str(failure.event_specific_data.error)
    assert not list((proj / "models").glob("*/*/manifest.json"))  # nothing half-saved


# ----------------------------------------------------------------- one forward pass for several layer settings

PROMPTS = [f"Question {i}: what is {i} * {i + 3}?" + " Explain." * (i % 7) for i in range(40)] + ["", "x" * 3000, "é漢字🙂 odd"]


def _settings(layers, **over):
    from fugu_pipeline.features.settings import EncoderSettings

    return EncoderSettings(model="tiny", device="cpu", dtype="float32", layer=layers, lexical=True, **over)


def test_layer_sets_are_encoded_once_and_equal_separate_runs(tmp_path):
    """Within the tolerance, and bit for bit where this machine's kernels give it."""
    from fugu_pipeline.features.cache import embed_layer_sets, embed_prompts
    from fugu_pipeline.features.encoder import Encoder

    sets = [_settings(-1), _settings((-1, 1)), _settings((2, -1))]
    domains = ["math"] * len(PROMPTS)
    # part of one setting is cached already: only the rest is encoded, and only once
    embed_prompts(PROMPTS[:10], domains[:10], sets[0], tmp_path / "one")
    n = embed_layer_sets(PROMPTS, domains, sets, tmp_path / "one", chunk_size=16)
    assert n == len(set(PROMPTS))  # the other settings missed every prompt
    assert embed_layer_sets(PROMPTS, domains, sets, tmp_path / "one") == 0  # all cached now: no model load
    for s in sets:
        shared = embed_prompts(PROMPTS, domains, s, tmp_path / "one")
        alone = embed_prompts(PROMPTS, domains, s, tmp_path / f"alone-{s.fingerprint('float32', 'x')}")
        assert shared.n_computed == 0 and alone.n_computed == len(set(PROMPTS))
        assert shared.fingerprint == alone.fingerprint and shared.contract == alone.contract
        assert_vector_parity(shared.vectors, alone.vectors, "float32",
                             lambda: encoder_batch_invariance(Encoder.load(s), s.format(PROMPTS, domains)))
    with pytest.raises(ValueError, match="differ only in their layers"):
        embed_layer_sets(PROMPTS, domains, [_settings(-1), _settings(-1, pooling="last")], tmp_path / "two")


def test_an_interrupted_layer_sets_pass_keeps_its_finished_chunks(tmp_path, monkeypatch):
    from fugu_pipeline.features.cache import EmbeddingCache, embed_layer_sets
    from fugu_pipeline.features.encoder import Encoder, LazyEncoder

    real, calls = Encoder.encode_texts, []

    def dies_on_the_second_chunk(self, texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, texts)

    monkeypatch.setattr(Encoder, "encode_texts", dies_on_the_second_chunk)
    sets = [_settings(-1), _settings((-1, 1))]
    with pytest.raises(KeyboardInterrupt):
        embed_layer_sets(PROMPTS, None, sets, tmp_path, chunk_size=8)
    for s in sets:
        assert len(EmbeddingCache(tmp_path, LazyEncoder(s).fingerprint)) == 8  # the first chunk, in both caches
    monkeypatch.setattr(Encoder, "encode_texts", real)
    assert embed_layer_sets(PROMPTS, None, sets, tmp_path, chunk_size=8) == len(set(PROMPTS)) - 8


@pytest.mark.slow
def test_fugu_lite_train_encodes_layer_sets_in_one_pass(proj, capsys):
    with (proj / "configs" / "train.yaml").open("a") as fh:  # the encoder's passes are checked, not the heads: the
        fh.write(ONE_POINT_HEADS)                            # smallest grid (the flags below set the features)
    assert main(["pipeline", "--project-dir", str(proj), "--encoder", "tiny", "--stop-after", "reward_matrix"]) == 0
    capsys.readouterr()
    assert main(["train", "--data", "data/reward_matrix.duckdb", "--encoder", "tiny", "--device", "cpu",
                 "--layer-sets", "-1", "-1 1", "--prompt-rules", "off", "--output", "m"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"features: \d+ prompts encoded once for 2 layer settings", err), err
    assert err.count("features: 300 cached, 0 encoded") == 2, err  # each setting then reads the cache


# ----------------------------------------------------------------- features: in configs/train.yaml

def test_the_features_block_resolves_the_same_for_the_command_line_and_the_asset(tmp_path):
    from fugu_pipeline.policies.oneshot.configs import FeatureChoiceConfig, TrainSetConfig
    from fugu_pipeline.config_files import ConfigError, load_config
    from fugu_pipeline.train.feature_choice import LayerSetError, heads_features

    base = _settings(-1).model_copy(update={"lexical": False})
    cfg = FeatureChoiceConfig()
    settings, sets, rules = heads_features(base, cfg)
    assert sets == [(-1,), (-1, 1)] and rules == "auto" and settings.lexical is True  # tiny: 2 layers, middle 1
    # flags / run config override the file; --layers (or a resource reading other layers) means no choice
    assert heads_features(base, cfg, lexical=True, layer_sets=["off"], prompt_rules="off")[1:] == (None, "off")
    assert heads_features(base, cfg, lexical=False)[0].lexical is False
    assert heads_features(base, cfg, layer_sets=["-1", "-1 2"])[1] == [(-1,), (-1, 2)]
    assert heads_features(_settings((-1, 1)), cfg)[1] is None
    assert heads_features(base, FeatureChoiceConfig(layer_sets=[[-2], [-1, 1]]))[1] == [(-2,), (-1, 1)]
    with pytest.raises(LayerSetError, match="'top'"):
        heads_features(base, cfg, layer_sets=["-1", "top"])
    # a bad file names the field
    for text in ("features:\n  layer_sets: [[]]\n", "features:\n  layer_sets: sometimes\n", "features:\n  lexcal: true\n"):
        (tmp_path / "t.yaml").write_text(text)
        with pytest.raises(ConfigError, match="features"):
            load_config(tmp_path / "t.yaml", TrainSetConfig)


def test_the_stripped_prompts_of_every_layer_setting_are_encoded_in_one_pass_too(tmp_path, capsys):
    """--prompt-rules auto with several layer settings: the rules are fitted on the training text,
    which the layers do not change, so the stripped prompts are prefilled in one pass as well and
    every fit then reads the cache."""
    import random

    from fugu_pipeline_tests.test_features_real_flow import prompts

    rnd = random.Random(0)
    rows = []
    for i, p in enumerate(prompts(60) + [f"Write code number {i} that sorts a list." for i in range(60)]):
        d = "mc" if i < 60 else "code"
        rows.append({"task_id": f"t{i}", "prompt": p, "domain": d, "split": ("train", "train", "val", "test")[i % 4],
                     "worker_ids": ["a", "b"], "quality": [int(rnd.random() < 0.6), int(rnd.random() < 0.5)]})
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "q.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    assert main(["train", "--data", str(tmp_path / "r.jsonl"), "--workers", str(tmp_path / "q.yaml"), "--encoder", "tiny",
                 "--device", "cpu", "--layer-sets", "-1", "-1 1", "--prompt-rules", "auto", "--cache-dir", str(tmp_path / "emb"),
                 "--work-dir", str(tmp_path / "w"), "--output", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert len(re.findall(r"features: \d+ prompts encoded once for 2 layer settings", err)) == 2, err  # plain, stripped
    assert "prompt rules on validation" in err  # the stripped variant was fitted
    loads = re.findall(r"features: \d+ cached, (\d+) encoded", err)
    assert len(loads) >= 4 and set(loads) == {"0"}, err
