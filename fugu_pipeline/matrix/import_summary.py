"""What `fugu-lite import` prints about an imported matrix: counts and splits, per split each
worker's mean and the oracle, the worker chosen on train with its test figure, and the same per
domain and per tag (with mean cost)."""

from __future__ import annotations

from collections import Counter

from fugu_pipeline.matrix.import_format import RewardRow


def summarize(rows: list[RewardRow]) -> dict:
    """Counts, and per split: per-worker mean quality, oracle, best fixed worker; plus the worker
    chosen on train and its test quality. Uses `rewards` where rows have no `quality`."""
    workers = rows[0].worker_ids
    metric = "quality" if all(r.quality is not None for r in rows) else "rewards"
    by_split: dict[str, list[list[float]]] = {}
    for r in rows:
        by_split.setdefault(r.split, []).append(getattr(r, metric))
    per_split = {}
    for split, vals in sorted(by_split.items()):
        means = {w: sum(v[j] for v in vals) / len(vals) for j, w in enumerate(workers)}
        best = max(workers, key=means.__getitem__)
        per_split[split] = {"rows": len(vals), "mean": means, "oracle": sum(max(v) for v in vals) / len(vals),
                            "best_fixed": {"worker": best, metric: means[best]}}
    splits_of: dict[str, set[str]] = {}
    for r in rows:
        splits_of.setdefault(r.prompt, set()).add(r.split)
    out = {"rows": len(rows), "workers": list(workers), "metric": metric,
           "splits": {s: len(v) for s, v in sorted(by_split.items())}, "by_split": per_split,
           "prompts_in_several_splits": sum(len(s) > 1 for s in splits_of.values())}
    if "train" in per_split and "test" in per_split:
        w = per_split["train"]["best_fixed"]["worker"]
        out["best_fixed_on_train"] = {"worker": w, "train": per_split["train"]["mean"][w], "test": per_split["test"]["mean"][w]}
    out["per_domain"] = _groups(rows, metric, lambda r: [r.domain])
    if any(r.tags for r in rows):
        out["per_tag"] = _groups(rows, metric, lambda r: r.tags)
    return out


def _groups(rows: list[RewardRow], metric: str, keys) -> dict[str, dict]:
    """Per group (a domain, a tag): rows per split, each worker's mean `metric` and mean cost over
    the group's rows, and the group's best worker on its training rows."""
    workers = rows[0].worker_ids
    members: dict[str, list[RewardRow]] = {}
    for r in rows:
        for k in keys(r):
            members.setdefault(k, []).append(r)
    out = {}
    for name, rs in sorted(members.items()):
        mean = lambda vals: [sum(v[j] for v in vals) / len(vals) for j in range(len(workers))]  # noqa: E731
        m = mean([getattr(r, metric) for r in rs])
        g: dict = {"rows": dict(sorted(Counter(r.split for r in rs).items())),
                   "mean": {w: round(x, 6) for w, x in zip(workers, m)}}
        train = [getattr(r, metric) for r in rs if r.split == "train"]
        if train:
            t = mean(train)
            g["best_on_train"] = workers[max(range(len(workers)), key=t.__getitem__)]
        costs = [r.cost_usd for r in rs if r.cost_usd is not None]
        if costs:
            g["mean_cost_usd"] = {w: float(f"{x:.6g}") for w, x in zip(workers, mean(costs))}
        out[name] = g
    return out
