"""The gates a challenger passes before it is even scored (the seed's submission gates), shared
by `promoted_router`, `fugu-lite preflight` and `fugu-lite validate`.

1. **rate limit**: at most one promotion attempt per `rate_limit_s` (default one day, the seed's)
   per submitter (`pipeline` for the asset). Persisted: the attempts are the records of
   `models/promoted/history.jsonl`; a refusal by this gate is recorded but is not an attempt.
   Each attempt reveals something about the held-out rows, so the limit bounds how fast anyone
   can select heads on them.
2. **weight sanity**: shapes the head kind and manifest need, every value finite, final layer not
   all zero (`train/checkpoints.weight_sanity`); a checkpoint too broken to load fails here.
3. **duplicate**: cosine ≥ `duplicate_cosine` (0.99) between the head's routing map (its final
   layer, `linear.weight` and `linear.bias` flattened: the part every head kind has and CMA-ES
   evolves; LayerNorm starts at ones in every head and makes unrelated heads look alike: two SFT
   heads trained from different seeds on the same 16-dim data measure 0.35 on the final layer and
   0.94 over all tensors, and the LayerNorm share grows with the feature size) and
   that of any head judged before (promoted or refused after scoring; kept in
   `models/promoted/seen/`) or the king. Only maps of the same size are compared.
4. **receipt**: the training receipt (`train/exchange.py`) records at least
   `min_fitness_steps` (3) finite fitness values, one per epoch or generation, and a training
   cost > 0 wherever the workers were paid (the host's matrix records a cost for them, or, with
   no host data, the receipt's own data did); in a pack folder it must also name these weights
   (sha256 and content hash) and agree with the manifest.

Each gate returns a `GateResult`, printed as `PASS name: why` / `FAIL name: why`, and every one
goes into the promotion record.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.train.pointer import POINTER

SEEN_DIR = POINTER.parent / "seen"
HISTORY = POINTER.parent / "history.jsonl"
DEFAULT_SUBMITTER = "pipeline"


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rate_limit_s: float = Field(86400.0, ge=0, description="at most one promotion attempt per this many seconds per submitter (0: off)")
    duplicate_cosine: float = Field(0.99, gt=0, le=1, description="refuse a head this similar to one judged before or the king")
    min_fitness_steps: int = Field(3, ge=0, description="fitness entries (epochs / generations) the receipt must record")
    require_paid_cost: bool = Field(True, description="where workers were paid, the receipt must record a training cost > 0")


@dataclass
class GateResult:
    name: str
    ok: bool
    reason: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.reason}"


# --------------------------------------------------------------------------- rate limit


def _epoch(stamp: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _read_records(path: Path) -> list[dict]:
    """The JSON lines of an append-only record file; a torn last line (a crash) is not a record."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines: a record may hold U+2028 raw
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def history(models_dir: str | Path) -> list[dict]:
    return _read_records(Path(models_dir) / HISTORY)


def rate_limit_gate(models_dir: str | Path, submitter: str, period_s: float, now: float | None = None) -> GateResult:
    """Refuse when `submitter` made a promotion attempt less than `period_s` ago."""
    if period_s <= 0:
        return GateResult("rate limit", True, "off")
    now = time.time() if now is None else now
    last = None
    for rec in history(models_dir):
        # refused by the rate limit itself, or failed on the host's side (a broken king, a pointer
        # that could not be written): no attempt of the submitter's
        if rec.get("rate_limited") or rec.get("not_an_attempt") or rec.get("submitter", DEFAULT_SUBMITTER) != submitter:
            continue
        t = _epoch(rec.get("at", ""))
        if t is not None and (last is None or t > last):
            last = t
    if last is not None and now - last < period_s:
        nxt = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last + period_s))
        return GateResult("rate limit", False, f"{submitter!r} made an attempt at "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(last))}; one attempt per {period_s / 3600:g} h, "
                          f"next at {nxt} (gates.rate_limit_s)")
    return GateResult("rate limit", True, f"no attempt by {submitter!r} in the last {period_s / 3600:g} h")


# --------------------------------------------------------------------------- duplicates


def routing_map(state_dict: dict) -> np.ndarray:
    """What the duplicate gate compares: a linear head's final layer (`linear.*`), flattened in
    name order; for the quality predictors (kNN, domain prior, MLP, ensemble), which have no final
    layer, their stored `routing_map` (centred predicted utility on a fixed probe set, checked
    against the head's own tables when it loads). float64."""
    parts = [np.asarray(_as_numpy(state_dict[k]), dtype=np.float64).ravel() for k in sorted(state_dict) if k.startswith("linear.")]
    if not parts and "routing_map" in state_dict:
        parts = [np.asarray(_as_numpy(state_dict["routing_map"]), dtype=np.float64).ravel()]
    return np.concatenate(parts) if parts else np.zeros(0)


def _as_numpy(t):
    return t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


class SeenHeads:
    """Every head judged after scoring (promoted or refused): `models/promoted/seen/index.jsonl`
    plus one `<content hash>.npy` routing map each. Append-only."""

    def __init__(self, models_dir: str | Path):
        self.dir = Path(models_dir) / SEEN_DIR

    def entries(self) -> list[dict]:
        return _read_records(self.dir / "index.jsonl")

    def vector(self, entry: dict) -> np.ndarray | None:
        try:
            return np.load(self.dir / entry["file"], allow_pickle=False)
        except (OSError, ValueError, KeyError):
            return None

    def add(self, content_hash: str, vector: np.ndarray, *, method: str, outcome: str, submitter: str) -> None:
        if any(e.get("content_hash") == content_hash for e in self.entries()):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{content_hash}.npy"
        tmp = self.dir / f".{name}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(vector, dtype=np.float64), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        rec = {"content_hash": content_hash, "method": method, "outcome": outcome, "submitter": submitter,
               "size": int(vector.size), "file": name, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        fd = os.open(self.dir / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def duplicate_gate(vector: np.ndarray, models_dir: str | Path, threshold: float, *,
                   king: tuple[str, np.ndarray] | None = None) -> GateResult:
    """Refuse a routing map within `threshold` cosine of a judged head or of the king."""
    seen = SeenHeads(models_dir)
    best: tuple[float, str] | None = None
    candidates = [(f"{e.get('method')} {e.get('content_hash')} ({e.get('outcome')})", seen.vector(e)) for e in seen.entries()]
    if king is not None and not any(king[0].endswith(str(e.get("content_hash"))) for e in seen.entries()):
        candidates.append((f"the king {king[0]}", king[1]))  # a king promoted before the registry existed
    compared = 0
    for label, v in candidates:
        if v is None or v.shape != vector.shape:
            continue
        compared += 1
        c = cosine(vector, v)
        if best is None or c > best[0]:
            best = (c, label)
    if best is not None and best[0] >= threshold:
        return GateResult("duplicate", False, f"cosine {best[0]:.4f} with {best[1]} (must be < {threshold}): "
                          "a copy of a head already judged")
    if best is None:
        return GateResult("duplicate", True, f"no earlier head of this size to compare ({len(candidates)} on record)")
    return GateResult("duplicate", True, f"highest cosine {best[0]:.4f} with {best[1]} of {compared} compared (< {threshold})")


# --------------------------------------------------------------------------- receipt


def paid_workers(data, worker_ids: list[str]) -> list[str] | None:
    """The workers the host's matrix records a positive cost for; [] when it records no cost at
    all (nobody was paid); None without host data."""
    if data is None:
        return None
    if data.cost_usd is None:
        return []
    cost = np.nan_to_num(np.asarray(data.cost_usd, float))
    return [w for i, w in enumerate(data.worker_ids) if w in worker_ids and cost[:, i].sum() > 0]


def receipt_gate(receipt, cfg: GateConfig, *, data=None, weights: bytes | None = None, manifest=None) -> GateResult:
    """The training receipt: fitness recorded for enough steps, a cost where workers were paid,
    and (for a pack) that it names these very weights and agrees with the manifest."""
    if receipt is None:
        return GateResult("receipt", False, "no training receipt (receipt.json)")
    problems = []
    if weights is not None:
        sha = hashlib.sha256(weights).hexdigest()
        if receipt.weights_sha256 != sha:
            problems.append(f"it names weights {receipt.weights_sha256[:12]}… but head.safetensors is {sha[:12]}…")
    if manifest is not None:
        from fugu_pipeline.train.checkpoints import checkpoint_hash

        for field in ("content_hash", "method", "head_kind", "data_version", "contract_fingerprint", "worker_ids"):
            if getattr(receipt, field) != getattr(manifest, field):
                problems.append(f"{field} {getattr(receipt, field)!r} differs from the manifest's {getattr(manifest, field)!r}")
        if weights is not None and checkpoint_hash(weights, manifest) != receipt.content_hash:
            problems.append("its content_hash is not the hash of these weights and this manifest")
    finite = [v for v in receipt.fitness if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(finite) < len(receipt.fitness):
        problems.append(f"{len(receipt.fitness) - len(finite)} fitness value(s) are not finite")
    if len(receipt.fitness) < cfg.min_fitness_steps:
        problems.append(f"{len(receipt.fitness)} recorded fitness step(s) ({receipt.fitness_curve or 'no curve'}); "
                        f"needs at least {cfg.min_fitness_steps} epochs or generations")
    cost_note = ""
    if cfg.require_paid_cost:
        paid = paid_workers(data, receipt.worker_ids)
        if paid is None:  # no host data: the receipt's own data says whether workers were paid
            if receipt.data_cost_usd is None:
                problems.append("it records no training cost, so nothing shows the head was trained on collected answers")
            elif receipt.data_cost_usd <= 0:
                cost_note = "; cost $0 (its data records no paid call)"
        elif paid and not (receipt.data_cost_usd or 0) > 0:
            problems.append(f"workers {paid} are paid, but it records a training cost of "
                            f"{'none' if receipt.data_cost_usd is None else f'${receipt.data_cost_usd:.4f}'}")
        elif not paid:
            cost_note = "; no worker is paid in the host's data, so no cost is required"
    if problems:
        return GateResult("receipt", False, "; ".join(problems))
    cost = "n/a" if receipt.data_cost_usd is None else f"${receipt.data_cost_usd:.4f}"
    return GateResult("receipt", True, f"{receipt.steps} fitness steps ({receipt.fitness_curve}), training cost {cost}{cost_note}")
