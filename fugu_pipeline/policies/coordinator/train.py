"""The multi-turn coordinator's trainer: separable CMA-ES (`cmaes.SepCMA`) on trajectory reward.
(torch loads only to save a checkpoint or with the SVF adapter: the reward, the config and
`policy_from_checkpoint` serve the route and evaluate stages cheaply.)

The evolved vector is the roles head W (3L + 3, D) (one worker softmax per role; (L + 3, D) with
`worker_per_role: false`) written in the search directions of `search.py` (one probe per
kind of transcript state), plus, with `svf: true`, one scale per singular value of the encoder's
second-to-last layer (`session/svf.py`). Generation 0 is the one-step policy (Worker role, best
fixed worker, in every state) whose Thinker and Verifier turns, where a step makes it take one, go
to the worker that plays that role best (`search.best_role_workers`); with `init_grammar` (the
default) it also follows the session's grammar (`search.grammar_offsets`: no Verifier before an
answer, an answer after a plan or a verdict, and right after a Worker answer committing leads checking
by only `init_verify_lead`), so the search only has to learn where to verify. Each parameter group has its
own step: the head's coordinates move the logits by about `sigma0`, the SVF scales are z = exp(u)
with u moved by about `svf_sigma` (0.1: z stays positive and near 1, TinyRouter's setting).
Each generation:
- one minibatch of training tasks and one set of sampling seeds, drawn from the run's seed, is
  shared by every candidate (common random numbers): the candidates differ only by their weights;
- every candidate (and the current mean) runs its sessions on that minibatch, all together through
  the session runner (one encoder pass per turn step for the whole population, worker calls in
  parallel over asyncio, finished trajectories appended to the store);
- fitness = mean reward, reward = quality of the committed answer − `turn_penalty` × turns −
  `cost_penalty` × USD.
Every `val_every` generations the mean and the generation's best run greedily on the validation
tasks (fixed seeds); the weights best on validation are kept, never worse than the warm start.

Resuming is replay: the same seed asks the same candidates, whose trajectories the store already
holds, so a killed run re-reads them (no worker call, no encoding) until it reaches the generation
it was killed in. The same seed on the same tasks and workers gives the same checkpoint bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.config_files import Seed, load_yaml_model
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.session.featurize import TranscriptFeaturizer
from fugu_pipeline.session.policy import LinearRolesPolicy
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.roles import PROMPT_VERSION, ROLES
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.session.transcript import HEAD_MARKER, TRANSCRIPT_VERSION, window_info
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.policies.coordinator.search import (  # noqa: F401 (SHIFT, TRAIN_SEEDS, state_kind: this module's API too)
    SHIFT,
    TRAIN_SEEDS,
    VAL_SEED_BASE,
    best_fixed_worker,
    best_role_workers,
    exploration_stats,
    grammar_offsets,
    initial_theta,
    search_basis,
    state_kind,
    stratified,
)

_logger = logging.getLogger(__name__)
METHOD = "roles"
HEAD_KIND = "roles_linear"
SVF_HEAD_KIND = "roles_linear_svf"


class RolesConfig(BaseModel):
    """Hyperparameters of the coordinator's trajectory CMA-ES (`configs/train_roles.yaml`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: Seed = 0
    generations: int = Field(60, ge=1)
    population_size: int | None = Field(None, ge=2, description="None = cmaes' 4 + floor(3 ln n)")
    sigma0: float = Field(2.0, gt=0, description="initial step size as a logit scale: a random step changes "
                          "each logit by about sigma0")
    search_dims: int | None = Field(16, ge=1, description="search: leading: CMA-ES searches this many whitened "
                                    "directions of the transcripts' features (None: all D); state_kinds searches one "
                                    "per kind of state. The head stays (L + 3) x D")
    search: Literal["state_kinds", "leading"] = Field(
        "state_kinds", description="state_kinds: one ridge probe per kind of transcript state (family, last role "
        "and verdict), so a step moves one kind of state's logits alike on every task; leading: the leading "
        "whitened directions of the features")
    explore_tasks: int = Field(96, ge=1, description="training tasks the uniform policy explores (sampled) to set "
                               "the feature standardisation and fit the search directions; also the tasks that "
                               "choose the start's worker for each role")
    explore_seeds: int = Field(2, ge=1, description="sampling seeds per explored task: more transcript states for "
                               "the state-kind probes (a probe fitted on few states leaks into other families)")
    worker_per_role: bool = Field(True, description="one worker softmax per role (the worker is picked given the "
                                  "role; the start gives each role the worker that played it best); false: one "
                                  "worker softmax whatever the role")
    tasks_per_generation: int = Field(32, ge=1, description="training tasks per generation (shared by all candidates)")
    seeds_per_task: int = Field(1, ge=1, description="sampling seeds per task and generation")
    sample_actions: bool = Field(False, description="true: training picks are sampled from the head's softmaxes "
                                 "(with the shared seeds); false: greedy. Validation and evaluation are always greedy")
    val_every: int = Field(5, ge=1)
    val_tasks: int | None = Field(60, ge=1, description="validation tasks used for selection (None = all)")
    val_seeds: int = Field(2, ge=1)
    max_turns: int = Field(5, ge=1, le=20)
    turn_penalty: float = Field(0.05, ge=0, description="reward lost per turn")
    cost_penalty: float = Field(10.0, ge=0, description="reward lost per USD spent (10: 0.1 per cent, the "
                                "shipped utility's cost weight)")
    init: Literal["one_step", "uniform"] = Field(
        "one_step", description="one_step: generation 0 is a one-step policy: role rows prefer Worker in every state "
        "(so a Worker answer is committed at once), worker rows come from the one-step router where encoders match, "
        "else prefer the best fixed worker of the exploration tasks; uniform: TinyRouter's all-zero head")
    init_worker_logit: float = Field(1.0, ge=0, description="one_step init: the lead of the best fixed worker in "
                                     "every state (with worker_per_role: of each role's best worker in that role's "
                                     "softmax); small, so a step can change it as easily as it changes the role")
    init_logit: float = Field(3.0, ge=0, description="one_step init: the lead of the Worker role in every state")
    init_grammar: bool = Field(True, description="one_step init that follows the session's grammar on the explored "
                               "states: no Verifier before an answer, the next turn answers after a plan or a verdict, "
                               "and right after a Worker answer committing leads checking by only init_verify_lead")
    init_verify_lead: float = Field(0.5, ge=0, description="init_grammar: the Worker role's lead over the Verifier "
                                    "right after a Worker answer (commit rather than check)")
    worker_sigma: float = Field(0.5, gt=0, description="the worker logits' own step (sigma0 is the role logits'): "
                                "a random step moves each worker logit by about this much, so the start's worker "
                                "for each role (init_worker_logit ahead) mostly stays while the roles are searched")
    warm_start: bool = Field(True, description="start the worker rows from the one-step router's where encoders match")
    svf: bool = Field(False, description="also evolve the SVF adapter (scales on the singular values of the "
                      "encoder's second-to-last layer); changes the features, so the adapted layer and the one "
                      "above it run per candidate")
    svf_sigma: float = Field(0.1, gt=0, le=1.0, description="SVF's own step size: scales are z = exp(u), and a "
                             "random step moves each u by about this much (0.1: z about 1 +- 0.1, always positive)")
    max_length: int = Field(1024, ge=16, description="encoder window for transcripts (cut from the front)")
    max_usd: float | None = Field(None, gt=0, description="budget for the whole training run (default: the worker "
                                  "config's max_usd_per_run)")


def load_roles_config(path: str | Path) -> RolesConfig:
    from fugu_pipeline.config_files import ConfigError

    return load_yaml_model(path, RolesConfig, ConfigError, what="config file", empty_ok=True)


def reward(tr: Trajectory, cfg: RolesConfig) -> float:
    return float(tr.quality or 0.0) - cfg.turn_penalty * tr.n_turns - cfg.cost_penalty * tr.cost_usd


@dataclass
class RolesTrainResult:
    weight: np.ndarray  # (L + 3, D) float32
    center: np.ndarray  # (D,) the frozen feature standardisation
    scale: np.ndarray  # (D,)
    worker_ids: list[str]
    featurizer: TranscriptFeaturizer
    config: dict[str, Any]
    curves: dict[str, list[float]]
    best_generation: int
    metrics: dict[str, Any]
    data_version: str
    wall_s: float
    svf_scales: np.ndarray | None = None  # (S,) with `svf: true`
    adapter: Any = None

    def policy(self) -> LinearRolesPolicy:
        f = self.featurizer if self.svf_scales is None else self.featurizer.with_scales(self.adapter, self.svf_scales)
        return LinearRolesPolicy(self.weight, self.worker_ids, f, center=self.center, scale=self.scale)

    def save(self, models_dir: str | Path) -> Path:
        import torch

        from fugu_pipeline.train.checkpoints import save_checkpoint

        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        state = {"linear.weight": t(self.weight), "feature_center": t(self.center), "feature_scale": t(self.scale)}
        kind, shape = HEAD_KIND, {}
        sets = (self.weight.shape[0] - len(ROLES)) // max(len(self.worker_ids), 1)
        if sets != 1:
            shape["worker_sets"] = int(sets)
        if self.svf_scales is not None:
            state["svf_scales"] = t(self.svf_scales)
            kind, shape = SVF_HEAD_KIND, {**shape, "svf_size": int(self.svf_scales.size)}
        return save_checkpoint(models_dir, METHOD, kind, state, {
            "head_shape": shape, "worker_ids": self.worker_ids, "feature_contract": self.featurizer.contract(),
            "data_version": self.data_version, "training_config": self.config,
            "metrics": {**self.metrics, "best_generation": self.best_generation}, "curves": self.curves,
            "wall_s": self.wall_s,
        })


def session_info(max_turns: int) -> dict[str, Any]:
    """What a roles checkpoint needs besides its weights to act as it was trained (in its manifest)."""
    return {"max_turns": max_turns, "roles": list(ROLES), "prompt_version": PROMPT_VERSION,
            "transcript_version": TRANSCRIPT_VERSION, "head_marker": HEAD_MARKER, "worker_window": window_info()}


def warm_start_weight(featurizer: TranscriptFeaturizer, worker_ids: list[str], checkpoint) -> tuple[np.ndarray | None, str]:
    """The roles head's worker rows from a one-step checkpoint, where that is meaningful: the same
    encoder model, pooling, position, layer and normalisation (its prompt template may differ) and
    a bias-free head over the features themselves (`normed_linear`; a LayerNorm head's rows act
    on other vectors). Role rows start at zero. Returns (weight or None, the reason)."""
    m = checkpoint.manifest
    ours = featurizer.contract().model_dump()
    theirs = m.feature_contract.model_dump()
    differ = [k for k in ("encoder_id", "revision", "pooling", "token_position", "layer", "normalize", "dim")
              if ours[k] != theirs[k]]
    if differ:
        return None, f"no warm start: the one-step router's encoder differs ({', '.join(differ)})"
    if m.head_kind != "normed_linear":
        return None, f"no warm start: the one-step head is {m.head_kind!r}; only a bias-free normed_linear head's rows transfer"
    rows = checkpoint.state_dict["linear.weight"].detach().cpu().numpy()
    w = np.zeros((len(worker_ids) + len(ROLES), featurizer.dim), dtype=np.float32)
    copied = [wid for wid in worker_ids if wid in m.worker_ids]
    for wid in copied:
        w[worker_ids.index(wid)] = rows[m.worker_ids.index(wid)]
    if not copied:
        return None, "no warm start: the one-step router knows none of these workers"
    return w, f"warm start: worker rows of {len(copied)} worker(s) from {m.method}/{m.content_hash}"


def policy_from_checkpoint(checkpoint, featurizer: TranscriptFeaturizer) -> LinearRolesPolicy:
    """The session policy of a roles checkpoint (`roles_linear` or `roles_linear_svf`) over this featurizer."""
    sd = {k: v.detach().cpu().numpy() for k, v in checkpoint.state_dict.items()}
    if "svf_scales" in sd:
        from fugu_pipeline.session.svf import SVFAdapter

        featurizer = featurizer.with_scales(SVFAdapter(featurizer.encoder.model), sd["svf_scales"])
    return LinearRolesPolicy(sd["linear.weight"], list(checkpoint.manifest.worker_ids), featurizer,
                             center=sd["feature_center"], scale=sd["feature_scale"])


def data_version(train: list[Task], val: list[Task], context: str) -> str:
    return sha256_text(canonical_json({"train": sorted((t.task_id, t.prompt_hash) for t in train),
                                       "val": sorted((t.task_id, t.prompt_hash) for t in val), "context": context}))[:16]


def train_roles(
    runner: SessionRunner,
    featurizer: TranscriptFeaturizer,
    worker_ids: list[str],
    train: list[Task],
    val: list[Task],
    cfg: RolesConfig | None = None,
    *,
    init_weight: np.ndarray | None = None,
    log: Callable[[str], None] | None = None,
) -> RolesTrainResult:
    from cmaes import SepCMA

    cfg, log = cfg or RolesConfig(), log or _logger.info
    if not train or not val:
        raise ValueError(f"the coordinator needs train and val tasks (got {len(train)} train, {len(val)} val)")
    t0 = time.perf_counter()
    n_workers, dim = len(worker_ids), featurizer.dim
    sets = len(ROLES) if cfg.worker_per_role else 1
    n_out = sets * n_workers + len(ROLES)
    center, scale, z, kinds, groups = exploration_stats(runner, featurizer, worker_ids, train, cfg.explore_tasks, cfg.seed,
                                                cfg.explore_seeds)
    by_kind = cfg.search == "state_kinds"
    basis, _ = search_basis(z, cfg.search_dims, kinds=kinds if by_kind else None, groups=groups if by_kind else None)
    k = len(basis)
    log(f"roles: features standardised over {len(z)} transcript states ({len(set(kinds))} kinds) of the uniform "
        f"policy on {min(cfg.explore_tasks, len(train))} training tasks x {cfg.explore_seeds} seed(s); CMA-ES searches "
        f"{k} directions (" + ("the constant and one decoupled probe per kind of state)" if cfg.search == "state_kinds"
                               else "the leading whitened directions)"))
    w0 = np.zeros((n_out, dim))
    flat = 1.0 / (SHIFT * dim)  # standardised features average SHIFT per dimension: a flat row is a constant logit

    def rows(role: str) -> slice:  # the worker softmax a role picks from
        at = ROLES.index(role) if sets > 1 else 0  # type: ignore[arg-type]
        return slice(at * n_workers, (at + 1) * n_workers)

    if init_weight is not None:  # rows that acted on raw features act on standardised ones: W' = W * scale
        w0[rows("worker")] = np.asarray(init_weight, np.float64)[:n_workers] * scale[None, :]
    if cfg.init == "one_step":
        w0[sets * n_workers + ROLES.index("worker")] = cfg.init_logit * flat
        best = None
        if init_weight is None or sets > 1:
            best = best_fixed_worker(runner, worker_ids, train, cfg.explore_tasks, cfg.seed,
                                     lambda t: reward(t, cfg), log)
        if init_weight is None:
            w0[rows("worker").start + worker_ids.index(best)] = cfg.init_worker_logit * flat
        if sets > 1:
            for role, w in best_role_workers(runner, worker_ids, best, train, cfg.explore_tasks, cfg.seed,
                                             lambda t: reward(t, cfg), log).items():
                if role != "worker":
                    w0[rows(role).start + worker_ids.index(w)] = cfg.init_worker_logit * flat
    # CMA-ES's initial sigma: a random step moves each logit by about sigma0 (a kind probe moves its kind's
    # logits one for one; k whitened directions move every logit by sqrt(k) times a coordinate)
    step = cfg.sigma0 if cfg.search == "state_kinds" else cfg.sigma0 / np.sqrt(k)
    # each parameter group its own step: a search coordinate of size `step` moves a role logit by sigma0 and a
    # worker logit by worker_sigma (theta = coordinate x unit)
    unit = np.ones((n_out, k))
    unit[: sets * n_workers] = cfg.worker_sigma / cfg.sigma0
    unit = unit.ravel()
    # W = theta @ B, acting like w0 on the explored states (state kinds: on the constant direction alone,
    # unless the grammar's per-kind offsets are fitted too: then on every direction)
    offsets = None
    if cfg.init == "one_step" and cfg.init_grammar:
        offsets = grammar_offsets(kinds, n_out, sets * n_workers, cfg.init_logit, cfg.init_verify_lead, cfg.init_logit)
    theta0 = initial_theta(w0, basis, z, offsets=offsets,
                           only=slice(0, 1) if by_kind and len(set(kinds)) > 1 and offsets is None else None).ravel() / unit
    if offsets is not None:  # how closely the fitted start follows the grammar on the explored states
        role_rows = slice(sets * n_workers, n_out)
        got = z @ ((theta0 * unit).reshape(n_out, k) @ basis)[role_rows].T
        want = z @ w0[role_rows].T + offsets[:, role_rows]
        log(f"roles: grammar start: the fitted head picks the grammar's role on "
            f"{np.mean(got.argmax(1) == want.argmax(1)):.2f} of the explored states")
    n_w, adapter = theta0.size, None
    svf_unit = cfg.svf_sigma / step  # an SVF search coordinate of size `step` moves a log-scale by svf_sigma
    if cfg.svf:  # the adapter's scales z = exp(u); u starts at 0 (the original encoder)
        from fugu_pipeline.session.svf import SVFAdapter

        adapter = SVFAdapter(featurizer.encoder.model)
        theta0 = np.concatenate([theta0, np.zeros(adapter.size)])
        log(f"roles: SVF adapter on the encoder's second-to-last layer: {adapter.size:,} singular values "
            f"({', '.join(adapter.names)}), step {cfg.svf_sigma} on the log-scales; the layers below it run "
            "once per transcript, it and the one above per candidate")

    def head(th: np.ndarray) -> np.ndarray:
        return ((np.asarray(th[:n_w], np.float64) * unit).reshape(n_out, k) @ basis).astype(np.float32)

    def svf_scales(th: np.ndarray) -> np.ndarray:
        return np.exp(svf_unit * np.asarray(th[n_w:], np.float64)).astype(np.float32)

    def make(th: np.ndarray) -> LinearRolesPolicy:
        w = head(th)
        f = featurizer if adapter is None else featurizer.with_scales(adapter, svf_scales(th))
        return LinearRolesPolicy(w, worker_ids, f, center=center, scale=scale)

    es = SepCMA(mean=theta0.copy(), sigma=step, seed=cfg.seed, population_size=cfg.population_size)
    rng = np.random.default_rng(cfg.seed)
    order = np.random.default_rng(cfg.seed + 1).permutation(len(val))
    val_set = [val[i] for i in order[: cfg.val_tasks or len(val)]]
    val_pairs = [(t, VAL_SEED_BASE + s) for t in val_set for s in range(cfg.val_seeds)]
    log(f"roles: SepCMA over a {n_out} x {dim} head ({n_out} x {k} search coordinates{' + SVF' if adapter else ''}: "
        f"{theta0.size:,} evolved numbers), population {es.population_size}, "
        f"sigma0 {cfg.sigma0} (worker logits {cfg.worker_sigma}), {cfg.generations} generations x {cfg.tasks_per_generation} tasks x "
        f"{cfg.seeds_per_task} seed(s); {len(train)} train / {len(val_set)} val tasks; "
        f"{'sampled' if cfg.sample_actions else 'greedy'} picks in training, greedy on val")

    paid: dict[str, float] = {}  # every distinct paid turn of training (a memo hit is no call): the training cost

    def score(thetas: list[np.ndarray], pairs, greedy: bool) -> tuple[np.ndarray, list[list[Trajectory]]]:
        trs = runner.run([make(th) for th in thetas], pairs, greedy=greedy)
        for turn in (u for row in trs for t in row for u in t.turns):
            if turn.request_sha:
                paid[turn.request_sha] = turn.cost_usd
        return np.array([[reward(tr, cfg) for tr in row] for row in trs]), trs

    r0, tr0 = score([theta0], val_pairs, True)
    start = ("warm_start" if init_weight is not None else "one_step_init") if cfg.init == "one_step" else "zero_init"
    best_val, best_theta, best_gen, best_what = float(r0.mean()), theta0, 0, start
    trained: tuple[float, np.ndarray, int, str] | None = None  # the best validated trained head
    svf_spread: dict[str, float] = {}
    curves: dict[str, list[float]] = {"train_best": [], "train_population_mean": [], "train_mean": [],
                                      "val_generation": [0.0], "val_mean": [best_val], "val_best": [best_val]}
    log(f"roles generation   0  val reward {best_val:.4f} ({best_what})")
    for g in range(1, cfg.generations + 1):
        batch = stratified(train, min(cfg.tasks_per_generation, len(train)), rng)
        seeds = rng.integers(0, TRAIN_SEEDS, size=(len(batch), cfg.seeds_per_task))
        pairs = [(train[int(i)], int(s)) for i, row in zip(batch, seeds) for s in row]
        xs = [es.ask() for _ in range(es.population_size)]
        if adapter is not None:  # how far the candidates' encoders are from the original (log-scales)
            u = np.log(np.stack([svf_scales(x) for x in xs]))
            svf_spread = {"svf_candidate_log_scale_std": float(u.std()), "svf_candidate_min_scale": float(np.exp(u.min()))}
        r, _ = score([*xs, es.mean.copy()], pairs, not cfg.sample_actions)
        fit = r.mean(axis=1)
        es.tell([(x, -float(f)) for x, f in zip(xs, fit[:-1])])
        curves["train_best"].append(float(fit[:-1].max()))
        curves["train_population_mean"].append(float(fit[:-1].mean()))
        curves["train_mean"].append(float(fit[-1]))
        line = f"roles generation {g:3d}  train best {fit[:-1].max():.4f}  pop mean {fit[:-1].mean():.4f}  mean {fit[-1]:.4f}"
        if g % cfg.val_every == 0 or g == cfg.generations:
            cands = [es.mean.copy(), np.asarray(xs[int(np.argmax(fit[:-1]))])]
            rv, _ = score(cands, val_pairs, True)
            v_mean, v_best = (float(x) for x in rv.mean(axis=1))
            curves["val_generation"].append(float(g))
            curves["val_mean"].append(v_mean)
            curves["val_best"].append(v_best)
            for v, th, what in ((v_mean, cands[0], "mean"), (v_best, cands[1], "generation_best")):
                if v > best_val + 1e-12:
                    best_val, best_theta, best_gen, best_what = v, np.asarray(th).copy(), g, what
                if trained is None or v > trained[0] + 1e-12:
                    trained = (v, np.asarray(th).copy(), g, what)
            line += f"  val mean {v_mean:.4f}  val gen-best {v_best:.4f}"
        log(line)
    if not head(best_theta).any() and trained is not None:
        # the all-zero start (init: uniform) is no head to keep (weight sanity refuses it, and its
        # greedy picks are a tie-break): keep the best trained head, and say it did not beat the start
        log(f"roles: no generation beat the uniform start on validation (val reward {best_val:.4f}); keeping the "
            f"best trained head ({trained[3]} of generation {trained[2]}, val reward {trained[0]:.4f})")
        best_val, best_theta, best_gen, best_what = trained
        best_what += "_not_better_than_uniform_start"
    log(f"roles: keeping {best_what} of generation {best_gen} (val reward {best_val:.4f})")

    weight = head(best_theta)
    kept_scales = None if adapter is None else svf_scales(best_theta)
    _, kept = score([best_theta], val_pairs, True)
    kept = kept[0]
    if adapter is not None:
        adapter.apply(None)  # the shared encoder back to its own weights
    metrics = {
        "val_reward": best_val, "val_accuracy": float(np.mean([t.quality or 0.0 for t in kept])),
        "val_turns": float(np.mean([t.n_turns for t in kept])), "val_cost_usd": float(np.mean([t.cost_usd for t in kept])),
        "start_val_reward": float(r0.mean()), "selected": best_what, "population_size": es.population_size,
        "evolved_params": int(theta0.size), "n_train": len(train), "n_val": len(val_set),
        "data_cost_usd": round(float(sum(paid.values())), 10), "paid_turns": len(paid), **svf_spread,
    }
    log(f"roles: {runner.stats.sessions_run} sessions run, {runner.stats.sessions_stored} read from the store, "
        f"{runner.stats.turns_reused} turns reused from the memo")
    context = runner.store.context if runner.store is not None else ""
    config = {**cfg.model_dump(), "session": session_info(cfg.max_turns), "store_context": context}
    return RolesTrainResult(weight=weight, center=center, scale=scale, worker_ids=list(worker_ids),
                            featurizer=featurizer, config=config, svf_scales=kept_scales, adapter=adapter,
                            curves=curves, best_generation=best_gen, metrics=metrics,
                            data_version=data_version(train, val_set, context), wall_s=round(time.perf_counter() - t0, 3))
