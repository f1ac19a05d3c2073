"""The multi-turn coordinator as a kind of the one contest (`evaluate/contest.py`), with its own king,
`models/promoted/roles.json`, and history, `models/promoted/roles-history.jsonl`.

Its scorer runs sessions through the session loop (`session/runner.py`) with the project's
workers, every session stored in the trajectory store per (task, head, seed, greedy), so a
re-judgement of the same heads reads them back and calls nothing:
- the **cached** term: the held-out tasks' greedy sessions at the evaluation seeds
  (`EVAL_SEED_BASE + k`, `seeds` per task);
- the **live** term: the fixed live sample (`live_sample` tasks a benchmark, 20 by default),
  each run once as it is served (greedy) at a seed of its own (`LIVE_SEED_BASE` + the
  composite's seed): the workers answer afresh;
- **efficiency**: correct answers per turn on the live sample, each session's turns counted;
- **novelty**: the share of tasks whose sequence of roles and workers differs from the king's;
- the **utility** `decide` reads: the shaped reward (quality − turn and cost penalties); the best
  fixed worker (answering alone, chosen on a sample of the training tasks) is the baseline; the
  training figure is the reward on that sample;
- its **behaviour** for the duplicate gate, over **whole sessions**: one greedy session on each
  task of a fixed probe sample of the host's training and validation tasks (seed `PROBE_SEED`,
  stored like every other session, so a head is probed once), and at every state where it picked
  (each turn, and the pick that commits an answer) its centred worker and role logits, placed by
  probe and turn (`max_turns` slots a probe, zeros after the session ended); its decision per
  probe is the session's sequence of role:worker and how it stopped. Two coordinators that open
  alike and part later are not copies; two that play every turn alike are (`session_behaviour`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.composite import CompositeConfig, HeldOut, held_rows
from fugu_pipeline.evaluate.contest import KIND_FILES, Entrant, KindBase, LiveUnavailable, Outcomes
from fugu_pipeline.evaluate.promotion_record import apply, promotion_lock
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.train.pointer import ROLES_POINTER

HISTORY = ROLES_POINTER.parent / "roles-history.jsonl"
DEFAULT_MARGIN = 0.02  # TinyRouter's king rule
EVAL_SEED_BASE = 2 * 10**9  # held-out sessions use seeds EVAL_SEED_BASE + k (as the multi-turn report)
LIVE_SEED_BASE = 3 * 10**9  # the live sample's sessions: seeds of their own
PROBE_TASKS = 64
PROBE_SEED = 4 * 10**9  # the probe sessions' seed (the duplicate gate), apart from the evaluation and live seeds
_UNREAD = object()


def roles_lock(models_dir: str | Path):
    """models/promoted/.roles.lock, held for one whole coordinator promotion."""
    return promotion_lock(models_dir, KIND_FILES["coordinator"][2])


def apply_roles(decision, challenger, models_dir: str | Path, *, report_path: str | None = None,
                expected_version=_UNREAD) -> dict | None:
    """Record a decision on a coordinator; when it promotes, swap models/promoted/roles.json (the
    one pointer discipline, `promotion_record.apply`, on the coordinator's pointer and history)."""
    kw = {} if expected_version is _UNREAD else {"expected_version": expected_version}
    return apply(decision, challenger, models_dir, report_path=report_path, pointer_file=ROLES_POINTER,
                 history=HISTORY.name, extra={"kind": "coordinator"}, **kw)


class RolesKind(KindBase):
    """The coordinator's scorer (module docstring). `run`: an open `project.RolesRun`."""

    name = "coordinator"
    pointer, history, lock = KIND_FILES["coordinator"]
    live_name = "the session loop (Thinker → Worker → Verifier)"

    def __init__(self, run, tasks: list, cfg, *, seeds: int = 1, n_train_sample: int = 60):
        self.run, self.cfg, self.seeds = run, cfg, seeds
        self.by_id = {t.task_id: t for t in tasks}
        self.test = [t for t in tasks if t.split == "test"]
        train = sorted((t for t in tasks if t.split == "train"), key=lambda t: t.task_id)
        self.train_sample = train[:: max(1, len(train) // n_train_sample)][:n_train_sample]
        self.probe_pool = [t for t in tasks if t.split in ("train", "val")]
        self.contract = run.featurizer.contract()
        self.live_tasks = {t.task_id for t in self.test}
        self.composite_seed = 0
        self._best_fixed: str | None = None

    # ------------------------------------------------------------------ reading heads

    def load(self, path: str) -> Entrant:
        from fugu_pipeline.policies.coordinator.route import check_session_format
        from fugu_pipeline.route.router import RouterError
        from fugu_pipeline.train.checkpoints import load_checkpoint
        from fugu_pipeline.policies.coordinator.head import ROLES_KINDS

        ckpt = load_checkpoint(path)
        m = ckpt.manifest
        if m.head_kind not in ROLES_KINDS:
            raise CheckpointError(f"{path}: a {m.head_kind!r} head is not a multi-turn coordinator ({', '.join(ROLES_KINDS)})")
        try:
            check_session_format(m)
        except RouterError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        return Entrant(str(ckpt.path), m.method, m.content_hash, ckpt, m)

    def contract_problems(self, entrant: Entrant) -> list[str]:
        m = entrant.manifest
        problems = m.feature_contract.differences(self.contract)
        missing = [w for w in m.worker_ids if w not in self.run.config.worker_ids]
        if missing:
            problems.append(f"it delegates to {missing}, which this host's workers do not include")
        return problems

    def _policy(self, entrant: Entrant):
        if "policy" not in entrant.extra:
            from fugu_pipeline.policies.coordinator.train import policy_from_checkpoint

            entrant.extra["policy"] = policy_from_checkpoint(entrant.head, self.run.featurizer)
        return entrant.extra["policy"]

    def rank(self, entrant: Entrant) -> float | None:
        return entrant.manifest.metrics.get("val_reward")

    # ------------------------------------------------------------------ scoring

    def held_out(self, cfg: CompositeConfig) -> HeldOut:
        self.composite_seed = cfg.seed
        return held_rows([t.task_id for t in self.test], [t.domain for t in self.test], cfg)

    def _sessions(self, policy, task_ids: list[str], seeds: list[int], live: bool = False) -> Outcomes:
        from fugu_pipeline.session.runner import BudgetExhausted
        from fugu_pipeline.policies.coordinator.train import reward
        from fugu_pipeline.workers.contract import FatalWorkerError

        pairs = [(self.by_id[t], s) for t in task_ids for s in seeds]
        try:
            trs = self.run.runner.run([policy], pairs, greedy=True)[0]
        except (FatalWorkerError, BudgetExhausted) as exc:
            if live:
                raise LiveUnavailable(str(exc)) from None
            raise
        k = len(seeds)
        rows = [trs[i * k:(i + 1) * k] for i in range(len(task_ids))]
        mean = lambda f: np.array([np.mean([f(t) for t in row]) for row in rows], float)  # noqa: E731
        decisions = [">".join(f"{turn.role}:{turn.chosen_worker}" for turn in row[0].turns) for row in rows]
        return Outcomes(list(task_ids), mean(lambda t: t.quality or 0.0), mean(lambda t: t.n_turns),
                        mean(lambda t: t.cost_usd), decisions, utility=mean(lambda t: reward(t, self.cfg)),
                        errors=sum(t.error is not None for row in rows for t in row))

    def outcomes(self, entrant: Entrant, task_ids: list[str], *, live: bool) -> Outcomes:
        seeds = [LIVE_SEED_BASE + self.composite_seed] if live else [EVAL_SEED_BASE + k for k in range(self.seeds)]
        return self._sessions(self._policy(entrant), task_ids, seeds, live)

    def best_fixed_worker(self) -> str:
        if self._best_fixed is None:
            from fugu_pipeline.session.policy import FixedPolicy
            from fugu_pipeline.policies.coordinator.train import reward

            ids = self.run.config.worker_ids
            if not self.train_sample:
                self._best_fixed = ids[0]
                return self._best_fixed
            rows = self.run.runner.run([FixedPolicy(ids, w) for w in ids],
                                       [(t, EVAL_SEED_BASE) for t in self.train_sample], greedy=True)
            self._best_fixed = ids[int(np.argmax([np.mean([reward(t, self.cfg) for t in row]) for row in rows]))]
        return self._best_fixed

    def baseline(self, task_ids: list[str]) -> Outcomes | None:
        from fugu_pipeline.session.policy import FixedPolicy

        fixed = FixedPolicy(self.run.config.worker_ids, self.best_fixed_worker())
        return self._sessions(fixed, task_ids, [EVAL_SEED_BASE + k for k in range(self.seeds)])

    def train_figure(self, entrant: Entrant) -> float | None:
        if not self.train_sample:
            return None
        out = self._sessions(self._policy(entrant), [t.task_id for t in self.train_sample], [EVAL_SEED_BASE])
        return float(np.mean(out.figure))

    def behaviour(self, entrant: Entrant):
        """The head's whole greedy sessions on the probe tasks (module docstring); the king's and
        any head's probed before are read back from the trajectory store."""
        from fugu_pipeline.evaluate.probe import probe_fingerprint, probe_ids

        ids = probe_ids([t.task_id for t in self.probe_pool], PROBE_TASKS)
        turns = self.run.runner.max_turns
        probe = probe_fingerprint(f"{self.name}:sessions:{turns}:{PROBE_SEED}", ids)
        policy = self._policy(entrant)
        trs = self.run.runner.run([policy], [(self.by_id[t], PROBE_SEED) for t in ids], greedy=True)[0]
        return session_behaviour(probe, policy, trs, {t: self.by_id[t].prompt for t in ids}, turns)


def session_behaviour(probe: str, policy, trajectories: list, prompts: dict[str, str], max_turns: int):
    """A coordinator's behaviour over its sessions (`probe.Behaviour`): per session, the centred
    logits of every softmax group (the worker sets and the roles) at each state where the policy
    picked, in slot (session, turn), and the decision "role:worker>...>stop reason". `prompts`:
    each session's task prompt by task id (a trajectory keeps only its hash)."""
    from fugu_pipeline.evaluate.probe import Behaviour, centred
    from fugu_pipeline.session.policy import Step

    steps, slots, decisions = [], [], []
    for i, tr in enumerate(trajectories):
        picks = len(tr.turns) + (tr.stop_reason == "committed")  # committing is a pick without a call
        for k in range(min(picks, max_turns)):
            steps.append(Step(prompts[tr.task_id], tr.domain, tr.turns[:k]))
            slots.append((i, k))
        decisions.append(">".join([*(f"{t.role}:{t.chosen_worker}" for t in tr.turns), tr.stop_reason]))
    n, sets = len(policy.worker_ids), policy.worker_sets
    width = len(policy.weight)  # every worker set, then the roles
    out = np.zeros((len(trajectories), max_turns, width))
    if steps:
        z = policy.logits(steps)
        rows = centred([z[:, j * n:(j + 1) * n] for j in range(sets)] + [z[:, sets * n:]]).reshape(len(steps), width)
        for (i, k), row in zip(slots, rows):
            out[i, k] = row
    return Behaviour(probe, np.asarray(decisions, dtype=object), out.ravel(), unit="whole session")
