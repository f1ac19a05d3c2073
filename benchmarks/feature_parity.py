"""Feature parity on real data (a script, not a test): for one checkpoint and the data it was
trained on, the held-out rows' cached features (what `evaluate` routes on) against what `route`
and `serve` compute (`Router.load(...).route_batch` in one batch, and `route` one prompt at a
time). Prints the share of held-out routes that agree, of vectors that are bit-equal, and whether the
largest difference is within the dtype's tolerance (`fugu_pipeline/features/parity.py`).

    python benchmarks/feature_parity.py --checkpoint models/sft/<hash> --data dc.jsonl \\
        --workers quality_only.yaml [--cache-dir data/embeddings] [--work-dir data/imports] [--split test]

The cache must hold the data's features (train or evaluate the checkpoint first); nothing is
re-embedded for the cached side (the script stops if it would be).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", required=True, help="the YAML (reward: block) the checkpoint was trained with")
    ap.add_argument("--cache-dir", default="data/embeddings")
    ap.add_argument("--work-dir", default="data/imports")
    ap.add_argument("--split", default="test")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.cli.training import encoder_settings, matrix_db
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.parity import compare_vectors
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.policies.registry import load_checkpoint

    ck = load_checkpoint(a.checkpoint)
    args = build_parser().parse_args(["evaluate", "--checkpoint", a.checkpoint, "--data", a.data, "--workers", a.workers,
                                      "--device", a.device, "--cache-dir", a.cache_dir, "--work-dir", a.work_dir])
    settings = encoder_settings(args, None, ck.manifest.feature_contract, ck.manifest.metrics)
    lazy = LazyEncoder(settings)
    data, emb = load_routing_data(matrix_db(args), lazy, Path(a.cache_dir))
    if emb.n_computed:
        raise SystemExit(f"{emb.n_computed} prompts were not cached: train or evaluate this checkpoint first")
    held = data.split(a.split)
    W = data.worker_ids
    cached = head_scores(ck.head, held.features).argmax(axis=1)
    router = Router.load(a.checkpoint, device=a.device)
    print(router.encoder.describe())
    t0 = time.perf_counter()
    batch = np.array([W.index(d.worker_id) for d in router.route_batch(held.prompts, held.domains)])
    t1 = time.perf_counter()
    single = np.array([W.index(router.route(p, d).worker_id) for p, d in zip(held.prompts, held.domains)])
    t2 = time.perf_counter()
    vectors = router.encoder.encode(held.prompts, held.domains)
    n = len(cached)
    print(f"{a.split} rows {n}: routes equal to the cached path's: one batch {int((batch == cached).sum())}/{n}, "
          f"one at a time {int((single == cached).sum())}/{n}; "
          f"{compare_vectors(vectors, held.features, router.encoder.resolved_dtype).describe()}; "
          f"{t1 - t0:.1f} s batched, {t2 - t1:.1f} s one at a time")
    router.close()


if __name__ == "__main__":
    main()
