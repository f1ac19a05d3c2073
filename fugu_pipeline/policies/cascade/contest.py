"""A cascade in the router slot of the one contest (`evaluate/contest.py`, `policies/oneshot/contest.RouterKind`).

The promoted router (`models/promoted/current.json`) may be a one-step head or a cascade: the
king and a challenger may each be either, and both answer the same held-out rows. This module is
the cascade's scorer there; `RouterKind` asks it whenever an entrant is a cascade checkpoint, and
everything else (gates, composite with its overfit gate, king + margin with a significant paired
difference, compare-and-swap, history) is the contest's one code path.

How a cascade is scored, from the host's recorded replies (the reward matrix's `answers` table or
its collected responses; no call is made):
- **outcome per task**: the graded quality of the answer it returns on that row, its utility (the
  matrix's reward formula over the quality, the cost and the latency it paid), and its **cost**:
  what its steps actually paid on that row (a step's recorded cost counts only when the cascade
  reaches it; `policies/cascade/evaluate.py`);
- **turns**: the worker calls it made on the row (each worker of each step it reached). The
  composite's efficiency term is correct answers per call, so a cascade that asks two cheap
  workers and then a strong one spends 3 where a one-step head spends 1;
- **decision** (novelty against the king): the workers it called, `a+b>c` (`+` within a step,
  `>` between steps); a one-step head's decision is its worker, so a cascade that stops at one
  worker decides as a one-step head routing there;
- **best fixed worker** and **train figure**: as for a one-step head (the worker with the best
  train utility; the cascade's own mean utility on the train rows);
- **validation figure** (which of several challengers enters): the out-of-fold figure its
  training recorded (`metrics.val_utility`), as for the heads `fugu-lite train` fits on val rows;
- **behaviour** (duplicate gate): on the host's probe rows, the worker whose answer it returns
  (one-hot, centred) and its verifier's score for every worker's reply (centred per row);
  decisions: the workers it called. Its vector is twice a one-step head's length, so a cascade
  is compared with cascades judged before, never with a one-step head.
- **live term**: the contest's live sample run as the cascade serves (`live.py`): routed by the
  loaded cascade, each step's workers called through the contest's live evaluator (its budget,
  cost ledger and store), the answer it returns graded; its calls are its turns. Without a live
  evaluator or task graders it is left out for both heads, as for one-step heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.contest import Entrant, Outcomes

@dataclass
class AnswerSource:
    """The host's recorded replies for a cascade: `load(data, encode, names)` → (answer grid, verifier
    inputs) for `data`'s rows in its worker order (`encode`: the verifier reads the encoder's
    features of each reply, not only its statistics; `names`: the statistics the checkpoint reads)."""

    load: Callable

    @classmethod
    def from_matrix(cls, db_path: str | Path, settings, cache_root: str | Path) -> "AnswerSource":
        """The replies of the reward matrix at `db_path`, each reply encoded (when the cascade reads
        it) by the model of `data`'s contract on `settings`' device, through the cache at `cache_root`."""

        def load(data, encode: bool, names):
            from fugu_pipeline.matrix.answers import read_answers
            from fugu_pipeline.route.router import encoder_settings_for
            from fugu_pipeline.policies.cascade.cross_encoder import CROSS_STAT
            from fugu_pipeline.policies.cascade.fit import answer_inputs

            grid = read_answers(db_path, data.task_ids, data.worker_ids)
            own = encoder_settings_for(data.contract, settings.device, settings.dtype)
            # the statistics the checkpoint reads, and no others (code runs only for one trained to run it)
            return grid, answer_inputs(data, grid, own, cache_root, encode=encode,
                                       stat_names=[n for n in names if n != CROSS_STAT])

        return cls(load)


def _validation_figure(ckpt, data) -> float | None:
    """The out-of-fold figure training recorded, when it was fitted on these rows (as
    `policies/oneshot/contest.validation_utility` ranks the heads fitted on val rows too)."""
    v = (ckpt.manifest.metrics or {}).get("val_utility")
    return float(v) if v is not None and ckpt.manifest.data_version == data.data_version else None


class CascadeScorer:
    """Scores cascade entrants on the rows of a `FeatureSource` (module docstring)."""

    live_name = "a cascade: its steps as it serves (route, call each step, verify, grade)"

    def __init__(self, features, answers: AnswerSource, load_router: Callable | None = None):
        self.features, self.answers = features, answers
        self.load_router = load_router  # `policies/registry.load_router` (as serving loads it), for the live term
        self._memo: dict[str, tuple] = {}
        self._live: dict = {}  # content hash -> the cascade loaded to run live (`check_live` to `live_outcomes`)

    def rows(self, entrant: Entrant):
        """(data in the checkpoint's worker order, answer grid, verifier inputs, verifier scores, what
        its plans read of the replies: `evaluate.read_replies`), once per entrant."""
        from fugu_pipeline.policies.cascade.cross_encoder_use import with_saved_cross
        from fugu_pipeline.policies.cascade.fit import with_stats

        key = entrant.content_hash
        if key not in self._memo:
            ckpt = entrant.head
            data, _ = self.features.for_checkpoint(ckpt)
            data = data.in_worker_order(ckpt.manifest.worker_ids, f"cascade {entrant.path}")
            names = ckpt.head.answer_stats
            grid, inputs = self.answers.load(data, ckpt.head.answer_dim > len(names), names)
            inputs = with_stats(with_saved_cross(ckpt, data, grid, inputs), names)  # its cross-encoder's column, if any
            from fugu_pipeline.policies.cascade.evaluate import read_replies, verifier_scores

            scores = verifier_scores(ckpt.head, inputs)
            self._memo[key] = (data, grid, inputs, scores, read_replies(ckpt, grid, inputs, scores))
        return self._memo[key]

    def _outcomes(self, entrant: Entrant, rows: np.ndarray):
        from fugu_pipeline.policies.cascade.evaluate import cascade_outcomes

        data, grid, inputs, _, read = self.rows(entrant)
        return cascade_outcomes(entrant.head, data, grid, inputs, rows=rows, read=read)

    def outcomes(self, entrant: Entrant, task_ids: list[str]) -> Outcomes:
        data = self.rows(entrant)[0]
        at = {t: i for i, t in enumerate(data.task_ids)}
        got = self._outcomes(entrant, np.array([at[t] for t in task_ids], int))
        paths = [o.path for o in got]  # the plan each row ran (a capped cascade's guard may serve another)
        return Outcomes(list(task_ids), np.array([o.quality for o in got], float), np.array([o.calls for o in got], float),
                        np.array([o.cost_usd for o in got], float), paths, utility=np.array([o.utility for o in got], float))

    def check_live(self, entrant: Entrant) -> None:
        """Load the cascade to run live (kept for `live_outcomes`), before any head's live call:
        LiveUnavailable, in one line, when it cannot be (then neither head runs live)."""
        self._live_router(entrant)

    def end_live(self) -> None:
        """Close every cascade `check_live` loaded whose live run never came (the other head's
        stopped the live term first)."""
        while self._live:
            self._live.popitem()[1].close()

    def _live_router(self, entrant: Entrant):
        from fugu_pipeline.evaluate.contest import LiveUnavailable
        from fugu_pipeline.features.settings import EncoderLoadError
        from fugu_pipeline.policies.cascade.route import CascadeRouter
        from fugu_pipeline.route.router import RouterError

        if entrant.content_hash not in self._live:
            s = self.features.settings  # the serving encoder's model, device and dtype (None: the checkpoint's own)
            where = {} if s is None else {"device": s.device, "dtype": s.dtype, "encoder": s.model}
            try:
                self._live[entrant.content_hash] = (self.load_router or CascadeRouter.load)(entrant.path, **where)
            except (EncoderLoadError, RouterError, OSError) as exc:
                raise LiveUnavailable(f"cascade {entrant.label} cannot be loaded to run live: {exc}") from None
        return self._live[entrant.content_hash]

    def live_outcomes(self, entrant: Entrant, task_ids: list[str], live, tasks: dict, seed: int) -> Outcomes:
        """The live sample run as the cascade serves (`live.py`), through `live` (the contest's
        `OneCallEvaluator`); LiveUnavailable when it cannot run or a call stops it. The loaded
        cascade is let go after."""
        from fugu_pipeline.evaluate.contest import LiveUnavailable
        from fugu_pipeline.evaluate.live import LiveBudgetExceeded
        from fugu_pipeline.policies.cascade.live import CascadeLive
        from fugu_pipeline.workers.contract import FatalWorkerError

        router = self._live_router(entrant)
        try:
            got = CascadeLive(live).evaluate(router, entrant.content_hash, [tasks[t] for t in task_ids], seed)
        except (LiveBudgetExceeded, FatalWorkerError) as exc:
            raise LiveUnavailable(str(exc)) from None
        finally:
            self._live.pop(entrant.content_hash, None)
            router.close()
        return Outcomes(list(task_ids), np.array([o.quality for o in got], float), np.array([o.turns for o in got], float),
                        np.array([o.cost_usd for o in got], float), [o.workers for o in got],
                        errors=sum(o.error is not None for o in got))

    def candidate(self, entrant: Entrant, held, problems: list[str]):
        """The decision's figures on the held-out eval rows (`decision.Candidate`)."""
        from fugu_pipeline.evaluate.decision import Candidate
        from fugu_pipeline.train.checkpoints import weight_sanity

        ckpt = entrant.head
        weights = weight_sanity(ckpt.state_dict, ckpt.manifest)
        ev = [held.task_ids[i] for i in np.flatnonzero(~held.audit)]
        if problems:
            nan = np.full(len(ev), np.nan)
            return Candidate(entrant.path, entrant.method, entrant.content_hash, nan, nan, float("nan"),
                             weight_problems=weights, contract_problems=list(problems))
        data = self.rows(entrant)[0]
        train = data.split("train")
        fixed = int(np.argmax(train.utility.mean(axis=0)))
        at = {t: i for i, t in enumerate(data.task_ids)}
        out = self.outcomes(entrant, ev)
        train_u = float(np.mean([o.utility for o in self._outcomes(entrant, np.flatnonzero(data.splits == "train"))]))
        return Candidate(entrant.path, entrant.method, entrant.content_hash, out.utility,
                         data.utility[np.array([at[t] for t in ev], int), fixed], train_u,
                         weight_problems=weights, val_router_utility=_validation_figure(ckpt, data))

    def behaviour(self, entrant: Entrant, kind_name: str):
        from fugu_pipeline.evaluate.probe import behaviour, probe_fingerprint, probe_ids

        data, _, _, scores, _ = self.rows(entrant)
        ids = probe_ids([t for t, s in zip(data.task_ids, data.splits) if s != "test"])
        at = {t: i for i, t in enumerate(data.task_ids)}
        rows = np.array([at[t] for t in ids], int)
        got = self.outcomes(entrant, ids)
        answered = np.zeros((len(rows), len(data.worker_ids)))
        col = {w: j for j, w in enumerate(data.worker_ids)}
        for k, o in enumerate(self._outcomes(entrant, rows)):
            answered[k, col[o.answered_by]] = 1.0
        return behaviour(probe_fingerprint(kind_name, ids), [answered, np.nan_to_num(scores[rows], nan=0.0)], got.decisions)
