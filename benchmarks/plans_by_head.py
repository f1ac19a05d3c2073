"""Would a one-shot head that routes each prompt to a plan save more than a plan per group?

    python benchmarks/plans_by_head.py --jsonl NAME=rows.jsonl [--jsonl ...] --encoder minilm [--sample 600]

For each set (an import with recorded replies, read as `benchmarks/cost_default.py` reads it) this
runs the cascade's own fit (`policies/cascade/fit.fit_cascade`, default settings, no cross-encoder),
which gives, per non-test row and out of fold, the quality and expected cost of each pooled
candidate (always the strongest, the cost ladder's plans), and the per-group choice where groups
are found. The actions of the head are those candidates plus every worker alone.

The head, nested in the same five folds: on the other folds' rows a multi-output ridge
(`policies/oneshot/ridge.RidgePath`, its penalty chosen by an inner cross-validation over those
folds) learns each action's quality and cost (as a share of the strongest's) from the prompt's
features; on this fold each prompt takes the action with the best predicted quality − λ · cost.
Every λ of a grid is one candidate; the cost-aware rule that ships a policy
(`train.selection.cheapest_not_below`, the cascade's margin and floor) picks among them, as it picks
among the pooled candidates and, per group, the group plans.

Printed per set: the strongest alone, the pooled choice, the per-group choice, the head's choice,
each as accuracy, $ per 1,000 and the paired difference from the strongest with its 95% interval.
A caveat the figures carry: a row's action outcome comes from plans searched on the other folds,
which include the rows the head is scored on in that fold, so the head's targets are not fully
out of fold (the plans' thresholds, not the rows' outcomes); the per-group choice reads the same
figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.real_data import machine  # noqa: E402

ALPHAS = (1.0, 10.0, 100.0, 1e3, 1e4, 1e5)
LAMBDAS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def ridge_predict(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, alpha: float) -> np.ndarray:
    from fugu_pipeline.policies.oneshot.ridge import RidgePath

    none = np.full(len(x_tr), -1)
    path = RidgePath(x_tr, none, 1, y_tr)
    w = path.solve(alpha)
    z = np.concatenate([(x_te - path.mean) / path.scale, np.zeros((len(x_te), 1))], axis=1)
    return z @ w + path.bias


def pick_alpha(x: np.ndarray, y: np.ndarray, folds: np.ndarray) -> float:
    """The penalty with the least squared error over an inner cross-validation by `folds`."""
    err = np.zeros(len(ALPHAS))
    for f in np.unique(folds):
        tr, te = folds != f, folds == f
        for i, a in enumerate(ALPHAS):
            err[i] += float(((ridge_predict(x[tr], y[tr], x[te], a) - y[te]) ** 2).sum())
    return ALPHAS[int(np.argmin(err))]


def figure(name: str, q: np.ndarray, c: np.ndarray, q_strong: np.ndarray, n_boot: int):
    from fugu_pipeline.train.selection import interval

    d, lo, hi = interval(q - q_strong, n_boot)
    return SimpleNamespace(name=name, quality=float(q.mean()), cost_usd=float(c.mean()), vs_strongest=d, vs_low=lo,
                           vs_high=hi, note="", q=q, c=c)


def actions(fit, data, rows: np.ndarray, folds: np.ndarray, usable: list[int]):
    """(names, quality, cost) per non-test row and action: the fit's pooled candidates out of fold,
    and every worker alone at the expected cost of the other folds."""
    from fugu_pipeline.train.selection import STRONGEST

    bad = {c.name for c in fit.candidates if c.note.startswith("unavailable")}
    names = [k for k in fit.oof_cost if k not in bad and (k == STRONGEST or k.startswith("cascade ≤"))]
    q = [fit.oof[k] for k in names]
    c = [fit.oof_cost[k] for k in names]
    for j in usable:
        cj = np.zeros(len(rows))
        for f in np.unique(folds):
            cj[folds == f] = np.nanmean(data.cost_usd[rows[folds != f], j])
        names.append(f"{data.worker_ids[j]} alone")
        q.append(data.quality[rows, j])
        c.append(cj)
    return names, np.stack(q, 1), np.stack(c, 1)


def head_candidates(x: np.ndarray, Q: np.ndarray, C: np.ndarray, folds: np.ndarray, ref: float) -> dict:
    """{λ: (quality, cost) per row}: each row routed, out of fold, to the action with the best
    predicted quality − λ · cost/ref."""
    y = np.concatenate([Q, C / ref], axis=1)
    a = Q.shape[1]
    got = {lam: (np.zeros(len(x)), np.zeros(len(x))) for lam in LAMBDAS}
    chosen = []
    for f in np.unique(folds):
        tr, te = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
        alpha = pick_alpha(x[tr], y[tr], folds[tr])
        chosen.append(alpha)
        pred = ridge_predict(x[tr], y[tr], x[te], alpha)
        for lam in LAMBDAS:
            pick = np.argmax(pred[:, :a] - lam * pred[:, a:], axis=1)
            got[lam][0][te], got[lam][1][te] = Q[te, pick], C[te, pick]
    return got, chosen


def run(name: str, rows: list, args) -> dict:
    from benchmarks.cost_default import matrix_of
    from fugu_pipeline.matrix.answers import read_answers
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import answer_inputs, fit_cascade
    from fugu_pipeline.train.selection import STRONGEST, cheapest_not_below, fold_ids

    t0 = time.perf_counter()
    work, db, settings, data, emb = matrix_of(name, rows, args)
    grid = read_answers(db, data.task_ids, data.worker_ids)
    inputs = answer_inputs(data, grid, settings, Path(args.cache_dir))
    cfg = CascadeConfig(n_boot=args.n_boot)
    fit = fit_cascade(data, grid, inputs, cfg, log=lambda m: print(f"[{name}] {m}", file=sys.stderr, flush=True))
    nt = np.flatnonzero(data.splits != "test")
    folds = fold_ids([data.task_ids[i] for i in nt], 5, 0)
    usable = [j for j, w in enumerate(data.worker_ids) if np.isfinite(data.quality[nt, j]).all()]
    names, Q, C = actions(fit, data, nt, folds, usable)
    q_strong = fit.oof[STRONGEST]
    ref = float(fit.oof_cost[STRONGEST].mean())
    t1 = time.perf_counter()
    per_lam, alphas = head_candidates(np.asarray(data.features[nt], np.float64), Q, C, folds, ref)
    head_s = time.perf_counter() - t1
    strong = figure(STRONGEST, q_strong, fit.oof_cost[STRONGEST], q_strong, args.n_boot)
    pooled = [figure(k, Q[:, i], C[:, i], q_strong, args.n_boot) for i, k in enumerate(names)]
    pooled_pick = cheapest_not_below(pooled, STRONGEST, "", cfg.margin, len(nt), cfg.floor)
    heads = [strong] + [figure(f"head λ={lam:g}", *per_lam[lam], q_strong, args.n_boot) for lam in LAMBDAS]
    head_pick = cheapest_not_below(heads, STRONGEST, "", cfg.margin, len(nt), cfg.floor)
    lines = {"strongest alone": strong,
             f"pooled: {pooled_pick.name}": next(c for c in pooled if c.name == pooled_pick.name),
             f"head over {len(names)} actions: {head_pick.name}": next(c for c in heads if c.name == head_pick.name)}
    if fit.groups is not None:
        lines[f"per {fit.groups.by} ({len(fit.groups.groups)} groups)"] = figure(
            "per group", fit.groups.quality, fit.groups.cost, q_strong, args.n_boot)
    print(f"\n### {name}: {len(nt)} non-test rows, workers {', '.join(data.worker_ids)}; {emb.encoder_description}")
    print(f"the cascade fit's choice (no one-shot heads in it): {fit.selected}; head penalties per fold {alphas}; "
          f"head fit {head_s:.1f}s for "
          f"{len(LAMBDAS)} λ")
    print("| policy (out of fold) | accuracy | $ per 1,000 | share of the strongest's | − strongest [95%] |")
    print("|---|---|---|---|---|")
    out = {"set": name, "rows": len(nt), "policies": {}}
    for label, fig in lines.items():
        share = fig.cost_usd / max(strong.cost_usd, 1e-300)
        print(f"| {label} | {fig.quality:.4f} | {fig.cost_usd * 1000:.4g} | {share:.0%} | "
              f"{fig.vs_strongest:+.4f} [{fig.vs_low:+.4f}, {fig.vs_high:+.4f}] |")
        out["policies"][label] = {"accuracy": fig.quality, "usd_per_1k": fig.cost_usd * 1000, "share": share,
                                  "vs_strongest": [fig.vs_strongest, fig.vs_low, fig.vs_high]}
    print("head at every λ: " + "; ".join(f"{c.name[5:]} {c.vs_strongest:+.3f} [{c.vs_low:+.3f}, {c.vs_high:+.3f}] at "
                                         f"{c.cost_usd / strong.cost_usd:.0%}"
                                          for c in heads[1:]))
    print(f"runtime {time.perf_counter() - t0:.0f}s", flush=True)
    return out


def main(argv=None) -> int:
    from benchmarks.cost_default import priced, sample
    from fugu_pipeline.matrix.import_format import read_reward_jsonl

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", action="append", default=[], required=True, help="NAME=rows.jsonl (an import with replies)")
    ap.add_argument("--encoder", default="minilm")
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--work-dir", default="/tmp/plans_by_head")
    ap.add_argument("--cache-dir", default="/tmp/plans_by_head/cache")
    args = ap.parse_args(argv)
    print(machine())
    for item in args.jsonl:
        name, _, path = item.partition("=")
        if not Path(path).is_file():
            raise SystemExit(f"--jsonl {item}: no file {path}; pass NAME=path to an import with replies")
        run(name, priced(sample(read_reward_jsonl(Path(path)), args.sample)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
