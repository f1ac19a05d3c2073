"""Training the routing head over cached features and the full reward matrix.

Three stages, each warm-starting the next (DESIGN §1):

- `train_sft`: supervised warm start. Targets are soft: softmax(U / temperature) over the workers'
  utilities (cross-entropy or KL); the `quality` head instead regresses each worker's quality.
- `train_rl`: offline contextual bandit. Every (task, worker) reward is known, so REINFORCE uses
  the exact expected reward under the policy as its baseline; `expected_reward` maximises that
  expectation directly (lower variance).
- `train_es`: separable CMA-ES on the final linear layer only, scoring the discrete greedy route;
  the whole population is scored with one matrix product per generation.

Every stage early-stops (or selects) on validation utility of the greedy route. Every
hyperparameter lives in the stage's pydantic config; every random draw is seeded from it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from cmaes import SepCMA
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fugu_pipeline.checkpoints import save_checkpoint
from fugu_pipeline.heads import HEAD_KINDS, QualityHead, RoutingHead, build_head
from fugu_pipeline.schemas import FeatureContract, UtilityConfig
from fugu_pipeline.training_data import RoutingData, TrainingDataError
from fugu_pipeline.config_files import load_yaml_model

Log = Callable[[str], None]
_logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- configs


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    head: str = Field("layernorm_linear", description=f"one of {HEAD_KINDS}")

    @field_validator("head")
    @classmethod
    def _known_head(cls, v: str) -> str:
        if v not in HEAD_KINDS:
            raise ValueError(f"unknown head {v!r}; choose one of {list(HEAD_KINDS)}")
        return v


class SFTConfig(_Config):
    temperature: float = Field(0.2, gt=0, description="soft targets softmax(U / temperature)")
    loss: Literal["ce", "kl"] = "ce"
    lr: float = Field(5e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    epochs: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(15, ge=1, description="epochs without a better validation utility before stopping")
    quality_cost_weight: float | None = Field(
        None, ge=0, description="quality head only: lambda in quality - lambda*cost; None = w_c/w_q of the utility config"
    )


class RLConfig(_Config):
    estimator: Literal["reinforce", "expected_reward"] = "reinforce"
    samples_per_task: int = Field(8, ge=1, description="REINFORCE actions sampled per task and step")
    entropy_coef: float = Field(0.01, ge=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    epochs: int = Field(50, ge=1)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(10, ge=1)


class ESConfig(_Config):
    population_size: int | None = Field(
        None, ge=2, description="None = the cmaes default 4 + floor(3 ln n), n = number of evolved weights"
    )
    sigma0: float = Field(0.02, gt=0, description="initial step size; small when warm-started")
    generations: int = Field(300, ge=1)
    val_every: int = Field(10, ge=1, description="evaluate the mean and the generation's best on val this often")


class ConfigError(ValueError):
    """A training config file is broken; the message names the file and the field."""


def load_config(path: str | Path, cls: type[BaseModel]) -> Any:
    """A trainer config from YAML (an empty file means all defaults); errors name file and field."""
    return load_yaml_model(path, cls, ConfigError, what="config file", empty_ok=True)


# --------------------------------------------------------------------------- results


@dataclass
class TrainResult:
    method: str  # sft | rl | es
    head_kind: str
    state_dict: dict[str, torch.Tensor]
    worker_ids: list[str]
    dim: int
    param_count: int
    config: dict[str, Any]
    curves: dict[str, list[float]]
    best_epoch: int  # epoch (SFT, RL) or generation (ES) of the kept weights; 0 = the warm start
    metrics: dict[str, Any]
    contract: FeatureContract
    utility_config: dict[str, Any] | None
    data_version: str
    wall_s: float

    def head(self) -> RoutingHead:
        return load_head(self.state_dict, self.head_kind, self.dim, len(self.worker_ids))

    def manifest_fields(self) -> dict[str, Any]:
        return {
            "worker_ids": self.worker_ids, "feature_contract": self.contract, "dim": self.dim,
            "utility_config": self.utility_config, "data_version": self.data_version,
            "training_config": self.config, "metrics": {**self.metrics, "best_epoch": self.best_epoch},
            "curves": self.curves, "wall_s": self.wall_s,
        }

    def save(self, models_dir: str | Path) -> Path:
        return save_checkpoint(models_dir, self.method, self.head_kind, self.state_dict, self.manifest_fields())


# --------------------------------------------------------------------------- helpers


def greedy_utility(scores: np.ndarray | torch.Tensor, utility: np.ndarray) -> float:
    """Mean utility of routing each row to its highest-scoring worker (first on ties)."""
    s = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    if len(s) == 0:
        return float("nan")
    return float(np.asarray(utility)[np.arange(len(s)), s.argmax(axis=1)].mean())


def load_head(state: dict[str, torch.Tensor], kind: str, dim: int, n_workers: int) -> RoutingHead:
    head = build_head(kind, dim, n_workers)
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"these weights do not fit a {kind!r} head of dim {dim} with {n_workers} workers "
            f"(set `head:` in the config to the kind the weights were trained as): {exc}"
        ) from None
    return head.eval()


def evaluate_head(
    head_state: dict[str, torch.Tensor], kind: str, data_split: RoutingData, train: RoutingData | None = None
) -> dict[str, Any]:
    """Router, oracle, random and best-fixed utility on one split. The best fixed worker is chosen
    on `train` when given (the honest baseline); `best_fixed_utility_optimistic` is chosen on the
    split itself."""
    head = load_head(head_state, kind, data_split.dim, data_split.n_workers)
    u = data_split.utility
    with torch.no_grad():
        scores = head(torch.from_numpy(data_split.features))
    means = u.mean(axis=0)
    fixed = int(np.argmax(train.utility.mean(axis=0))) if train is not None else int(np.argmax(means))
    return {
        "n": len(u),
        "router_utility": greedy_utility(scores, u),
        "oracle_utility": float(u.max(axis=1).mean()),
        "random_utility": float(u.mean()),
        "best_fixed_worker": data_split.worker_ids[fixed],
        "best_fixed_utility": float(means[fixed]),
        "best_fixed_utility_optimistic": float(means.max()),
    }


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed torch, make CPU kernels deterministic for the duration, and hand out a generator."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        yield torch.Generator().manual_seed(seed)
    finally:
        torch.use_deterministic_algorithms(previous)


def _prepare(data: RoutingData, force: bool) -> tuple[RoutingData, RoutingData]:
    data.validate(require=("train", "val"), force=force)
    return data.split("train"), data.split("val")


def _val_utility(head: RoutingHead, x: torch.Tensor, u: np.ndarray) -> float:
    head.eval()
    with torch.no_grad():
        v = greedy_utility(head(x), u)
    head.train()
    return v


def _state(head: RoutingHead) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()}


def _result(
    method: str,
    cfg: SFTConfig | RLConfig | ESConfig,
    head: RoutingHead,
    state: dict[str, torch.Tensor],
    data: RoutingData,
    train: RoutingData,
    val: RoutingData,
    curves: dict[str, list[float]],
    best_epoch: int,
    t0: float,
    extra: dict[str, Any] | None = None,
) -> TrainResult:
    """Package the kept weights with their metrics on val (best fixed chosen on train) and train."""
    ev_val = evaluate_head(state, cfg.head, val, train)
    ev_train = evaluate_head(state, cfg.head, train, train)
    metrics = {
        "val_utility": ev_val["router_utility"],
        "val_best_fixed_utility": ev_val["best_fixed_utility"],
        "val_oracle_utility": ev_val["oracle_utility"],
        "val_random_utility": ev_val["random_utility"],
        "train_utility": ev_train["router_utility"],
        "best_fixed_worker": ev_val["best_fixed_worker"],
        "n_train": len(train.task_ids),
        "n_val": len(val.task_ids),
        **(extra or {}),
    }
    return TrainResult(
        method=method, head_kind=cfg.head, state_dict=state, worker_ids=list(data.worker_ids), dim=data.dim,
        param_count=head.param_count(), config=cfg.model_dump(), curves=curves, best_epoch=best_epoch,
        metrics=metrics, contract=data.contract,
        utility_config=data.utility_config.model_dump() if data.utility_config else None,
        data_version=data.data_version, wall_s=round(time.perf_counter() - t0, 3),
    )


def _set_cost_buffers(head: QualityHead, train: RoutingData, cfg: SFTConfig, log: Log) -> None:
    """Quality head: expected normalised cost per worker (train mean of min(C/C0, cap)) and lambda."""
    ucfg = train.utility_config or UtilityConfig()
    lam = cfg.quality_cost_weight
    if lam is None:
        lam = ucfg.cost_weight / ucfg.quality_weight if ucfg.quality_weight > 0 else 0.0
    if train.cost_usd is None:
        cost, lam = np.zeros(train.n_workers), 0.0
        log("sft: no cost data; the quality head routes on predicted quality alone")
    else:
        cost = np.minimum(np.maximum(train.cost_usd, 0.0) / ucfg.cost_scale_usd, ucfg.cap).mean(axis=0)
    head.expected_cost.copy_(torch.tensor(cost, dtype=torch.float32))
    head.cost_weight.fill_(float(lam))


@dataclass
class _EarlyStop:
    """Keeps the weights of the best validation epoch and says when patience has run out."""

    method: str
    patience: int
    log: Log
    best_state: dict[str, torch.Tensor]
    best_val: float = -float("inf")
    best_epoch: int = 0

    def stop(self, epoch: int, val_utility: float, head: RoutingHead) -> bool:
        if val_utility > self.best_val + 1e-12:
            self.best_val, self.best_epoch, self.best_state = val_utility, epoch, _state(head)
            return False
        if epoch - self.best_epoch >= self.patience:
            self.log(f"{self.method}: early stop at epoch {epoch}; keeping epoch {self.best_epoch} "
                     f"(val utility {self.best_val:.4f})")
            return True
        return False


# --------------------------------------------------------------------------- SFT


def train_sft(data: RoutingData, cfg: SFTConfig | None = None, log: Log | None = None, force: bool = False) -> TrainResult:
    cfg, log = cfg or SFTConfig(), log or _logger.info
    train, val = _prepare(data, force)
    if cfg.head == "quality" and train.quality is None:
        raise TrainingDataError(
            "head 'quality' learns each worker's quality, but this data has no quality matrix; "
            "use head 'layernorm_linear' or load rewards with quality"
        )
    t0 = time.perf_counter()
    with _seeded(cfg.seed) as gen:
        x, u = torch.from_numpy(train.features), torch.from_numpy(train.utility).float()
        xv = torch.from_numpy(val.features)
        head = build_head(cfg.head, data.dim, data.n_workers)
        if cfg.head == "quality":
            target = torch.from_numpy(train.quality).float()
            _set_cost_buffers(head, train, cfg, log)
        else:
            target = torch.softmax(u / cfg.temperature, dim=1)
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        log(f"sft: head {cfg.head}, {head.param_count():,} params, dim {data.dim}, {data.n_workers} workers, "
            f"{len(x)} train / {len(xv)} val tasks")

        curves: dict[str, list[float]] = {"train_loss": [], "val_utility": []}
        early = _EarlyStop("sft", cfg.patience, log, _state(head))
        head.train()
        for epoch in range(1, cfg.epochs + 1):
            perm, total = torch.randperm(len(x), generator=gen), 0.0
            for i in range(0, len(x), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                logits = head.linear(head.frozen(x[idx]))
                if cfg.head == "quality":
                    loss = F.binary_cross_entropy_with_logits(logits, target[idx])
                elif cfg.loss == "ce":
                    loss = -(target[idx] * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
                else:
                    loss = F.kl_div(F.log_softmax(logits, dim=1), target[idx], reduction="batchmean")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
            v = _val_utility(head, xv, val.utility)
            curves["train_loss"].append(total / len(x))
            curves["val_utility"].append(v)
            log(f"sft epoch {epoch:3d}  loss {total / len(x):.4f}  val utility {v:.4f}")
            if early.stop(epoch, v, head):
                break
    return _result("sft", cfg, head, early.best_state, data, train, val, curves, early.best_epoch, t0)


# --------------------------------------------------------------------------- RL


def train_rl(
    data: RoutingData,
    cfg: RLConfig | None = None,
    init_state: dict[str, torch.Tensor] | None = None,
    log: Log | None = None,
    force: bool = False,
) -> TrainResult:
    cfg, log = cfg or RLConfig(), log or _logger.info
    if cfg.head == "quality":
        raise ValueError("RL trains a softmax policy; the 'quality' head is a quality regressor. "
                         "Train it with SFT, or use head 'layernorm_linear' or 'normed_linear' for RL")
    train, val = _prepare(data, force)
    t0 = time.perf_counter()
    with _seeded(cfg.seed) as gen:
        x, u = torch.from_numpy(train.features), torch.from_numpy(train.utility).float()
        xv = torch.from_numpy(val.features)
        head = build_head(cfg.head, data.dim, data.n_workers)
        if init_state is not None:
            head = load_head(init_state, cfg.head, data.dim, data.n_workers)
        opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        log(f"rl ({cfg.estimator}): head {cfg.head}, {head.param_count():,} params, "
            f"{'warm start' if init_state is not None else 'fresh init'}, {len(x)} train / {len(xv)} val tasks")

        curves: dict[str, list[float]] = {"train_loss": [], "train_expected_utility": [], "val_utility": []}
        early = _EarlyStop("rl", cfg.patience, log, _state(head), best_val=_val_utility(head, xv, val.utility))
        log(f"rl epoch   0  val utility {early.best_val:.4f} (start)")
        head.train()
        for epoch in range(1, cfg.epochs + 1):
            perm, total, expected = torch.randperm(len(x), generator=gen), 0.0, 0.0
            for i in range(0, len(x), cfg.batch_size):
                idx = perm[i : i + cfg.batch_size]
                logp = F.log_softmax(head(x[idx]), dim=1)
                p, ub = logp.exp(), u[idx]
                value = (p * ub).sum(dim=1)  # exact expected utility under the policy
                entropy = -(p * logp).sum(dim=1).mean()
                if cfg.estimator == "reinforce":
                    a = torch.multinomial(p.detach(), cfg.samples_per_task, replacement=True, generator=gen)
                    advantage = ub.gather(1, a) - value.detach()[:, None]
                    objective = (advantage * logp.gather(1, a)).mean()
                else:
                    objective = value.mean()
                loss = -objective - cfg.entropy_coef * entropy
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
                expected += value.sum().item()
            v = _val_utility(head, xv, val.utility)
            curves["train_loss"].append(total / len(x))
            curves["train_expected_utility"].append(expected / len(x))
            curves["val_utility"].append(v)
            log(f"rl epoch {epoch:3d}  loss {total / len(x):.4f}  E[U] {expected / len(x):.4f}  val utility {v:.4f}")
            if early.stop(epoch, v, head):
                break
    return _result("rl", cfg, head, early.best_state, data, train, val, curves, early.best_epoch, t0)


# --------------------------------------------------------------------------- CMA-ES


def population_fitness(
    feats: np.ndarray, utility: np.ndarray, thetas: np.ndarray, transform: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """Mean greedy-route utility of every candidate final layer, with one matrix product.

    feats (N, K) are the cached frozen features (with a column of ones when the layer has a bias);
    thetas (P, K*W) are candidates, each a (K, W) matrix flattened; returns (P,)."""
    n, k = feats.shape
    p, w = len(thetas), utility.shape[1]
    m = np.asarray(thetas, dtype=np.float32).reshape(p, k, w).transpose(1, 0, 2).reshape(k, p * w)
    z = (feats @ m).reshape(n, p, w)
    if transform is not None:
        z = transform(z)
    return utility[np.arange(n)[:, None], z.argmax(axis=2)].mean(axis=0)


def _es_parts(head: RoutingHead, x: torch.Tensor) -> np.ndarray:
    """The frozen features, with a ones column appended when the final layer has a bias."""
    with torch.no_grad():
        f = head.frozen(x).numpy().astype(np.float32)
    if head.linear.bias is not None:
        f = np.concatenate([f, np.ones((len(f), 1), np.float32)], axis=1)
    return np.ascontiguousarray(f)


def _es_transform(head: RoutingHead) -> Callable[[np.ndarray], np.ndarray] | None:
    if not isinstance(head, QualityHead):
        return None
    lam = float(head.cost_weight.item())
    cost = head.expected_cost.numpy().astype(np.float32)
    return lambda z: 1.0 / (1.0 + np.exp(-z)) - lam * cost


def train_es(
    data: RoutingData,
    cfg: ESConfig | None = None,
    init_state: dict[str, torch.Tensor] | None = None,
    log: Log | None = None,
    force: bool = False,
) -> TrainResult:
    cfg, log = cfg or ESConfig(), log or _logger.info
    train, val = _prepare(data, force)
    t0 = time.perf_counter()
    with _seeded(cfg.seed):
        head = build_head(cfg.head, data.dim, data.n_workers)
        if init_state is not None:
            head = load_head(init_state, cfg.head, data.dim, data.n_workers)
        f_train = _es_parts(head, torch.from_numpy(train.features))
        f_val = _es_parts(head, torch.from_numpy(val.features))
        transform = _es_transform(head)
        weight = head.linear.weight.detach().numpy().astype(np.float64)  # (W, D)
        bias = head.linear.bias
        m0 = weight.T if bias is None else np.vstack([weight.T, bias.detach().numpy()[None, :]])
        theta0 = m0.ravel()
        es = SepCMA(mean=theta0.copy(), sigma=cfg.sigma0, seed=cfg.seed, population_size=cfg.population_size)
        log(f"es: SepCMA over the final layer of a {cfg.head} head: {theta0.size:,} evolved weights "
            f"(head has {head.param_count():,} params), population {es.population_size}, sigma0 {cfg.sigma0}, "
            f"{cfg.generations} generations, {len(f_train)} train / {len(f_val)} val tasks")

        fit = lambda f, u, th: population_fitness(f, u, th, transform)  # noqa: E731
        best_val = float(fit(f_val, val.utility, theta0[None])[0])
        best_theta, best_gen, best_what = theta0, 0, "warm_start"
        log(f"es generation   0  val utility {best_val:.4f} (warm start)")
        curves: dict[str, list[float]] = {
            "train_best": [], "train_population_mean": [], "train_mean": [],
            "val_generation": [0.0], "val_mean": [best_val], "val_best": [best_val],  # generation 0: the warm start
        }
        for g in range(1, cfg.generations + 1):
            xs = np.stack([es.ask() for _ in range(es.population_size)])
            scores = fit(f_train, train.utility, np.vstack([xs, es.mean[None]]))  # last row: the current mean
            pop = scores[:-1]
            es.tell([(x_, -float(s)) for x_, s in zip(xs, pop)])
            curves["train_best"].append(float(pop.max()))
            curves["train_population_mean"].append(float(pop.mean()))
            curves["train_mean"].append(float(scores[-1]))
            if g % cfg.val_every == 0 or g == cfg.generations:
                cands = np.stack([es.mean.copy(), xs[int(np.argmax(pop))]])
                v_mean, v_best = (float(s) for s in fit(f_val, val.utility, cands))
                curves["val_generation"].append(float(g))
                curves["val_mean"].append(v_mean)
                curves["val_best"].append(v_best)
                for v, th, what in ((v_mean, cands[0], "mean"), (v_best, cands[1], "generation_best")):
                    if v > best_val + 1e-12:
                        best_val, best_theta, best_gen, best_what = v, th.copy(), g, what
                log(f"es generation {g:3d}  train best {pop.max():.4f}  train mean {scores[-1]:.4f}  "
                    f"val mean {v_mean:.4f}  val gen-best {v_best:.4f}")
        log(f"es: keeping {best_what} of generation {best_gen} (val utility {best_val:.4f})")

        m = torch.tensor(best_theta.reshape(m0.shape), dtype=torch.float32)
        state = _state(head)
        state["linear.weight"] = (m if bias is None else m[:-1]).T.contiguous()
        if bias is not None:
            state["linear.bias"] = m[-1].contiguous()
    extra = {"es_selected": best_what, "es_population_size": es.population_size, "es_evolved_params": int(theta0.size)}
    return _result("es", cfg, head, state, data, train, val, curves, best_gen, t0, extra)
