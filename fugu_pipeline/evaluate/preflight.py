"""`fugu-lite preflight`: the submission gates on a pack folder (`train/exchange.py`), offline.

Nothing is scored and nothing is recorded: it says whether `fugu-lite validate` would let the
head be scored, and why not. Any kind of head (a one-step router, a coordinator, a triage head)
is checked against its own kind's king, history and registry. In order:

1. **files**: head.safetensors, manifest.json, receipt.json, contract.json, ledger.jsonl and
   signature.json are all there;
2. **manifest**: it parses and its contract fingerprint matches its contract;
3. **weights**: readable safetensors whose sha256 is the manifest's, with the shapes the head kind
   needs, every value finite, the final layer not all zero;
4. **contract**: contract.json agrees with the manifest, and the head routes the host's workers in
   the host's order and reads the host's features (encoder, pooling, layer, template, dim...);
   the host is the kind's king by default, or `--workers` / `--encoder` / `--data`;
5. **signature**: signed (ed25519) over every pack file by a key the host accepts
   (`models/promoted/keys.json`); the key is who submits. Checked before the weights are read,
   with each member's size against the caps (`pack_member_max_bytes`, `pack_total_max_bytes`):
   a pack that fails here for any reason but a changed member is not read further (its
   contract.json aside);
6. **ledger**: the cost ledger's hash chain holds from its first line to its last, and every
   line is signed by a collector key the host trusts (`collector_key.py`);
7. **receipt**: it names these weights (sha256 and content hash), agrees with the manifest
   (fitness curve and cost included), cites the ledger's head, lines and totals as recomputed,
   claims no more training cost than the ledger's paid calls, records ≥ 3 fitness steps and a
   training cost where the host's workers are paid;
8. **size**: the kind's own cap (a triage head: under 1M parameters);
9. **duplicate**: its behaviour on the host's probe set is not within cosine 0.99 of a head judged
   before or of the king (checked offline when the host keeps the probe inputs of this feature
   contract, `probe.py`; a coordinator's whole sessions only when the host judged the same head
   before; `validate` always checks it);
10. **rate limit**: the key has an attempt of this kind left in this period (checked, not spent);
11. **king**: whom it would face.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fugu_pipeline.evaluate.gates import GateConfig, GateResult, duplicate_gate, rate_limit_gate, receipt_gate
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.train.checkpoints import MANIFEST_FILE, MAX_MANIFEST_BYTES, WEIGHTS_FILE, CheckpointError, Manifest, read_capped, weights_limit
from fugu_pipeline.train.exchange import (
    CONTRACT_FILE,
    LEDGER_COPY,
    PACK_FILES,
    RECEIPT_FILE,
    extra_members,
    PackContract,
    pack_ledger,
    read_receipt,
)
from fugu_pipeline.train.pointer import POINTER, PointerError, pointer_target, read_pointer
from fugu_pipeline.train.signing import SIGNATURE_FILE

EXTERNAL_SUBMITTER = "external"


@dataclass
class Host:
    """What a head must fit: the worker ids in order and the feature contract (None: unchecked)."""

    worker_ids: list[str] | None
    contract: FeatureContract | None
    source: str


@dataclass
class PreflightResult:
    ok: bool
    gates: list[GateResult]
    submitter: str
    manifest: Manifest | None = None
    receipt: object | None = None
    notes: list[str] = field(default_factory=list)
    key: str | None = None  # the signing key's fingerprint (who submits)
    kind: str = "router"


def king_manifest(models_dir: str | Path, pointer_file: Path = POINTER) -> tuple[Path, Manifest] | None:
    """The king's folder and manifest; None when nothing is promoted or it cannot be read
    (`validate` then says why and refuses unless told to replace a broken king)."""
    try:
        pointer = read_pointer(models_dir, pointer_file)
    except PointerError:
        return None
    if pointer is None:
        return None
    path = pointer_target(models_dir, pointer)
    try:
        return path, Manifest.model_validate_json((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _pointer_problem(models_dir: str | Path, pointer_file: Path = POINTER) -> str | None:
    try:
        read_pointer(models_dir, pointer_file)
    except PointerError as exc:
        return str(exc)
    return None


def host_expectation(models_dir: str | Path, *, workers_yaml: str | None = None, encoder: str | None = None, data=None,
                     pointer_file: Path = POINTER) -> Host:
    """The host's worker set and feature contract: from `workers_yaml` / `encoder` / `data` when
    given, else from the manifest of the king of the kind whose pointer is `pointer_file`."""
    king = king_manifest(models_dir, pointer_file)
    sources = []
    workers = contract = None
    if workers_yaml:
        from fugu_pipeline.workers.config import load_workers_config

        workers = load_workers_config(workers_yaml).worker_ids
        sources.append(f"workers of {workers_yaml}")
    elif data is not None:
        workers = list(data.worker_ids)
        sources.append("workers of the host's matrix")
    if getattr(data, "contract", None) is not None:
        contract = data.contract
        sources.append("features of the host's data")
    elif encoder:
        from fugu_pipeline.features.encoder import LazyEncoder
        from fugu_pipeline.features.settings import EncoderSettings

        lazy = LazyEncoder(EncoderSettings(model=encoder))
        contract = lazy.get().feature_contract()
        lazy.close()
        sources.append(f"encoder {encoder}")
    broken = _pointer_problem(models_dir, pointer_file) if king is None else None
    if broken:
        sources.append(f"no king ({broken})")
    if king is not None and (workers is None or contract is None):
        sources.append(f"the king {king[1].method} {king[1].content_hash}")
        workers = workers if workers is not None else list(king[1].worker_ids)
        contract = contract if contract is not None else king[1].feature_contract
    return Host(workers, contract, ", ".join(sources) or "nothing (no king, no --workers / --encoder / --data): "
                "worker set and encoder unchecked")


def preflight(pack_dir: str | Path, models_dir: str | Path, cfg: GateConfig, *, host: Host | None = None, data=None,
              submitter: str | None = None, now: float | None = None, replace_broken_king: bool = False) -> PreflightResult:
    """Every gate on a pack folder; `ok` when all pass. Stops early only where a later gate has
    nothing to read (no manifest, no weights). The `king` gate fails when the promoted head of the
    pack's kind cannot be loaded (`validate` would stop before scoring) unless `replace_broken_king`."""
    from fugu_pipeline.evaluate.contest import KIND_FILES, kind_of
    from fugu_pipeline.evaluate.decision import weight_gate

    pack = Path(pack_dir)
    gates: list[GateResult] = []
    who = submitter or EXTERNAL_SUBMITTER
    if not pack.is_dir():
        return PreflightResult(False, [GateResult("files", False, f"{pack} is not a folder")], who)
    missing = [f for f in (*PACK_FILES, SIGNATURE_FILE) if not (pack / f).is_file()]
    gates.append(GateResult("files", not missing, "missing " + ", ".join(missing) if missing
                            else ", ".join((*PACK_FILES, SIGNATURE_FILE))))
    if MANIFEST_FILE in missing or WEIGHTS_FILE in missing:
        return PreflightResult(False, gates, who)
    try:
        manifest = Manifest.model_validate_json(read_capped(pack / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest"))
    except (OSError, ValueError) as exc:
        gates.append(GateResult("manifest", False, f"not a valid checkpoint manifest: {str(exc)[:300]}"))
        return PreflightResult(False, gates, who)
    kind = kind_of(manifest.head_kind)
    pointer_file, history_name, _ = KIND_FILES[kind]
    if manifest.contract_fingerprint != manifest.feature_contract.fingerprint():
        gates.append(GateResult("manifest", False, "contract_fingerprint does not match feature_contract (edited)"))
    else:
        gates.append(GateResult("manifest", True, f"{manifest.method} {manifest.head_kind} ({kind}), "
                                f"{manifest.param_count:,} params"))
    try:  # the files the checkpoint needs beside its weights (a cascade verifier's cross-encoder)
        gone = [f"{n} (the manifest names it)" for n in extra_members(manifest) if not (pack / n).is_file()]
    except CheckpointError as exc:
        gone = [str(exc)]
    if gone:
        gates.append(GateResult("files", False, "missing " + ", ".join(gone)))
    # the signature and its key first: a pack nobody the host accepts signed (or one over the size
    # caps) is refused before its weights are read; a member changed after signing is read to say more
    sig, readable = _signature_gate(pack, models_dir, cfg)
    if not readable:  # the small contract.json is still checked: what else a submitter would have to fix
        gates.extend([_contract_gate(pack, manifest, host, CONTRACT_FILE not in missing), sig[0]])
        return PreflightResult(False, gates, who, manifest, kind=kind)
    try:
        weights = read_capped(pack / WEIGHTS_FILE, min(weights_limit(manifest.tensors), cfg.pack_member_max_bytes),
                              "the manifest's tensors")
    except (OSError, ValueError) as exc:
        gates.append(GateResult("weights", False, str(exc)[:300]))
        return PreflightResult(False, gates, who, kind=kind)
    problems = weight_gate(pack)
    gates.append(GateResult("weights", not problems, "; ".join(problems) if problems else "shape, finite, not all zero"))
    from fugu_pipeline.train.checkpoints import checkpoint_hash

    if not problems and checkpoint_hash(weights, manifest) != manifest.content_hash:  # e.g. reordered labels
        gates[1] = GateResult("manifest", False, "its content_hash does not match its weights and fields (edited after "
                              "saving: reordered worker_ids or domains would mislabel every output)")
    gates.append(_contract_gate(pack, manifest, host, CONTRACT_FILE not in missing))

    key = None
    gates.append(sig[0])
    if sig[1] is not None:
        who, key = sig[1]
    ledger = pack_ledger(pack, models_dir, cfg.pack_member_max_bytes)
    gates.append(GateResult("ledger", isinstance(ledger, object) and ledger is not None and not isinstance(ledger, str),
                            f"no {LEDGER_COPY}" if ledger is None else ledger if isinstance(ledger, str)
                            else f"hash chain holds, every line signed by a collector this host trusts: {ledger.describe()}"))
    receipt = None
    if RECEIPT_FILE in missing:
        gates.append(GateResult("receipt", False, f"no training receipt ({RECEIPT_FILE} is missing): pack the checkpoint "
                                "with fugu-lite pack"))
    else:
        try:
            receipt = read_receipt(pack)
            gates.append(receipt_gate(receipt, cfg, data=data, weights=weights, manifest=manifest, ledger=ledger))
        except (ValueError, CheckpointError) as exc:
            gates.append(GateResult("receipt", False, str(exc)[:300]))
    cap = getattr(_head_class(manifest.head_kind), "max_params", None)  # the kind's own cap (a triage head's)
    if cap is not None:
        n = manifest.param_count
        gates.append(GateResult("size", n < cap, f"{n:,} parameters ({'<' if n < cap else 'not <'} {cap:,})"))
    gates.append(_duplicate_offline(pack, manifest, kind, models_dir, cfg, pointer_file, not problems))
    gates.append(rate_limit_gate(models_dir, who, cfg.rate_limit_s, now, history_name=history_name, key=key))
    gates.append(king_gate(models_dir, replace_broken_king, kind))
    return PreflightResult(all(g.ok for g in gates), gates, who, manifest, receipt, key=key, kind=kind)


def _signature_gate(pack: Path, models_dir: str | Path, cfg: GateConfig):
    """((the gate, (name, fingerprint) or None), whether the members may be read): the contest's own
    check (`contest_entry.signature_check`), so a pack refused there is refused in the same line."""
    from fugu_pipeline.evaluate.contest_entry import signature_check

    gate, signer, readable = signature_check(pack, models_dir, cfg)
    return (gate, signer), readable


def _duplicate_offline(pack: Path, manifest: Manifest, kind: str, models_dir, cfg: GateConfig, pointer_file: Path,
                       loadable: bool) -> GateResult:
    """The duplicate gate on the probe inputs the host keeps for this feature contract."""
    from fugu_pipeline.evaluate.probe import checkpoint_behaviour, load_probe
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

    if kind == "coordinator":
        return _coordinator_duplicate_offline(manifest, models_dir, cfg)
    kept = load_probe(models_dir, kind, manifest.contract_fingerprint)
    if kept is None:
        return GateResult("duplicate", True, "not checked offline: the host keeps no probe inputs for this feature "
                          "contract yet (validate checks it on the host's features)")
    if not loadable:
        return GateResult("duplicate", False, "not checked: the weights cannot be loaded")
    why = getattr(_head_class(manifest.head_kind), "not_probed_offline", None)
    if why is not None:
        return GateResult("duplicate", True, f"not checked offline: {why}")
    probe, feats, domains = kept
    try:
        seen = checkpoint_behaviour(probe, load_checkpoint(pack), feats, domains)
    except CheckpointError as exc:
        return GateResult("duplicate", False, f"not checked: {exc}")
    king = None
    k = king_manifest(models_dir, pointer_file)
    if (k is not None and k[1].contract_fingerprint == manifest.contract_fingerprint
            and getattr(_head_class(k[1].head_kind), "not_probed_offline", None) is None):
        try:
            king = (f"{k[1].method} {k[1].content_hash}", checkpoint_behaviour(probe, load_checkpoint(k[0]), feats, domains))
        except CheckpointError:
            king = None
    return duplicate_gate(seen, models_dir, cfg.duplicate_cosine, kind=kind, king=king)


def _head_class(head_kind: str):
    """The registered head class of a kind (`train/head_base.HEADS`, filled by the policies registry), or
    None: what a kind says to these gates beyond the shared ones (`max_params`, `not_probed_offline`)."""
    from fugu_pipeline.train.head_base import HEADS

    return HEADS.get(head_kind)


def _coordinator_duplicate_offline(manifest: Manifest, models_dir, cfg: GateConfig) -> GateResult:
    """A coordinator's behaviour is its whole sessions with the host's workers, which preflight does
    not run: offline, only a head the host has judged already (its content hash in the registry)
    is known, and its recorded sessions are compared with every head judged before."""
    from fugu_pipeline.evaluate.gates import SeenHeads

    registry = SeenHeads(models_dir)
    own = next((e for e in registry.entries("coordinator") if e.get("content_hash") == manifest.content_hash), None)
    seen = registry.behaviour(own) if own is not None else None
    if seen is None:
        return GateResult("duplicate", True, "not checked offline: a coordinator's behaviour is its whole sessions "
                          "with the host's workers (validate runs them on the probe tasks and checks it)")
    seen.unit = "whole session"
    return duplicate_gate(seen, models_dir, cfg.duplicate_cosine, kind="coordinator")


def king_gate(models_dir: str | Path, replace_broken_king: bool = False, kind: str = "router") -> GateResult:
    """Whom the challenger would face: the kind's promoted head, the baselines only when nothing is
    promoted, and a failure when the promoted head cannot be loaded (unless it is to be replaced)."""
    from fugu_pipeline.evaluate.contest import KIND_FILES
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

    pointer_file = KIND_FILES[kind][0]
    noun = "checkpoint" if kind == "router" else kind
    why = None
    try:
        ptr = read_pointer(models_dir, pointer_file)
        if ptr is None:
            return GateResult("king", True, "nothing is promoted: faces the baselines only")
        king = load_checkpoint(pointer_target(models_dir, ptr))
        if ptr.get("content_hash") and ptr["content_hash"] != king.manifest.content_hash:
            why = f"the pointer names {ptr['content_hash']} but {ptr['checkpoint']} holds {king.manifest.content_hash}"
    except (CheckpointError, OSError) as exc:
        why = str(exc)
    if why is None:
        return GateResult("king", True, f"faces the promoted {king.manifest.method} {king.manifest.content_hash}")
    if replace_broken_king:
        return GateResult("king", True, f"the promoted {noun} cannot be loaded ({why}); it is replaced as asked "
                          "(--replace-broken-king): faces the baselines only")
    return GateResult("king", False, f"the promoted {noun} cannot be loaded ({why}): restore it, or pass "
                      "--replace-broken-king to replace it facing the baselines only")


def _contract_gate(pack: Path, manifest: Manifest, host: Host | None, present: bool) -> GateResult:
    problems = []
    if not present:
        problems.append(f"{CONTRACT_FILE} is missing")
    else:
        try:
            c = PackContract.model_validate_json(read_capped(pack / CONTRACT_FILE, 2**20, "a contract"))
        except (OSError, ValueError) as exc:
            problems.append(f"{CONTRACT_FILE} does not parse: {str(exc)[:200]}")
        else:
            # compared as JSON: a multi-layer contract's tuple and the file's list are the same contract
            mine = json.loads(json.dumps({
                "feature_contract": manifest.feature_contract.model_dump(mode="json"), "contract_fingerprint": manifest.contract_fingerprint,
                "worker_ids": list(manifest.worker_ids), "head_kind": manifest.head_kind, "tensors": manifest.tensors}))
            theirs = json.loads(c.model_dump_json())
            problems += [f"{CONTRACT_FILE} {k} differs from the manifest's" for k in mine if mine[k] != theirs[k]]
    if host is not None and host.worker_ids is not None and list(manifest.worker_ids) != list(host.worker_ids):
        problems.append(f"trained for workers {manifest.worker_ids}, the host routes {host.worker_ids} "
                        f"({host.source})")
    own = ""
    if host is not None and host.contract is not None:
        mine, host_c = manifest.feature_contract, host.contract
        diffs = mine.differences(host_c)
        if diffs and (mine.encoder_id, mine.revision) == (host_c.encoder_id, host_c.revision):
            # the host's encoder model read another way (layers, pooling, prompt rules, lexical block):
            # scoring and serving compute the head's own features from its contract (feature_source.py)
            own = "; reads its own features of the host's encoder model (" + "; ".join(
                d.replace("encoder has", "host has") for d in diffs) + "), computed from its contract when scored"
        elif diffs:
            problems.append("trained on other features than the host's (" + host.source + "): "
                            + "; ".join(d.replace("encoder has", "host has") for d in diffs))
    if problems:
        return GateResult("contract", False, "; ".join(problems))
    checked = "" if host is None or (host.worker_ids is None and host.contract is None) else f", matches {host.source}"
    return GateResult("contract", True, f"encoder {manifest.feature_contract.encoder_id} (dim {manifest.dim}), "
                      f"workers {manifest.worker_ids}{checked}{own}")
