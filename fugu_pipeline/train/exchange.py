"""The exchange format for heads: one folder that carries a head trained anywhere into the same
gates as the pipeline's own (`fugu-lite pack`, `preflight`, `validate`).

    <pack>/head.safetensors   the weights, byte for byte the checkpoint's
    <pack>/manifest.json      the checkpoint manifest (so the folder is itself a loadable checkpoint)
    <pack>/receipt.json       the training receipt (`Receipt`): which weights (their sha256 and the
                              checkpoint's content hash), trained on which data at what cost, and the
                              recorded fitness per epoch / generation
    <pack>/contract.json      what the head needs as input: the feature contract (encoder, pooling,
                              layer, template, dim), its fingerprint, the worker ids in order, the
                              head kind and its tensor shapes
    <pack>/ledger.jsonl       the cost ledger of the project that trained it (`fugu_pipeline/ledger.py`):
                              every paid call, hash-chained; the receipt cites its head hash, its
                              number of lines and its totals, which the host recomputes
    <pack>/cross_encoder.safetensors  only for a checkpoint that needs it beside its weights (a
                              cascade verifier's cross-encoder; `extra_members`: its manifest names
                              the file and its sha256), byte for byte
    <pack>/signature.json     the submitter's ed25519 signature over all of the above (`signing.py`)

Every promotable kind packs the same way: one-step routers, the multi-turn coordinator (a roles
checkpoint) and the triage head all have a checkpoint `Manifest`.

The receipt is derived from the manifest: `fitness` is the curve training recorded once per
epoch or generation (ES: `train_best`, the best fitness of each generation; SFT / RL:
`val_utility`; otherwise the longest curve), `data_cost_usd` what the calls behind the training
rows cost (recorded by training; a coordinator: what its training sessions cost; None for a
checkpoint that predates it). Nothing here judges a head: the gates are in `evaluate/gates.py`.
No torch at import.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.files import FileTooLargeError, atomic_write, fsync_dir, stream_file
from fugu_pipeline.config_files import first_validation_error
from fugu_pipeline.collector_key import CollectorKeyError
from fugu_pipeline.ledger import (
    KindTotal,
    LedgerError,
    LedgerSummary,
    read_entries,
    settle_killed_runs,
    summarize,
    verify_ledger,
)
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    WEIGHTS_FILE,
    CheckpointError,
    Manifest,
    checkpoint_hash,
    hashed_fields,
    load_checkpoint,
    read_capped,
    weights_limit,
)

RECEIPT_FILE = "receipt.json"
CONTRACT_FILE = "contract.json"
LEDGER_COPY = "ledger.jsonl"
PACK_FILES = (WEIGHTS_FILE, MANIFEST_FILE, RECEIPT_FILE, CONTRACT_FILE, LEDGER_COPY)  # what the signature covers
# files a checkpoint may need beside its weights, each named with its sha256 in the manifest's
# head_params (a cascade verifier's fine-tuned cross-encoder); a pack carries and signs those it needs
EXTRA_FILES = ("cross_encoder.safetensors",)
SIGNED_FILES = PACK_FILES + EXTRA_FILES  # a host verifies every one of these the pack holds
RECEIPT_FORMAT = "fugu-head-receipt/2"
MAX_RECEIPT_BYTES = 2**20  # a receipt is a few KiB (a fitness curve of thousands of steps included)
FITNESS_CURVES = ("train_best", "val_utility", "val_accuracy")  # preferred, in order: one entry per generation / epoch


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str = RECEIPT_FORMAT
    content_hash: str
    weights_sha256: str
    method: str
    head_kind: str
    param_count: int
    worker_ids: list[str]
    contract_fingerprint: str
    encoder_id: str
    data_version: str
    data_cost_usd: float | None = None
    fitness_curve: str | None = None
    fitness: list[float] = []
    trained_at: str = ""
    code_version: str = ""
    submitter: str = ""
    packed_at: str = ""
    ledger_head: str | None = None  # the cost ledger this receipt cites (None: a checkpoint's own, unpacked)
    ledger_lines: int | None = None
    ledger_totals: dict[str, KindTotal] | None = None

    @property
    def steps(self) -> int:
        return len(self.fitness)


class PackContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    feature_contract: FeatureContract
    contract_fingerprint: str
    worker_ids: list[str]
    head_kind: str
    tensors: dict[str, list[int]]


def fitness_of(manifest: Manifest) -> tuple[str | None, list[float]]:
    """The curve that records fitness once per epoch or generation, and its values."""
    curves = manifest.curves or {}
    for name in FITNESS_CURVES:
        if curves.get(name):
            return name, [float(v) for v in curves[name]]
    if not curves:
        return None, []
    name = max(sorted(curves), key=lambda k: len(curves[k]))
    return name, [float(v) for v in curves[name]]


def receipt_from_manifest(manifest: Manifest, *, submitter: str = "", data=None) -> Receipt:
    """The receipt of a checkpoint. `data` (a RoutingData) fills in the training cost of a
    checkpoint that predates `metrics.data_cost_usd`, when its data version is the same."""
    cost = manifest.metrics.get("data_cost_usd")
    if cost is None and data is not None and data.data_version == manifest.data_version:
        cost = training_cost(data)
    curve, fitness = fitness_of(manifest)
    return Receipt(
        content_hash=manifest.content_hash, weights_sha256=manifest.weights_sha256, method=manifest.method,
        head_kind=manifest.head_kind, param_count=manifest.param_count, worker_ids=list(manifest.worker_ids),
        contract_fingerprint=manifest.contract_fingerprint, encoder_id=manifest.feature_contract.encoder_id,
        data_version=manifest.data_version, data_cost_usd=None if cost is None else float(cost),
        fitness_curve=curve, fitness=fitness, trained_at=manifest.created_at, code_version=manifest.code_version,
        submitter=submitter,
    )


def training_cost(data) -> float | None:
    """USD the worker calls behind the train and val rows cost (None when the data has no cost)."""
    import numpy as np

    if data.cost_usd is None:
        return None
    rows = np.isin(data.splits, ("train", "val"))
    c = data.cost_usd[rows]
    return float(np.nansum(c)) if c.size else 0.0


def pack(checkpoint_dir: str | Path, out_dir: str | Path, *, submitter: str = "", ledger: str | Path | None = None,
         signing_key: str | None = None) -> Path:
    """Write the exchange folder of a checkpoint. `ledger`: the cost ledger of the project that
    trained it (None: no paid call, an empty ledger), verified and copied; `signing_key`: the
    submitter's private key (`signing.py`; None: an unsigned pack, which hosts refuse). Refuses a
    checkpoint whose weights no longer match its manifest, a broken ledger, and an existing
    non-empty `out_dir` that is not the same pack."""
    src = Path(checkpoint_dir)
    src = src.parent if src.is_file() else src
    # every check a loader makes (hashes, format, weights finite and of the manifest's shapes): a pack
    # that the host could not load is refused here, where the submitter can still put it right
    ckpt = load_checkpoint(src)
    try:
        manifest_bytes = read_capped(src / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest")
        weights = read_capped(src / WEIGHTS_FILE, weights_limit(ckpt.manifest.tensors), "the manifest's tensors")
        manifest = Manifest.model_validate_json(manifest_bytes)
    except (OSError, ValueError) as exc:  # ValueError: pydantic's, and a file too large
        raise CheckpointError(f"{src}: not a checkpoint ({_one_line(exc)})") from None
    if checkpoint_hash(weights, manifest) != ckpt.manifest.content_hash:  # replaced since it was loaded
        raise CheckpointError(f"{src}: the checkpoint changed while being packed; pack it again")
    extras = {name: _extra_bytes(src, name, digest) for name, digest in extra_members(manifest).items()}
    out = Path(out_dir)
    try:
        if out.exists() and any(out.iterdir()):
            if not (out / RECEIPT_FILE).exists():
                raise CheckpointError(f"{out} exists and is not a pack folder; choose an empty or new folder")
            theirs = _packed_hash(out)
            if theirs != manifest.content_hash:
                raise CheckpointError(f"{out} holds another pack ({theirs or 'unreadable receipt.json'}, not "
                                      f"{manifest.content_hash}); choose an empty or new folder, or delete it first")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"{exc.filename or out}: cannot write the pack there ({exc.strerror or exc}); "
                              "choose a writable --out folder") from None
    try:
        if ledger is not None:
            settle_killed_runs(ledger)  # calls a killed run left in flight are counted before the receipt cites it
        entries = read_entries(ledger) if ledger is not None else []
    except (LedgerError, OSError, CollectorKeyError) as exc:
        raise CheckpointError(f"cannot pack with this cost ledger: {exc}") from None
    summary = summarize(entries)
    receipt = receipt_from_manifest(manifest, submitter=submitter)
    receipt.packed_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    receipt.ledger_head, receipt.ledger_lines, receipt.ledger_totals = summary.head, summary.lines, summary.totals
    contract = PackContract(feature_contract=manifest.feature_contract, contract_fingerprint=manifest.contract_fingerprint,
                            worker_ids=list(manifest.worker_ids), head_kind=manifest.head_kind, tensors=manifest.tensors)
    atomic_write(out / WEIGHTS_FILE, weights)
    atomic_write(out / MANIFEST_FILE, manifest_bytes)
    atomic_write(out / CONTRACT_FILE, json.dumps(contract.model_dump(mode="json"), indent=2) + "\n")
    atomic_write(out / LEDGER_COPY, b"".join(e.model_dump_json().encode() + b"\n" for e in entries))
    atomic_write(out / RECEIPT_FILE, json.dumps(receipt.model_dump(mode="json"), indent=2) + "\n")
    for name, blob in extras.items():
        atomic_write(out / name, blob)
    if signing_key is not None:
        from fugu_pipeline.train.signing import sign_pack

        sign_pack(out, [*PACK_FILES, *extras], signing_key)
    return out


def extra_members(manifest: Manifest) -> dict[str, str]:
    """The files beside its weights that a checkpoint needs ({name: sha256}): each `head_params`
    entry naming a `file` and its `sha256` (a cascade verifier's cross-encoder). A name a pack may
    not carry (`EXTRA_FILES`) is a CheckpointError."""
    out = {}
    for key, v in (manifest.head_params or {}).items():
        if isinstance(v, dict) and isinstance(v.get("file"), str) and isinstance(v.get("sha256"), str):
            if v["file"] not in EXTRA_FILES:
                raise CheckpointError(f"head_params.{key}.file {v['file']!r}: a pack carries only {list(EXTRA_FILES)} "
                                      "beside the weights")
            out[v["file"]] = v["sha256"]
    return out


def _extra_bytes(src: Path, name: str, digest: str) -> bytes:
    """`src/name`, read once and checked against the manifest's sha256 (what the pack will carry)."""
    from fugu_pipeline.train.signing import MAX_MEMBER_BYTES

    try:
        blob = read_capped(src / name, MAX_MEMBER_BYTES, f"a pack member ({name})")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{src / name}: the checkpoint needs it beside its weights ({_one_line(exc)})") from None
    if hashlib.sha256(blob).hexdigest() != digest:
        raise CheckpointError(f"{src / name} does not match the manifest's sha256 for it (changed after saving); "
                              "save or train the checkpoint again")
    return blob


def pack_ledger(pack_dir: str | Path, models_dir: str | Path | None = None, max_bytes: int | None = None
                ) -> LedgerSummary | str | None:
    """The recomputed summary of a pack's ledger, read line by line (each line at most
    `ledger.MAX_LINE_BYTES`, the file at most `max_bytes`, refused unread beyond); a string (one
    line naming the file and line) saying why it cannot be verified; None when the pack holds
    none. With `models_dir` (a host), every line must be signed by a collector key the host
    trusts (`collector_key.trusted_keys`)."""
    from fugu_pipeline.collector_key import trusted_keys

    p = Path(pack_dir) / LEDGER_COPY
    if not p.is_file():
        return None
    try:
        return verify_ledger(p, trusted_keys(models_dir) if models_dir is not None else None, max_bytes=max_bytes)
    except (LedgerError, OSError, CollectorKeyError) as exc:
        return str(exc)


def _packed_hash(out: Path) -> str | None:
    """The content hash of the pack already in `out` (its receipt's), or None when unreadable."""
    try:
        return read_receipt(out).content_hash
    except (OSError, ValueError, CheckpointError, AttributeError):
        return None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def read_receipt(path: str | Path) -> Receipt | None:
    """The receipt.json of a pack folder, or None when the folder has none (a plain checkpoint).
    Raises CheckpointError, in one line, when it is over `MAX_RECEIPT_BYTES` (refused before any
    of it is read) or does not parse (its first problem, `field: message`)."""
    p = Path(path) / RECEIPT_FILE
    if not p.exists():
        return None
    buf = io.BytesIO()
    try:
        stream_file(p, MAX_RECEIPT_BYTES, sink=buf)
    except FileTooLargeError as exc:
        raise CheckpointError(f"{exc}: a receipt is a few KiB; refused unread (pack the checkpoint again with "
                              "fugu-lite pack)") from None
    try:
        return Receipt.model_validate_json(buf.getvalue())
    except ValidationError as exc:
        raise CheckpointError(f"{p}: not a valid receipt: {first_validation_error(exc)}") from None


def weight_digests(path: str | Path, manifest: Manifest, limit: int) -> tuple[str, str]:
    """(the sha256 of a weights file, the checkpoint's content hash with `manifest`), the file read
    once in 1 MiB chunks (`files.stream_file`, as `signing.file_digests` hashes a pack's members);
    FileTooLargeError, unread, for a file of more than `limit` bytes (or not a regular file)."""
    whole, content = hashlib.sha256(), hashlib.sha256()
    stream_file(path, limit, whole, content)
    content.update(hashed_fields(manifest))
    return whole.hexdigest(), content.hexdigest()[:16]


def import_checkpoint(path: str | Path, models_dir: str | Path, *, expected_hash: str | None = None,
                      max_bytes: int | None = None) -> Path:
    """Copy a checkpoint folder (a pack) into `models/<method>/<content hash>/`, byte for byte, and
    return that folder (the same one when it is already there). The weights are read once: streamed
    into a temporary folder while they are hashed, which is renamed into place only when they are
    the manifest's (weights_sha256 and content_hash), so the bytes checked are the bytes kept.
    Refuses (CheckpointError) a manifest that does not parse, whose content_hash is not its
    weights' and fields', that is not `expected_hash` (the checkpoint judged), weights of more
    than the manifest's tensors take (or `max_bytes`), and a method and hash that would name a
    folder outside `models/<method>/`."""
    src = Path(path)
    try:
        manifest_bytes = read_capped(src / MANIFEST_FILE, MAX_MANIFEST_BYTES, "a manifest")
        manifest = Manifest.model_validate_json(manifest_bytes)
    except (OSError, ValueError) as exc:  # ValueError: pydantic's, a manifest that is not UTF-8, one too large
        raise CheckpointError(f"{src / MANIFEST_FILE}: not a checkpoint to import ({_one_line(exc)})") from None
    if expected_hash is not None and manifest.content_hash != expected_hash:
        raise CheckpointError(f"{src / MANIFEST_FILE}: holds {manifest.content_hash}, not {expected_hash}, the checkpoint "
                              "judged (it changed after it was judged); nothing imported")
    models = Path(os.path.abspath(models_dir))
    parent = models / manifest.method
    target = parent / manifest.content_hash
    if parent.parent != models or target.parent != parent:  # the validators make this unreachable; kept as the last word
        raise CheckpointError(f"{src / MANIFEST_FILE}: method {manifest.method!r} / content_hash {manifest.content_hash!r} "
                              f"would write outside {models}")
    try:
        if src.resolve() == target.resolve() or (target / MANIFEST_FILE).exists():
            return target
    except OSError:
        pass
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".import-{manifest.content_hash}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    limit = weights_limit(manifest.tensors) if max_bytes is None else min(max_bytes, weights_limit(manifest.tensors))
    try:
        whole, content = hashlib.sha256(), hashlib.sha256()
        try:
            with open(tmp / WEIGHTS_FILE, "xb") as out:
                stream_file(src / WEIGHTS_FILE, limit, whole, content, sink=out)
                out.flush()
                os.fsync(out.fileno())
        except (OSError, FileTooLargeError) as exc:
            raise CheckpointError(f"{src / WEIGHTS_FILE}: cannot import the weights ({_one_line(exc)})") from None
        content.update(hashed_fields(manifest))
        if whole.hexdigest() != manifest.weights_sha256 or content.hexdigest()[:16] != manifest.content_hash:
            raise CheckpointError(f"{src / MANIFEST_FILE}: manifest content_hash does not match its weights and fields "
                                  "(edited); pack the checkpoint again")
        atomic_write(tmp / MANIFEST_FILE, manifest_bytes)
        fsync_dir(tmp)
        tmp.replace(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
    return target
