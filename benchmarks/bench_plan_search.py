"""How fast the cascade plan search is, against a floor measured in the same run: a plain vectorised
numpy replay of the same plan evaluations.

What is timed, per matrix (the synthetic multiple-choice matrices of `bench_cascade_fit.py`: N rows x
W workers whose accuracy rises 0.55 -> 0.85 and cost 1,000-fold, replies whose features carry a noisy
sign of being right), with the grid `fit_cascade` searches (the verifier's out-of-fold scores, read
with the replies already paid for; each call's recorded cost and latency; 5 hash folds of the
non-test rows, default `cascade.search`):

- **before**: the search of a reference revision (`--reference`, default the last one before the plan
  search was rewritten), as `fit_cascade` ran it: each fold's plans once (`frontier.plan_points`),
  then every non-test row twice (the frontier's named plans, then the final search): 7 passes, each
  plan a `CascadePlan` run by `simulate`;
- **floor**: this file's own replay (`replay` below): per distinct row set (5 folds + all rows), the
  arrays cut once, then per plan a vectorised run of its steps over its own columns; the plans
  (tuples) are listed before the clock starts;
- **after**: `plans.points_for` as `fit_cascade` now calls it: the same 7 searches through one memo
  (6 distinct row sets), plans listed as tuples, shared step results.

The context verifier's score tables (`ContextScores.at`) are filled by a first untimed pass, so no
timed run pays for them. Every plan's mean expected cost, accuracy and utility must be identical in
the three (the largest |difference| is printed, and asserted 0), and so must the plan each search
picks (the best utility; the most accurate within each share of `frontier.SHARES`).

    .venv/bin/python benchmarks/bench_plan_search.py                 # 1000x5, 4000x11, 12000x11
    .venv/bin/python benchmarks/bench_plan_search.py --sizes 1000x5 --no-before

Prints CPU seconds (process time) and wall seconds of each, and the ratios to the floor.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.machine import describe  # noqa: E402

REFERENCE = "11deeea"  # the plan search before it ran plans as tuples on cut row sets


def build(rows: int, workers: int, seed: int):
    """The grid `fit_cascade` searches on the synthetic matrix, its non-test rows and their folds."""
    from benchmarks.bench_cascade_fit import synthetic
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.fit import grid_on
    from fugu_pipeline.policies.cascade.policy import answer_codes
    from fugu_pipeline.policies.cascade.verifier import VerifierInputs, oof_scores
    from fugu_pipeline.policies.cascade.verifier_context import with_context
    from fugu_pipeline.train.selection import fold_ids

    data, grid, inputs = synthetic(rows, workers, seed)
    fit_rows = np.flatnonzero(data.splits != "test")
    folds = fold_ids([data.task_ids[i] for i in fit_rows], 5, 0)
    codes = answer_codes(grid.final)
    sub = VerifierInputs(inputs.prompt[fit_rows], inputs.answer[fit_rows], inputs.has[fit_rows], inputs.target[fit_rows],
                         inputs.stat_names)
    base, _, _ = oof_scores(sub, folds)
    scores = np.full(grid.final.shape, np.nan)
    scores[fit_rows] = base
    scores = with_context(CascadeConfig().verifier_context, inputs, scores, codes, fit_rows, folds, lambda m: None)

    def grid_for(r):
        return grid_on(data, codes, scores, r)

    return grid_for, fit_rows, folds


def replay(grid, rows: np.ndarray, plans: list) -> np.ndarray:
    """(plans, 3): mean expected cost, quality and utility of each plan (tuples of (worker columns,
    agree, verify) steps) on `rows`: the floor, written plainly (the same operations as `simulate`,
    each plan's steps over the plan's own columns, nothing shared between plans)."""
    C, Q = grid.codes[rows], grid.quality[rows]
    context = hasattr(grid.scores, "at")
    S = None if context else grid.scores[rows]
    n, u = len(rows), grid.utility
    ar = np.arange(n)
    K, L = grid.call_cost, grid.call_latency  # each call's (N, W), or each worker's (W,)
    Kr, Lr = (K[rows], L[rows]) if K.ndim == 2 else (None, None)
    out = np.empty((len(plans), 3))
    for p, plan in enumerate(plans):
        active, pick = np.ones(n, bool), np.zeros(n, np.int64)
        paid, waited = np.zeros(n), np.zeros(n)
        called: list[int] = []
        for k, (idx, agree, verify) in enumerate(plan):
            idx = list(idx)
            called += idx
            if Kr is None:
                paid[active] += np.add.reduce(K[idx])
                waited[active] += np.maximum.reduce(L[idx])
            else:  # adding 0 to the rows that stopped leaves them as they were
                paid += np.where(active, Kr[:, idx].sum(axis=1), 0.0)
                waited += np.where(active, Lr[:, idx].max(axis=1), 0.0)
            if k == len(plan) - 1:
                Ci = C[:, idx]
                eq = (Ci[:, :, None] == Ci[:, None, :]) & (Ci[:, :, None] >= 0)
                cnt = eq.sum(axis=2)
                j = np.asarray(idx)[np.argmax(cnt, axis=1)]
                pick[active] = np.where(cnt.max(axis=1) > 0, j, idx[0])[active] if len(idx) > 1 else idx[0]
                break
            decided = np.zeros(n, bool)
            if agree is not None and len(called) >= agree:
                Cc = C[:, called]
                cnt = ((Cc[:, :, None] == Cc[:, None, :]) & (Cc[:, :, None] >= 0)).sum(axis=2)
                ok = active & (cnt.max(axis=1) >= agree)
                pick[ok] = np.asarray(called)[np.argmax(cnt, axis=1)][ok]
                decided |= ok
            if verify is not None:
                Sk = grid.scores.at(called)[np.ix_(rows, idx)] if context else S[:, idx]
                s = np.where(C[:, idx] >= 0, Sk, -np.inf)
                s = np.where(np.isnan(s), -np.inf, s)
                ok = active & ~decided & (s.max(axis=1) >= verify)
                pick[ok] = np.asarray(idx)[np.argmax(s, axis=1)][ok]
                decided |= ok
            active &= ~decided
            if not active.any():
                break
        q = Q[ar, pick]
        util = (u.quality_weight * q - u.cost_weight * np.minimum(np.maximum(paid, 0) / u.cost_scale_usd, u.cap)
                - u.latency_weight * np.minimum(np.maximum(waited, 0) / u.latency_scale_s, u.cap))
        out[p] = paid.mean(), q.mean(), util.mean()
    return out


def load_reference(rev: str):
    """The reference revision's `search.py` as a module (its `candidate_plans` and `Grid`)."""
    got = subprocess.run(["git", "show", f"{rev}:fugu_pipeline/policies/cascade/search.py"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    if got.returncode != 0:
        raise SystemExit(f"cannot read the reference search at {rev}: {got.stderr.strip()}; pass --reference REV or --no-before")
    path = Path(tempfile.mkdtemp()) / "reference_search.py"
    path.write_text(got.stdout)
    spec = importlib.util.spec_from_file_location("reference_search", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reference_search"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def picks(arr: np.ndarray, ref_cost: float) -> list[int]:
    """The plan each search picks from (cost, quality, utility) rows: the best utility, then the most
    accurate within each share (ties: the cheaper, then the first)."""
    from fugu_pipeline.policies.cascade.frontier import SHARES

    out = [int(np.lexsort((np.arange(len(arr)), arr[:, 0], -arr[:, 2]))[0])]
    for s in SHARES:
        ok = np.flatnonzero(arr[:, 0] <= s * ref_cost * (1 + 1e-9))
        out.append(-1 if not len(ok) else int(ok[np.lexsort((ok, arr[ok, 0], -arr[ok, 1]))[0]]))
    return out


def clock(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - t0


def one(rows: int, workers: int, seed: int, before_mod) -> dict:
    from fugu_pipeline.policies.cascade.plans import plan_tuples, points_for
    from fugu_pipeline.policies.cascade.config import CascadeConfig
    from fugu_pipeline.policies.cascade.search import strongest

    cfg = CascadeConfig().searched()  # the search a fit with no cap runs
    grid_for, fit_rows, folds = build(rows, workers, seed)
    sets = [fit_rows[folds != f] for f in np.unique(folds)] + [fit_rows]
    grids = [grid_for(r) for r in sets]
    passes = list(zip(grids, sets)) + [(grids[-1], sets[-1])]  # as fit_cascade searched: the last set twice
    listed = [list(plan_tuples(g, r, cfg)) for g, r in zip(grids, sets)]
    points_for(grids[-1], sets[-1], cfg)  # fills the context verifier's tables: no timed run pays for them
    for g, r, plans in zip(grids, sets, listed):
        replay(g, r, plans[:50])

    after, cpu_a, wall_a = clock(lambda: (lambda memo: [points_for(g, r, cfg, None, memo) for g, r in passes])({}))
    floor, cpu_f, wall_f = clock(lambda: [replay(g, r, plans) for g, r, plans in zip(grids, sets, listed)])
    got = {"rows": rows, "workers": workers, "plans": len(listed[-1]), "after": (cpu_a, wall_a), "floor": (cpu_f, wall_f)}
    diff = 0.0
    for k, (g, r) in enumerate(zip(grids, sets)):
        a = np.stack([after[k].cost, after[k].quality, after[k].utility], axis=1)
        diff = max(diff, float(np.abs(a - floor[k]).max()))
        assert picks(a, g.exp_cost[strongest(g, r)]) == picks(floor[k], g.exp_cost[strongest(g, r)])
    got["max_diff_floor"] = diff
    if before_mod is not None:
        def old():
            res = []
            for g, r in passes:
                G = before_mod.Grid(g.worker_ids, g.codes, g.scores, g.quality, g.exp_cost, g.exp_latency, g.utility)
                pts = []
                for plan in before_mod.candidate_plans(G, r, cfg):  # its plans, each run by `simulate` with each call's cost
                    q, c, u = g.run(plan, r)
                    pts.append((float(c.mean()), float(q.mean()), float(u.mean())))
                res.append(np.asarray(pts))
            return res

        before, cpu_b, wall_b = clock(old)
        got["before"] = (cpu_b, wall_b)
        diff = 0.0
        for k, (g, r) in enumerate(passes):
            a = after[k]
            diff = max(diff, float(np.abs(np.stack([a.cost, a.quality, a.utility], axis=1) - before[k]).max()))
            assert picks(before[k], g.exp_cost[strongest(g, r)]) == picks(np.stack([a.cost, a.quality, a.utility], axis=1),
                                                                           g.exp_cost[strongest(g, r)])
        got["max_diff_before"] = diff
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000x5,4000x11,12000x11", help="ROWSxWORKERS, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", default=REFERENCE, help="git revision of the search timed as 'before'")
    ap.add_argument("--no-before", action="store_true", help="time the floor and the current search only")
    args = ap.parse_args()
    before_mod = None if args.no_before else load_reference(args.reference)
    print(f"machine: {describe()}")
    for size in args.sizes.split(","):
        rows, workers = (int(x) for x in size.lower().split("x"))
        r = one(rows, workers, args.seed, before_mod)
        cpu_f, wall_f = r["floor"]
        line = (f"{rows} rows x {workers} workers, {r['plans']} plans a search, 7 searches (6 distinct row sets): "
                f"floor {cpu_f:.2f} s CPU ({wall_f:.2f} s wall); after {r['after'][0]:.2f} s CPU ({r['after'][1]:.2f} s "
                f"wall) = {r['after'][0] / cpu_f:.2f}x the floor")
        if "before" in r:
            line += (f"; before {r['before'][0]:.2f} s CPU ({r['before'][1]:.2f} s wall) = {r['before'][0] / cpu_f:.2f}x the "
                     f"floor, {r['before'][0] / r['after'][0]:.1f}x after")
        line += f"; max |difference| after - floor {r['max_diff_floor']:.3g}"
        if "before" in r:
            line += f", after - before {r['max_diff_before']:.3g}"
        print(line + "; the same picks", flush=True)
        assert r["max_diff_floor"] == 0.0 and r.get("max_diff_before", 0.0) == 0.0


if __name__ == "__main__":
    main()
