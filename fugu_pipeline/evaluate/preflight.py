"""`fugu-lite preflight`: the submission gates on a pack folder (`train/exchange.py`), offline.

Nothing is scored and nothing is recorded: it says whether `fugu-lite validate` would let the
head be scored, and why not. In order:

1. **files**: head.safetensors, manifest.json, receipt.json and contract.json are all there;
2. **manifest**: it parses and its contract fingerprint matches its contract;
3. **weights**: readable safetensors whose sha256 is the manifest's, with the shapes the head kind
   needs, every value finite, the final layer not all zero;
4. **contract**: contract.json agrees with the manifest, and the head routes the host's workers in
   the host's order and reads the host's features (encoder, pooling, layer, template, dim...);
   the host is the king by default, or `--workers` / `--encoder` / `--data`;
5. **receipt**: it names these weights (sha256 and content hash), agrees with the manifest, records
   ≥ 3 fitness steps and a training cost where the host's workers are paid;
6. **duplicate**: not within cosine 0.99 of a head judged before or of the king;
7. **rate limit**: the submitter has an attempt left in this period (checked, not spent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fugu_pipeline.evaluate.gates import (
    GateConfig,
    GateResult,
    duplicate_gate,
    rate_limit_gate,
    receipt_gate,
    routing_map,
)
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.train.checkpoints import MANIFEST_FILE, MAX_MANIFEST_BYTES, WEIGHTS_FILE, Manifest, read_capped, weights_limit
from fugu_pipeline.train.exchange import (
    CONTRACT_FILE,
    PACK_FILES,
    RECEIPT_FILE,
    PackContract,
    read_receipt,
)
from fugu_pipeline.train.pointer import PointerError, pointer_target, read_pointer

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


def king_manifest(models_dir: str | Path) -> tuple[Path, Manifest] | None:
    """The king's folder and manifest; None when nothing is promoted or it cannot be read
    (`validate` then says why and refuses unless told to replace a broken king)."""
    try:
        pointer = read_pointer(models_dir)
    except PointerError:
        return None
    if pointer is None:
        return None
    path = pointer_target(models_dir, pointer)
    try:
        return path, Manifest.model_validate_json((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _pointer_problem(models_dir: str | Path) -> str | None:
    try:
        read_pointer(models_dir)
    except PointerError as exc:
        return str(exc)
    return None


def host_expectation(models_dir: str | Path, *, workers_yaml: str | None = None, encoder: str | None = None, data=None) -> Host:
    """The host's worker set and feature contract: from `workers_yaml` / `encoder` / `data` when
    given, else from the king's manifest."""
    king = king_manifest(models_dir)
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
    broken = _pointer_problem(models_dir) if king is None else None
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
    nothing to read (no manifest, no weights). The `king` gate fails when the promoted checkpoint
    cannot be loaded (`validate` would stop before scoring) unless `replace_broken_king`."""
    from fugu_pipeline.evaluate.promotion import weight_gate

    pack = Path(pack_dir)
    gates: list[GateResult] = []
    missing = [f for f in PACK_FILES if not (pack / f).is_file()]
    if not pack.is_dir():
        return PreflightResult(False, [GateResult("files", False, f"{pack} is not a folder")], submitter or EXTERNAL_SUBMITTER)
    gates.append(GateResult("files", not missing, "missing " + ", ".join(missing) if missing else ", ".join(PACK_FILES)))
    if MANIFEST_FILE in missing or WEIGHTS_FILE in missing:
        return PreflightResult(False, gates, submitter or EXTERNAL_SUBMITTER)
    try:
        manifest = Manifest.model_validate_json(read_capped(pack / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest"))
    except (OSError, ValueError) as exc:
        gates.append(GateResult("manifest", False, f"not a valid checkpoint manifest: {str(exc)[:300]}"))
        return PreflightResult(False, gates, submitter or EXTERNAL_SUBMITTER)
    if manifest.contract_fingerprint != manifest.feature_contract.fingerprint():
        gates.append(GateResult("manifest", False, "contract_fingerprint does not match feature_contract (edited)"))
    else:
        gates.append(GateResult("manifest", True, f"{manifest.method} {manifest.head_kind}, {manifest.param_count:,} params"))

    try:
        weights = read_capped(pack / WEIGHTS_FILE, weights_limit(manifest.tensors), "the manifest's tensors")
    except (OSError, ValueError) as exc:
        gates.append(GateResult("weights", False, str(exc)[:300]))
        return PreflightResult(False, gates, submitter or EXTERNAL_SUBMITTER)
    problems = weight_gate(pack)
    gates.append(GateResult("weights", not problems, "; ".join(problems) if problems else "shape, finite, not all zero"))

    gates.append(_contract_gate(pack, manifest, host, CONTRACT_FILE not in missing))

    receipt = None
    if RECEIPT_FILE in missing:
        gates.append(GateResult("receipt", False, f"no training receipt ({RECEIPT_FILE} is missing): pack the checkpoint "
                                "with fugu-lite pack"))
    else:
        try:
            receipt = read_receipt(pack)
            gates.append(receipt_gate(receipt, cfg, data=data, weights=weights, manifest=manifest))
        except ValueError as exc:
            gates.append(GateResult("receipt", False, str(exc)[:300]))
    who = submitter or (receipt.submitter if receipt is not None and receipt.submitter else EXTERNAL_SUBMITTER)

    vector = _routing_map(weights)
    if vector is None:
        gates.append(GateResult("duplicate", False, "not checked: the weights cannot be read"))
    else:
        king = king_manifest(models_dir)
        king_map = None
        if king is not None:
            kv = _routing_map((king[0] / WEIGHTS_FILE).read_bytes()) if (king[0] / WEIGHTS_FILE).exists() else None
            king_map = None if kv is None else (f"{king[1].method} {king[1].content_hash}", kv)
        gates.append(duplicate_gate(vector, models_dir, cfg.duplicate_cosine, king=king_map))
    gates.append(rate_limit_gate(models_dir, who, cfg.rate_limit_s, now))
    gates.append(king_gate(models_dir, replace_broken_king))
    return PreflightResult(all(g.ok for g in gates), gates, who, manifest, receipt)


def king_gate(models_dir: str | Path, replace_broken_king: bool = False) -> GateResult:
    """Whom the challenger would face: the promoted checkpoint, the baselines only when nothing is
    promoted, and a failure when the promoted checkpoint cannot be loaded (unless it is to be replaced)."""
    from fugu_pipeline.evaluate.contest import king_or_why

    king, why = king_or_why(models_dir)
    if king is not None:
        return GateResult("king", True, f"faces the promoted {king.manifest.method} {king.manifest.content_hash}")
    if why is None:
        return GateResult("king", True, "nothing is promoted: faces the baselines only")
    if replace_broken_king:
        return GateResult("king", True, f"the promoted checkpoint cannot be loaded ({why}); it is replaced as asked "
                          "(--replace-broken-king): faces the baselines only")
    return GateResult("king", False, f"the promoted checkpoint cannot be loaded ({why}): restore it, or pass "
                      "--replace-broken-king to replace it facing the baselines only")


def _routing_map(weights: bytes):
    from safetensors.numpy import load

    try:
        return routing_map(load(weights))
    except Exception:  # safetensors raises its own error types
        return None


def _contract_gate(pack: Path, manifest: Manifest, host: Host | None, present: bool) -> GateResult:
    problems = []
    if not present:
        problems.append(f"{CONTRACT_FILE} is missing")
    else:
        try:
            c = PackContract.model_validate_json((pack / CONTRACT_FILE).read_text(encoding="utf-8"))
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
