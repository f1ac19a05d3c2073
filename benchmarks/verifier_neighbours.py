"""Whether what a worker did on the nearest prompts tells the cascade's verifier more, out of fold, on
data with recorded replies (not a test; a column tried and not kept).

    .venv/bin/python benchmarks/verifier_neighbours.py --encoder <all-MiniLM-L6-v2 dir> \\
        [--routing PATH/TO/routing] [--synthetic mc2,mc4] [--jsonl NAME=rows.jsonl] [--rows 400] [--k 5,10,20,40]

The sets are `benchmarks/verifier_cross.py`'s (the same flags, rows and folds). Per set, the verifier
as `fugu-lite train` fits it (`policies/cascade/verifier.oof_scores`, 5 folds by task hash) gives each
cell an out-of-fold score. The column tried: for cell (task, worker), the worker's mean quality on
the `k` prompts nearest to the task (cosine over the frozen encoder's prompt features), among the
rows of the other folds only; a training row's own neighbours leave the row itself out. Per fold a
logistic model reads the verifier's log-odds, the column's and the worker (one-hot), fitted on the
other folds' cells and scored on the fold's. Printed: the verifier's out-of-fold AUC and the stacked
model's, overall and per worker, for each `k`. A locality the linear verifier misses (a worker right
on one kind of prompt and wrong on another that the prompt vector does not separate linearly) would
show as a gain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402


def logit(p: np.ndarray, lo: float) -> np.ndarray:
    p = np.clip(p, lo, 1 - lo)
    return np.log(p / (1 - p))


def neighbour_quality(P: np.ndarray, Q: np.ndarray, rows: np.ndarray, pool: np.ndarray, k: int, own: bool) -> np.ndarray:
    """(len(rows), W): each worker's mean quality over the `k` rows of `pool` nearest to each of `rows`
    (cosine over the unit rows of `P`); `own`: `rows` are `pool` and a row is not its own neighbour."""
    sim = P[rows] @ P[pool].T
    if own:
        np.fill_diagonal(sim, -np.inf)
    nearest = np.argpartition(-sim, k, axis=1)[:, :k]
    return np.nanmean(Q[pool][nearest], axis=1)


def stacked(base: np.ndarray, inp, P: np.ndarray, folds: np.ndarray, k: int) -> np.ndarray:
    """Out-of-fold scores of the stacked model (module docstring), NaN where no reply."""
    from fugu_pipeline.policies.cascade.verifier import fit_logistic

    Q = inp.target
    W = Q.shape[1]
    S = np.full(Q.shape, np.nan)

    def design(rows, near):
        X = np.concatenate([logit(base[rows], 1e-4)[..., None], logit(near, 0.02)[..., None],
                            np.broadcast_to(np.eye(W), (len(rows), W, W))], axis=2)
        return X.reshape(len(rows) * W, -1)

    for f in np.unique(folds):
        tr, te = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
        X = design(tr, neighbour_quality(P, Q, tr, tr, k, own=True))
        y, m = Q[tr].ravel(), (inp.has[tr] & ~np.isnan(Q[tr]) & ~np.isnan(base[tr])).ravel()
        m &= ~np.isnan(X).any(axis=1)
        model = fit_logistic(X[m], np.clip(y[m], 0, 1), l2=1e-2, n_workers=W)
        S[te] = model.predict(np.nan_to_num(design(te, neighbour_quality(P, Q, te, tr, k, own=False)))).reshape(len(te), W)
    return np.where(inp.has, S, np.nan)


def run(name: str, args) -> dict:
    from benchmarks.cascade_data import build_matrix
    from benchmarks.verifier_cross import _by_worker, rows_of
    from fugu_pipeline.policies.cascade.answer_features import STATS
    from fugu_pipeline.policies.cascade.fit import answer_inputs
    from fugu_pipeline.policies.cascade.verifier import auc, oof_scores
    from fugu_pipeline.train.selection import fold_ids

    t0 = time.perf_counter()
    data, grid, settings, _ = build_matrix(rows_of(name, args), Path(args.work_dir) / name, args.encoder, args.cache_dir)
    inp = answer_inputs(data, grid, settings, Path(args.cache_dir), stat_names=STATS)
    folds = fold_ids(data.task_ids, 5, 0)
    base, chosen, fig = oof_scores(inp, folds)
    P = inp.prompt / np.maximum(np.linalg.norm(inp.prompt, axis=1, keepdims=True), 1e-12)
    m = inp.has & ~np.isnan(inp.target)
    print(f"\n### {name}: {len(data.task_ids)} rows x {data.n_workers} workers; verifier {chosen}; "
          f"{time.perf_counter() - t0:.0f}s to load and fit")
    print("| verifier | out-of-fold AUC | per worker |\n|---|---|---|")
    print(f"| as fitted | {fig['oof_auc']:.3f} | " + ", ".join(f"{w} {a:.3f}" for w, a in
                                                        _by_worker(base, inp, data.worker_ids).items()) + " |")
    out = {"set": name, "rows": len(data.task_ids), "verifier_auc": fig["oof_auc"], "stacked": {}}
    for k in args.k:
        S = stacked(base, inp, P, folds, k)
        a = auc(S[m], inp.target[m] >= 0.5)
        out["stacked"][k] = a
        print(f"| + the worker's quality on the {k} nearest prompts | {a:.3f} | " + ", ".join(
            f"{w} {v:.3f}" for w, v in _by_worker(S, inp, data.worker_ids).items()) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", required=True, help="the prompt encoder (e.g. the MiniLM folder)")
    ap.add_argument("--routing", type=Path, help="the routing data folder holding routellm_evals/ (gsm8k)")
    ap.add_argument("--synthetic", default="", help="synthetic multiple-choice sets: mc2, mc4 (comma-separated)")
    ap.add_argument("--jsonl", action="append", default=[], metavar="NAME=PATH", help="a reward-matrix JSONL with answers")
    ap.add_argument("--rows", type=int, default=400, help="rows kept per set (the first by task-id hash)")
    ap.add_argument("--k", type=lambda v: [int(x) for x in v.split(",")], default=[5, 10, 20, 40])
    ap.add_argument("--prices", default=None, help="JSON {worker: $ per million tokens} for sets without costs")
    ap.add_argument("--work-dir", default="/tmp/fugu-verifier-neighbours")
    ap.add_argument("--cache-dir", default="/tmp/fugu-verifier-neighbours/cache")
    args = ap.parse_args(argv)
    args.mot = None
    names = (["gsm8k"] if args.routing else []) + [s for s in args.synthetic.split(",") if s] \
        + [x.split("=", 1)[0] for x in args.jsonl]
    if not names:
        raise SystemExit("no data: pass --routing, --synthetic mc2,mc4 or --jsonl NAME=PATH")
    print(f"machine: {machine()}", flush=True)
    for n in names:
        run(n, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
