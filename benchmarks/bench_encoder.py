"""Benchmark the task-embedding path (a script, not a test). Prints measured figures only.

For each model (the built-in tiny Qwen3, and a model with Qwen3-0.6B's shapes and random
weights) and each dtype, on prompts of mixed lengths:

  - prompts/s of `embed_prompts` (cold cache: tokenise, bucket, forward, pool, write the cache)
    vs a bare `transformers` forward over the same prompts in the same batches (aim: ratio >= 0.9);
  - the FLOP rate achieved on real tokens (2 x non-embedding params x tokens + attention)
    vs this machine's measured matmul peak in the same dtype (aim: >= 60%);
  - the speed-up of length bucketing over naive batching (random order, padded to the batch
    max, same number of batches) (aim: >= 1.5x);
  - a fully cached `embed_prompts` call (no forward pass) and the peak RSS.

Each batch is timed best of `--repeats`, the three methods interleaved, so a burst of load from
another process distorts all of them alike, or none.

    python benchmarks/bench_encoder.py                       # CPU: tiny + 0.6B-shaped, ~3 min
    python benchmarks/bench_encoder.py --models qwen3-0.6b-shaped --device cuda \\
        --dtypes bfloat16 --n-prompts 1000 --max-tokens 512 --token-budget 16384

The 0.6B-shaped model reads the tiny model's tokenizer (ids < 2048): its weights are random, so
only the token counts matter.
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fugu_pipeline.features.cache import embed_prompts  # noqa: E402
from fugu_pipeline.features.encoder import Encoder, plan_batches  # noqa: E402
from fugu_pipeline.features.settings import EncoderSettings, cpu_has_native_bf16
from fugu_pipeline.features.tiny import (  # noqa: E402
    CORPUS,
    ensure_tiny_encoder,
    qwen3_0_6b_shaped_config,
)

DEFAULT_N = {"tiny": 512, "qwen3-0.6b-shaped": 16}
DEFAULT_REPEATS = {"tiny": 3, "qwen3-0.6b-shaped": 2}
GPU_HINT = ("1,000 prompts through the Qwen3-0.6B-shaped model in bf16 on a GPU:\n"
            "  python benchmarks/bench_encoder.py --models qwen3-0.6b-shaped --device cuda "
            "--dtypes bfloat16 --n-prompts 1000 --min-tokens 16 --max-tokens 512 --token-budget 16384")


def timed(fn) -> np.ndarray:
    """[wall seconds, CPU seconds per torch thread]. When other processes share the CPU the wall
    time swells; CPU time is less sensitive (threads spin-waiting still inflate it), so figures
    are printed both ways."""
    import torch

    w, c = time.perf_counter(), time.process_time()
    fn()
    return np.array([time.perf_counter() - w, (time.process_time() - c) / torch.get_num_threads()])


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_prompts(tokenizer, n: int, lo: int, hi: int, seed: int = 0) -> list[str]:
    """n prompts of log-uniform token lengths in [lo, hi], cut from a random word stream."""
    rng = random.Random(seed)
    words = CORPUS.split()
    prompts = []
    for _ in range(n):
        target = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        ids = tokenizer(" ".join(rng.choice(words) for _ in range(target)), add_special_tokens=False)["input_ids"]
        prompts.append(tokenizer.decode(ids[:target]))
    return prompts


def matmul_peak(dtype_name: str, device: str) -> np.ndarray:
    """Best FLOP/s of a large square matmul in this dtype: [by wall time, by CPU time per thread]."""
    import torch

    n = 8192 if device.startswith("cuda") else 2048
    dt = getattr(torch, dtype_name)
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    torch.matmul(a, b)
    sync(device)
    best = np.full(2, np.inf)
    for _ in range(8):
        best = np.minimum(best, timed(lambda: (torch.matmul(a, b), sync(device))))
    return 2 * n**3 / best


def useful_flops(config, non_embedding_params: int, lengths: list[int]) -> float:
    """2 x params x tokens, plus QK^T and AV: 4 x layers x length^2 x (heads x head_dim)."""
    attn = config.num_attention_heads * getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    return sum(2 * non_embedding_params * n + 4 * config.num_hidden_layers * n * n * attn for n in lengths)


def bare_forward(model, tokenizer, texts, batches, max_length: int, device: str) -> float:
    """Seconds for a plain `transformers` forward over the given batches (tokenizer pads)."""
    import torch

    t = time.perf_counter()
    for batch in batches:
        enc = tokenizer([texts[i] for i in batch], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
        with torch.inference_mode():
            model(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device))
    sync(device)
    return time.perf_counter() - t


def build_encoder(name: str, dtype: str, device: str, token_budget: int) -> Encoder:
    import torch
    from transformers import AutoModel, AutoTokenizer

    settings = EncoderSettings(model="tiny" if name == "tiny" else name, device=device, dtype=dtype,
                               token_budget=token_budget, max_length=1024)
    if name == "tiny":
        return Encoder.load(settings)
    if name != "qwen3-0.6b-shaped":
        raise SystemExit(f"unknown model {name!r}: use tiny or qwen3-0.6b-shaped")
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_encoder())
    torch.manual_seed(0)
    model = AutoModel.from_config(qwen3_0_6b_shaped_config(), dtype=getattr(torch, dtype))
    model.requires_grad_(False).eval().to(device)
    model.config.use_cache = False
    return Encoder(settings, tokenizer, model, device=device, dtype=dtype,
                   fingerprint=f"random-0.6b-shaped-{dtype}")




def bench(name: str, dtype: str, device: str, n: int, lo: int, hi: int, token_budget: int, peak: np.ndarray,
          repeats: int) -> None:
    enc = build_encoder(name, dtype, device, token_budget)
    model, tok, max_len = enc.model, enc.tokenizer, enc.settings.max_length
    params = sum(p.numel() for p in model.parameters())
    non_emb = params - model.get_input_embeddings().weight.numel()
    prompts = make_prompts(tok, n, lo, hi)
    lengths = [len(x) for x in enc.tokenize(prompts)]
    batches = plan_batches(lengths, token_budget, enc.settings.max_batch_size)
    shuffled = random.Random(1).sample(range(n), n)
    size = math.ceil(n / len(batches))
    naive = [shuffled[i: i + size] for i in range(0, n, size)]
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    padded_naive = sum(max(lengths[i] for i in b) * len(b) for b in naive)
    print(f"\n== {name} ({params / 1e6:.1f}M params, {non_emb / 1e6:.1f}M non-embedding) on {device}, {dtype} ==")
    print(f"   {n} prompts, {min(lengths)}..{max(lengths)} tokens (mean {np.mean(lengths):.0f}, "
          f"{sum(lengths)} in all); {len(batches)} bucketed batches under a {token_budget}-token budget; "
          f"each batch timed best of {repeats}, methods interleaved")

    enc.encode(prompts[:2])  # warm-up
    bare_forward(model, tok, prompts, [[0, 1]], max_len, device)
    ours = np.full((len(batches), 2), np.inf)
    bare = np.full((len(batches), 2), np.inf)
    slow = np.full((len(naive), 2), np.inf)
    passes = enc.forward_passes
    with tempfile.TemporaryDirectory() as root:
        for r in range(repeats):
            for j in range(max(len(batches), len(naive))):
                if j < len(batches):  # a fresh cache per call: a cold call writes one shard
                    texts = [prompts[i] for i in batches[j]]
                    cache = Path(root) / f"{r}-{j}"
                    ours[j] = np.minimum(ours[j], timed(lambda: embed_prompts(texts, None, enc, cache)))
                    bare[j] = np.minimum(bare[j], timed(lambda: bare_forward(model, tok, prompts, [batches[j]], max_len, device)))
                if j < len(naive):
                    slow[j] = np.minimum(slow[j], timed(lambda: bare_forward(model, tok, prompts, [naive[j]], max_len, device)))
        passes = (enc.forward_passes - passes) // repeats
        warm = [embed_prompts([prompts[i] for i in b], None, enc, Path(root) / f"0-{j}") for j, b in enumerate(batches)]
    assert sum(w.n_cached for w in warm) == n and sum(w.forward_passes for w in warm) == 0
    t_ours, t_bare, t_naive = ours.sum(0), bare.sum(0), slow.sum(0)
    rate = useful_flops(model.config, non_emb, lengths) / t_ours
    both = lambda x, f: f"{x[0]:{f}} wall, {x[1]:{f}} CPU-time"  # noqa: E731
    print(f"   embed_prompts (cold) : {n / t_ours[0]:.1f} prompts/s ({t_ours[0]:.2f} s wall, "
          f"{passes} forward passes, includes hashing and cache writes)")
    print(f"   bare transformers    : {n / t_bare[0]:.1f} prompts/s ({t_bare[0]:.2f} s wall, same batches)")
    print(f"   ratio ours/bare      : {both(t_bare / t_ours, '.2f')} (aim >= 0.9)")
    print(f"   embed_prompts cached : {sum(w.seconds for w in warm) * 1e3:.1f} ms for {n} prompts "
          f"({len(warm)} calls), 0 forward passes")
    print(f"   FLOP rate            : {both(rate / 1e9, '.1f')} GFLOP/s on real tokens vs matmul peak "
          f"{both(peak / 1e9, '.1f')} -> {both(100 * rate / peak, '.0f')} % (aim >= 60%)")
    print(f"   length bucketing     : {padded} padded tokens vs {padded_naive} naive (random order, "
          f"{len(naive)} batches of {size}, bare forward both) -> {both(t_naive / t_bare, '.2f')} x faster "
          f"(aim >= 1.5x)")
    print(f"   peak RSS so far      : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    enc.close()


def main(argv: list[str] | None = None) -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-prompts", type=int, default=None,
                    help=f"prompts per model (default: {DEFAULT_N})")
    ap.add_argument("--models", default="tiny,qwen3-0.6b-shaped")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtypes", default="auto",
                    help="comma list; auto = float32 (+ bfloat16 where native) on CPU, bfloat16 on CUDA")
    ap.add_argument("--repeats", type=int, default=None, help=f"best of (default: {DEFAULT_REPEATS})")
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--token-budget", type=int, default=1024, help="padded tokens per batch")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device = EncoderSettings(device=args.device).resolve_device()
    if args.dtypes == "auto":
        if device.startswith("cuda"):
            dtypes = ["bfloat16"]
        else:
            dtypes = ["float32"] + (["bfloat16"] if device == "cpu" and cpu_has_native_bf16() else [])
    else:
        dtypes = args.dtypes.split(",")
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native CPU bf16: {cpu_has_native_bf16()}")
    ensure_tiny_encoder()
    for dtype in dtypes:
        peak = matmul_peak(dtype, device)
        print(f"\nmatmul peak, {dtype}: {peak[0] / 1e9:.1f} GFLOP/s by wall time, "
              f"{peak[1] / 1e9:.1f} by CPU time per thread")
        for name in args.models.split(","):
            bench(name, dtype, device, args.n_prompts or DEFAULT_N.get(name, 64),
                  args.min_tokens, args.max_tokens, args.token_budget, peak,
                  args.repeats or DEFAULT_REPEATS.get(name, 1))
    print("\n" + GPU_HINT)


if __name__ == "__main__":
    main()
