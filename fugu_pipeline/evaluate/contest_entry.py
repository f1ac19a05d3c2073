"""How a challenger enters the contest (`contest.run_contest`), the same for every kind and every
caller (`promote_best`, `run_contest`, `fugu-lite validate`, the promotion assets):

1. **a pack's signature, key and size caps, before any weight is read**: a pack (a folder with
   receipt.json outside the models folder) must be signed by a key the host accepts, by the key
   its attempt counts under, and hold no member over `pack_member_max_bytes` and no more than
   `pack_total_max_bytes` in all (`train/signing.verify_pack`, which checks the signature and the
   key before it reads a member and the sizes before it hashes them by streaming). A pack that
   fails is refused here, in the same line `fugu-lite preflight` prints (`signature_check`, which
   preflight calls too), and the kind never loads it;
2. **the weights**: the kind's verified load (a head that cannot be loaded is refused with the
   weight gate's reason);
3. the kind's own rules, its contract, a duplicate by behaviour, and **the receipt**
   (`receipt_result`): a pack's weights are hashed in 1 MiB chunks under the same member cap,
   never read whole, and the receipt must name them.
"""

from __future__ import annotations

from pathlib import Path

from fugu_pipeline.evaluate.gates import GateConfig, GateResult, WeightDigests, duplicate_gate
from fugu_pipeline.evaluate.promotion_record import _now, append_history
from fugu_pipeline.train.checkpoints import CheckpointError


def is_pack(path: str | Path, models_dir: str | Path) -> bool:
    """A pack: a folder with receipt.json outside the models folder (a host's own checkpoint is not)."""
    from fugu_pipeline.evaluate.promotion_record import relative_to
    from fugu_pipeline.train.exchange import RECEIPT_FILE

    p = Path(path)
    return (p / RECEIPT_FILE).exists() and relative_to(p, Path(models_dir)) is None


def signature_check(pack: Path, models_dir: str | Path, cfg: GateConfig):
    """(the signature gate, (the key's name, its fingerprint) or None, whether the members may be
    read: the signature verifies with a key the host accepts and they are within the caps; a
    member changed after signing may still be read, to say more about it)."""
    from fugu_pipeline.train.exchange import SIGNED_FILES
    from fugu_pipeline.train.signing import MemberMismatch, SigningError, read_keys, verify_pack

    try:  # every member it holds, a checkpoint's extra file (a cross-encoder) included, signed as it is
        name, fp = verify_pack(pack, list(SIGNED_FILES), read_keys(models_dir), **cfg.pack_caps())
    except MemberMismatch as exc:
        return GateResult("signature", False, str(exc)), None, True
    except SigningError as exc:
        return GateResult("signature", False, str(exc)), None, False
    return GateResult("signature", True, f"signed by {name} (key {fp}), a key this host accepts"), (name, fp), True


def signature_gate(path: str | Path, models_dir: str | Path, key: str | None, cfg: GateConfig | None = None
                   ) -> GateResult | None:
    """A pack's signature gate (`signature_check`), failing too when `key` (the key its attempt is
    counted under) is not the one that signed it; None for a host's own checkpoint."""
    if not is_pack(path, models_dir):
        return None
    gate, signer, _ = signature_check(Path(path), models_dir, cfg or GateConfig())
    if signer is not None and key is not None and signer[1] != key:
        return GateResult("signature", False, f"signed by {signer[0]} (key {signer[1]}), but submitted as key {key}")
    return gate


def admit(kind, paths, models_dir: Path, policy, *, king, key: str | None, who: dict) -> tuple[list, list[str]]:
    """Every challenger through the entry gates, in order (module docstring): ([(entrant, its
    gates)] of those that passed, a `REFUSED path: ...` line for each refused). Each refusal is
    recorded in the kind's history."""
    from fugu_pipeline.evaluate.decision import weight_gate

    def refuse(path: str, lines: list[str], shown: str, **extra) -> None:
        append_history(models_dir, {"at": _now(), "kind": kind.name, "promote": False, "challenger": path,
                                    "reasons": lines, **extra, **who}, kind.history)
        reasons.append(f"REFUSED {path}: {shown}")

    passed, reasons = [], []
    for path in dict.fromkeys(str(p) for p in paths):
        sig = signature_gate(path, models_dir, key, policy.gates)  # before the kind reads a byte of its weights
        if sig is not None and not sig.ok:
            refuse(path, [sig.line()], sig.line())
            continue
        try:
            ent = kind.load(path)
        except CheckpointError as exc:
            problems = weight_gate(path)
            reason = "FAIL weights: " + "; ".join(problems) if problems else f"FAIL checkpoint: {exc}"
            refuse(path, [reason], reason)
            continue
        gates = entry_gates(kind, ent, models_dir, policy, king, sig)
        if all(g.ok for g in gates):
            passed.append((ent, gates))
            continue
        refuse(path, [g.line() for g in gates], "; ".join(g.line() for g in gates if not g.ok),
               method=ent.method, content_hash=ent.content_hash)
    return passed, reasons


def entry_gates(kind, entrant, models_dir, policy, king, sig: GateResult | None) -> list[GateResult]:
    """The gates of a loaded challenger (`sig`: its signature gate, already passed, or None)."""
    gates = [GateResult("weights", True, "shape, finite, not all zero")]
    if sig is not None:
        gates.append(sig)
    gates.extend(kind.own_gates(entrant))
    problems = kind.contract_problems(entrant)
    gates.append(GateResult("contract", not problems, "; ".join(problems) if problems else
                            f"reads the host's features and workers ({len(entrant.manifest.worker_ids)} workers)"))
    if not problems:
        seen = kind.behaviour(entrant)
        king_seen = None
        if king is not None and not kind.contract_problems(king):
            king_seen = (king.label, kind.behaviour(king))
        gates.append(duplicate_gate(seen, models_dir, policy.gates.duplicate_cosine, kind=kind.name, king=king_seen,
                                    own_hash=None))
        entrant.extra["behaviour"] = seen
    gates.append(kind.receipt(entrant, policy))
    return gates


def receipt_result(entrant, policy, *, data=None, models_dir=None) -> GateResult:
    """The receipt gate: the folder's receipt.json (a pack: checked against its weights, hashed by
    streaming under `pack_member_max_bytes`, its manifest and its ledger), else the receipt of its
    manifest."""
    from fugu_pipeline.evaluate.gates import receipt_gate
    from fugu_pipeline.files import FileTooLargeError
    from fugu_pipeline.train.checkpoints import WEIGHTS_FILE, weights_limit
    from fugu_pipeline.train.exchange import pack_ledger, read_receipt, receipt_from_manifest, weight_digests

    try:
        receipt = read_receipt(entrant.path)
    except CheckpointError as exc:
        return GateResult("receipt", False, str(exc))
    if receipt is None:
        return receipt_gate(receipt_from_manifest(entrant.manifest, data=data), policy.gates, data=data)
    cap = policy.gates.pack_member_max_bytes
    limit = min(cap, weights_limit(entrant.manifest.tensors))
    try:
        sha, content = weight_digests(Path(entrant.path) / WEIGHTS_FILE, entrant.manifest, limit)
    except FileTooLargeError as exc:
        why = "pack_member_max_bytes" if limit == cap else "more than the manifest's tensors can take"
        return GateResult("receipt", False, f"{exc} ({why}): refused")
    except OSError as exc:
        return GateResult("receipt", False, f"{Path(entrant.path) / WEIGHTS_FILE}: cannot read the weights "
                          f"({exc.strerror or exc})")
    return receipt_gate(receipt, policy.gates, data=data, weights=WeightDigests(sha, content), manifest=entrant.manifest,
                        ledger=pack_ledger(entrant.path, models_dir, cap))
