"""A loaded checkpoint plus the encoder its feature contract names: one routing decision per prompt.

`promoted.py` wraps it to follow the promoted pointer (`load_promoted`).
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.reward import MAX_COST_WEIGHT as MAX_COST_WEIGHT  # the request field's bound (serve)
from fugu_pipeline.route.capped import CapRouting
from fugu_pipeline.route.errors import BudgetUnavailable, RouterError  # noqa: F401 (this module's API too)
from fugu_pipeline.route.follow import TARGET
from fugu_pipeline.route.shipped import point_problem, read_shipped, serving_point


# What a decision's `scores` hold, by head kind (`score_kind`):
POLICY_PROBABILITY = "policy_probability"  # a policy head (layernorm_linear, normed_linear): softmax of its logits
PREDICTED_UTILITY = "predicted_utility"  # a head that predicts quality (quality, knn, domain_prior, ridge, mlp, ensemble)
QUALITY_MINUS_COST = "predicted_quality_minus_cost"  # q̂ − λ·cost: a cost weight or a budget moved the route
CASCADE_PLAN = "cascade_plan"  # a cascade: 1 for the workers its plan may call, 0 for the rest


@dataclass
class RouteDecision:
    """One route. `scores` is what the head scored each allowed worker on and `score_kind` says what
    that is: a policy's probabilities (they sum to 1), or a predicted utility (higher is better, in
    the utility's units), or predicted quality minus λ·cost. The route is the best score; `ranking`
    is the fallback order."""

    worker_id: str
    scores: dict[str, float]
    ranking: list[str]  # best first: the fallback order
    checkpoint: str = ""
    extra: dict = field(default_factory=dict)
    score_kind: str = POLICY_PROBABILITY
    # the router that made it, where a cap asked was sent to another checkpoint of the run
    # (`Router.cap_router`), and on every decision a server routes: a cascade's steps are called
    # with it and its reply's cost settles that router's cap; None: the router asked
    router: "Router | None" = field(default=None, repr=False, compare=False)

    def softmax_scores(self) -> dict[str, float]:
        """softmax over `scores`: a policy's own probabilities; for the other kinds an order-preserving
        squash close to uniform (predicted utilities differ by hundredths), not a chance of being best."""
        if self.score_kind == POLICY_PROBABILITY:
            return dict(self.scores)
        names = list(self.scores)
        p = _softmax(np.array([self.scores[w] for w in names], dtype=np.float64))
        return {w: float(v) for w, v in zip(names, p)}

    @property
    def probabilities(self) -> dict[str, float]:
        """The policy's probabilities for a policy head. For a head that predicts utility this is the
        old field, softmax over predicted utilities (near uniform): deprecated, read `scores`."""
        if self.score_kind != POLICY_PROBABILITY:
            warnings.warn(f"RouteDecision.probabilities is a softmax over {self.score_kind} scores, not a probability: "
                          "read RouteDecision.scores (and score_kind) instead", DeprecationWarning, stacklevel=2)
        return self.softmax_scores()


def encoder_settings_for(contract: FeatureContract, device: str = "auto", dtype: str = "auto", encoder: str | None = None):
    """EncoderSettings that reproduce a checkpoint's feature contract. `encoder` overrides where the
    model is loaded from (e.g. the same model in another directory); the contract is then checked."""
    from pydantic import ValidationError

    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.train.checkpoints import CheckpointError

    try:
        return EncoderSettings(
            model=encoder or contract.encoder_id, revision=contract.revision, device=device, dtype=dtype,
            max_length=contract.max_length, pooling=contract.pooling, token_position=contract.token_position,
            layer=contract.layer, normalize=contract.normalize, prompt_template=contract.prompt_template,
            prompt_rules=contract.prompt_rules, lexical=contract.lexical,
        )
    except ValidationError as exc:  # a contract read from a checkpoint no encoder setting reproduces
        why = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise CheckpointError(f"feature contract (encoder {contract.encoder_id!r}) does not make valid encoder "
                              f"settings: {why}; use a checkpoint saved by this version, or save it again") from None


def serving_dtype(settings, metrics: dict) -> str:
    """The dtype `--dtype auto` serves in: the one the training features were computed in (recorded
    as `feature_dtype` by training), so the served vectors equal the cached ones; a
    half dtype on a CPU without native bf16 stays auto (float32): there it would be slow and still
    not bit-equal to a GPU's."""
    from fugu_pipeline.features.settings import cpu_has_native_bf16

    trained = metrics.get("feature_dtype")
    if trained not in ("float32", "bfloat16", "float16"):
        return "auto"
    if trained != "float32" and settings.resolve_device() == "cpu" and not cpu_has_native_bf16():
        return "auto"
    return trained


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class Router(CapRouting):
    """A loaded checkpoint and its encoder. Thread-safe for concurrent `route_batch` calls.

    Budget mode (`route_batch(..., budget=Budget(share=0.3))`) needs the checkpoint's budget
    calibration (`budget.json` beside it, written by `train-*` and `evaluate`, `route/budget.py`):
    λ for the cap comes from its validation curve, and the expected cost from its training fit."""

    def __init__(self, checkpoint, encoder, *, encoder_override: str | None = None):
        from fugu_pipeline.route.budget import CALIBRATION_FILE, usable_calibration

        if checkpoint.manifest.head_kind.startswith("roles"):
            raise RouterError(f"{checkpoint.path} is a multi-turn coordinator ({checkpoint.manifest.head_kind}), not a "
                              "one-step router: run it with `fugu-lite ask --mode multi-turn` or a request with "
                              '"fugu_mode": "multi_turn" (policies/coordinator/route.py)')
        if checkpoint.manifest.head_kind.startswith("triage"):
            raise RouterError(f"{checkpoint.path} is a triage head ({checkpoint.manifest.head_kind}): it labels a prompt's "
                              "domain and difficulty and routes nothing (fugu-lite triage-report)")
        if checkpoint.manifest.head_kind == "cascade" and type(self) is Router:
            raise RouterError(f"{checkpoint.path} is a cascade, not a one-step router: load it with "
                              "policies.registry.load_router (route, ask and serve do)")
        self.checkpoint = checkpoint
        self.encoder = encoder
        self.worker_ids: list[str] = list(checkpoint.manifest.worker_ids)
        self.path = str(checkpoint.path)
        # None (and why) when there is none, it cannot be read, or it was drawn for other weights:
        # only a budgeted route needs it, and is refused with that reason
        self.calibration, self.calibration_problem = usable_calibration(
            checkpoint.path, checkpoint.manifest.content_hash, self.worker_ids)
        self.calibration_damaged = self.calibration is None and (Path(checkpoint.path) / CALIBRATION_FILE).exists()
        # what `fugu-lite train` chose and said it ships (route/shipped.py): reported with every route, and
        # a one-shot head's operating point with no cap asked; None (and why, when there is a file) otherwise
        self.shipped, self.shipped_problem = read_shipped(checkpoint.path, checkpoint.manifest.content_hash)
        # the checkpoints of the same run the shipped description sends a cap asked later to (`cap_router`),
        # by tag, as `policies/registry.attach_cap_routers` loaded them; why one could not be
        self.cap_routers: dict[str, Router] = {}
        self.cap_problems: dict[str, str] = {}
        self.owns_encoder = True  # False for a router of the run that reads with another's encoder
        self._lock = threading.Lock()
        self.init_caps()
        if problem := point_problem(self.default_point, checkpoint):
            raise RouterError(problem)

    @property
    def tag(self) -> str:
        """`<method>/<content hash>`: how the checkpoint is named to clients (never by its path)."""
        m = self.checkpoint.manifest
        return f"{m.method}/{m.content_hash or Path(self.path).name}"

    def check_probe(self) -> None:
        """CheckpointError unless the head's scores on the encoder's features of the probe prompts
        are sane (`train/probe.py`): called on every load, so a checkpoint whose weights overflow is
        refused with one line instead of failing every request."""
        import torch

        from fugu_pipeline.train.checkpoints import CheckpointError
        from fugu_pipeline.train.probe import PROBE_PROMPTS, score_problems

        head = self.checkpoint.head
        doms: list[str | None] = [None]
        if getattr(head, "uses_domains", False):
            doms += list(getattr(head, "domains", None) or [])[:8]
        prompts = [p for p in PROBE_PROMPTS for _ in doms]
        domains = [d for _ in PROBE_PROMPTS for d in doms]
        feats = self.encoder.encode(prompts, [d or "general" for d in domains])
        with self._lock:
            problems = score_problems(head, torch.from_numpy(feats), domains if len(doms) > 1 else None)
        if problems:
            raise CheckpointError(f"checkpoint {self.tag} ({self.path}): refusing to route with it: its {problems[0]} on "
                                  f"the encoder's features of {len(PROBE_PROMPTS)} probe prompts (its weights overflow); "
                                  "train it again or promote another")

    @classmethod
    def load(cls, checkpoint_path: str | Path, *, device: str = "auto", dtype: str = "auto", encoder: str | None = None) -> "Router":
        from fugu_pipeline.features.encoder import Encoder
        from fugu_pipeline.features.settings import EncoderLoadError
        from fugu_pipeline.train.checkpoints import load_checkpoint

        probe = load_checkpoint(checkpoint_path)
        settings = encoder_settings_for(probe.manifest.feature_contract, device, dtype, encoder)
        if dtype == "auto":
            settings = settings.model_copy(update={"dtype": serving_dtype(settings, probe.manifest.metrics)})
        try:
            enc = Encoder.load(settings)
        except EncoderLoadError as exc:
            if encoder is None:  # a checkpoint trained on this model elsewhere: say how to point at it here
                raise EncoderLoadError(
                    f"checkpoint {checkpoint_path}: {exc}\nIf this is the same model in another place, give its "
                    "directory with --encoder (serve/route/evaluate; Router.load(encoder=...)): the checkpoint's "
                    "feature contract is still checked against it.") from exc
            raise
        expected = enc.feature_contract()
        if encoder is not None:  # a relocated model: same contract apart from where it lives
            expected = expected.model_copy(update={"encoder_id": probe.manifest.feature_contract.encoder_id})
        ckpt = load_checkpoint(checkpoint_path, expected_contract=expected)
        try:
            router = cls(ckpt, enc)
        except BaseException:  # refused at load: the encoder is let go too
            enc.close()
            raise
        try:
            router.check_probe()
        except BaseException:
            router.close()
            raise
        return router

    def encode(self, prompts: list[str], domains: list[str | None] | None = None) -> np.ndarray:
        """The prompts' features (N, dim) as the head reads them: `domains` fill the encoder's prompt
        template ("general" when unknown)."""
        return self.encoder.encode(prompts, None if domains is None else [d or "general" for d in domains])

    def scores(self, prompts: list[str], domains: list[str | None] | None = None, cost_weight: float | None = None) -> np.ndarray:
        """Routing scores (N, W). `domains` (None, or one per prompt, None = unknown) fill the
        encoder's prompt template ("general" when unknown) and reach heads that take the domain
        (kNN, domain prior, MLP, ensemble), for which an unknown domain means the pooled prior."""
        import torch

        from fugu_pipeline.train.head_base import call_head

        feats = self.encode(prompts, domains)
        head = self.checkpoint.head
        with self._lock, torch.inference_mode():
            x = torch.from_numpy(feats)
            if cost_weight is not None and hasattr(head, "route_scores"):
                s = head.route_scores(x, cost_weight, head.expected_cost)  # normalised cost, learnt on train
            else:
                s = call_head(head, x, None if domains is None else list(domains))
        return s.float().numpy()

    def predict_quality(self, prompts: list[str], domains: list[str | None] | None = None) -> np.ndarray | None:
        """Predicted quality (N, W) in [0, 1] of every worker, for heads that predict it, else None."""
        import torch

        from fugu_pipeline.train.head_base import head_quality

        feats = self.encode(prompts, domains)
        with self._lock, torch.inference_mode():
            q = head_quality(self.checkpoint.head, torch.from_numpy(feats), None if domains is None else list(domains))
        return None if q is None else q.float().numpy()

    @property
    def default_point(self):
        """The operating point used when a request asks no cap, or None: the head's plain route
        (`route/shipped.serving_point`: the shipped description's point, else the budget calibration's)."""
        return serving_point(self.shipped, self.calibration, self.checkpoint.head)

    def score_kind(self, cost_weight: float | None = None, budget=None) -> str:
        """What this head's route scores are, for a request with this cost weight or budget."""
        head = self.checkpoint.head
        if budget is not None or (cost_weight is not None and hasattr(head, "route_scores")):
            return QUALITY_MINUS_COST
        return PREDICTED_UTILITY if hasattr(head, "predict_quality") else POLICY_PROBABILITY

    def cost_weight_problem(self) -> str | None:
        """Why a fixed cost weight cannot move this head's route (None when it can: a `quality` head).
        The routes with and without the weight would be the same, so callers refuse it or list it as ignored."""
        head, kind = self.checkpoint.head, self.checkpoint.manifest.head_kind
        if hasattr(head, "route_scores"):
            return None
        if hasattr(head, "predict_quality"):
            return (f"head kind {kind!r} has no cost term (only 'quality' heads trade predicted quality against a fixed "
                    "cost weight), so the route would be the same as without it; to trade quality for cost with this "
                    "head, route it under a cost cap (a budget, λ chosen on validation)")
        return (f"head kind {kind!r} is a policy: it has no predicted quality to trade against cost, so the route "
                "would be the same as without it; train a head that predicts quality (`fugu-lite train`, or "
                "`head: quality` for train-sft) to route by cost")

    def route_batch(self, prompts: list[str], domains: list[str | None] | None = None, *, budget=None,
                    **kw) -> list[RouteDecision]:
        """Route many prompts in one encoder pass (`own_route_batch`). Under a `budget` the shipped
        description sends to another checkpoint of the run (`cap_router`), that checkpoint routes them:
        each decision names it (`extra["checkpoint_tag"]`, `router`) and says why (`extra["budget"]["sent_to"]`)."""
        sent = self.cap_router(budget)
        if sent is None:
            return self.own_route_batch(prompts, domains, budget=budget, **kw)
        other, note = sent
        out = other.own_route_batch(prompts, domains, budget=budget, **kw)
        for d in out:
            d.router = other
            d.extra["checkpoint_tag"] = other.tag
            d.extra.setdefault("budget", {})["sent_to"] = note
        return out

    def own_route_batch(
        self,
        prompts: list[str],
        domains: list[str | None] | None = None,
        *,
        allowed: list[str] | None = None,
        cost_weight: float | None = None,
        budget=None,
        cost_texts: list[str] | None = None,
        default_point: bool = True,
    ) -> list[RouteDecision]:
        """Route many prompts in one encoder pass with this checkpoint. `allowed` restricts the workers
        (unknown ids are an error); `cost_weight` trades quality for cost with a quality head; `budget` (a
        `route.budget.Budget`) routes under a cost cap with λ chosen on validation (`cost_texts`:
        the text the worker will be billed for, when it is more than the routed prompt). With neither,
        the checkpoint's default operating point applies (`default_point`; False: the plain route)."""
        if allowed is not None:
            unknown = [w for w in allowed if w not in self.worker_ids]
            if unknown:
                shown = [w if len(w) <= 80 else w[:77] + "..." for w in unknown[:5]]
                raise RouterError(f"unknown worker(s) {shown}{' and more' if len(unknown) > 5 else ''}; this router "
                                  f"knows {self.worker_ids} (a server or `--workers` also takes the configured ids "
                                  "whose aliases these are)", param="fugu_allowed_workers", code="unknown_worker")
            if not allowed:
                raise RouterError("the allowed worker list is empty", param="fugu_allowed_workers", code="invalid_value")
        if budget is not None and cost_weight is not None:
            raise RouterError("give a budget or a cost weight, not both", param="fugu_budget", code="invalid_value")
        if cost_weight is not None and not (math.isfinite(cost_weight) and 0 <= cost_weight <= MAX_COST_WEIGHT):
            raise RouterError(f"the cost weight must be a number in [0, {MAX_COST_WEIGHT:g}], got {cost_weight!r}",
                              param="fugu_cost_weight", code="invalid_value")
        doms = None if domains is None else list(domains)  # None entries: unknown domain
        point, c_hat = None, None
        dp = self.default_point if default_point and budget is None and cost_weight is None else None
        shipped_cap = dp if dp is not None and dp.cap is not None and self.calibration is not None else None
        if shipped_cap is not None:  # shipped under train's cap: routed as a request asking that cap
            budget, dp = shipped_cap.cap, None
        feats = self.encode(prompts, doms) if dp is not None and dp.clusters is not None else None
        keys = dp.group_keys(doms, feats) if dp is not None else None  # each request's domain, or prompt cluster
        lams = dp.lambdas(keys, len(prompts)) if dp is not None else None  # each request's λ (NaN: the strongest)
        mask = np.array([allowed is None or w in allowed for w in self.worker_ids])
        if budget is not None:
            scores, point, c_hat, lam, eff, follower = self.budget_scores(
                prompts, doms, budget, cost_texts, mask, strict=shipped_cap is None)  # a shipped cap is never refused
            followed = follower.state()
        elif lams is not None and np.isfinite(lams).any():
            scores, c_hat = self.lambda_scores(prompts, doms, np.nan_to_num(lams)[:, None], cost_texts, feats)
        else:
            scores = self.scores(prompts, doms, cost_weight)
        if not np.isfinite(scores).all():  # never route (or report) on NaN; the load-time probe makes this rare
            raise RouterError(f"checkpoint {self.tag} gave scores that are not finite for this request: its weights "
                              "overflow on these features (the checkpoint is at fault, not the request); promote "
                              "another checkpoint", code="checkpoint_fault", server_fault=True)
        scores = np.where(mask, scores, -np.inf)
        head = self.checkpoint.head
        kind = QUALITY_MINUS_COST if lams is not None and np.isfinite(lams).any() else self.score_kind(cost_weight, budget)
        first = self.worker_ids.index(dp.strongest_worker) if lams is not None and np.isnan(lams).any() and \
            dp.strongest_worker in self.worker_ids and mask[self.worker_ids.index(dp.strongest_worker)] else None
        shown = _softmax(scores) if kind == POLICY_PROBABILITY else scores
        known = set(getattr(head, "domains", None) or ()) if getattr(head, "uses_domains", False) else set()
        out = []
        for k, (row_s, row_shown) in enumerate(zip(scores, shown)):
            order = [int(i) for i in np.argsort(-row_s, kind="stable") if mask[i]]
            if first is not None and np.isnan(lams[k]):  # the default: the strongest worker (the others as its fallbacks)
                order = [first] + [i for i in order if i != first]
            d = RouteDecision(
                worker_id=self.worker_ids[order[0]],
                scores={w: float(v) for w, v, ok in zip(self.worker_ids, row_shown, mask) if ok},
                ranking=[self.worker_ids[i] for i in order],
                checkpoint=self.path,
                score_kind=kind,
            )
            if doms is not None and doms[k] is not None and known and doms[k] not in known:
                shown = ", ".join(sorted(known)[:12]) + (" ..." if len(known) > 12 else "")
                d.extra["domain_note"] = (f"domain {doms[k]!r} is not one this head was trained on ({shown}): routed as an "
                                          "unseen domain (names are matched exactly, case included)")
            if dp is not None:
                d.extra["budget"] = {"default": True, "operating_point": dp.describe(),
                                     "lambda": None if np.isnan(lams[k]) else float(lams[k]),
                                     "strongest_worker": dp.strongest_worker, "reason": dp.reason,
                                     **({"group": keys[k]} if dp.clusters is not None else {}),
                                     **({"expected_cost_usd": float(c_hat[k, order[0]])} if c_hat is not None else {})}
            if point is not None:
                d.extra["budget"] = {"cap": point.budget.describe(), "lambda": float(lam[k]),
                                     "met_on_validation": point.met_on_validation,
                                     "validation_share": round(point.val_share, 6),
                                     "expected_cost_usd": float(c_hat[k, order[0]]),
                                     "follow": {"effective_cap_usd": float(eff[k]), "target": TARGET,
                                                "calibration_lambda": point.lam, **followed},
                                     "reference_worker": self.calibration.reference_worker,
                                     **({"reference_note": self.calibration.reference_note}
                                        if self.calibration.reference_note else {}),
                                     **({"note": point.note} if point.note else {}),
                                     **({"default": True, "operating_point": shipped_cap.describe(), "reason": shipped_cap.reason}
                                        if shipped_cap is not None else {})}
                if allowed is not None and set(allowed) != set(self.worker_ids):
                    d.extra["budget"]["allowed_note"] = (
                        "the cap's λ was chosen on validation routing among every worker; routing among "
                        f"{sorted(allowed)} only, the cap may not hold (expected cost of this route: "
                        f"{float(c_hat[k, order[0]]) / max(self.calibration.reference_cost_usd, 1e-300):.1%} of "
                        f"{self.calibration.reference_worker}'s mean)")
            out.append(d)
        return out

    def route(self, prompt: str, domain: str | None = None, **kw) -> RouteDecision:
        return self.route_batch([prompt], [domain], **kw)[0]

    def close(self) -> None:
        for other in self.cap_routers.values():
            other.close()
        if self.owns_encoder:
            self.encoder.close()
