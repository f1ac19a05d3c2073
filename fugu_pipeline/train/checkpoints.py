"""Router checkpoints on disk: `models/<method>/<content-hash>/{head.safetensors, manifest.json}`.

The weights are safetensors (never pickle). The manifest pins the feature contract, the worker
order, the reward config, the data version, the code version, the training config, metrics and
curves. The directory name is a hash of the weight bytes and the manifest minus its
timestamps, so the same training run always lands in the same directory. Loading refuses a
checkpoint whose contract differs from the encoder's, whose weights are malformed, or whose
manifest was edited after saving (its content_hash is recomputed: reordered worker_ids would
otherwise send every route to the wrong worker). The manifest itself refuses a method that is not
a plain name, a content_hash that is not 16 hex digits, and empty or repeated worker ids.

torch and safetensors are imported inside the functions that need them, so the manifest model and
`weight_sanity`'s callers can import this module cheaply.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.files import fsync_dir
from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.workers.config import IMPORT_WORKER_ID_PATTERN

CODE_VERSION = "fugu-train-1"  # bump when heads/training change what a given config and data produce
WEIGHTS_FILE = "head.safetensors"
MANIFEST_FILE = "manifest.json"
UNHASHED_FIELDS = ("created_at", "wall_s", "content_hash")  # left out of the directory hash
_METHOD_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
_HASH_RE = re.compile(r"^[0-9a-f]{16}$")
_WORKER_ID = re.compile(IMPORT_WORKER_ID_PATTERN)


FORMAT_VERSION = 1  # the checkpoint layout this code writes and reads
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest with long training curves is well under 1 MB


class CheckpointFileError(ValueError):
    """A checkpoint file that cannot be the one its checkpoint needs: not a regular file, or larger
    than it can be. Raised before the file is read into memory."""


def read_capped(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a checkpoint file of at most `limit` bytes. A device, FIFO or socket (a link
    to /dev/zero reads for ever) and a larger file are refused without reading them."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointFileError(f"{path}: cannot read it: a folder, not a file; restore the file or save the "
                                  "checkpoint again")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointFileError(f"{path}: not a regular file (a device, pipe or socket); restore the file "
                                  "or save the checkpoint again")
    if st.st_size > limit:
        raise CheckpointFileError(f"{path}: {st.st_size:,} bytes, more than {what} can take ({limit:,}): not this "
                                  "checkpoint's file; restore it or save the checkpoint again")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise CheckpointFileError(f"{path}: grew past {limit:,} bytes while being read; try again once nothing writes it")
    return data


def weights_limit(tensors: dict[str, list[int]]) -> int:
    """The most bytes a safetensors file of these tensors (a manifest's `tensors`) takes: 8 bytes a
    number (float64, the widest the heads use) and a header of at most 1 MiB."""
    return sum(math.prod(shape) for shape in tensors.values()) * 8 + 2**20


def known_format(v: int) -> int:
    """A manifest's format_version, when this code reads that format."""
    if v > FORMAT_VERSION:
        raise ValueError(f"format_version {v}: written by a newer fugu_pipeline (this one reads format "
                         f"{FORMAT_VERSION}); upgrade fugu_pipeline to load it")
    if v != FORMAT_VERSION:
        raise ValueError(f"format_version {v} is not a checkpoint format (this code reads {FORMAT_VERSION})")
    return v


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or used; the message says which field or tensor and why."""


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    method: str
    head_kind: str
    head_params: dict[str, Any] = {}  # constructor arguments of the quality predictors (k, sizes, domain vocabulary)
    head_shape: dict[str, int] = {}  # a head kind's extra sizes, e.g. {"svf_size": 7168} (roles heads)
    dim: int
    n_workers: int
    param_count: int
    worker_ids: list[str]
    feature_contract: FeatureContract
    contract_fingerprint: str
    utility_config: dict[str, Any] | None = None
    data_version: str
    code_version: str
    training_config: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    curves: dict[str, list[float]] = {}
    tensors: dict[str, list[int]]  # name -> shape, as saved
    weights_sha256: str
    content_hash: str = ""
    created_at: str = ""
    wall_s: float | None = None

    @field_validator("format_version")
    @classmethod
    def _a_format_this_code_reads(cls, v: int) -> int:
        return known_format(v)

    # method and content_hash name the folder a checkpoint is stored in (models/<method>/<hash>/):
    # a pack from elsewhere must not name a path outside it
    @field_validator("method")
    @classmethod
    def _method_is_a_name(cls, v: str) -> str:
        if not _METHOD_RE.match(v):
            raise ValueError(f"method {v!r} must be a lowercase name like 'sft' (letters, digits, _ and -)")
        return v

    @field_validator("content_hash")
    @classmethod
    def _hash_is_hex(cls, v: str) -> str:
        if v and not _HASH_RE.match(v):  # "" only while save_checkpoint computes it
            raise ValueError(f"content_hash {v!r} must be 16 lowercase hex digits")
        return v

    @field_validator("head_params", "head_shape")
    @classmethod
    def _numbers_finite(cls, v: dict[str, Any], info) -> dict[str, Any]:
        bad = _non_finite(v, info.field_name)
        if bad:
            raise ValueError(f"{bad[0]} is {bad[1]}: hyper-parameters must be finite numbers (save the checkpoint again)")
        return v

    @field_validator("worker_ids")
    @classmethod
    def _workers_distinct(cls, v: list[str]) -> list[str]:
        if any(not w.strip() for w in v):
            raise ValueError("worker_ids holds an empty worker id")
        odd = next((w for w in v if not _WORKER_ID.match(w)), None)
        if odd is not None:
            raise ValueError(f"worker id {odd[:80]!r}{'...' if len(odd) > 80 else ''} is not a worker id: "
                             f"each must match {IMPORT_WORKER_ID_PATTERN}")
        dup = sorted({w for w in v if v.count(w) > 1})
        if dup:
            raise ValueError(f"worker_ids lists {dup} more than once: each output must be a different worker")
        return v


def _non_finite(v: Any, where: str) -> tuple[str, float] | None:
    """(path, value) of the first NaN or infinite number inside a JSON value, else None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where, v
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        found = _non_finite(x, f"{where}.{k}")
        if found:
            return found
    return None


@dataclass
class Checkpoint:
    path: Path
    manifest: Manifest
    head: Any  # fugu_pipeline.policies.oneshot.heads.RoutingHead, in eval mode
    state_dict: dict[str, Any]


def save_checkpoint(
    models_dir: str | Path,
    method: str,
    head_kind: str,
    state_dict: dict[str, Any],
    manifest_fields: dict[str, Any],
) -> Path:
    """Write `models_dir/method/<hash>/` atomically and return it. `manifest_fields` holds
    worker_ids, feature_contract, data_version, and optionally utility_config, training_config,
    metrics, curves, wall_s, code_version (default CODE_VERSION)."""
    import torch
    from safetensors.torch import save as st_save

    from fugu_pipeline.train.head_base import build_head

    if not _METHOD_RE.match(method):
        raise CheckpointError(f"method {method!r} must be a lowercase name like 'sft' (letters, digits, _ and -)")
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
    if any(not isinstance(v, torch.Tensor) for v in tensors.values()):
        raise CheckpointError("state_dict values must all be torch tensors")
    weights = st_save(tensors, metadata={"format": "pt"})

    fields = dict(manifest_fields)
    head_params = dict(fields.pop("head_params", None) or {})
    contract = FeatureContract.model_validate(fields.pop("feature_contract"))
    worker_ids = list(fields.pop("worker_ids"))
    dim = int(fields.pop("dim", contract.dim))
    head_shape = {k: int(v) for k, v in (fields.pop("head_shape", None) or {}).items()}
    try:
        manifest = Manifest(
            method=method,
            head_kind=head_kind,
            head_params=head_params,
            head_shape=head_shape,
            dim=dim,
            n_workers=len(worker_ids),
            param_count=build_head(head_kind, dim, len(worker_ids), head_params, **head_shape).param_count(),
            worker_ids=worker_ids,
            feature_contract=contract,
            contract_fingerprint=contract.fingerprint(),
            code_version=fields.pop("code_version", CODE_VERSION),
            tensors={k: list(v.shape) for k, v in tensors.items()},
            weights_sha256=hashlib.sha256(weights).hexdigest(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **fields,
        )
    except (ValidationError, ValueError) as exc:
        raise CheckpointError(f"cannot build the checkpoint manifest: {exc}") from None
    problems = weight_sanity(tensors, manifest)
    if problems:
        raise CheckpointError(f"refusing to save {method}/{head_kind} weights: " + "; ".join(problems))

    content_hash = checkpoint_hash(weights, manifest)
    manifest.content_hash = content_hash
    parent = Path(models_dir) / method
    target = parent / content_hash
    if (target / MANIFEST_FILE).exists():
        return target  # same weights and manifest already saved
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{content_hash}-", dir=parent))
    try:
        os.chmod(tmp, 0o755)
        _write_synced(tmp / WEIGHTS_FILE, weights)
        _write_synced(tmp / MANIFEST_FILE, (json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n").encode())
        try:
            os.replace(tmp, target)
        except OSError:
            if (target / MANIFEST_FILE).exists():
                return target  # another process saved the same checkpoint first
            raise CheckpointError(f"{target} exists but holds no {MANIFEST_FILE}; delete it and save again") from None
        fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def hashed_fields(manifest: Manifest) -> bytes:
    """What the content hash covers after the weights' bytes: the manifest's fields, canonical."""
    body = {k: v for k, v in manifest.model_dump(mode="json").items() if k not in UNHASHED_FIELDS}
    for extra in ("head_params", "head_shape"):  # heads without them hash as they did before the fields existed
        if not body.get(extra):
            body.pop(extra, None)
    return canonical_json(body).encode()


def checkpoint_hash(weights: bytes, manifest: Manifest) -> str:
    return hashlib.sha256(weights + hashed_fields(manifest)).hexdigest()[:16]


def load_checkpoint(path: str | Path, expected_contract: FeatureContract | None = None) -> Checkpoint:
    """Load a checkpoint directory (or its head.safetensors). Refuses, with CheckpointError, a
    contract that differs from `expected_contract` (naming every differing field), a weights file
    that changed after saving, malformed weights, and a manifest whose content_hash is not the
    hash of its weights and fields (edited after saving)."""
    from safetensors.torch import load as st_load

    from fugu_pipeline.train.head_base import build_head

    path = Path(path)
    if path.is_file():
        path = path.parent
    mpath, wpath = path / MANIFEST_FILE, path / WEIGHTS_FILE
    if not mpath.exists() or not wpath.exists():
        raise CheckpointError(f"{path} is not a checkpoint: it needs {MANIFEST_FILE} and {WEIGHTS_FILE}")
    try:
        manifest = Manifest.model_validate_json(read_capped(mpath, MAX_MANIFEST_BYTES, "a manifest").decode("utf-8"))
    except CheckpointFileError as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{mpath}: cannot read the manifest ({exc.strerror or exc}); "
                              "restore the file or save the checkpoint again") from None
    except ValidationError as exc:
        raise CheckpointError(f"{mpath}: not a valid checkpoint manifest: {_one_line(exc)}") from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{mpath}: not a valid checkpoint manifest: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start}); restore the file or save the checkpoint again") from None
    if manifest.contract_fingerprint != manifest.feature_contract.fingerprint():
        raise CheckpointError(f"{mpath}: contract_fingerprint does not match feature_contract (manifest was edited)")
    if expected_contract is not None:
        diffs = manifest.feature_contract.differences(expected_contract)
        if diffs:
            raise CheckpointError(
                f"{path}: feature contract does not match the encoder ({len(diffs)} field(s) differ): "
                + "; ".join(diffs)
                + ". Use a checkpoint trained on this encoder's features, or configure the encoder to match."
            )
    _check_folder(path, manifest)
    try:
        raw = read_capped(wpath, weights_limit(manifest.tensors), "the manifest's tensors")
    except CheckpointFileError as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{wpath}: cannot read the weights ({exc.strerror or exc}); "
                              "restore the file or save the checkpoint again") from None
    try:
        tensors = st_load(raw)
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{wpath}: not a readable safetensors file: {exc}") from None
    problems = weight_sanity(tensors, manifest)
    if hashlib.sha256(raw).hexdigest() != manifest.weights_sha256:
        problems.insert(0, f"{WEIGHTS_FILE} does not match the manifest's weights_sha256 (changed after saving)")
    if problems:
        raise CheckpointError(f"{path}: refusing these weights: " + "; ".join(problems))
    if checkpoint_hash(raw, manifest) != manifest.content_hash:
        raise CheckpointError(f"{mpath}: manifest content_hash does not match its weights and fields (edited): "
                              f"they hash to {checkpoint_hash(raw, manifest)}, it says {manifest.content_hash or 'nothing'}; "
                              "restore the manifest or save the checkpoint again")
    head = build_head(manifest.head_kind, manifest.dim, manifest.n_workers, manifest.head_params, **manifest.head_shape)
    head.load_state_dict(tensors)
    head.eval()
    return Checkpoint(path=path, manifest=manifest, head=head, state_dict=tensors)


def _check_folder(path: Path, manifest: Manifest) -> None:
    """A folder named like a content hash is `models/<method>/<content_hash>/` (save_checkpoint):
    it must hold that checkpoint and, inside a folder named like a method of this product, be filed
    under its own method. Other folder names (a pack, a copy elsewhere) are not checked."""
    if not _HASH_RE.match(path.name) or not manifest.content_hash:
        return
    if path.name != manifest.content_hash:
        raise CheckpointError(f"{path}: the folder is named for checkpoint {path.name} but its manifest's content_hash "
                              f"is {manifest.content_hash} (files swapped or copied over); restore the folder, or move "
                              f"these files to {path.parent / manifest.content_hash}")
    if path.parent.name != manifest.method and path.parent.name in _method_folders():
        raise CheckpointError(f"{path}: filed under {path.parent.name}/ but its manifest's method is "
                              f"{manifest.method!r}; move it to {path.parent.parent / manifest.method / path.name}")


def _method_folders() -> set[str]:
    """The folder names this product files checkpoints under: the trainers' methods and the heads' kinds."""
    from fugu_pipeline.train.head_base import HEADS

    return {"sft", "rl", "es", "roles", "triage", *HEADS}


def _one_line(exc: ValidationError) -> str:
    """A pydantic error on one line: each failing field and why."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in exc.errors())


def weight_sanity(state_dict: dict[str, Any], manifest: Manifest | dict[str, Any]) -> list[str]:
    """Problems with these weights for this manifest (empty when sane): unknown head kind, missing
    or unexpected tensors, shapes other than the head's and the manifest's, non-finite values, an
    all-zero final layer, the kind's own checks (`RoutingHead.sanity`: e.g. a kNN head's
    neighbour rows normalised and qualities in [0, 1], its routing map matching its tables), and
    the head's scores on a probe set (`probe.py`)."""
    import torch

    from fugu_pipeline.train.head_base import HEADS, expected_shapes

    m = manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)
    if m.head_kind not in HEADS:
        return [f"unknown head kind {m.head_kind!r} (known: {list(HEADS)})"]
    if len(m.worker_ids) != m.n_workers:
        return [f"manifest lists {len(m.worker_ids)} worker_ids but n_workers={m.n_workers}"]
    if m.dim != m.feature_contract.dim:
        return [f"manifest dim={m.dim} but its feature contract says dim={m.feature_contract.dim}"]
    try:
        want = expected_shapes(m.head_kind, m.dim, m.n_workers, m.head_params, **m.head_shape)
    except (TypeError, ValueError) as exc:
        return [f"head_params {m.head_params} / head_shape {m.head_shape} do not build a {m.head_kind} head: {exc}"]
    problems = []
    missing = sorted(set(want) - set(state_dict))
    extra = sorted(set(state_dict) - set(want))
    if missing:
        problems.append(f"missing tensor(s) {missing}")
    if extra:
        problems.append(f"unexpected tensor(s) {extra}")
    for name, t in state_dict.items():
        if name not in want:
            continue
        shape = tuple(t.shape)
        if shape != want[name]:
            problems.append(f"{name} has shape {list(shape)}, a {m.head_kind} head of dim {m.dim} "
                            f"with {m.n_workers} workers needs {list(want[name])}")
        elif m.tensors and tuple(m.tensors.get(name, ())) != shape:
            problems.append(f"{name} has shape {list(shape)} but the manifest records {m.tensors.get(name)}")
        if t.dtype != torch.float32:  # what save_checkpoint writes: another dtype is a converted or crafted file
            problems.append(f"{name} has dtype {t.dtype}, expected torch.float32")
            if not torch.is_floating_point(t):
                continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            problems.append(f"{name} holds {bad} non-finite (NaN or infinite) value(s)")
    scale = state_dict.get("feature_scale")  # roles heads standardise their features
    if scale is not None and torch.is_floating_point(scale) and bool((scale <= 0).any()):
        problems.append("feature_scale holds zero or negative values: features cannot be standardised")
    for name in getattr(HEADS[m.head_kind], "final_layers", ("linear.weight",)):
        final = state_dict.get(name)
        if final is not None and torch.is_floating_point(final) and not bool(final.ne(0).any()):
            problems.append(f"{name} is all zero: the head would send every task to the same worker" if name == "linear.weight"
                            else f"{name} is all zero: the head would give every prompt the same label")
    if not problems:
        problems.extend(_kind_sanity(state_dict, m))
    return problems


def _kind_sanity(state_dict: dict[str, Any], m: Manifest) -> list[str]:
    """The head kind's own checks on tensors that already have the right names, shapes and values,
    then, for every kind, its scores on a probe set (`probe.py`: finite weights can still overflow)."""
    from fugu_pipeline.train.head_base import build_head
    from fugu_pipeline.train.probe import PROBE_ROWS, random_probe, score_problems

    head = build_head(m.head_kind, m.dim, m.n_workers, m.head_params, **m.head_shape)
    head.load_state_dict({k: v.float() for k, v in state_dict.items()})
    problems = head.eval().sanity()
    if problems:
        return problems
    found = score_problems(head, *random_probe(head))
    return [f"{'; '.join(found)} on {PROBE_ROWS} random unit-length probe features: the weights overflow (train "
            "the checkpoint again, or restore it)"] if found else []


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
