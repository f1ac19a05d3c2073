"""What a head does, as the duplicate gate compares it: its behaviour on a fixed probe set.

The probe set is a fixed sample of the host's tasks (up to `PROBE_SIZE`, chosen by a salted hash
of the task id, so it does not move as rows are added), each read the way the head reads it (its
own features, through its feature contract). A head's behaviour there is
- its **decision** per probe (the worker it routes to; a triage head's domain and difficulty; a
  coordinator's whole session, every turn's role and worker, `policies/coordinator/contest.session_behaviour`), and
- its **score vector**: the logits (or scores) of every softmax group, each group centred per probe
  (its mean taken away), concatenated over probes and groups (a coordinator's: at every state of
  its session where it picked).

Centring per group is what makes it a measure of behaviour: softmax and argmax do not change when
the same number is added to every score of a group, so a copy with one random vector added to
every worker row (`v · x` added to every worker's score of probe x) and +5 on every bias scores
exactly as the original after centring, while its raw weights have cosine 0.1 with the original.
A scaled copy (every score doubled) keeps cosine 1 too. Two heads are duplicates when the cosine
of their centred score vectors is at least `duplicate_cosine` (0.99, TinyRouter's threshold);
the share of probes where their decisions agree is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fugu_pipeline.hashing import canonical_json, sha256_text

PROBE_SIZE = 256
PROBE_SALT = "probe:1"


@dataclass
class Behaviour:
    """A head on the probe set: decisions (N,) and the centred score vector (flattened)."""

    probe: str  # the probe set's fingerprint: only behaviours on the same probes compare
    decisions: np.ndarray
    vector: np.ndarray
    unit: str = "decision"  # what one entry of `decisions` is (a coordinator's: its whole session)

    def cosine(self, other: "Behaviour") -> float:
        a, b = self.vector, other.vector
        na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
        if a.shape != b.shape or na == 0 or nb == 0:
            return 0.0
        return float(np.dot(a, b) / (na * nb))

    def agreement(self, other: "Behaviour") -> float:
        if self.decisions.shape != other.decisions.shape or not len(self.decisions):
            return 0.0
        return float(np.mean(self.decisions == other.decisions))


def probe_ids(task_ids: list[str], size: int = PROBE_SIZE) -> list[str]:
    """The fixed probe sample of these task ids (salted-hash order, at most `size`)."""
    ids = sorted(set(task_ids), key=lambda t: sha256_text(f"{PROBE_SALT}:{t}"))
    return ids[:size]


def probe_fingerprint(kind: str, ids: list[str]) -> str:
    return sha256_text(canonical_json({"kind": kind, "ids": sorted(ids)}))[:16]


def centred(groups: list[np.ndarray]) -> np.ndarray:
    """Each (N, k) group of scores with its per-row mean taken away, concatenated per row and
    flattened: the part of the scores softmax and argmax see."""
    parts = [np.asarray(g, np.float64) - np.asarray(g, np.float64).mean(axis=1, keepdims=True) for g in groups]
    return np.concatenate(parts, axis=1).ravel() if parts else np.zeros(0)


def behaviour(probe: str, groups: list[np.ndarray], decisions) -> Behaviour:
    return Behaviour(probe=probe, decisions=np.asarray(decisions, dtype=object), vector=centred(groups))


def head_groups(checkpoint, features: np.ndarray, domains: list[str] | None = None) -> tuple[list[np.ndarray], list]:
    """(score groups, decisions) of a loaded checkpoint of any head kind on these probe features:
    a one-step head's routing scores (one group; decision: the worker); a coordinator's worker
    logits (one group, or one per role) and role logits over the standardised transcript features
    (decision: role and worker of its first pick); a triage head's domain and difficulty logits (two groups;
    decision: the two labels)."""
    m = checkpoint.manifest
    kind = m.head_kind
    x = np.ascontiguousarray(features, dtype=np.float32)
    if kind.startswith("roles"):
        sd = {k: v.detach().cpu().numpy() for k, v in checkpoint.state_dict.items()}
        z = (x - sd["feature_center"]) / sd["feature_scale"]
        logits = z @ sd["linear.weight"].T
        w = len(m.worker_ids)
        sets = (logits.shape[1] - 3) // max(w, 1)  # one worker softmax, or one per role
        groups = [logits[:, i * w:(i + 1) * w] for i in range(sets)] + [logits[:, sets * w:]]
        from fugu_pipeline.session.roles import ROLES

        roles = groups[-1].argmax(1)
        decisions = [f"{ROLES[int(r)]}:{m.worker_ids[int(groups[int(r) if sets > 1 else 0][i].argmax())]}"
                     for i, r in enumerate(roles)]
        return groups, decisions
    if kind.startswith("triage"):
        import torch

        with torch.inference_mode():
            d, h = checkpoint.head(torch.from_numpy(x))
        d, h = d.numpy(), h.numpy()
        p = m.head_params
        return [d, h], [f"{p['domains'][int(i)]}/{p['difficulty_names'][int(j)]}" for i, j in zip(d.argmax(1), h.argmax(1))]
    from fugu_pipeline.evaluate.reports import head_scores

    scores = head_scores(checkpoint.head, x, domains)
    return [scores], [m.worker_ids[int(j)] for j in scores.argmax(axis=1)]


def checkpoint_behaviour(probe: str, checkpoint, features: np.ndarray, domains: list[str] | None = None) -> Behaviour:
    groups, decisions = head_groups(checkpoint, features, domains)
    return behaviour(probe, groups, decisions)


# --------------------------------------------------------------------------- the probe inputs a host keeps


def probe_file(models_dir, kind: str, contract_fingerprint: str):
    from pathlib import Path

    from fugu_pipeline.train.pointer import POINTER

    return Path(models_dir) / POINTER.parent / "seen" / f"probe-{kind}-{contract_fingerprint[:16]}.npz"


def save_probe(models_dir, kind: str, contract_fingerprint: str, probe: str, features: np.ndarray, domains) -> None:
    """Keep the probe inputs of a contract (written once), so `preflight` can check a pack's
    behaviour offline, without the encoder."""
    import os

    path = probe_file(models_dir, kind, contract_fingerprint)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, features=np.asarray(features, np.float32), domains=np.asarray([str(d) for d in domains]),
                 probe=np.asarray(probe))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_probe(models_dir, kind: str, contract_fingerprint: str) -> tuple[str, np.ndarray, list[str]] | None:
    """(probe fingerprint, features, domains) the host kept for this contract, or None."""
    path = probe_file(models_dir, kind, contract_fingerprint)
    try:
        with np.load(path, allow_pickle=False) as z:
            return str(z["probe"]), z["features"], [str(d) for d in z["domains"]]
    except (OSError, KeyError, ValueError):
        return None
