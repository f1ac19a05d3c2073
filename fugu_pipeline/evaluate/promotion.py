"""King versus challenger: a checkpoint is promoted only when it is really better.

Before a challenger is scored it passes the submission gates (`gates.py`): the rate limit (one
attempt per period per submitter), weight sanity (shape, finite, not all zero; a checkpoint too
broken to load fails here), duplicate detection (cosine ≥ 0.99 to a head judged before or the
king) and the training receipt (≥ 3 recorded fitness steps, a cost where workers were paid).

Then it replaces the promoted checkpoint only if, on the same frozen held-out eval rows (the test
split minus its audit slice, `composite.py`), it
1. beats the best fixed worker (chosen on train): mean paired utility gain above zero, and the
   paired bootstrap 95% interval's low end above zero,
2. beats the promoted checkpoint (the king) by the seed's rule on the composite:
   composite(challenger) ≥ composite(king) + 0.02, with the paired bootstrap low end of the
   difference above zero as well, and is not rejected by the composite's overfit gate,
3. reads features the serving encoder model computes: its own feature contract, scored on the
   same rows encoded as that contract says (layers, prompt rules, lexical block and the like may
   differ from the pipeline's, as serving computes each checkpoint's own; another encoder model
   may not, `feature_source.py`),
4. its train-minus-held-out utility gap is under a threshold, and
5. for a quality head: its predicted qualities are not all in one narrow band (std under
   `min_quality_std`), which means it learnt nothing about which worker is good where.
The pointer `models/promoted/current.json` is replaced atomically (temp file, fsync, rename,
fsync of the folder) under a lock held for the whole attempt (`models/promoted/.lock`: a second
attempt waits and faces the new king), then every decision is appended to
`models/promoted/history.jsonl` with its submitter (the pointer first: the history never claims a
promotion whose pointer was not written); a head that was scored joins the registry of judged heads (`models/promoted/seen/`).
A challenger outside the models folder (a pack) is copied into `models/<method>/<hash>/` when
promoted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.evaluate.composite import CompositeConfig, audit_mask, composite_lines
from fugu_pipeline.evaluate.feature_source import FeatureSource
from fugu_pipeline.evaluate.gates import (
    DEFAULT_SUBMITTER,
    GateConfig,
    GateResult,
    SeenHeads,
    duplicate_gate,
    rate_limit_gate,
    receipt_gate,
    routing_map,
)
from fugu_pipeline.evaluate.metrics import paired_bootstrap
from fugu_pipeline.evaluate.reports import (
    head_scores,
    quality_predictions,
    routed_utility,
)
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    WEIGHTS_FILE,
    CheckpointError,
    CheckpointFileError,
    Manifest,
    load_checkpoint,
    read_capped,
    weight_sanity,
    weights_limit,
)
from fugu_pipeline.evaluate.promotion_record import (  # noqa: F401 - append_history, apply: this module's API too
    _now,
    _pointer_or_none,
    append_history,
    apply,
    check_writable,
    promotion_lock,
)
from fugu_pipeline.train.pointer import pointer_version


class PromotionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    margin: float = Field(0.02, ge=0.0, description="replace the king only at challenger ≥ king + margin (paired mean held-out utility)")
    min_gain_over_best_fixed: float = Field(0.0, description="required paired mean gain over the best fixed worker (strictly above)")
    require_significant: bool = Field(True, description="also require the paired bootstrap 95% interval's low end above zero, "
                                                        "against the best fixed worker and against the king")
    max_train_gap: float = Field(0.25, gt=0.0, description="largest allowed train minus held-out router utility")
    min_quality_std: float = Field(0.01, ge=0.0, description="a quality head whose held-out predictions have a smaller std is refused")
    n_boot: int = Field(2000, ge=100)
    seed: int = 0
    composite: CompositeConfig = Field(default_factory=CompositeConfig, description="the composite score the king is judged on")
    gates: GateConfig = Field(default_factory=GateConfig, description="rate limit, duplicate, receipt")


class PolicyError(ValueError):
    """The promotion policy file is broken; the message names the file and the field."""


DEFAULT_POLICY_FILE = "configs/promotion.yaml"


def load_policy(path: str | Path | None, *, required: bool = False, **overrides) -> PromotionPolicy:
    """The policy from a YAML file (`configs/promotion.yaml`); a missing default file means the
    defaults, a missing file asked for by name (`required`) is an error. `overrides` that are not
    None replace top-level fields (`rate_limit_s` and `live_sample` reach into their blocks)."""
    from fugu_pipeline.config_files import load_yaml_model

    if path is not None and (required or Path(path).exists()):
        policy = load_yaml_model(path, PromotionPolicy, PolicyError, what="promotion policy file", empty_ok=True)
    else:
        policy = PromotionPolicy()
    over = {k: v for k, v in overrides.items() if v is not None}
    if "rate_limit_s" in over:
        policy = policy.model_copy(update={"gates": policy.gates.model_copy(update={"rate_limit_s": over.pop("rate_limit_s")})})
    if "live_sample" in over:
        policy = policy.model_copy(update={"composite": policy.composite.model_copy(update={"live_sample": over.pop("live_sample")})})
    try:
        return PromotionPolicy.model_validate({**policy.model_dump(), **over})
    except ValueError as exc:
        raise PolicyError(f"promotion policy: {exc}") from None


@dataclass
class Candidate:
    """A checkpoint scored on the frozen held-out rows (per-task utilities, same row order)."""

    path: str
    method: str
    content_hash: str
    test_utility: np.ndarray  # router's utility per held-out task
    best_fixed_utility: np.ndarray  # best fixed worker (chosen on train) per held-out task
    train_router_utility: float
    weight_problems: list[str] = field(default_factory=list)
    contract_problems: list[str] = field(default_factory=list)
    val_router_utility: float | None = None
    quality_pred_std: float | None = None  # quality heads: std of the predicted qualities on the held-out rows

    @property
    def mean(self) -> float:
        return float(np.mean(self.test_utility))


@dataclass
class Decision:
    promote: bool
    challenger: str
    reasons: list[str]
    figures: dict

    def as_dict(self) -> dict:
        return {"promote": self.promote, "challenger": self.challenger, "reasons": self.reasons, "figures": self.figures}


def decide(challenger: Candidate, champion: Candidate | None, policy: PromotionPolicy, contest: dict | None = None,
           king_error: str | None = None) -> Decision:
    """Every gate is evaluated (so the UI shows all reasons), then promote iff all pass. `contest`
    (`contest.score_against_king`) holds the composites; it is needed whenever a king can be scored.
    `king_error`: why the promoted checkpoint could not be loaded, when the caller chose to let the
    challenger replace it facing the baselines only (`replace_broken_king`)."""
    reasons: list[str] = []
    ok = True
    figures: dict = {"challenger_test_utility": challenger.mean}

    vs_fixed = paired_bootstrap(challenger.test_utility, challenger.best_fixed_utility, policy.n_boot, policy.seed)
    figures["gain_over_best_fixed"] = vs_fixed
    bar = policy.min_gain_over_best_fixed
    sig = " and low end > 0" if policy.require_significant else ""
    beat_fixed = vs_fixed["mean"] > bar and (not policy.require_significant or vs_fixed["low"] > 0)
    ok &= beat_fixed
    reasons.append(f"{'PASS' if beat_fixed else 'FAIL'} best fixed: gain {vs_fixed['mean']:+.4f} "
                   f"[{vs_fixed['low']:+.4f}, {vs_fixed['high']:+.4f}] (needs > {bar:+.4f}{sig})")

    if champion is None and king_error:
        reasons.append(f"PASS promoted: the promoted checkpoint cannot be loaded ({king_error}); "
                       "replaced as asked (replace_broken_king), the challenger faced the baselines only")
    elif champion is None:
        reasons.append("PASS promoted: nothing promoted yet")
    elif champion.content_hash == challenger.content_hash:
        ok = False
        reasons.append("FAIL promoted: the challenger is the promoted checkpoint already")
    elif champion.contract_problems:
        reasons.append("PASS promoted: the promoted checkpoint uses other features ("
                       + "; ".join(champion.contract_problems) + "), so it cannot be scored on these rows")
    elif challenger.contract_problems:
        ok = False
        reasons.append("FAIL promoted: the challenger cannot be scored on these rows (see the feature contract)")
    else:
        if contest is None or contest.get("king") is None:
            raise ValueError("a king that can be scored on these rows needs the composite contest (contest.score_against_king)")
        vs_king = paired_bootstrap(challenger.test_utility, champion.test_utility, policy.n_boot, policy.seed)
        figures["utility_gain_over_promoted"] = vs_king
        figures["promoted_test_utility"] = champion.mean
        diff = contest["difference"]
        c, k = contest["challenger"]["composite"], contest["king"]["composite"]
        figures["gain_over_promoted"] = diff
        figures["composite"], figures["king_composite"] = c, k
        beat_king = c >= k + policy.margin - 1e-12 and (not policy.require_significant or diff["low"] > 0)
        ok &= beat_king
        reasons.append(f"{'PASS' if beat_king else 'FAIL'} promoted ({champion.method} {champion.content_hash}): composite "
                       f"{c:.4f} vs king {k:.4f}, {diff['mean']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}] "
                       f"(needs ≥ {policy.margin:+.4f}{sig}); utility {vs_king['mean']:+.4f}")
    if contest is not None:
        figures.setdefault("composite", contest["challenger"]["composite"])
        bad = [r for r in contest["challenger"]["benchmarks"] if r["overfit"]["verdict"].endswith("reject")]
        ok &= not bad
        reasons.append("FAIL overfit gate (eval − audit): " + "; ".join(
            f"{r['benchmark']} gap {r['overfit']['gap']:+.4f} ± {r['overfit']['gap_se']:.4f} > {policy.composite.overfit_reject_gap}"
            for r in bad) if bad else "PASS overfit gate (eval − audit): " + ", ".join(
            f"{r['benchmark']} {r['overfit']['verdict']}" for r in contest["challenger"]["benchmarks"]))

    sane = not challenger.weight_problems
    ok &= sane
    reasons.append("PASS weights: shape, finite, not all zero" if sane else "FAIL weights: " + "; ".join(challenger.weight_problems))

    contract_ok = not challenger.contract_problems
    ok &= contract_ok
    reasons.append("PASS feature contract: the serving encoder computes this checkpoint's features" if contract_ok
                   else "FAIL feature contract: " + "; ".join(challenger.contract_problems))

    if challenger.quality_pred_std is not None:
        spread_ok = challenger.quality_pred_std >= policy.min_quality_std
        ok &= spread_ok
        reasons.append(f"{'PASS' if spread_ok else 'FAIL'} quality head: predicted qualities spread with std "
                       f"{challenger.quality_pred_std:.4f} (must be ≥ {policy.min_quality_std})"
                       + ("" if spread_ok else ": nearly the same quality for every task and worker, so the route "
                          "is decided by cost alone; its labels carried no signal"))

    gap = challenger.train_router_utility - challenger.mean
    figures["train_minus_test"] = gap
    gap_ok = gap < policy.max_train_gap
    ok &= gap_ok
    reasons.append(f"{'PASS' if gap_ok else 'FAIL'} overfit: train − held-out {gap:+.4f} (must be < {policy.max_train_gap})")
    return Decision(promote=bool(ok), challenger=challenger.path, reasons=reasons, figures=figures)


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
        test_u = routed_utility(test.utility, head_scores(checkpoint.head, test.features, test.domains))
        train_u = float(np.mean(routed_utility(train.utility, head_scores(checkpoint.head, train.features, train.domains))))
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


def weight_gate(path: str | Path) -> list[str]:
    """The weight gate on a checkpoint that may not load: its tensors against its manifest (shape,
    finite, not all zero) and the weights file against the manifest's hash. Empty when the weights
    are sane, or when the manifest itself cannot be read (then it is not a weights problem)."""
    import hashlib

    from pydantic import ValidationError
    from safetensors.torch import load as st_load

    path = Path(path)
    path = path.parent if path.is_file() else path
    try:
        manifest = Manifest.model_validate_json(read_capped(path / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest"))
    except (OSError, ValidationError, UnicodeDecodeError, CheckpointFileError):
        return []
    try:
        raw = read_capped(path / WEIGHTS_FILE, weights_limit(manifest.tensors), "the manifest's tensors")
    except CheckpointFileError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{WEIGHTS_FILE} cannot be read ({exc.strerror or exc})"]
    try:
        tensors = st_load(raw)
    except Exception as exc:  # safetensors raises its own error types
        return [f"{WEIGHTS_FILE} is not a readable safetensors file: {exc}"]
    problems = weight_sanity(tensors, manifest)
    if hashlib.sha256(raw).hexdigest() != manifest.weights_sha256:
        problems.insert(0, f"{WEIGHTS_FILE} does not match the manifest's weights_sha256 (changed after saving)")
    return problems


def _refuse(path: str, exc: CheckpointError, models_dir: str | Path, submitter: str = DEFAULT_SUBMITTER) -> str:
    """A checkpoint that cannot be loaded: the weight gate's reason when its weights are the
    problem, else the load error; recorded in the history like any decision."""
    problems = weight_gate(path)
    reason = "FAIL weights: " + "; ".join(problems) if problems else f"FAIL checkpoint: {exc}"
    append_history(models_dir, {"at": _now(), "promote": False, "challenger": str(path), "reasons": [reason],
                                "submitter": submitter})
    return f"REFUSED {path}: {reason}"


def pre_gates(ckpt, data, models_dir: str | Path, policy: PromotionPolicy, king=None) -> list[GateResult]:
    """Duplicate and receipt gates of a loaded checkpoint (its weights are sane: it loaded). The
    receipt is the folder's receipt.json when it has one (a pack), else the manifest's."""
    from fugu_pipeline.train.exchange import read_receipt, receipt_from_manifest

    king_map = None if king is None else (f"{king.manifest.method} {king.manifest.content_hash}", routing_map(king.state_dict))
    dup = duplicate_gate(routing_map(ckpt.state_dict), models_dir, policy.gates.duplicate_cosine, king=king_map)
    try:
        receipt = read_receipt(ckpt.path)
    except CheckpointError as exc:
        return [dup, GateResult("receipt", False, str(exc))]
    if receipt is None:
        rec = receipt_gate(receipt_from_manifest(ckpt.manifest, data=data), policy.gates, data=data)
    else:
        weights = (Path(ckpt.path) / WEIGHTS_FILE).read_bytes()
        rec = receipt_gate(receipt, policy.gates, data=data, weights=weights, manifest=ckpt.manifest)
    return [GateResult("weights", True, "shape, finite, not all zero"), dup, rec]


def promote_best(checkpoint_paths: list[str], data, models_dir: str | Path, policy: PromotionPolicy, *,
                 live=None, tasks: dict | None = None, submitter: str = DEFAULT_SUBMITTER, now: float | None = None,
                 features: FeatureSource | None = None, replace_broken_king: bool = False) -> dict:
    """One promotion attempt. The rate limit first (a refusal there is recorded but is no attempt);
    every challenger through the weight, duplicate and receipt gates; among those that pass, the
    one with the best validation utility is scored on the frozen held-out rows of `data` (the
    composite against the king, with `live` evaluating the live term on `tasks`) and faces the
    gates of `decide`. Each checkpoint, the king included, is scored on its own features from
    `features` (`feature_source.py`: the same rows, encoded as its contract says, by the serving
    encoder model); without `features`, only checkpoints on `data`'s contract can be scored.
    Returns {promoted, challenger, reasons, pointer, contest}.

    The models folder must be writable (checked before anything is scored). The whole attempt
    holds models/promoted/.lock, so a second attempt waits and then faces the king the first one
    promoted; the pointer is compare-and-swapped on the version read before the king was loaded.
    A promoted checkpoint that cannot be loaded (damaged pointer, edited or missing checkpoint)
    raises CheckpointError before scoring, recorded in the history, unless `replace_broken_king`:
    then the challenger faces the baselines only and the history says why."""
    check_writable(models_dir)
    with promotion_lock(models_dir):
        return _promote_best(checkpoint_paths, data, models_dir, policy, live=live, tasks=tasks, submitter=submitter,
                             now=now, features=features, replace_broken_king=replace_broken_king)


def _promote_best(checkpoint_paths, data, models_dir, policy, *, live, tasks, submitter, now, features,
                  replace_broken_king) -> dict:
    from fugu_pipeline.evaluate.contest import king_or_why, score_against_king

    features = features if features is not None else FeatureSource.fixed(data)

    rate = rate_limit_gate(models_dir, submitter, policy.gates.rate_limit_s, now)
    if not rate.ok:
        append_history(models_dir, {"at": _now(), "promote": False, "challenger": None, "reasons": [rate.line()],
                                    "submitter": submitter, "rate_limited": True, "paths": list(checkpoint_paths)})
        return {"promoted": False, "challenger": None, "reasons": [rate.line(), "NOT PROMOTED: rate limited"],
                "pointer": _pointer_or_none(models_dir), "contest": None}
    reasons: list[str] = [rate.line()]
    version = pointer_version(models_dir)  # the king this attempt faces: the pointer write is conditional on it
    king, king_error = king_or_why(models_dir)
    if king_error and not replace_broken_king:
        line = (f"FAIL promoted: the promoted checkpoint cannot be loaded ({king_error}); a challenger cannot face it: "
                "restore it, or replace it on purpose with --replace-broken-king (asset config replace_broken_king)")
        append_history(models_dir, {"at": _now(), "promote": False, "challenger": None, "reasons": [line],
                                    "submitter": submitter, "king_error": king_error, "not_an_attempt": True,
                                    "paths": list(checkpoint_paths)})
        raise CheckpointError(f"{king_error} -- nothing scored, nothing promoted: restore the promoted checkpoint, "
                              "or pass --replace-broken-king to let the challenger replace it facing the baselines only")
    passed: list[tuple[object, list[GateResult]]] = []
    for path in dict.fromkeys(checkpoint_paths):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            reasons.append(_refuse(path, exc, models_dir, submitter))
            continue
        own, _ = features.for_checkpoint(ckpt)
        gates = pre_gates(ckpt, own, models_dir, policy, king)
        if all(g.ok for g in gates):
            passed.append((ckpt, gates))
            continue
        lines = [g.line() for g in gates]
        append_history(models_dir, {"at": _now(), "promote": False, "challenger": str(path), "reasons": lines,
                                    "method": ckpt.manifest.method, "content_hash": ckpt.manifest.content_hash,
                                    "submitter": submitter})
        reasons.append(f"REFUSED {path}: " + "; ".join(g.line() for g in gates if not g.ok))
    if not passed:
        return {"promoted": False, "challenger": None, "reasons": reasons or ["no challenger"],
                "pointer": _pointer_or_none(models_dir), "contest": None}
    scored = [(scored_candidate(c, features, policy.composite), c, g) for c, g in passed]
    usable = [t for t in scored if not t[0].contract_problems] or scored
    best, ckpt, gates = max(usable, key=lambda t: (t[0].val_router_utility if t[0].val_router_utility is not None else -np.inf))
    reasons.append(f"challenger: {best.method} {best.content_hash} (best validation utility "
                   f"{best.val_router_utility if best.val_router_utility is not None else float('nan'):.4f} of {len(scored)})")
    reasons.extend(g.line() for g in gates if g.name != "weights")
    champion = None
    if king is not None:
        champion = scored_candidate(king, features, policy.composite)
    elif king_error:
        reasons.append(f"the promoted checkpoint cannot be loaded ({king_error}); replace_broken_king: "
                       "the challenger faces the baselines only")
    contest = None
    if not best.contract_problems:
        contest = score_against_king(ckpt, king, features.for_checkpoint(ckpt)[0], policy.composite, live=live,
                                     tasks=tasks, features=features)
        reasons.extend(composite_lines(contest["challenger"], "challenger composite"))
        if contest["king"] is not None:
            reasons.extend(composite_lines(contest["king"], "king composite"))
        reasons.append(contest["live"])
    decision = decide(best, champion, policy, contest, king_error=king_error)
    reasons.extend(decision.reasons)
    report = Path(best.path) / "reports" / "test.json"
    extra = {"gates": [g.line() for g in gates], "contest": _contest_record(contest)}
    if king_error:
        extra["king_error"] = king_error
    pointer = apply(decision, best, models_dir, report_path=str(report) if report.exists() else None, submitter=submitter,
                    extra=extra, expected_version=version)
    SeenHeads(models_dir).add(best.content_hash, routing_map(ckpt.state_dict), method=best.method,
                              outcome="promoted" if pointer else "refused", submitter=submitter)
    reasons.append("PROMOTED" if pointer else "NOT PROMOTED: the promoted checkpoint stays")
    return {"promoted": pointer is not None, "challenger": best.path, "reasons": reasons,
            "pointer": pointer or _pointer_or_none(models_dir), "contest": contest}


def _contest_record(contest: dict | None) -> dict | None:
    """The composites for the history line: totals, the difference and each benchmark's terms."""
    if contest is None:
        return None
    slim = lambda sc: None if sc is None else {  # noqa: E731
        "composite": sc["composite"], "rejected": sc["rejected"],
        "benchmarks": {r["benchmark"]: {k: r[k] for k in ("cached", "live", "efficiency", "novelty", "score")}
                       | {"overfit": r["overfit"]["verdict"]} for r in sc["benchmarks"]}}
    return {"challenger": slim(contest["challenger"]), "king": slim(contest["king"]), "difference": contest["difference"],
            "live": contest["live"]}
