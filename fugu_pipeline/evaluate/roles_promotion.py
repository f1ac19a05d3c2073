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

import json
import os
import time
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.promotion import Candidate, Decision, PromotionPolicy, decide
from fugu_pipeline.train.checkpoints import weight_sanity
from fugu_pipeline.train.pointer import ROLES_POINTER, read_pointer, write_pointer

HISTORY = ROLES_POINTER.parent / "roles-history.jsonl"
DEFAULT_MARGIN = 0.02  # the seed's king rule


def roles_candidate(checkpoint, test_reward: np.ndarray, best_fixed_reward: np.ndarray, train_reward: float,
                    expected_contract=None, val_reward: float | None = None) -> Candidate:
    m = checkpoint.manifest
    contract = m.feature_contract.differences(expected_contract) if expected_contract is not None else []
    return Candidate(path=str(checkpoint.path), method=m.method, content_hash=m.content_hash,
                     test_utility=np.asarray(test_reward, float), best_fixed_utility=np.asarray(best_fixed_reward, float),
                     train_router_utility=float(train_reward), weight_problems=weight_sanity(checkpoint.state_dict, m),
                     contract_problems=contract, val_router_utility=val_reward)


def apply_roles(decision: Decision, challenger: Candidate, models_dir: str | Path, *, report_path: str | None = None) -> dict | None:
    """Record the decision; when it promotes, swap models/promoted/roles.json. Returns the new pointer or None."""
    models_dir = Path(models_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    previous = read_pointer(models_dir, ROLES_POINTER)
    record = {"at": now, **decision.as_dict(), "method": challenger.method, "content_hash": challenger.content_hash,
              "previous": (previous or {}).get("checkpoint")}
    path = models_dir / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True, default=float) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if not decision.promote:
        return None
    try:
        rel = str(Path(challenger.path).resolve().relative_to(models_dir.resolve()))
    except ValueError:
        rel = str(Path(challenger.path).resolve())
    pointer = {"checkpoint": rel, "method": challenger.method, "content_hash": challenger.content_hash,
               "promoted_at": now, "test_reward": challenger.mean, "reasons": decision.reasons, "report": report_path,
               "previous": (previous or {}).get("checkpoint")}
    write_pointer(models_dir, pointer, ROLES_POINTER)
    return pointer


def promote_roles(challenger: Candidate, champion: Candidate | None, models_dir: str | Path,
                  policy: PromotionPolicy | None = None, *, report_path: str | None = None) -> dict:
    """Decide and apply; returns {promoted, reasons, pointer}."""
    policy = policy or PromotionPolicy(margin=DEFAULT_MARGIN)
    decision = decide(challenger, champion, policy)
    pointer = apply_roles(decision, challenger, models_dir, report_path=report_path)
    reasons = [*decision.reasons, "PROMOTED" if pointer else "NOT PROMOTED: the promoted coordinator stays"]
    return {"promoted": pointer is not None, "reasons": reasons, "figures": decision.figures,
            "pointer": pointer or read_pointer(models_dir, ROLES_POINTER)}
