"""The one-step router's composite (`composite.py`) on a RoutingData: routes from the heads, the
live run through a `LiveEvaluator`, king and challenger side by side; and `RouterKind`, the one-step
router as a kind of the one contest (`evaluate/contest.py`). Other kinds that share the router slot (a
cascade) are scored by their own scorers, which the policies registry hands in (`mates`).

Shared by `promoted_router`, `fugu-lite validate` (king versus challenger) and the evaluation
reports (`eval_report_*`, `fugu-lite evaluate`: the head against the current king).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.composite import (
    CompositeConfig,
    audit_mask,
    HeldOut,
    LiveRows,
    held_out,
    paired_difference,
    score_head,
)
from fugu_pipeline.evaluate.contest import Entrant, KindBase, LiveUnavailable, Outcomes
from fugu_pipeline.evaluate.feature_source import FeatureSource
from fugu_pipeline.evaluate.live import LiveBudgetExceeded, LiveEvaluator, LivePolicy
from fugu_pipeline.evaluate.decision import Candidate
from fugu_pipeline.evaluate.reports import head_scores, quality_predictions, routed_utility
from fugu_pipeline.evaluate.metrics import pick
from fugu_pipeline.policies.oneshot.default_report import routes_at, served_routes
from fugu_pipeline.route.shipped import served_point_of
from fugu_pipeline.train.checkpoints import weight_sanity
from fugu_pipeline.workers.contract import FatalWorkerError

def head_routes(checkpoint, data) -> np.ndarray:
    """The routes (worker indices) a loaded checkpoint serves on the test rows, in split order
    (`default_report.served_routes`: at its operating point when it has one)."""
    return served_routes(checkpoint, data.split("test"))


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
        policy = LivePolicy(label=label, checkpoint=checkpoint_path, seed=cfg.seed,
                            routes={t: held.worker_ids[int(routes[row_of[t]])] for t in ids})
        try:
            outcomes = live.evaluate(policy, [tasks[t] for t in ids])
        except (LiveBudgetExceeded, FatalWorkerError) as exc:  # no partial live term: both heads or neither
            return None, f"live term not measured: {exc}"
        out[b] = LiveRows(quality=np.array([o.quality for o in outcomes], float),
                          calls=np.array([o.calls for o in outcomes], float),
                          turns=np.array([o.turns for o in outcomes], float),
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
    from fugu_pipeline.policies.oneshot.heads import ROUTER_HEAD_KINDS

    held = held_out(data, cfg)
    routes = head_routes(checkpoint, data)
    king_routes, king_note = None, "no king"
    if king is not None and king.manifest.head_kind not in ROUTER_HEAD_KINDS:
        king_note = (f"the king is a {king.manifest.head_kind} ({king.manifest.content_hash}): this report scores "
                     "one-step routes; the promotion contest scores it as its own kind (a cascade: from the recorded replies)")
    elif king is not None:
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


# --------------------------------------------------------------------------- a one-step head's figures for the decision


def eval_rows(data, composite: CompositeConfig):
    """The held-out rows promotion decides on: the test split minus its audit slice."""
    test = data.split("test")
    return test.subset(np.flatnonzero(~audit_mask(test.task_ids, composite)))


def candidate(checkpoint, data, expected_contract=None, composite: CompositeConfig | None = None):
    """Score a checkpoint on the frozen held-out eval rows for promotion."""
    test, train = eval_rows(data, composite or CompositeConfig()), data.split("train")
    fixed = int(np.argmax(train.utility.mean(axis=0)))
    contract_problems = checkpoint.manifest.feature_contract.differences(expected_contract) if expected_contract else []
    workers_ok = list(checkpoint.manifest.worker_ids) == list(data.worker_ids)
    if not workers_ok:
        contract_problems.append(f"workers {checkpoint.manifest.worker_ids} differ from the matrix's {data.worker_ids}")
    q_std = None
    if contract_problems or not workers_ok:
        test_u = np.full(len(test.task_ids), np.nan)
        train_u = float("nan")
        val_u = None
    else:
        q_pred = quality_predictions(checkpoint.head, test.features, test.domains)
        q_std = None if q_pred is None else float(np.std(q_pred))
        served = served_point_of(checkpoint)  # the files beside it, read once for both splits
        test_u = pick(test.utility, routes_at(checkpoint, test, *served))
        train_u = float(np.mean(pick(train.utility, routes_at(checkpoint, train, *served))))
        val_u = validation_utility(checkpoint, data)
    return Candidate(
        path=str(checkpoint.path), method=checkpoint.manifest.method, content_hash=checkpoint.manifest.content_hash,
        test_utility=test_u, best_fixed_utility=test.utility[:, fixed], train_router_utility=train_u,
        weight_problems=weight_sanity(checkpoint.state_dict, checkpoint.manifest),
        contract_problems=contract_problems, val_router_utility=val_u, quality_pred_std=q_std,
    )


def scored_candidate(checkpoint, features: FeatureSource, composite: CompositeConfig):
    """`candidate` on the checkpoint's own features; one that cannot be scored carries why."""
    own, problems = features.for_checkpoint(checkpoint)
    if not problems:
        return candidate(checkpoint, own, expected_contract=own.contract, composite=composite)
    out = candidate(checkpoint, features.data, expected_contract=features.data.contract, composite=composite)
    out.contract_problems = list(dict.fromkeys(out.contract_problems + problems))
    return out


def validation_utility(checkpoint, data) -> float | None:
    """The validation utility promotion ranks challengers by. A head fitted on the val rows too
    (`metrics.fit_splits` holds 'val': the heads of `fugu-lite train`) is ranked by the
    out-of-fold figure its training recorded, never by its in-sample score on rows it has seen."""
    m = checkpoint.manifest.metrics
    if "val" in (m.get("fit_splits") or []):
        v = m.get("val_utility")
        return float(v) if v is not None and checkpoint.manifest.data_version == data.data_version else None
    val = data.split("val")
    if not len(val.task_ids):
        return None
    return float(np.mean(routed_utility(val.utility, head_scores(checkpoint.head, val.features, val.domains))))


# --------------------------------------------------------------------------- the one-step router as a contest kind


class RouterKind(KindBase):
    """The router slot of the one contest (`evaluate/contest.py`): every checkpoint, the king included,
    scored on its own features of the same held-out rows (`feature_source.py`). A one-step head's
    outcome on a task is the stored quality of the worker it routes to (one turn), its live term
    one call to that worker (`OneCallEvaluator`). Another kind in the same slot is scored by its
    own scorer from `mates` ({head kind: scorer, or the reason it cannot be scored here}, from the
    policies registry): a cascade by `policies/cascade/contest.CascadeScorer` on the same rows (the quality
    of the answer it returns, what its steps paid, its calls as turns); without the host's
    recorded replies it is refused at load with the reason."""

    name = "router"
    history = "history.jsonl"
    lock = ".lock"
    live_name = "one call per task (route, call, grade)"

    def __init__(self, features: FeatureSource, *, live: LiveEvaluator | None = None, tasks: dict | None = None,
                 mates: dict | None = None):
        from fugu_pipeline.train.pointer import POINTER

        self.pointer = POINTER
        self.features = features
        self.live = live
        self.tasks = tasks
        self.live_tasks = set(tasks) if (live is not None and tasks) else None
        self.live_note = ("live term not measured: no live evaluator (no worker config given)" if live is None else
                          "live term not measured: no task file with graders for the held-out rows (--tasks)")
        if live is not None:
            self.live_name = live.name
        self.models_dir = None  # set by the contest: where the probe inputs are kept for preflight
        self.mates = dict(mates or {})  # head kind -> its scorer, or why it cannot be scored here

    def _mate(self, entrant):
        """The scorer of another kind in this slot that `entrant` is (None: a one-step head)."""
        return None if entrant.manifest is None else self.mates.get(entrant.manifest.head_kind)

    def load(self, path: str) -> Entrant:
        from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint
        from fugu_pipeline.policies.oneshot.heads import ROUTER_HEAD_KINDS

        ckpt = load_checkpoint(path)
        if ckpt.manifest.head_kind in self.mates:
            if isinstance(self.mates[ckpt.manifest.head_kind], str):
                raise CheckpointError(f"{path}: {self.mates[ckpt.manifest.head_kind]}")
        elif ckpt.manifest.head_kind not in ROUTER_HEAD_KINDS:
            raise CheckpointError(f"{path}: a {ckpt.manifest.head_kind!r} head is not a one-step router; it is judged "
                                  "by its own kind's contest")
        return Entrant(str(ckpt.path), ckpt.manifest.method, ckpt.manifest.content_hash, ckpt, ckpt.manifest)

    def _data(self, entrant):
        return self.features.for_checkpoint(entrant.head)

    def contract_problems(self, entrant) -> list[str]:
        return list(self._data(entrant)[1])

    def held_out(self, cfg: CompositeConfig) -> HeldOut:
        self.composite_seed = cfg.seed
        return held_out(self.features.data, cfg)

    def candidate(self, entrant, held: HeldOut, cfg: CompositeConfig):
        if (mate := self._mate(entrant)) is not None:
            return mate.candidate(entrant, held, self.contract_problems(entrant))
        return scored_candidate(entrant.head, self.features, cfg)

    def check_live(self, entrant) -> None:
        if (mate := self._mate(entrant)) is not None:
            mate.check_live(entrant)

    def end_live(self) -> None:
        for mate in self.mates.values():
            if not isinstance(mate, str):
                mate.end_live()

    def live_label(self, entrant) -> str:
        mate = self._mate(entrant)
        return mate.live_name if mate is not None else self.live_name

    def outcomes(self, entrant, task_ids: list[str], *, live: bool) -> Outcomes:
        if (mate := self._mate(entrant)) is not None:
            if live:  # run as it serves, through the same live evaluator (`policies/cascade/live.py`)
                return mate.live_outcomes(entrant, task_ids, self.live, self.tasks, getattr(self, "composite_seed", 0))
            return mate.outcomes(entrant, task_ids)
        data, _ = self._data(entrant)
        test = data.split("test")
        row = {t: i for i, t in enumerate(test.task_ids)}
        idx = np.array([row[t] for t in task_ids], int)
        routes = head_routes(entrant.head, data)[idx]
        workers = [test.worker_ids[int(r)] for r in routes]
        if live:
            policy = LivePolicy(label=entrant.label, checkpoint=entrant.path, head=entrant.content_hash,
                                seed=getattr(self, "composite_seed", 0), routes=dict(zip(task_ids, workers)))
            try:
                got = self.live.evaluate(policy, [self.tasks[t] for t in task_ids])
            except (LiveBudgetExceeded, FatalWorkerError) as exc:
                raise LiveUnavailable(str(exc)) from None
            return Outcomes(list(task_ids), np.array([o.quality for o in got], float), np.array([o.turns for o in got], float),
                            np.array([o.cost_usd for o in got], float), workers, errors=sum(o.error is not None for o in got))
        measure = test.quality if test.quality is not None and not np.isnan(test.quality).any() else test.utility
        n = np.arange(len(idx))
        cost = test.cost_usd[idx, routes] if test.cost_usd is not None else np.zeros(len(idx))
        return Outcomes(list(task_ids), measure[idx][n, routes], np.ones(len(idx)), np.nan_to_num(cost), workers,
                        utility=test.utility[idx][n, routes])

    def behaviour(self, entrant):
        from fugu_pipeline.evaluate.probe import checkpoint_behaviour, probe_fingerprint, probe_ids, save_probe

        if (mate := self._mate(entrant)) is not None:
            return mate.behaviour(entrant, self.name)
        data, _ = self._data(entrant)
        ids = probe_ids([t for t, s in zip(data.task_ids, data.splits) if s != "test"])
        at = {t: i for i, t in enumerate(data.task_ids)}
        rows = np.array([at[t] for t in ids], int)
        probe = probe_fingerprint(self.name, ids)
        domains = [data.domains[i] for i in rows]
        if self.models_dir is not None:
            save_probe(self.models_dir, self.name, entrant.manifest.contract_fingerprint, probe, data.features[rows], domains)
        return checkpoint_behaviour(probe, entrant.head, data.features[rows], domains)

    def receipt_data(self):
        return self.features.data
