"""The decision of the one contest (`contest.py`): a challenger's figures (`Candidate`) against
the king's, through every rule of `PromotionPolicy` (`promotion.py`), with every reason kept
(`Decision`); and the weight gate on a checkpoint that may not load. Kind-agnostic: the figures
come from each kind's scorer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.metrics import paired_bootstrap
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    WEIGHTS_FILE,
    CheckpointFileError,
    Manifest,
    read_capped,
    weight_sanity,
    weights_limit,
)


@dataclass
class Candidate:
    """A checkpoint scored on the frozen held-out rows (per-task utilities, same row order)."""

    path: str
    method: str
    content_hash: str
    test_utility: np.ndarray  # the head's utility (a coordinator: reward) per held-out eval task
    best_fixed_utility: np.ndarray | None  # best fixed alternative (chosen on train) per task; None: the kind has none
    train_router_utility: float  # nan: the kind has no training figure
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


def decide(challenger: Candidate, champion: Candidate | None, policy, contest: dict | None = None,
           king_error: str | None = None, *, noun: str = "checkpoint", asked_by: str | None = None) -> "Decision":
    """Every gate is evaluated (so the UI shows all reasons), then promote iff all pass. `contest`
    (`contest.score_against_king`) holds the composites; it is needed whenever a king can be scored.
    `king_error`: why the promoted checkpoint could not be loaded, when the caller chose to let the
    challenger replace it facing the baselines only; `asked_by`: who asked for that (the history's
    `replace_broken_king`); `noun`: what the kind's promoted head is called."""
    reasons: list[str] = []
    ok = True
    figures: dict = {"challenger_test_utility": challenger.mean}

    bar = policy.min_gain_over_best_fixed
    sig = " and low end > 0" if policy.require_significant else ""
    if challenger.best_fixed_utility is not None:
        vs_fixed = paired_bootstrap(challenger.test_utility, challenger.best_fixed_utility, policy.n_boot, policy.seed)
        figures["gain_over_best_fixed"] = vs_fixed
        beat_fixed = vs_fixed["mean"] > bar and (not policy.require_significant or vs_fixed["low"] > 0)
        ok &= beat_fixed
        reasons.append(f"{'PASS' if beat_fixed else 'FAIL'} best fixed: gain {vs_fixed['mean']:+.4f} "
                       f"[{vs_fixed['low']:+.4f}, {vs_fixed['high']:+.4f}] (needs > {bar:+.4f}{sig})")

    if champion is None and king_error:
        reasons.append(f"PASS promoted: the promoted {noun} cannot be loaded ({king_error}); replaced as asked by "
                       f"{asked_by or 'an unnamed caller'}, the challenger faced the baselines only")
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
    if np.isnan(challenger.train_router_utility) and not challenger.contract_problems:
        reasons.append("PASS overfit: no training figure for this kind (the composite's eval − audit gate applies)")
    else:
        figures["train_minus_test"] = gap
        gap_ok = gap < policy.max_train_gap
        ok &= gap_ok
        reasons.append(f"{'PASS' if gap_ok else 'FAIL'} overfit: train − held-out {gap:+.4f} (must be < {policy.max_train_gap})")
    return Decision(promote=bool(ok), challenger=challenger.path, reasons=reasons, figures=figures)


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
