"""The gates a challenger passes before it is even scored (TinyRouter's submission gates), shared
by every kind's promotion (`contest.py`), `fugu-lite preflight` and `fugu-lite validate`.

1. **rate limit**: at most one promotion attempt per `rate_limit_s` (default one day, TinyRouter's)
   per submitter and kind. A signed pack's submitter is its key (`train/signing.py`): the name in
   the receipt counts for nothing. Persisted: the attempts are the records of the kind's history
   (`models/promoted/history.jsonl`, `roles-history.jsonl`, `triage-history.jsonl`); a refusal
   by this gate, or one that is the host's fault, is recorded but is not an attempt. Each attempt
   reveals something about the held-out rows, so the limit bounds how fast anyone can select
   heads on them.
2. **weight sanity**: shapes the head kind and manifest need, every value finite, final layer not
   all zero (`train/checkpoints.weight_sanity`); a checkpoint too broken to load fails here.
3. **duplicate**: behaviour, not bytes (`probe.py`): the cosine of the head's centred scores on the
   host's probe set with those of every head judged before (promoted or refused after scoring;
   `models/promoted/seen/`) and of the king, refused at ≥ `duplicate_cosine` (0.99). Only
   behaviours of the same kind on the same probe set compare.
4. **receipt**: the training receipt (`train/exchange.py`) records at least `min_fitness_steps`
   (3) finite fitness values, one per epoch or generation, the very curve the manifest recorded,
   and a training cost > 0 wherever the workers were paid; in a pack folder it must also name
   these weights (sha256 and content hash), agree with the manifest, and cite the pack's cost
   ledger (`fugu_pipeline/ledger.py`): its head hash, its number of lines and its totals, as the
   host recomputes them, and a training cost no larger than the paid calls it records.

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

from fugu_pipeline.evaluate.probe import Behaviour
from fugu_pipeline.train.pointer import POINTER
from fugu_pipeline.train.signing import MAX_MEMBER_BYTES, MAX_PACK_BYTES

SEEN_DIR = POINTER.parent / "seen"
HISTORY = POINTER.parent / "history.jsonl"
DEFAULT_SUBMITTER = "pipeline"


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate_limit_s: float = Field(86400.0, ge=0, description="at most one promotion attempt per this many seconds per submitter (0: off)")
    duplicate_cosine: float = Field(0.99, gt=0, le=1, description="refuse a head this similar to one judged before or the king")
    min_fitness_steps: int = Field(3, ge=0, description="fitness entries (epochs / generations) the receipt must record")
    require_paid_cost: bool = Field(True, description="where workers were paid, the receipt must record a training cost > 0")
    pack_member_max_bytes: int = Field(MAX_MEMBER_BYTES, gt=0, description="a pack member (weights, ledger...) of more "
                                       "bytes is refused before it is read")
    pack_total_max_bytes: int = Field(MAX_PACK_BYTES, gt=0, description="a pack whose members hold more bytes is "
                                      "refused before they are read")

    def pack_caps(self) -> dict:
        """The size caps, as `train/signing.verify_pack` takes them."""
        return {"member_cap": self.pack_member_max_bytes, "total_cap": self.pack_total_max_bytes}


@dataclass(frozen=True)
class WeightDigests:
    """What the receipt gate checks of a pack's weights, hashed by streaming
    (`train/exchange.weight_digests`): the file's sha256 and the checkpoint's content hash."""

    sha256: str
    content_hash: str | None  # None without a manifest


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


def history(models_dir: str | Path, name: str = HISTORY.name) -> list[dict]:
    return _read_records(Path(models_dir) / HISTORY.parent / name)


def rate_limit_gate(models_dir: str | Path, submitter: str, period_s: float, now: float | None = None, *,
                    history_name: str = HISTORY.name, key: str | None = None) -> GateResult:
    """Refuse when `submitter` (with `key`: the signing key, whatever name it came under) made a
    promotion attempt of this kind (`history_name`) less than `period_s` ago."""
    if period_s <= 0:
        return GateResult("rate limit", True, "off")
    now = time.time() if now is None else now
    last = None
    for rec in history(models_dir, history_name):
        # refused by the rate limit itself, or failed on the host's side (a broken king, a pointer
        # that could not be written): no attempt of the submitter's
        if rec.get("rate_limited") or rec.get("not_an_attempt"):
            continue
        if (rec.get("key") != key) if key is not None else (rec.get("key") is not None or
                                                           rec.get("submitter", DEFAULT_SUBMITTER) != submitter):
            continue
        t = _epoch(rec.get("at", ""))
        if t is not None and (last is None or t > last):
            last = t
    if last is not None and now - last < period_s:
        nxt = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last + period_s))
        who = f"{submitter!r} (key {key})" if key else repr(submitter)
        return GateResult("rate limit", False, f"{who} made an attempt at "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(last))}; one attempt per {period_s / 3600:g} h, "
                          f"next at {nxt} (gates.rate_limit_s)")
    who = f"{submitter!r} (key {key})" if key else repr(submitter)
    return GateResult("rate limit", True, f"no attempt by {who} in the last {period_s / 3600:g} h")


# --------------------------------------------------------------------------- duplicates


class SeenHeads:
    """Every head judged after scoring (promoted or refused), by behaviour:
    `models/promoted/seen/index.jsonl` plus one `<kind>-<content hash>.npz` (decisions and the
    centred score vector on the probe set) each. Append-only."""

    def __init__(self, models_dir: str | Path):
        self.dir = Path(models_dir) / SEEN_DIR

    def entries(self, kind: str | None = None) -> list[dict]:
        return [e for e in _read_records(self.dir / "index.jsonl")
                if "probe" in e and (kind is None or e.get("kind", "router") == kind)]

    def behaviour(self, entry: dict) -> Behaviour | None:
        try:
            with np.load(self.dir / entry["file"], allow_pickle=False) as z:
                return Behaviour(probe=entry["probe"], decisions=z["decisions"].astype(object), vector=z["vector"])
        except (OSError, ValueError, KeyError):
            return None

    def add(self, content_hash: str, seen: Behaviour, *, method: str, outcome: str, submitter: str,
            kind: str = "router") -> None:
        if any(e.get("content_hash") == content_hash and e.get("kind", "router") == kind for e in self.entries()):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{kind}-{content_hash}.npz"
        tmp = self.dir / f".{name}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, decisions=np.asarray([str(d) for d in seen.decisions]), vector=np.asarray(seen.vector, np.float64))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        rec = {"content_hash": content_hash, "method": method, "outcome": outcome, "submitter": submitter, "kind": kind,
               "probe": seen.probe, "size": int(seen.vector.size), "file": name,
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        fd = os.open(self.dir / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def duplicate_gate(seen: Behaviour, models_dir: str | Path, threshold: float, *, kind: str = "router",
                   king: tuple[str, Behaviour] | None = None, own_hash: str | None = None) -> GateResult:
    """Refuse a head whose behaviour on the probe set is within `threshold` cosine of a judged
    head's or the king's (`probe.py`)."""
    registry = SeenHeads(models_dir)
    entries = [e for e in registry.entries(kind) if e.get("content_hash") != own_hash]
    candidates = [(f"{e.get('method')} {e.get('content_hash')} ({e.get('outcome')})", registry.behaviour(e)) for e in entries]
    if king is not None and not any(king[0].endswith(str(e.get("content_hash"))) for e in entries):
        candidates.append((f"the king {king[0]}", king[1]))  # a king promoted before the registry existed
    best: tuple[float, float, str] | None = None
    compared = 0
    for label, other in candidates:
        if other is None or other.probe != seen.probe or other.vector.shape != seen.vector.shape:
            continue
        compared += 1
        c = seen.cosine(other)
        if best is None or c > best[0]:
            best = (c, seen.agreement(other), label)
    if best is not None and best[0] >= threshold:
        return GateResult("duplicate", False, f"behaves like {best[2]}: cosine {best[0]:.4f} of centred scores on "
                          f"{len(seen.decisions)} probes, same {seen.unit} on {best[1]:.0%} (must be < {threshold}): "
                          "a copy of a head already judged")
    if best is None:
        return GateResult("duplicate", True, f"no earlier {kind} head on these {len(seen.decisions)} probes "
                          f"({len(candidates)} on record)")
    return GateResult("duplicate", True, f"highest cosine {best[0]:.4f} (same {seen.unit} on {best[1]:.0%} of "
                      f"{len(seen.decisions)} probes) with {best[2]} of {compared} compared (< {threshold})")


# --------------------------------------------------------------------------- receipt


def paid_workers(data, worker_ids: list[str]) -> list[str] | None:
    """The workers the host's matrix records a positive cost for; [] when it records no cost at
    all, or only the mock workers' simulated costs (nobody was paid); None without host data."""
    if data is None:
        return None
    if data.cost_usd is None or getattr(data, "cost_simulated", False):
        return []
    cost = np.nan_to_num(np.asarray(data.cost_usd, float))
    return [w for i, w in enumerate(data.worker_ids) if w in worker_ids and cost[:, i].sum() > 0]


def receipt_gate(receipt, cfg: GateConfig, *, data=None, weights: bytes | WeightDigests | None = None, manifest=None,
                 ledger=None) -> GateResult:
    """The training receipt: fitness recorded for enough steps (the manifest's own curve), a cost
    where workers were paid, and (for a pack: `weights` its bytes or their digests, `manifest`,
    `ledger` the recomputed `LedgerSummary` of its ledger) that it names these very weights, agrees
    with the manifest and cites the ledger as it is."""
    if receipt is None:
        return GateResult("receipt", False, "no training receipt (receipt.json)")
    problems = []
    if isinstance(weights, bytes):
        from fugu_pipeline.train.checkpoints import checkpoint_hash

        weights = WeightDigests(hashlib.sha256(weights).hexdigest(),
                                None if manifest is None else checkpoint_hash(weights, manifest))
    if weights is not None:
        sha = weights.sha256
        if receipt.weights_sha256 != sha:
            problems.append(f"it names weights {receipt.weights_sha256[:12]}… but head.safetensors is {sha[:12]}…")
    if manifest is not None:
        from fugu_pipeline.train.exchange import fitness_of

        for field in ("content_hash", "method", "head_kind", "data_version", "contract_fingerprint", "worker_ids"):
            if getattr(receipt, field) != getattr(manifest, field):
                problems.append(f"{field} {getattr(receipt, field)!r} differs from the manifest's {getattr(manifest, field)!r}")
        if weights is not None and weights.content_hash != receipt.content_hash:
            problems.append("its content_hash is not the hash of these weights and this manifest")
        curve, fitness = fitness_of(manifest)
        if (receipt.fitness_curve, [round(v, 9) for v in receipt.fitness]) != (curve, [round(v, 9) for v in fitness]):
            problems.append(f"fitness {_short(receipt.fitness)} ({receipt.fitness_curve}) is not what training recorded in "
                            f"the manifest ({curve}: {_short(fitness)})")
        recorded = manifest.metrics.get("data_cost_usd")
        if weights is not None and recorded is not None and receipt.data_cost_usd is not None \
                and abs(float(recorded) - receipt.data_cost_usd) > 1e-9 * max(1.0, abs(float(recorded))):
            problems.append(f"training cost ${receipt.data_cost_usd:.4f} is not what training recorded in the manifest "
                            f"(${float(recorded):.4f})")
    if weights is not None:  # a pack: the receipt cites its cost ledger, which the host recomputed
        problems += _ledger_problems(receipt, ledger)
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
    if getattr(data, "cost_simulated", False) and receipt.data_cost_usd is not None:
        cost, cost_note = f"{cost}, simulated by the mock workers (their calls cost nothing real)", ""
    cited = f"; ledger {ledger.describe()}" if ledger is not None and not isinstance(ledger, str) else ""
    return GateResult("receipt", True, f"{receipt.steps} fitness steps ({receipt.fitness_curve}), training cost {cost}"
                      f"{cost_note}{cited}")


def _short(values) -> str:
    vals = [round(float(v), 4) for v in values]
    return str(vals if len(vals) <= 6 else [*vals[:3], "…", *vals[-2:]])


def _ledger_problems(receipt, ledger) -> list[str]:
    """Why the ledger does not support the receipt's figures (empty when it does). `ledger`: the
    recomputed summary, a string saying why it could not be read, or None (no ledger in the pack)."""
    if getattr(receipt, "ledger_head", None) is None:
        return ["it cites no cost ledger (pack it again with fugu-lite pack, which adds ledger.jsonl)"]
    if ledger is None:
        return ["it cites a cost ledger but the pack holds no ledger.jsonl"]
    if isinstance(ledger, str):
        return [f"its cost ledger cannot be verified: {ledger}"]
    problems = []
    if receipt.ledger_head != ledger.head or receipt.ledger_lines != ledger.lines:
        problems.append(f"it cites ledger head {receipt.ledger_head[:12]}… of {receipt.ledger_lines} line(s), the ledger's "
                        f"is {ledger.head[:12]}… of {ledger.lines}")
    theirs = {k: (t.calls, round(t.cost_usd, 6)) for k, t in (receipt.ledger_totals or {}).items()}
    mine = {k: (t.calls, round(t.cost_usd, 6)) for k, t in ledger.totals.items()}
    if theirs != mine:
        problems.append(f"its ledger totals {theirs} are not the ledger's {mine}")
    paid = ledger.paid()
    if receipt.data_cost_usd is not None and receipt.data_cost_usd > paid + 1e-9:
        problems.append(f"it claims a training cost of ${receipt.data_cost_usd:.4f}, the ledger's paid calls total "
                        f"${paid:.4f}")
    return problems
