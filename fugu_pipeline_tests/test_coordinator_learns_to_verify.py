"""The coordinator learns to use the Verifier where checking pays and not where it only costs.

On the mock roles pool, the `checking` family pays for a check (Workers are right about half the
time, the checker as Verifier catches ~90% of wrong answers, a Worker handed the objection gets the
retry right ~90% of the time); on `lookup` a check catches nothing and only costs. Trained on the
two families together, held-out, greedy: the coordinator calls a Verifier in most checking
sessions (on the checker), rarely on lookup, and is more accurate than answering at once on
checking. Before one worker softmax per role (and the start's best checker for the Verifier role),
it never called the Verifier: a Verifier turn needed a role flip and a worker flip at once.
"""

from __future__ import annotations

import numpy as np
import pytest

from fugu_pipeline.policies.coordinator.evaluate import EVAL_SEED_BASE
from fugu_pipeline.policies.coordinator.project import open_run, split
from fugu_pipeline.session.policy import FixedPolicy
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.policies.coordinator.train import RolesConfig, train_roles
from fugu_pipeline.workers.config import load_workers_config

from . import roles_fixtures
from .conftest import REPO

WORKERS = REPO / "configs" / "workers.mock-roles.yaml"
SMALL = dict(generations=25, tasks_per_generation=12, explore_tasks=48, explore_seeds=3, val_every=5, val_tasks=24,
             val_seeds=2, max_length=256)


encoder = roles_fixtures.encoder


def verified(trs) -> float:
    return float(np.mean([any(u.role == "verifier" for u in t.turns) for t in trs]))


@pytest.mark.slow
def test_the_coordinator_verifies_on_checking_and_not_on_lookup(tmp_path, encoder):
    tasks = [Task.model_validate(r) for r in roles_batch(40) if r["domain"] in ("checking", "lookup")]
    cfg = RolesConfig(**SMALL)
    config = load_workers_config(WORKERS)
    test = split(tasks, "test")
    with open_run(config, encoder.settings, tmp_path / "store", tasks, cfg, encoder=encoder) as run:
        res = train_roles(run.runner, run.featurizer, config.worker_ids, split(tasks, "train"), split(tasks, "val"),
                          cfg, log=lambda s: None)
        pairs = [(t, EVAL_SEED_BASE + s) for t in test for s in range(2)]
        coord, alone = run.runner.run([res.policy(), FixedPolicy(config.worker_ids, "fast-solver")], pairs, greedy=True)
    checking = [t for t in coord if t.domain == "checking"]
    lookup = [t for t in coord if t.domain == "lookup"]
    assert verified(checking) > 0.6, f"Verifier in {verified(checking):.2f} of checking sessions"
    assert verified(lookup) < 0.25, f"Verifier in {verified(lookup):.2f} of lookup sessions"
    checks = [u.chosen_worker for t in checking for u in t.turns if u.role == "verifier"]
    assert checks.count("checker") > 0.6 * len(checks)  # mostly the careful checker, not whoever answers best
    acc = lambda trs, dom: np.mean([t.quality for t in trs if t.domain == dom])  # noqa: E731
    assert acc(coord, "checking") > acc(alone, "checking") + 0.15  # the check and the retry pay
    assert res.weight.shape[0] == 3 * len(config.worker_ids) + 3  # one worker softmax per role


def test_a_per_role_head_picks_the_worker_from_the_picked_roles_softmax(tmp_path, encoder):
    """Sessions, the saved checkpoint and the contest's probe behaviour all read the worker of the
    picked role's softmax: here Verifier on the checker, although the Worker role's softmax prefers
    fast-solver. (Before: the probe read the 9 worker logits as role logits: IndexError.)"""
    from fugu_pipeline.evaluate.probe import head_groups
    from fugu_pipeline.session.featurize import TranscriptFeaturizer
    from fugu_pipeline.session.policy import Step, pick
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.policies.coordinator.train import RolesTrainResult, policy_from_checkpoint

    ids = ["fast-solver", "planner", "checker"]
    f = TranscriptFeaturizer(encoder)
    step = Step("What is 6 x 7?", "checking")
    x = f.features([step.head])[0]
    w = np.zeros((3 * 3 + 3, f.dim), np.float32)
    w[3 + 0] = x  # the Worker role's softmax: fast-solver
    w[6 + 2] = x  # the Verifier role's softmax: checker
    w[9 + 2] = x  # role: Verifier
    res = RolesTrainResult(weight=w, center=np.zeros(f.dim, np.float32), scale=np.ones(f.dim, np.float32),
                           worker_ids=ids, featurizer=f, config={}, curves={}, best_generation=0, metrics={},
                           data_version="x", wall_s=0.0)
    ckpt = load_checkpoint(res.save(tmp_path / "models"))
    assert ckpt.manifest.head_shape == {"worker_sets": 3}
    pw, pr = policy_from_checkpoint(ckpt, f).distributions([step])
    assert pw.shape == (1, 3, 3)
    act = pick(pw[0], pr[0], greedy=True)
    assert (act.role, ids[act.worker]) == (2, "checker")
    groups, decisions = head_groups(ckpt, x[None, :])
    assert len(groups) == 4 and decisions == ["verifier:checker"]


def test_the_grammar_start_answers_at_once_and_leaves_the_check_one_small_step_away():
    """`init_grammar`: generation 0 is still the one-step policy (a Worker answers, then a Worker
    turn commits it), but the fitted head keeps the Verifier off before any answer and after a plan
    or a verdict, and right after a Worker answer leads the Verifier by only init_verify_lead: on
    three families the plain start's lead of 3 there was never crossed (Verifier in 0.00 of the
    recipe's checking sessions)."""
    from fugu_pipeline.session.roles import ROLES
    from fugu_pipeline.policies.coordinator.search import SHIFT, grammar_offsets, initial_theta, search_basis

    rng = np.random.default_rng(0)
    steps = ["-|-", "thinker|-", "worker|-", "verifier|revise"]
    kinds = [f"{fam}|{s}" for fam in ("checking", "lookup", "multistep") for s in steps]
    d, n_rows, role0 = 48, 3 * 3 + 3, 9
    where = rng.normal(size=(len(kinds), d))  # each kind of state its own direction, every task its own words
    state_kinds = [kinds[i % len(kinds)] for i in range(1200)]
    groups = [f"t{i // 4}" for i in range(1200)]
    z = SHIFT + 0.5 * where[[kinds.index(k) for k in state_kinds]] + 0.3 * rng.normal(size=(1200, d))
    basis, _ = search_basis(z, None, kinds=state_kinds, groups=groups)
    w0 = np.zeros((n_rows, d))
    w0[role0 + ROLES.index("worker")] = 3.0 / (SHIFT * d)  # the one-step start: Worker role 3 ahead everywhere
    offsets = grammar_offsets(state_kinds, n_rows, role0, 3.0, 0.5, 3.0)
    head = initial_theta(w0, basis, z, offsets=offsets) @ basis
    logits = z @ head[role0:].T  # (states, [thinker, worker, verifier])
    t, w, v = (ROLES.index(r) for r in ("thinker", "worker", "verifier"))
    for step in steps:
        at = np.array([k.endswith(step) for k in state_kinds])
        lead = logits[at, w] - logits[at, v]
        if step == "worker|-":  # commit leads check by about init_verify_lead (per-task noise flips a few)
            assert 0.2 < np.median(lead) < 0.8 and (logits[at].argmax(1) == w).mean() > 0.75
        else:
            assert (logits[at].argmax(1) == w).mean() > 0.95, step  # generation 0 answers at once
            assert np.median(lead) > 4.0  # no check before an answer, an answer after a plan or a verdict
    plain = initial_theta(w0, basis, z, only=slice(0, 1)) @ basis
    at = np.array([k.endswith("worker|-") for k in state_kinds])
    assert np.median((z @ plain[role0:].T)[at, w] - (z @ plain[role0:].T)[at, v]) > 2.5  # the plain start: 3
