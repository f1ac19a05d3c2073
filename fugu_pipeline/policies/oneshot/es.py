"""CMA-ES: separable CMA-ES (`cmaes.SepCMA`) on the final linear layer only, over the cached frozen
features, scoring the discrete greedy route; the whole population is scored with one matrix
product per generation. Keeps the weights best on validation (never worse than the warm start)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from cmaes import SepCMA

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.policies.oneshot.configs import ESConfig
from fugu_pipeline.policies.oneshot.heads import QualityHead, RoutingHead, build_head
from fugu_pipeline.train.loop import Log, prepare, seeded, state_of
from fugu_pipeline.train.result import TrainResult, load_head, make_result

_logger = logging.getLogger(__name__)


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
    train, val = prepare(data, force)
    t0 = time.perf_counter()
    with seeded(cfg.seed):
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
        state = state_of(head)
        state["linear.weight"] = (m if bias is None else m[:-1]).T.contiguous()
        if bias is not None:
            state["linear.bias"] = m[-1].contiguous()
    extra = {"es_selected": best_what, "es_population_size": es.population_size, "es_evolved_params": int(theta0.size)}
    return make_result("es", cfg, head, state, data, train, val, curves, best_gen, t0, extra)
