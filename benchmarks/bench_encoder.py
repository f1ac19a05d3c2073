"""Benchmark the task-embedding path (a script, not a test). Prints measured figures only.

For each model (the built-in tiny Qwen3, and a model with Qwen3-0.6B's shapes and random
weights) and each dtype, on prompts of mixed lengths (generated, or real ones with --prompts):

  - tokens/s of `embed_prompts` (cold cache: tokenise, plan, forward, pool, write the cache), whose
    batches share a padded length (a multiple of 8), against padded length-bucketed batching (the
    prompts sorted by length, each batch padded to its longest) through a bare `transformers`
    forward on the same prompts (aim: ratio >= 0.9), and against exact-length batches (the plan
    before: never padded, many small forward passes);
  - parity: how many prompts, encoded alone as `route` does, give their cached vector bit for
    bit, and whether the largest difference is within the dtype's tolerance (`features/parity.py`);
  - the FLOP rate achieved on real tokens (2 x non-embedding params x tokens + attention)
    vs this machine's measured matmul peak in the same dtype, and the peak RSS.

Each method runs over all the prompts, best of `--repeats`, the methods interleaved, so a burst of
load from another process distorts all of them alike, or none. Tokens/s counts real tokens only.

    python benchmarks/bench_encoder.py                       # CPU: tiny + 0.6B-shaped
    python benchmarks/bench_encoder.py --models tiny --prompts PATH/TO/default_query_train.jsonl.gz --n-prompts 5616 --max-tokens 512
    python benchmarks/bench_encoder.py --models qwen3-0.6b-shaped --prompts PATH/TO/dcrouter_train.json.gz --n-prompts 64 --max-tokens 512 --threads 2 --dtypes float32 --repeats 1
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
from fugu_pipeline.features.encoder import Encoder, padded_length, plan_batches  # noqa: E402
from fugu_pipeline.features.parity import compare_vectors  # noqa: E402
from fugu_pipeline.features.settings import EncoderSettings, cpu_has_native_bf16
from fugu_pipeline.features.tiny import (  # noqa: E402
    CORPUS,
    ensure_tiny_encoder,
    qwen3_0_6b_shaped_config,
)

DEFAULT_N = {"tiny": 1024, "qwen3-0.6b-shaped": 48}
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




def padded_sorted(lengths: list[int], token_budget: int, max_batch_size: int) -> list[list[int]]:
    """Padded length-bucketed batching (what the embedding did before batches of one exact length):
    the prompts sorted by length, cut greedily under the token budget counted at each batch's
    longest, every batch padded to its longest."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_batch_size and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def read_prompts(path: str, n: int) -> list[str]:
    """The first n prompts of a JSONL file, or of a JSON file holding a list of objects (RouterDC's
    preprocessed `dcrouter_*.json`), .gz too: each row's "prompt", "query" or "question" field."""
    import gzip
    import json

    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    try:
        if text.lstrip().startswith("["):  # one JSON array
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.split("\n") if line.strip()]  # not splitlines(): a JSON string may hold U+2028
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: not JSONL nor one JSON list ({exc}); give a file of prompt objects") from None
    out = []
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise SystemExit(f"{path}: row {i} is a {type(row).__name__}, not an object with a prompt, query or question")
        text = next((row[k] for k in ("prompt", "query", "question") if isinstance(row.get(k), str)), None)
        if text:
            out.append(text)
        if len(out) == n:
            break
    return out


def bench(name: str, dtype: str, device: str, n: int, lo: int, hi: int, token_budget: int, peak: np.ndarray,
          repeats: int, prompts_file: str | None = None) -> None:
    enc = build_encoder(name, dtype, device, token_budget)
    model, tok, max_len = enc.model, enc.tokenizer, enc.settings.max_length
    params = sum(p.numel() for p in model.parameters())
    non_emb = params - model.get_input_embeddings().weight.numel()
    if prompts_file:
        enc.settings = enc.settings.model_copy(update={"max_length": hi})  # real prompts: cut at --max-tokens
        max_len = hi
        prompts = read_prompts(prompts_file, n)
        n = len(prompts)
    else:
        prompts = make_prompts(tok, n, lo, hi)
    lengths = [len(x) for x in enc.tokenize(prompts)]
    tokens = sum(lengths)
    ours_plan = plan_batches(lengths, token_budget, enc.settings.max_batch_size, max_len)
    ref_plan = padded_sorted(lengths, token_budget, enc.settings.max_batch_size)
    exact_plan = plan_batches(lengths, token_budget, enc.settings.max_batch_size, max_len, multiple=1)
    padded = lambda plan: sum(max(lengths[i] for i in b) * len(b) for b in plan)  # noqa: E731
    ours_padded = sum(padded_length(max(lengths[i] for i in b), max_len) * len(b) for b in ours_plan)
    print(f"\n== {name} ({params / 1e6:.1f}M params, {non_emb / 1e6:.1f}M non-embedding) on {device}, {dtype} ==")
    print(f"   {n} prompts{' from ' + prompts_file if prompts_file else ''}, {min(lengths)}..{max(lengths)} tokens "
          f"(mean {np.mean(lengths):.0f}, {tokens} in all), {token_budget}-token budget; best of {repeats}, methods interleaved")
    print(f"   forward passes: ours {len(ours_plan)} ({ours_padded} tokens with pads), padded length-bucketed "
          f"{len(ref_plan)} ({padded(ref_plan)}), exact-length {len(exact_plan)} ({padded(exact_plan)})")

    enc.encode(prompts[:2])  # warm-up
    bare_forward(model, tok, prompts, [[0, 1]], max_len, device)
    best = {k: np.full(2, np.inf) for k in ("ours", "ref", "exact")}
    passes = enc.forward_passes
    with tempfile.TemporaryDirectory() as root:
        for r in range(repeats):
            best["ours"] = np.minimum(best["ours"], timed(lambda: embed_prompts(prompts, None, enc, Path(root) / f"cold-{r}")))
            best["ref"] = np.minimum(best["ref"], timed(lambda: bare_forward(model, tok, prompts, ref_plan, max_len, device)))
            best["exact"] = np.minimum(best["exact"], timed(lambda: bare_forward(model, tok, prompts, exact_plan, max_len, device)))
        passes = (enc.forward_passes - passes) // repeats
        cached = embed_prompts(prompts, None, enc, Path(root) / "cold-0")
        alone = np.concatenate([enc.encode([p]) for p in prompts])
    assert cached.n_cached == n and cached.forward_passes == 0
    parity = compare_vectors(alone, cached.vectors, enc.resolved_dtype)
    rate = lambda t: tokens / t  # noqa: E731  (real tokens: pads are work thrown away)
    both = lambda x, f: f"{x[0]:{f}} wall, {x[1]:{f}} CPU-time"  # noqa: E731
    ours, ref, exact = best["ours"], best["ref"], best["exact"]
    print(f"   embed_prompts (cold) : {rate(ours[0]):,.0f} tokens/s ({ours[0]:.2f} s wall, {passes} forward passes, "
          "tokenising, hashing and cache writes included)")
    print(f"   padded length-bucketed, bare transformers: {rate(ref[0]):,.0f} tokens/s ({ref[0]:.2f} s wall)")
    print(f"   exact-length batches, bare transformers  : {rate(exact[0]):,.0f} tokens/s ({exact[0]:.2f} s wall)")
    print(f"   ratio ours / padded length-bucketed      : {both(ref / ours, '.2f')} (aim >= 0.9)")
    print(f"   parity (alone vs the cache's batches): {parity.describe()}")
    rate_flops = useful_flops(model.config, non_emb, lengths) / ours
    print(f"   FLOP rate            : {both(rate_flops / 1e9, '.1f')} GFLOP/s on real tokens vs matmul peak "
          f"{both(peak / 1e9, '.1f')} -> {both(100 * rate_flops / peak, '.0f')} %")
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
    ap.add_argument("--prompts", default=None, help="real prompts: a JSONL file, or a JSON list (RouterDC's dcrouter_train.json.gz), "
                    ".gz too, with a prompt, query or question field, e.g. LLMRouter's default_query_train.jsonl.gz")
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
                  args.repeats or DEFAULT_REPEATS.get(name, 1), args.prompts)
    print("\n" + GPU_HINT)


if __name__ == "__main__":
    main()
