"""Benchmark the cascade verifier's out-of-fold grid (`policies/cascade/verifier.py:oof_scores`; not a test).

Runs `oof_scores` (2 x 3 input sets x 4 L2 strengths x every fold) on the same inputs with the
verifier module of a reference git revision (default: the last one that fitted every grid point by
torch L-BFGS from zero) and with the current one, and prints their CPU seconds (process time, every
thread), wall seconds, the setting each chose and the largest |difference| of the out-of-fold scores.

    python benchmarks/bench_verifier.py                          # synthetic, the 300-task sample's shape
    python benchmarks/bench_verifier.py --prompt-dim 1040 --answer-dim 1060   # a real encoder's width
    python benchmarks/bench_verifier.py --inputs inputs.npz     # arrays saved from a project (below)
    python benchmarks/bench_verifier.py --threads 1             # the reference on one torch thread too

Synthetic inputs (seeded): N tasks x W workers, prompt features, reply features whose last
`--stats` columns are the reply's statistics, graded quality in [0, 1] that the statistics and the
worker tell most of, ~5% of cells without a reply, hash-like folds. Default shape: what
`fugu-lite train` gives the verifier on the offline main job's 300-task sample (225 non-test rows,
3 workers, 80 prompt columns, 80 + 20 reply columns, 5 folds). `--inputs` reads an .npz with the
arrays `prompt`, `answer`, `has`, `target`, `folds` and `stat_names` (a `VerifierInputs` and its folds
as `policies/cascade/fit.py` passes them to `oof_scores`).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch  # imported before either clock starts: neither run pays for it

from benchmarks.machine import describe
from fugu_pipeline.policies.cascade import verifier as current

REFERENCE = "6242b877c77896f0bed100adb77975fa37c8087f"  # before the Newton solver and the shared fits


def synthetic(args) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(args.seed)
    n, w, d, a, k = args.tasks, args.workers, args.prompt_dim, args.answer_dim, args.stats
    prompt = rng.normal(size=(n, d)).astype(np.float32)
    answer = rng.normal(size=(n, w, a)).astype(np.float32)
    skill = np.linspace(0.4, 1.2, w)
    logit = skill[None, :] + 0.6 * prompt[:, :1] + answer[:, :, a - k:a - k + 3].sum(axis=2) * 0.8
    logit += 0.3 * answer[:, :, :4].sum(axis=2) + rng.normal(scale=0.7, size=(n, w))
    right = rng.random((n, w)) < 1 / (1 + np.exp(-logit))
    target = np.where(rng.random((n, w)) < 0.1, rng.random((n, w)), right.astype(float))
    has = rng.random((n, w)) > 0.05
    arrays = {"prompt": prompt, "answer": answer, "has": has, "target": target,
              "stat_names": np.array([f"s{i}" for i in range(k)])}
    return arrays, rng.integers(0, args.folds, size=n)


def load_reference(rev: str):
    # the module's path at that revision: the cascade's package, or train/ before the kinds had packages
    for where in ("fugu_pipeline/policies/cascade/verifier.py", "fugu_pipeline/train/verifier.py"):
        got = subprocess.run(["git", "show", f"{rev}:{where}"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1])
        if got.returncode == 0:
            break
    got.check_returncode()
    src = got.stdout
    path = Path(tempfile.mkdtemp()) / "verifier_reference.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("verifier_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def timed(module, arrays: dict, folds: np.ndarray):
    inp = module.VerifierInputs(arrays["prompt"], arrays["answer"], arrays["has"], arrays["target"],
                                tuple(str(s) for s in arrays["stat_names"]))
    c0, w0 = time.process_time(), time.perf_counter()
    S, setting, fig = module.oof_scores(inp, folds)
    return S, setting, fig, time.process_time() - c0, time.perf_counter() - w0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", help=".npz of VerifierInputs arrays and folds (default: synthetic)")
    ap.add_argument("--tasks", type=int, default=225)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--prompt-dim", type=int, default=80)
    ap.add_argument("--answer-dim", type=int, default=100, help="reply columns, the statistics included")
    ap.add_argument("--stats", type=int, default=20)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", default=REFERENCE, help="git revision of the verifier to compare with")
    ap.add_argument("--no-reference", action="store_true", help="time the current module only")
    ap.add_argument("--threads", type=int, help="the caller's torch intra-op threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.inputs:
        z = np.load(args.inputs)
        arrays, folds = {k: z[k] for k in ("prompt", "answer", "has", "target", "stat_names")}, z["folds"]
    else:
        arrays, folds = synthetic(args)
    n, w, a = arrays["answer"].shape
    print(describe())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads in the caller")
    print(f"inputs: {args.inputs or f'synthetic seed {args.seed}'}; {n} tasks x {w} workers, "
          f"{int(arrays['has'].sum())} replies, {arrays['prompt'].shape[1]} prompt + {a} reply columns "
          f"({len(arrays['stat_names'])} statistics), {len(np.unique(folds))} folds")
    S, setting, fig, cpu, wall = timed(current, arrays, folds)
    if not args.no_reference:
        S0, setting0, fig0, cpu0, wall0 = timed(load_reference(args.reference), arrays, folds)
        print(f"reference ({args.reference[:10]}): CPU {cpu0:7.2f} s, wall {wall0:7.2f} s, chose {setting0}, "
              f"out-of-fold log-loss {fig0['oof_logloss']:.5f}, AUC {fig0['oof_auc']:.4f}")
    print(f"current:                CPU {cpu:7.2f} s, wall {wall:7.2f} s, chose {setting}, "
          f"out-of-fold log-loss {fig['oof_logloss']:.5f}, AUC {fig['oof_auc']:.4f}")
    if not args.no_reference:
        same = np.isnan(S) == np.isnan(S0)
        delta = np.abs(S - S0)[~np.isnan(S)]
        print(f"CPU ratio {cpu0 / cpu:.1f}x, wall ratio {wall0 / wall:.1f}x; same setting: {setting == setting0}; "
              f"same cells scored: {bool(same.all())}; max |delta score| {delta.max():.2e}, "
              f"mean {delta.mean():.2e} over {delta.size} cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
