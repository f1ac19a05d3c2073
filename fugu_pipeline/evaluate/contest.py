"""Scoring heads with the composite (`composite.py`) on a RoutingData: routes from the heads,
the live run through a `LiveEvaluator`, king and challenger side by side.

Shared by `promoted_router`, `fugu-lite validate` (king versus challenger) and the evaluation
reports (`eval_report_*`, `fugu-lite evaluate`: the head against the current king).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.composite import (
    CompositeConfig,
    HeldOut,
    LiveRows,
    held_out,
    paired_difference,
    score_head,
)
from fugu_pipeline.evaluate.feature_source import FeatureSource
from fugu_pipeline.evaluate.live import LiveBudgetExceeded, LiveEvaluator, LivePolicy
from fugu_pipeline.evaluate.reports import head_scores
from fugu_pipeline.workers.contract import FatalWorkerError


def head_routes(checkpoint, data) -> np.ndarray:
    """Greedy routes (worker indices) of a loaded checkpoint on the test rows, in split order."""
    test = data.split("test")
    return np.argmax(head_scores(checkpoint.head, test.features, test.domains), axis=1)


def live_rows(live: LiveEvaluator | None, tasks: dict | None, label: str, checkpoint_path: str, routes: np.ndarray,
              held: HeldOut, cfg: CompositeConfig) -> tuple[dict[str, LiveRows] | None, str]:
    """One head's live outcomes per benchmark on the fixed live sample, and a note saying what ran."""
    if cfg.live_sample == 0:
        return None, "live term off (live_sample: 0)"
    if live is None:
        return None, "live term not measured: no live evaluator (no worker config given)"
    if not tasks:
        return None, "live term not measured: no task file with graders for the held-out rows (--tasks)"
    row_of = {t: i for i, t in enumerate(held.task_ids)}
    out: dict[str, LiveRows] = {}
    total = 0
    for b in held.names():
        ids = held.live_sample(b, cfg.live_sample, cfg.seed, available=set(tasks))
        if not ids:
            continue
        policy = LivePolicy(label=label, checkpoint=checkpoint_path,
                            routes={t: held.worker_ids[int(routes[row_of[t]])] for t in ids})
        try:
            outcomes = live.evaluate(policy, [tasks[t] for t in ids])
        except (LiveBudgetExceeded, FatalWorkerError) as exc:  # no partial live term: both heads or neither
            return None, f"live term not measured: {exc}"
        out[b] = LiveRows(quality=np.array([o.quality for o in outcomes], float),
                          calls=np.array([o.calls for o in outcomes], float),
                          cost_usd=float(sum(o.cost_usd for o in outcomes)),
                          errors=sum(o.error is not None for o in outcomes))
        total += len(ids)
    if not out:
        return None, "live term not measured: none of the held-out tasks is in the task files"
    return out, f"live: {live.name}, {total} tasks ({cfg.live_sample} a benchmark at most)"


def score_against_king(checkpoint, king, data, cfg: CompositeConfig, *, live: LiveEvaluator | None = None,
                       tasks: dict | None = None, features: FeatureSource | None = None) -> dict:
    """The composite of `checkpoint` (scored on `data`, its own features) and of the king, with the
    paired bootstrap of their difference, on the same held-out rows. The king reads its own
    features from `features` (the rows its contract describes); without `features`, or when the
    king's encoder model differs, it is scored only if it reads `data`'s features.

    Returns {"challenger", "king" (or None), "difference" (or None), "live", "king_note"}."""
    held = held_out(data, cfg)
    routes = head_routes(checkpoint, data)
    king_routes, king_note = None, "no king"
    if king is not None:
        source = features if features is not None else FeatureSource.fixed(data)
        king_data, problems = source.for_checkpoint(king)
        if problems:
            king_note = "the king uses other features or workers (" + "; ".join(problems) + "): not scored on these rows"
        else:
            king_routes, king_note = head_routes(king, king_data), f"king {king.manifest.method} {king.manifest.content_hash}"
    live_c, note = live_rows(live, tasks, "challenger", str(checkpoint.path), routes, held, cfg)
    ch = score_head(routes, held, cfg, king_routes=king_routes, live=live_c)
    out = {"challenger": ch, "king": None, "difference": None, "live": note, "king_note": king_note,
           "audit": {"fraction": cfg.audit_fraction, "rows": int(held.audit.sum()), "of": int(len(held.audit))}}
    if king_routes is not None:
        live_k, note_k = live_rows(live, tasks, "king", str(king.path), king_routes, held, cfg)
        if (live_k is None) != (live_c is None):  # scored alike or not at all
            out["live"] = note if live_c is None else note_k  # the failure's reason
            live_c, live_k = None, None
            ch = score_head(routes, held, cfg, king_routes=king_routes)
            out["challenger"] = ch
        kg = score_head(king_routes, held, cfg, live=live_k, is_king=True)
        out["king"] = kg
        out["difference"] = paired_difference(routes, king_routes, held, cfg, ch, kg, live_c, live_k)
    return out


def load_king(models_dir: str | Path):
    """The promoted checkpoint, loaded, or None (none promoted, or it cannot be loaded: see `king_or_why`)."""
    return king_or_why(models_dir)[0]


def king_or_why(models_dir: str | Path) -> tuple[object | None, str | None]:
    """(the promoted checkpoint, None); (None, None) when nothing is promoted; (None, why) when the
    pointer is damaged, names a checkpoint that cannot be loaded, or names another checkpoint than
    the one it promoted (its content_hash differs from the manifest's)."""
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint
    from fugu_pipeline.train.pointer import pointer_location, pointer_target, read_pointer

    try:
        pointer = read_pointer(models_dir)
        if pointer is None:
            return None, None
        king = load_checkpoint(pointer_target(models_dir, pointer))
    except (CheckpointError, OSError) as exc:
        return None, str(exc)
    want = pointer.get("content_hash")
    if want and want != king.manifest.content_hash:
        return None, (f"{pointer_location(models_dir)}: content_hash {want} but {pointer['checkpoint']} holds checkpoint "
                      f"{king.manifest.content_hash}: not the promoted checkpoint; re-run promotion or restore it")
    return king, None


def add_composite(rep: dict, checkpoint, data, models_dir: str | Path | None, cfg: CompositeConfig, *,
                  live: LiveEvaluator | None = None, tasks: dict | None = None,
                  features: FeatureSource | None = None) -> dict:
    """Put the composite of `checkpoint` (against the current king of `models_dir`, novelty
    included, the king on its own features from `features`) with every term into an evaluation
    report, and onto its summary line."""
    king, why = king_or_why(models_dir) if models_dir is not None else (None, None)
    contest = score_against_king(checkpoint, king, data, cfg, live=live, tasks=tasks, features=features)
    if why:
        contest["king_note"] = f"the promoted checkpoint cannot be loaded, not scored: {why}"
    rep["composite"] = contest
    c = contest["challenger"]["composite"]
    k = contest["king"]["composite"] if contest["king"] is not None else None
    tail = f" | {rep['utility_formula']}" if rep.get("utility_formula") else ""
    head = rep["summary"].removesuffix(tail) if tail and rep["summary"].endswith(tail) else rep["summary"]
    rep["summary"] = head + f" | composite {c:.4f}" + ("" if k is None else f" (king {k:.4f})") + tail  # the formula stays last
    return rep
