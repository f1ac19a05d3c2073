"""The triage head's report: domain and difficulty accuracy, per domain, with confusion matrices,
against the majority-label baseline, and what the prediction is worth for routing.

- `domain`: accuracy overall and per true domain, the confusion matrix (rows: true domain,
  columns: predicted), and the majority baseline (always the most common train domain).
- `difficulty`: the same for the difficulty buckets (labels from the matrix, `policies/triage/train.py`),
  overall, per domain, and as a confusion matrix.
- `routing`: the triage head used as a router's input: each task goes to the worker with the best
  mean train utility in its *predicted* domain, against the best fixed worker (chosen on train),
  the same rule with the *true* domain (the ceiling of domain-only routing) and the oracle.
torch loads lazily (through `policies/triage/train.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fugu_pipeline.files import atomic_write


def _confusion(true: np.ndarray, pred: np.ndarray, n: int) -> list[list[int]]:
    m = np.zeros((n, n), dtype=int)
    np.add.at(m, (true, pred), 1)
    return m.tolist()


def triage_report(ckpt, data, split: str = "test") -> dict:
    """The report of a loaded triage checkpoint (`policies.triage.train.load_triage`) on one split."""
    from fugu_pipeline.policies.triage.train import TriageConfig, difficulty_labels, triage_probabilities

    m = ckpt  # the label vocabulary (domains, buckets, edges) and the manifest's worker_ids, param_count
    rows, train = data.split(split), data.split("train")
    if rows.n_tasks == 0:
        raise ValueError(f"the '{split}' split has no rows")
    if rows.quality is None or np.isnan(rows.quality).any():
        raise ValueError("difficulty labels need the matrix's quality; this data has none")
    cfg = TriageConfig(solve_threshold=m.solve_threshold, difficulty_edges=m.difficulty_edges, difficulty_names=m.difficulty_names)
    p_dom, p_diff = triage_probabilities(ckpt.head, rows.features)
    pred_d, pred_h = p_dom.argmax(axis=1), p_diff.argmax(axis=1)
    known = np.array([d in m.domains for d in rows.domains])
    true_d = np.array([m.domains.index(d) if d in m.domains else -1 for d in rows.domains])
    true_h = difficulty_labels(rows.quality, cfg)[0]
    train_d = [d for d in train.domains if d in m.domains]
    # the most frequent training domain; on a tie the first in the checkpoint's order (not a set's, which changes per process)
    major_d = m.domains.index(max(sorted(set(train_d), key=m.domains.index), key=train_d.count)) if train_d else 0
    major_h = int(np.bincount(difficulty_labels(train.quality, cfg)[0], minlength=len(m.difficulty_names)).argmax()) \
        if train.quality is not None and train.n_tasks else 0

    per_domain = []
    for i, d in enumerate(m.domains):
        s = true_d == i
        if not s.any():
            continue
        per_domain.append({"domain": d, "n": int(s.sum()), "domain_accuracy": float((pred_d[s] == i).mean()),
                           "difficulty_accuracy": float((pred_h[s] == true_h[s]).mean()),
                           "difficulty_counts": {n: int((true_h[s] == j).sum()) for j, n in enumerate(m.difficulty_names)}})
    rep = {
        "split": split, "n_tasks": int(rows.n_tasks), "checkpoint": str(ckpt.path), "domains": m.domains,
        "difficulty_names": m.difficulty_names, "difficulty_edges": m.difficulty_edges, "solve_threshold": m.solve_threshold,
        "worker_ids": m.worker_ids, "param_count": m.param_count, "n_unknown_domain": int((~known).sum()),
        "domain": {"accuracy": float((pred_d[known] == true_d[known]).mean()) if known.any() else None,
                   "majority_baseline": float((true_d[known] == major_d).mean()) if known.any() else None,
                   "majority_label": m.domains[major_d],
                   "confusion": _confusion(true_d[known], pred_d[known], len(m.domains))},
        "difficulty": {"accuracy": float((pred_h == true_h).mean()),
                       "majority_baseline": float((true_h == major_h).mean()),
                       "majority_label": m.difficulty_names[major_h],
                       "confusion": _confusion(true_h, pred_h, len(m.difficulty_names))},
        "per_domain": per_domain,
    }
    if list(rows.worker_ids) == list(m.worker_ids):
        rep["routing"] = _routing_value(rows, train, pred_d, true_d, m.domains)
    return rep


def _routing_value(rows, train, pred_d: np.ndarray, true_d: np.ndarray, domains: list[str]) -> dict:
    fixed = int(np.argmax(train.utility.mean(axis=0)))
    tdom = np.asarray(train.domains)
    best_in = np.array([int(np.argmax(train.utility[tdom == d].mean(axis=0))) if (tdom == d).any() else fixed for d in domains])
    n = np.arange(rows.n_tasks)
    by_pred = rows.utility[n, best_in[pred_d]]
    by_true = rows.utility[n, np.where(true_d >= 0, best_in[np.maximum(true_d, 0)], fixed)]
    return {"measure": "utility", "by_predicted_domain": float(by_pred.mean()), "by_true_domain": float(by_true.mean()),
            "best_fixed": float(rows.utility[:, fixed].mean()), "best_fixed_worker": rows.worker_ids[fixed],
            "oracle": float(rows.utility.max(axis=1).mean()),
            "worker_per_domain": {d: rows.worker_ids[int(best_in[i])] for i, d in enumerate(domains)}}


def triage_lines(rep: dict) -> list[str]:
    d, h = rep["domain"], rep["difficulty"]
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    lines = [f"triage on the {rep['split']} split ({rep['n_tasks']} tasks; {rep['param_count']:,} params)",
             f"  domain accuracy     {fmt(d['accuracy'])}  (majority '{d['majority_label']}': {fmt(d['majority_baseline'])})",
             f"  difficulty accuracy {fmt(h['accuracy'])}  (majority '{h['majority_label']}': {fmt(h['majority_baseline'])}; "
             f"buckets {rep['difficulty_names']} at solve share {rep['difficulty_edges']})"]
    for r in rep["per_domain"]:
        lines.append(f"  {r['domain']:<14} n {r['n']:>4}  domain acc {r['domain_accuracy']:.4f}  difficulty acc "
                     f"{r['difficulty_accuracy']:.4f}  labels {r['difficulty_counts']}")
    lines.append("  domain confusion (rows true, columns predicted: " + ", ".join(rep["domains"]) + ")")
    lines += [f"    {name:<12} {row}" for name, row in zip(rep["domains"], d["confusion"])]
    lines.append("  difficulty confusion (rows true, columns predicted: " + ", ".join(rep["difficulty_names"]) + ")")
    lines += [f"    {name:<12} {row}" for name, row in zip(rep["difficulty_names"], h["confusion"])]
    if "routing" in rep:
        r = rep["routing"]
        lines.append(f"  routing by predicted domain {r['by_predicted_domain']:.4f} | by true domain {r['by_true_domain']:.4f} | "
                     f"best fixed ({r['best_fixed_worker']}) {r['best_fixed']:.4f} | oracle {r['oracle']:.4f}  (utility)")
    return lines


def triage_markdown(rep: dict) -> str:
    d, h = rep["domain"], rep["difficulty"]
    parts = ["| domain | n | domain acc | difficulty acc |", "|---|---|---|---|"]
    parts += [f"| {r['domain']} | {r['n']} | {r['domain_accuracy']:.4f} | {r['difficulty_accuracy']:.4f} |" for r in rep["per_domain"]]
    for title, names, conf in (("domain", rep["domains"], d["confusion"]), ("difficulty", rep["difficulty_names"], h["confusion"])):
        parts += ["", f"**{title} confusion** (rows true, columns predicted)", "",
                  "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        parts += [f"| {n} | " + " | ".join(str(v) for v in row) + " |" for n, row in zip(names, conf)]
    return "\n".join(parts)


def write_triage_report(rep: dict, path: str | Path) -> Path:
    return atomic_write(Path(path), json.dumps(rep, indent=2, sort_keys=True, default=float))
