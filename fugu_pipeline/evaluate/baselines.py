"""The baselines every report carries, from the stored matrix alone: no head, no encoder.

On the rows of one split (the held-out one in reports), for a per-task measure M (N, W): the
utility, and the quality where the matrix has it.

- **always** one worker: the mean of its column, for every worker.
- **random** routing: each task sent to a uniformly drawn worker, repeated over `seeds` seeds;
  `mean` over the seeds and the 2.5 / 97.5 percentiles of the seeds' means (`low`, `high`: where
  one random router lands 95% of the time), plus `expected`, the exact expectation (the mean over
  workers). A head must clear `high` to beat a lucky random router, not just `expected`.
- **oracle** ceiling: each task's best worker, known after the fact; no router can do better.
- **cross-fit oracle**: the tasks split at random into two halves; the best single worker is chosen
  on one half and scored on the other, then the halves swap, so every task is scored by a worker
  chosen without it. Averaged over `repeats` random splits (`low`, `high`: the 2.5 / 97.5
  percentiles over the splits). This is what picking one worker from data achieves out of sample;
  `headroom` = oracle − cross-fit oracle is the room a router has above that, not above random
  routing (which makes the room look larger than any router can use). On a fixed set of rows the
  two halves are complementary (a worker that looks better than it is on one half looks worse on
  the other), so the estimate is conservative where workers are close; `best_fixed_utility` (the
  worker chosen on train) is the other honest single-worker reference in every report.
- **cross-fit oracle by domain**: the same, choosing one worker per domain (a router that knows
  only the domain); a domain absent from the other half falls back to the pooled choice.
"""

from __future__ import annotations

import numpy as np

DEFAULT_SEEDS = 100
DEFAULT_REPEATS = 20


def always(measure: np.ndarray, worker_ids: list[str]) -> dict[str, float]:
    """Each worker's mean over the rows."""
    return {w: float(measure[:, i].mean()) for i, w in enumerate(worker_ids)}


def random_routing(measure: np.ndarray, seeds: int = DEFAULT_SEEDS, seed: int = 0) -> dict:
    """Uniform random routing over `seeds` seeds: mean, 95% interval over the seeds, expectation."""
    n, w = measure.shape
    rng = np.random.default_rng(seed)
    routes = rng.integers(0, w, size=(seeds, n))
    means = measure[np.arange(n)[None, :], routes].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(means.mean()), "low": float(lo), "high": float(hi),
            "expected": float(measure.mean()), "seeds": int(seeds)}


def oracle(measure: np.ndarray) -> float:
    return float(measure.max(axis=1).mean())


def cross_fit_scores(measure: np.ndarray, groups: list[str] | None = None, *, seed: int = 0) -> np.ndarray:
    """One random split into halves: every task's value under the worker chosen on the other
    half (per group when `groups` is given, else one worker for all). Returns (N,)."""
    n = len(measure)
    rng = np.random.default_rng(seed)
    half = np.zeros(n, bool)
    half[rng.permutation(n)[: n // 2]] = True
    out = np.empty(n)
    g = np.asarray(groups) if groups is not None else None
    for side in (half, ~half):
        other = ~side
        if not other.any():  # one task: nothing to choose on; the pooled mean stands in
            out[side] = measure[side].mean(axis=1)
            continue
        pooled = int(np.argmax(measure[other].mean(axis=0)))
        if g is None:
            out[side] = measure[side, pooled]
            continue
        for name in np.unique(g[side]):
            rows = side & (g == name)
            pick_rows = other & (g == name)
            col = int(np.argmax(measure[pick_rows].mean(axis=0))) if pick_rows.any() else pooled
            out[rows] = measure[rows, col]
    return out


def cross_fit_oracle(measure: np.ndarray, groups: list[str] | None = None, *, repeats: int = DEFAULT_REPEATS, seed: int = 0) -> dict:
    """The cross-fitted best single worker (per group when given), averaged over random splits. On
    one row there is no other half to choose on: the figure is undefined (`mean` None, `note` why)."""
    if len(measure) < 2:
        return {"mean": None, "low": None, "high": None, "repeats": int(repeats),
                "note": f"undefined on {len(measure)} row: a worker is chosen on one half and scored on the other"}
    vals = np.array([cross_fit_scores(measure, groups, seed=seed + r).mean() for r in range(repeats)])
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return {"mean": float(vals.mean()), "low": float(lo), "high": float(hi), "repeats": int(repeats)}


def baseline_rows(
    worker_ids: list[str],
    utility: np.ndarray,
    quality: np.ndarray | None = None,
    domains: list[str] | None = None,
    *,
    seeds: int = DEFAULT_SEEDS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
    router: dict[str, float] | None = None,
) -> dict:
    """Every baseline on these rows, for the utility and (where given) the quality.

    `router` ({"utility": x, "quality": y}) adds the router's share of the headroom:
    (router − cross-fit oracle) / (oracle − cross-fit oracle)."""
    if len(utility) == 0:
        raise ValueError("no rows: nothing to compute baselines on")
    measures = {"utility": np.asarray(utility, float)}
    if quality is not None and not np.isnan(quality).any():
        measures["quality"] = np.asarray(quality, float)
    out: dict = {"n_tasks": int(len(utility)), "worker_ids": list(worker_ids), "measures": list(measures)}
    for name, m in measures.items():
        row = {
            "always": always(m, worker_ids),
            "random": random_routing(m, seeds, seed),
            "oracle": oracle(m),
            "cross_fit_oracle": cross_fit_oracle(m, repeats=repeats, seed=seed),
        }
        if domains is not None and len(set(domains)) > 1:
            row["cross_fit_oracle_by_domain"] = cross_fit_oracle(m, domains, repeats=repeats, seed=seed)
        cf = row["cross_fit_oracle"]["mean"]
        row["headroom"] = None if cf is None else row["oracle"] - cf
        if router is not None and name in router:
            room = row["headroom"]
            row["router"] = float(router[name])
            row["router_share_of_headroom"] = (float((router[name] - cf) / room)
                                               if room is not None and abs(room) > 1e-12 else None)
        out[name] = row
    return out


def baseline_summary(b: dict) -> str:
    """One line: random routing's 95% interval, the cross-fit oracle and the headroom (utility)."""
    u = b["utility"]
    rnd, cf = u["random"], u["cross_fit_oracle"]
    share = u.get("router_share_of_headroom")
    if cf["mean"] is None:
        return f"random {rnd['mean']:.4f} [95% {rnd['low']:.4f}, {rnd['high']:.4f}] | cross-fit oracle and headroom {cf['note']}"
    return (f"random {rnd['mean']:.4f} [95% {rnd['low']:.4f}, {rnd['high']:.4f}] | cross-fit oracle {cf['mean']:.4f} | "
            f"headroom {u['headroom']:.4f}" + ("" if share is None else f" (router {share:+.1%} of it)"))


# Printed worker rows per table: with dozens of workers (EmbedLLM has 112) the text shows the best
# ones and says how many it left out; the JSON report and the metadata keep every worker.
SHOWN_WORKERS = 12


def shown_always(always: dict[str, float], limit: int = SHOWN_WORKERS) -> tuple[list[tuple[str, float]], int, float]:
    """The workers a printed table shows, best first (all of them up to `limit`, else the best
    `limit - 2`), how many it leaves out, and the worst value."""
    ranked = sorted(always.items(), key=lambda kv: -kv[1])
    keep = ranked if len(ranked) <= limit else ranked[:limit - 2]
    return keep, len(ranked) - len(keep), (ranked[-1][1] if ranked else float("nan"))


def always_lines(always: dict[str, float], limit: int = SHOWN_WORKERS) -> list[str]:
    """`always <worker> <value>`, best first; beyond `limit` workers, the best `limit - 2` and a line
    saying how many more there are."""
    keep, left_out, worst = shown_always(always, limit)
    lines = [f"  always {w:<28} {v:.4f}" for w, v in keep]
    if left_out:
        lines.append(f"  ... {left_out} more workers, down to {worst:.4f} (every one in the JSON report)")
    return lines


def baseline_lines(b: dict) -> list[str]:
    """The baselines as aligned text lines (the command line and the report summary); rows a
    command left out (`fugu-lite baseline random`) are skipped."""
    lines = []
    for name in b["measures"]:
        r = b[name]
        lines.append(f"{name} on {b['n_tasks']} tasks:")
        lines += always_lines(r.get("always", {}))
        if "random" in r:
            rnd = r["random"]
            lines.append(f"  random routing ({rnd['seeds']} seeds)      {rnd['mean']:.4f} [95%: {rnd['low']:.4f}, {rnd['high']:.4f}] "
                         f"(expectation {rnd['expected']:.4f})")
        if "oracle" in r:
            lines.append(f"  oracle ceiling                   {r['oracle']:.4f}")
        if "cross_fit_oracle" in r and r["cross_fit_oracle"]["mean"] is None:
            lines.append(f"  cross-fit oracle (best single)   {r['cross_fit_oracle']['note']}")
        elif "cross_fit_oracle" in r:
            cf = r["cross_fit_oracle"]
            lines.append(f"  cross-fit oracle (best single)   {cf['mean']:.4f} [95%: {cf['low']:.4f}, {cf['high']:.4f}] "
                         f"({cf['repeats']} half splits)")
        if "cross_fit_oracle_by_domain" in r:
            cd = r["cross_fit_oracle_by_domain"]
            lines.append(f"  cross-fit oracle (per domain)    {cd['mean']:.4f} [95%: {cd['low']:.4f}, {cd['high']:.4f}]")
        if r.get("headroom", 0) is None:
            lines.append("  headroom (oracle − cross-fit)    undefined (no cross-fit oracle)")
        elif "headroom" in r:
            lines.append(f"  headroom (oracle − cross-fit)    {r['headroom']:.4f}")
        if "router" in r:
            share = r["router_share_of_headroom"]
            lines.append(f"  router                           {r['router']:.4f} "
                         f"({'n/a' if share is None else f'{share:+.1%}'} of the headroom)")
    return lines


def baseline_markdown(b: dict) -> str:
    """One table per measure, for the asset metadata."""
    parts = []
    for name in b["measures"]:
        r = b[name]
        keep, left_out, worst = shown_always(r["always"])
        rows = [f"| always {w} | {v:.4f} | |" for w, v in keep]
        if left_out:
            rows.append(f"| ... {left_out} more workers | down to {worst:.4f} | every one in the JSON report |")
        rnd, cf = r["random"], r["cross_fit_oracle"]
        rows.append(f"| random ({rnd['seeds']} seeds) | {rnd['mean']:.4f} | 95% [{rnd['low']:.4f}, {rnd['high']:.4f}], expectation {rnd['expected']:.4f} |")
        rows.append(f"| oracle | {r['oracle']:.4f} | ceiling |")
        if cf["mean"] is None:
            rows.append(f"| cross-fit oracle | n/a | {cf['note']} |")
        else:
            rows.append(f"| cross-fit oracle | {cf['mean']:.4f} | best single worker chosen on the other half; 95% [{cf['low']:.4f}, {cf['high']:.4f}] |")
        if "cross_fit_oracle_by_domain" in r:
            cd = r["cross_fit_oracle_by_domain"]
            rows.append(f"| cross-fit oracle by domain | {cd['mean']:.4f} | 95% [{cd['low']:.4f}, {cd['high']:.4f}] |")
        rows.append("| headroom | n/a | no cross-fit oracle |" if r["headroom"] is None
                    else f"| headroom | {r['headroom']:.4f} | oracle − cross-fit oracle |")
        if "router" in r:
            share = r["router_share_of_headroom"]
            rows.append(f"| router | {r['router']:.4f} | {'n/a' if share is None else f'{share:+.1%}'} of the headroom |")
        parts.append("\n".join([f"**{name}** ({b['n_tasks']} tasks)", "", "| baseline | value | note |", "|---|---|---|", *rows]))
    return "\n\n".join(parts)
