"""Leave-one-domain-out evaluation of the whole training procedure: how routing holds up on a
domain it never saw.

For each domain D of the matrix: the rows of every other domain (all splits) are the training
data; `fit_and_save` runs on them with `objective: lodo` (so the choice among heads and grid points
is itself made by leaving one TRAINING domain out at a time: D never influences it); the chosen
head routes D's rows with the domain hidden (unknown at routing time: the prior falls back to the
pooled mean, the same-domain bonus is off). Under that objective a head replaces the domain prior
(which routes an unseen domain like the best fixed worker) only when its inner gain over the prior
has a 95% interval above zero, domains resampled (`policies/oneshot/fit.py:unseen_domain_gain`). The
baseline is the best fixed worker chosen on the training domains. Figures are macro averages over the held-out domains, with a 95% interval from
a bootstrap that resamples rows within each domain.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np


def stratified_macro_bootstrap(diffs: dict[str, np.ndarray], n_boot: int = 2000, seed: int = 0) -> dict:
    """Macro mean of per-row differences with a 95% interval (rows resampled within each domain)."""
    rng = np.random.default_rng(seed)
    vals = np.zeros(n_boot)
    for d in diffs.values():
        d = np.asarray(d, float)
        vals += d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    vals /= max(len(diffs), 1)
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return {"mean": float(np.mean([np.mean(d) for d in diffs.values()])), "low": float(lo), "high": float(hi)}


def leave_one_domain_out(data, cfg, *, log=None, domains: list[str] | None = None) -> dict:
    """{"rows": per held-out domain, "router_macro", "fixed_macro", "difference": CI}. `cfg` is a
    TrainSetConfig; its objective is set to 'lodo' for the inner choice."""
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.policies.oneshot.fit import fit_and_save

    log = log or (lambda m: None)
    cfg = cfg.model_copy(update={"objective": "lodo"})
    doms = np.asarray(data.domains, dtype=str)
    held_out = sorted(set(doms.tolist())) if domains is None else list(domains)
    present = sorted(set(doms.tolist()))
    if len(present) < 4 or set(held_out) - set(present):
        from fugu_pipeline.features.routing_data import TrainingDataError

        # each held-out domain leaves the others to train on, and the inner choice leaves one of those
        # out in turn over at least 3 (`policies/oneshot/fit.py`): with fewer, an inner fit on an empty or one-domain
        # set failed with a message about that set, not this data
        missing = sorted(set(held_out) - set(present))
        raise TrainingDataError(f"leave-one-domain-out needs at least 4 domains (one held out, 3 for the inner choice), "
                                f"this data has {len(present)}: {present[:8]}" if not missing else
                                f"leave-one-domain-out: domains {missing} are not in the data (it has {present[:8]})")
    rows, diffs = [], {}
    for D in held_out:
        tr, te = np.flatnonzero(doms != D), np.flatnonzero(doms == D)
        train = data.subset(tr)
        train = dataclasses.replace(train, splits=np.full(len(tr), "train"), data_version="")
        fixed = int(np.argmax(train.utility.mean(axis=0)))
        with tempfile.TemporaryDirectory() as tmp:
            report = fit_and_save(train, Path(tmp), cfg, log=lambda m: None, force=True)
            head = load_checkpoint(report.selected_path()).head
            s = head_scores(head, data.features[te], None)  # the held-out domain is unknown at routing time
        u = data.utility[te, np.argmax(s, axis=1)]
        f = data.utility[te, fixed]
        diffs[D] = u - f
        rows.append({"domain": D, "n": int(len(te)), "router": float(u.mean()), "best_fixed": float(f.mean()),
                     "best_fixed_worker": data.worker_ids[fixed], "pick": report.selected,
                     "oracle": float(data.utility[te].max(axis=1).mean())})
        log(f"lodo {D}: router {u.mean():.4f} vs best fixed {f.mean():.4f} ({report.selected})")
    return {"rows": rows, "router_macro": float(np.mean([r["router"] for r in rows])),
            "fixed_macro": float(np.mean([r["best_fixed"] for r in rows])),
            "difference": stratified_macro_bootstrap(diffs)}
