"""King versus challenger: a checkpoint is promoted only when it is really better.

A challenger replaces the promoted checkpoint only if, on the same frozen held-out rows, it
1. beats the best fixed worker (chosen on train): mean paired gain above zero, and the paired
   bootstrap 95% interval's low end above zero,
2. beats the promoted checkpoint (the king) by the margin, the seed's rule: challenger ≥ king + 0.02
   (mean paired gain), with the bootstrap low end above zero as well,
3. passes weight sanity (shape, finite, not all zero); a checkpoint whose weights are too broken to
   load is refused by this same gate, with its reason, before anything else,
4. has the feature contract the pipeline serves with,
5. its train-minus-held-out utility gap is under a threshold, and
6. for a quality head: its predicted qualities are not all in one narrow band (std under
   `min_quality_std`), which means it learnt nothing about which worker is good where.
The pointer `models/promoted/current.json` is replaced atomically (temp file, fsync, rename,
fsync of the folder) and every decision is appended to `models/promoted/history.jsonl`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.evaluate.metrics import paired_bootstrap
from fugu_pipeline.evaluate.reports import (
    head_scores,
    quality_predictions,
    routed_utility,
)
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    Manifest,
    load_checkpoint,
    weight_sanity,
)
from fugu_pipeline.train.pointer import (
    POINTER,
    pointer_target,
    read_pointer,
    write_pointer,
)


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


def decide(challenger: Candidate, champion: Candidate | None, policy: PromotionPolicy) -> Decision:
    """Every gate is evaluated (so the UI shows all reasons), then promote iff all pass."""
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

    if champion is None:
        reasons.append("PASS promoted: nothing promoted yet")
    elif champion.content_hash == challenger.content_hash:
        ok = False
        reasons.append("FAIL promoted: the challenger is the promoted checkpoint already")
    elif champion.contract_problems:
        reasons.append("PASS promoted: the promoted checkpoint uses other features ("
                       + "; ".join(champion.contract_problems) + "), so it cannot be scored on these rows")
    else:
        vs_king = paired_bootstrap(challenger.test_utility, champion.test_utility, policy.n_boot, policy.seed)
        figures["gain_over_promoted"] = vs_king
        figures["promoted_test_utility"] = champion.mean
        beat_king = vs_king["mean"] >= policy.margin - 1e-12 and (not policy.require_significant or vs_king["low"] > 0)
        ok &= beat_king
        reasons.append(f"{'PASS' if beat_king else 'FAIL'} promoted ({champion.method} {champion.content_hash}): gain "
                       f"{vs_king['mean']:+.4f} [{vs_king['low']:+.4f}, {vs_king['high']:+.4f}] (needs ≥ {policy.margin:+.4f}{sig})")

    sane = not challenger.weight_problems
    ok &= sane
    reasons.append("PASS weights: shape, finite, not all zero" if sane else "FAIL weights: " + "; ".join(challenger.weight_problems))

    contract_ok = not challenger.contract_problems
    ok &= contract_ok
    reasons.append("PASS feature contract matches the serving encoder" if contract_ok
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


def candidate(checkpoint, data, expected_contract=None):
    """Score a checkpoint on the frozen held-out rows for promotion."""
    test, train = data.split("test"), data.split("train")
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
        q_pred = quality_predictions(checkpoint.head, test.features)
        q_std = None if q_pred is None else float(np.std(q_pred))
        test_u = routed_utility(test.utility, head_scores(checkpoint.head, test.features))
        train_u = float(np.mean(routed_utility(train.utility, head_scores(checkpoint.head, train.features))))
        val = data.split("val")
        val_u = float(np.mean(routed_utility(val.utility, head_scores(checkpoint.head, val.features)))) if len(val.task_ids) else None
    return Candidate(
        path=str(checkpoint.path), method=checkpoint.manifest.method, content_hash=checkpoint.manifest.content_hash,
        test_utility=test_u, best_fixed_utility=test.utility[:, fixed], train_router_utility=train_u,
        weight_problems=weight_sanity(checkpoint.state_dict, checkpoint.manifest),
        contract_problems=contract_problems, val_router_utility=val_u, quality_pred_std=q_std,
    )


def append_history(models_dir: str | Path, record: dict) -> None:
    path = Path(models_dir) / POINTER.parent / "history.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def apply(decision: Decision, challenger: Candidate, models_dir: str | Path, *, report_path: str | None = None) -> dict | None:
    """Record the decision; when it promotes, swap the pointer. Returns the new pointer or None."""
    models_dir = Path(models_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    previous = read_pointer(models_dir)
    record = {"at": now, **decision.as_dict(), "method": challenger.method, "content_hash": challenger.content_hash,
              "previous": (previous or {}).get("checkpoint")}
    append_history(models_dir, record)
    if not decision.promote:
        return None
    try:
        rel = str(Path(challenger.path).resolve().relative_to(models_dir.resolve()))
    except ValueError:
        rel = str(Path(challenger.path).resolve())
    pointer = {"checkpoint": rel, "method": challenger.method, "content_hash": challenger.content_hash,
               "promoted_at": now, "test_utility": challenger.mean, "reasons": decision.reasons,
               "report": report_path, "previous": (previous or {}).get("checkpoint")}
    write_pointer(models_dir, pointer)
    return pointer


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
        manifest = Manifest.model_validate_json((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValidationError):
        return []
    try:
        raw = (path / WEIGHTS_FILE).read_bytes()
        tensors = st_load(raw)
    except Exception as exc:  # safetensors raises its own error types
        return [f"{WEIGHTS_FILE} is not a readable safetensors file: {exc}"]
    problems = weight_sanity(tensors, manifest)
    if hashlib.sha256(raw).hexdigest() != manifest.weights_sha256:
        problems.insert(0, f"{WEIGHTS_FILE} does not match the manifest's weights_sha256 (changed after saving)")
    return problems


def _refuse(path: str, exc: CheckpointError, models_dir: str | Path) -> str:
    """A checkpoint that cannot be loaded: the weight gate's reason when its weights are the
    problem, else the load error; recorded in the history like any decision."""
    problems = weight_gate(path)
    reason = "FAIL weights: " + "; ".join(problems) if problems else f"FAIL checkpoint: {exc}"
    append_history(models_dir, {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "promote": False,
                                "challenger": str(path), "reasons": [reason]})
    return f"REFUSED {path}: {reason}"


def promote_best(checkpoint_paths: list[str], data, models_dir: str | Path, policy: PromotionPolicy) -> dict:
    """Score every challenger on the frozen held-out rows of `data`, pick the one with the best
    validation utility among the loadable ones, and let it face the promoted checkpoint.
    A checkpoint that cannot be loaded (NaN or wrong-shape weights, edited files) is refused by the
    weight gate with its reason (history too). Returns {promoted, challenger, reasons, pointer}."""
    reasons: list[str] = []
    scored: list[Candidate] = []
    for path in dict.fromkeys(checkpoint_paths):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            reasons.append(_refuse(path, exc, models_dir))
            continue
        scored.append(candidate(ckpt, data, expected_contract=data.contract))
    if not scored:
        return {"promoted": False, "challenger": None, "reasons": reasons or ["no challenger"], "pointer": read_pointer(models_dir)}
    usable = [c for c in scored if not c.contract_problems] or scored
    best = max(usable, key=lambda c: (c.val_router_utility if c.val_router_utility is not None else -np.inf))
    reasons.append(f"challenger: {best.method} {best.content_hash} (best validation utility "
                   f"{best.val_router_utility if best.val_router_utility is not None else float('nan'):.4f} of {len(scored)})")
    champion = None
    if read_pointer(models_dir) is not None:
        try:
            champion = candidate(load_checkpoint(pointer_target(models_dir, read_pointer(models_dir))), data, expected_contract=data.contract)
        except (CheckpointError, FileNotFoundError) as exc:
            reasons.append(f"the promoted checkpoint cannot be loaded ({exc}); the challenger faces the baselines only")
    decision = decide(best, champion, policy)
    reasons.extend(decision.reasons)
    report = Path(best.path) / "reports" / "test.json"
    pointer = apply(decision, best, models_dir, report_path=str(report) if report.exists() else None)
    reasons.append("PROMOTED" if pointer else "NOT PROMOTED: the promoted checkpoint stays")
    return {"promoted": pointer is not None, "challenger": best.path, "reasons": reasons,
            "pointer": pointer or read_pointer(models_dir)}
