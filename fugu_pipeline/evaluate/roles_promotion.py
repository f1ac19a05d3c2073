"""King versus challenger for the multi-turn coordinator, with the one-step router's gates
(`evaluate/promotion.py:decide`) and its own pointer, `models/promoted/roles.json`.

The challenger (a roles checkpoint) is promoted only if, on the same held-out tasks and seeds,
1. its mean reward beats the best fixed worker's (chosen on train) by the policy's bar (paired),
2. it beats the promoted coordinator by the margin (the seed's rule: at least king + 0.02),
3. its weights pass weight sanity (shape, finite, not all zero),
4. its feature contract is the one the coordinator is served with, and
5. its train − held-out reward gap is under the threshold.
The pointer is replaced atomically and every decision is appended to
`models/promoted/roles-history.jsonl`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.promotion import Candidate, Decision, PromotionPolicy, decide
from fugu_pipeline.evaluate.promotion_record import append_history, promotion_lock, relative_to
from fugu_pipeline.storage import PreconditionFailed
from fugu_pipeline.train.checkpoints import CheckpointError, weight_sanity
from fugu_pipeline.train.pointer import ROLES_POINTER, PointerError, pointer_version, read_pointer, write_pointer

HISTORY = ROLES_POINTER.parent / "roles-history.jsonl"
DEFAULT_MARGIN = 0.02  # the seed's king rule
_UNREAD = object()


def roles_lock(models_dir: str | Path):
    """models/promoted/.roles.lock, held for one whole coordinator promotion (king scored, decided,
    pointer swapped): a second attempt waits, then faces the coordinator the first one promoted."""
    return promotion_lock(models_dir, ".roles.lock")


def roles_candidate(checkpoint, test_reward: np.ndarray, best_fixed_reward: np.ndarray, train_reward: float,
                    expected_contract=None, val_reward: float | None = None) -> Candidate:
    m = checkpoint.manifest
    contract = m.feature_contract.differences(expected_contract) if expected_contract is not None else []
    return Candidate(path=str(checkpoint.path), method=m.method, content_hash=m.content_hash,
                     test_utility=np.asarray(test_reward, float), best_fixed_utility=np.asarray(best_fixed_reward, float),
                     train_router_utility=float(train_reward), weight_problems=weight_sanity(checkpoint.state_dict, m),
                     contract_problems=contract, val_router_utility=val_reward)


def apply_roles(decision: Decision, challenger: Candidate, models_dir: str | Path, *, report_path: str | None = None,
                expected_version=_UNREAD) -> dict | None:
    """Record the decision; when it promotes, swap models/promoted/roles.json. Returns the new pointer or None.

    As for the one-step router (`promotion_record.apply`): the pointer is written before the
    history line, so the history never says "promoted" for a pointer that was not written; the
    challenger's path is stored relative to the models folder without resolving symlinks; with
    `expected_version` (read before the king was scored) a pointer replaced meanwhile is not
    overwritten. A failed write is recorded as a failed attempt and raised as CheckpointError."""
    models_dir = Path(models_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        previous = read_pointer(models_dir, ROLES_POINTER)
    except PointerError:  # a damaged pointer: the challenger faced the baselines only, the history says so
        previous = None
    record = {"at": now, **decision.as_dict(), "method": challenger.method, "content_hash": challenger.content_hash,
              "previous": (previous or {}).get("checkpoint")}
    if not decision.promote:
        append_history(models_dir, record, HISTORY.name)
        return None
    rel = relative_to(challenger.path, models_dir) or os.path.abspath(challenger.path)
    pointer = {"checkpoint": rel, "method": challenger.method, "content_hash": challenger.content_hash,
               "promoted_at": now, "test_reward": challenger.mean, "reasons": decision.reasons, "report": report_path,
               "previous": (previous or {}).get("checkpoint")}
    try:
        if expected_version is not _UNREAD and pointer_version(models_dir, ROLES_POINTER) != expected_version:
            raise PreconditionFailed(f"{models_dir / ROLES_POINTER} changed since it was read: another promotion replaced it")
        write_pointer(models_dir, pointer, ROLES_POINTER)
    except (OSError, PreconditionFailed) as exc:
        why = f"the promoted coordinator pointer was not written: {exc}"
        append_history(models_dir, {**record, "promote": False, "reasons": [*record["reasons"], f"FAIL {why}"],
                                    "not_an_attempt": True}, HISTORY.name)
        raise CheckpointError(f"{models_dir / ROLES_POINTER}: {why}; nothing was promoted, run the promotion again") from None
    append_history(models_dir, record, HISTORY.name)
    return pointer


def promote_roles(challenger: Candidate, champion: Candidate | None, models_dir: str | Path,
                  policy: PromotionPolicy | None = None, *, report_path: str | None = None,
                  expected_version=_UNREAD) -> dict:
    """Decide and apply; returns {promoted, reasons, pointer}. Run it under `roles_lock(models_dir)`
    with `expected_version` read before the king was scored."""
    policy = policy or PromotionPolicy(margin=DEFAULT_MARGIN)
    decision = decide(challenger, champion, policy)
    pointer = apply_roles(decision, challenger, models_dir, report_path=report_path, expected_version=expected_version)
    reasons = [*decision.reasons, "PROMOTED" if pointer else "NOT PROMOTED: the promoted coordinator stays"]
    return {"promoted": pointer is not None, "reasons": reasons, "figures": decision.figures,
            "pointer": pointer or read_pointer(models_dir, ROLES_POINTER)}
