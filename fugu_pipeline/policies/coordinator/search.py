"""Where the coordinator's CMA-ES starts and which directions it searches (`policies/coordinator/train.py` runs it).

- `exploration_stats`: the uniform policy's rollouts (sampled picks, several seeds per task) give
  the feature standardisation and the transcript states the search directions are fitted on.
- `search_basis`: the directions theta moves the head along (W = theta @ B): one ridge probe per
  kind of state (`state_kind`: family, last role, verdict), or the leading whitened directions.
- `initial_theta`: generation 0 written in those coordinates so that it acts as intended on the
  explored states (a least-squares fit of its logits, not of its weights: a weight-space projection
  onto 15 probes kept about 0.6 of a constant logit, so the one-step start's "Worker" lead of 3
  was 1.9). With the state-kind basis the start sits on the constant direction alone and every
  kind's coordinate starts at 0: a decoupled probe reads its kind with per-task noise, which should
  enter a decision only where CMA-ES moves that kind. With `grammar_offsets` the start also follows the
  session's grammar, fitted on every direction: on three families the plain start's Worker lead of 3
  right after a Worker answer was never crossed by the search (Verifier in 0.00 of the recipe's
  checking sessions); with that lead cut to 0.5 (and the Verifier kept off where nothing can be
  checked) it verified in 0.49 of them and in none of lookup's.
- `best_fixed_worker`: the worker that answers best alone (the one-step start's Worker).
- `best_role_workers`: the worker that plays each other role best, each in a scripted session
  (Thinker: the worker plans, the best fixed worker answers; Verifier: the best fixed worker
  answers, the worker checks, a REVISE gets one retry). With one worker softmax per role, the
  start's Verifier turns go to the best checker, so CMA-ES finds "verify here" by one role flip
  instead of a role flip and a worker flip that must coincide.

Why the probes need many explored states: a transcript's vector is dominated by its task's words;
a probe fitted on the uniform policy's 135 states of 32 tasks (tiny encoder) told the kind of a
held-out state right 0.70 of the time, and read "after a Worker answer on checking" at 0.41 with
0.29 leaking from the same state of other families, so one step verified on every family alike.
On ~1,500 states (all training tasks, three seeds) it was 0.94, and the checking probe's smallest
held-out reading (0.37) was above the largest on other families (0.33).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from fugu_pipeline.session.featurize import TranscriptFeaturizer
from fugu_pipeline.session.policy import FixedPolicy, LinearRolesPolicy, ScriptedPolicy, Step
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.roles import ROLES
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.tasks.schema import Task

TRAIN_SEEDS = 10**9  # training and exploration seeds lie below; validation and held-out seeds above
VAL_SEED_BASE = 10**9
SHIFT = 1.0  # standardised features keep a constant part: the bias-free head can still prefer a role everywhere


def state_kind(domain: str | None, turns) -> str:
    """What a transcript state is, apart from its task: the family, and the last turn's role and
    verdict (what a coordinator decides on; `transcript.state_line` shows the encoder the same)."""
    last = turns[-1] if turns else None
    return f"{domain}|{last.role if last else '-'}|{last.verdict if last and last.verdict else '-'}"


def exploration_pairs(tasks: list[Task], n_tasks: int, seed: int, seeds_per_task: int = 1) -> list[tuple[Task, int]]:
    """(task, seed) pairs of the exploration: `n_tasks` training tasks, `seeds_per_task` seeds each."""
    rng = np.random.default_rng([seed, 7])
    chosen = rng.choice(len(tasks), size=min(n_tasks, len(tasks)), replace=False)
    return [(tasks[int(i)], int(rng.integers(0, TRAIN_SEEDS))) for i in chosen for _ in range(seeds_per_task)]


def exploration_stats(runner: SessionRunner, featurizer: TranscriptFeaturizer, worker_ids: list[str],
                      tasks: list[Task], n_tasks: int, seed: int,
                      seeds_per_task: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], list[str]]:
    """The feature standardisation of every transcript state the uniform policy meets on `n_tasks`
    training tasks x `seeds_per_task` seeds (sampled picks): per dimension, (x - center) / scale
    has spread 1 and mean SHIFT. Centring alone would take away the only constant a bias-free head
    has (the large direction all hidden states share), and with it any preference that holds in
    every state ("Worker, unless ..."). The rollouts are ordinary stored trajectories. Returns
    (center, scale, the standardised features of every state, each state's kind (`state_kind`),
    each state's task id)."""
    pairs = exploration_pairs(tasks, n_tasks, seed, seeds_per_task)
    uniform = LinearRolesPolicy(np.zeros((len(worker_ids) + len(ROLES), featurizer.dim), np.float32), worker_ids, featurizer)
    trs = runner.run([uniform], pairs, greedy=False)[0]
    by_id = {t.task_id: t for t, _ in pairs}
    states = [(tr, k) for tr in trs for k in range(len(tr.turns) + 1)]
    heads = [Step(by_id[tr.task_id].prompt, tr.domain, tr.turns[:k]).head for tr, k in states]
    kinds = [state_kind(tr.domain, tr.turns[:k]) for tr, k in states]
    x = featurizer.features(heads).astype(np.float64)
    scale = x.std(axis=0)
    scale = np.where(scale > 1e-6, scale, 1.0)  # a constant dimension carries nothing: leave it unscaled
    center = x.mean(axis=0) - SHIFT * scale  # (x - center) / scale has mean SHIFT and spread 1 in every dimension
    return center.astype(np.float32), scale.astype(np.float32), (x - center) / scale, kinds, [tr.task_id for tr, _ in states]


def best_fixed_worker(runner: SessionRunner, worker_ids: list[str], tasks: list[Task], n_tasks: int, seed: int,
                      reward: Callable[[Trajectory], float], log: Callable[[str], None]) -> str:
    """The worker with the best mean reward answering alone in one turn on the exploration tasks."""
    pairs = exploration_pairs(tasks, n_tasks, seed)
    rows = runner.run([FixedPolicy(worker_ids, w) for w in worker_ids], pairs, greedy=True)
    means = [float(np.mean([reward(t) for t in row])) for row in rows]
    best = worker_ids[int(np.argmax(means))]
    log(f"roles: one-step start on {best} (reward alone: " + ", ".join(f"{w} {m:.3f}" for w, m in zip(worker_ids, means)) + ")")
    return best


def role_scripts(worker_ids: list[str], base: str) -> dict[str, list[ScriptedPolicy]]:
    """Per role other than Worker, one scripted policy per worker playing it next to `base`:
    Thinker: w plans, base answers, commit; Verifier: base answers, w checks (ACCEPT stops), base
    answers again after a REVISE, commit."""
    return {
        "thinker": [ScriptedPolicy(worker_ids, [(w, "thinker"), (base, "worker"), (base, "worker")], f"script:T-{w}")
                    for w in worker_ids],
        "verifier": [ScriptedPolicy(worker_ids, [(base, "worker"), (w, "verifier"), (base, "worker"), (base, "worker")],
                                    f"script:V-{w}") for w in worker_ids],
    }


def best_role_workers(runner: SessionRunner, worker_ids: list[str], base: str, tasks: list[Task], n_tasks: int,
                      seed: int, reward: Callable[[Trajectory], float], log: Callable[[str], None]) -> dict[str, str]:
    """{role: the worker with the best mean reward playing it} for Thinker and Verifier (the
    Worker role's is `base`), each in its scripted session (`role_scripts`) on the exploration tasks,
    every family mixed: which worker is the best checker, not whether checking pays."""
    pairs = exploration_pairs(tasks, n_tasks, seed)
    out = {"worker": base}
    for role, scripts in role_scripts(worker_ids, base).items():
        rows = runner.run(scripts, pairs, greedy=True)
        means = [float(np.mean([reward(t) for t in row])) for row in rows]
        out[role] = worker_ids[int(np.argmax(means))]
        log(f"roles: {role} start on {out[role]} (reward of the scripted {role} sessions: "
            + ", ".join(f"{w} {m:.3f}" for w, m in zip(worker_ids, means)) + ")")
    return out


def stratified(tasks: list[Task], size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` task indices drawn without replacement, as evenly over the tasks' domains as they allow
    (every generation scores every family, so one generation's fitness is not another's family mix)."""
    by: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by.setdefault(t.domain, []).append(i)
    pools = [list(rng.permutation(v)) for _, v in sorted(by.items())]
    out: list[int] = []
    while len(out) < size:
        for p in pools:
            if p and len(out) < size:
                out.append(int(p.pop()))
    return np.array(out)


def _probes(z: np.ndarray, y: np.ndarray, reg: float) -> np.ndarray:
    gram = z.T @ z
    lam = reg * max(float(np.trace(gram)) / z.shape[1], 1e-12)
    return np.linalg.solve(gram + lam * np.eye(z.shape[1]), z.T @ y).T  # (C, D)


def held_out_confusion(z: np.ndarray, y: np.ndarray, groups: list[str], reg: float) -> np.ndarray | None:
    """(C, C): row c = the mean reading of every probe on held-out states of kind c, the probes
    fitted on the other half of the tasks (two-fold, split by task); None when a kind is missing
    from either half."""
    half = np.array([int(hashlib.sha256(g.encode()).hexdigest(), 16) % 2 for g in groups])
    m = np.zeros((y.shape[1], y.shape[1]))
    for h in (0, 1):
        fit, held = half == h, half != h
        if (y[fit].sum(axis=0) < 2).any() or (y[held].sum(axis=0) < 2).any():
            return None
        m += y[held].T @ (z[held] @ _probes(z[fit], y[fit], reg).T)
    return m / y.sum(axis=0)[:, None]


MAX_CONDITION = 50.0  # decouple the probes only where their held-out confusion is this well conditioned


def search_basis(z: np.ndarray, dims: int | None, reg: float = 0.01, kinds: list[str] | None = None,
                 groups: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(B (k, D), B+ (D, k)): the directions CMA-ES moves the head along; theta (rows, k) gives
    W = theta @ B, and the saved head is W itself (rows, D).

    With `kinds` (each state's `state_kind`): first the constant direction (standardised features
    average SHIFT per dimension, so every state reads about 1 on it: a preference that holds in
    every state, such as the start's), then one direction per kind of state, the ridge-regression
    probe that reads that kind off a transcript's features (B z is about the one-hot of z's kind).
    Within a kind the features still differ with every task (the task's words dominate a
    transcript's vector); a probe barely does, so coordinate c of theta moves the logits of kind c
    alike on every task and leaves the other kinds alone: "after a Worker answer on a checking task:
    verify" is one coordinate, and the kinds' decisions can be searched nearly independently.
    With `groups` too (each state's task): decoupled, B' = M^-T B with M the probes' mean readings
    on held-out tasks' states (`held_out_confusion`), so that on average over a kind's unseen
    states B' z is exactly the one-hot of the kind: a ridge probe reads only about 0.4-0.9 on its
    own kind's unseen states and up to 0.3 on another family's same step (the tiny encoder), so
    without this a coordinate moves its kind's logits by half a step and its neighbours' by a
    quarter, and "verify after a checking answer" drags "verify after a lookup answer" along.
    Only where M is well conditioned (condition number under MAX_CONDITION): on two families
    (~640 explored states) it was 24 and the decoupled probes are what make the Verifier findable;
    on three families (~880 states) it was 340, and inverting it gave probes that read their own
    kind at -5.8 to +1.5 on held-out tasks with a spread of 4.5 within a kind (the plain probes:
    0.27 to 0.9, spread 0.11): every candidate's step was per-task noise, and a 40-generation
    search on three families never beat its start. There the plain probes are kept.
    Without `kinds`: the k leading directions of the features' second moment, whitened.
    `dims` None: all D directions (without kinds)."""
    n, d = z.shape
    if kinds is not None and len(set(kinds)) > 1:
        classes = sorted(set(kinds))
        y = np.zeros((n, len(classes)))
        y[np.arange(n), [classes.index(c) for c in kinds]] = 1.0
        basis = _probes(z, y, reg)
        m = held_out_confusion(z, y, groups, reg) if groups is not None else None
        if m is not None and np.linalg.cond(m) < MAX_CONDITION:
            basis = np.linalg.solve(m.T, basis)
        basis = np.vstack([np.full((1, d), 1.0 / (SHIFT * d)), basis])  # row 0: the constant (every state reads ~1)
        return basis, np.linalg.pinv(basis)
    m = z.T @ z / max(len(z), 1)
    lam, u = np.linalg.eigh(m)
    order = np.argsort(-lam)[: min(dims or len(lam), len(lam))]
    lam = np.maximum(lam[order], 0.0) + reg * max(float(np.trace(m)) / len(m), 1e-12)
    u = u[:, order]
    return (u / np.sqrt(lam)).T, u * np.sqrt(lam)


def grammar_offsets(kinds: list[str], n_rows: int, role_row0: int, worker_lead: float, verify_lead: float,
                    low: float) -> np.ndarray:
    """(n, rows): what the session's grammar adds to a one-step start's logits on each explored state
    (by its `state_kind`), so that generation 0 still answers in one turn but the search only has to
    learn where to verify: before any answer the Verifier is `low` down (nothing to check yet); after
    a plan or a verdict the Thinker and the Verifier are (the next turn answers); right after a
    Worker answer the Thinker is, and the Worker role's lead over the Verifier (commit vs check) is
    cut from the start's `worker_lead` to `verify_lead`."""
    t, w, v = (role_row0 + ROLES.index(r) for r in ("thinker", "worker", "verifier"))
    out = np.zeros((len(kinds), n_rows))
    for i, kind in enumerate(kinds):
        last = kind.split("|")[1]
        if last == "-":
            out[i, v] -= low
        elif last == "worker":
            out[i, t] -= low
            out[i, w] -= worker_lead - verify_lead
        else:  # after a plan or a verdict: answer
            out[i, t] -= low
            out[i, v] -= low
    return out


def initial_theta(w0: np.ndarray, basis: np.ndarray, z: np.ndarray, reg: float = 1e-6,
                  only: slice | None = None, offsets: np.ndarray | None = None) -> np.ndarray:
    """Search coordinates theta (rows, k) whose head theta @ B gives, on the explored states z, the
    logits closest (least squares) to those of the intended start w0 (rows, D), plus `offsets`
    (n, rows) per state where given; with `only`, fitted with those coordinates alone (the others
    start at 0)."""
    if only is not None:
        theta = np.zeros((len(w0), len(basis)))
        theta[:, only] = initial_theta(w0, basis[only], z, reg, offsets=offsets)
        return theta
    p = z @ basis.T  # (n, k): what each coordinate moves on each state
    target = z @ np.asarray(w0, np.float64).T  # (n, rows)
    if offsets is not None:
        target = target + offsets
    gram = p.T @ p
    lam = reg * max(float(np.trace(gram)) / max(len(gram), 1), 1e-12)
    return np.linalg.solve(gram + lam * np.eye(len(gram)), p.T @ target).T
