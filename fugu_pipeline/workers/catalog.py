"""The OpenRouter model catalog: fetch it, store it, compare two snapshots, price a call.

A snapshot keeps, per model, what decides the answers and the cost of a worker: pricing,
context length, supported parameters and expiration date, hashed into a `fingerprint`. When a
configured worker's fingerprint changes, its cells were answered by a different offer and are
collected again (the `catalog_change_sensor`).

Storage: `data/catalog/latest.json` (replaced atomically) and
`data/catalog/history/<UTC time>-<digest>.json`, written only when the catalog's content changed.
Plain Python, no dagster.
"""

from __future__ import annotations

import asyncio
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.api_keys import scrub_secrets
from fugu_pipeline.files import atomic_write
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.workers.contract import WorkerCallError
from fugu_pipeline.workers.retry import (
    Retryable,
    RetryPolicy,
    retryable_status,
    with_retries,
)

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
MAX_CATALOG_BYTES = 64 << 20  # OpenRouter's catalog is a few MiB; past this a reply is not a catalog


def catalog_base_url(explicit: str | None = None) -> str:
    """The API root whose `/models` is the catalog: `explicit` (a flag), else
    `$FUGU_OPENROUTER_BASE_URL` (a proxy, a mirror, a local stub), else OpenRouter's own API. The
    catalog asset and `fugu-lite list-models` read it here, so both list the same catalog."""
    from fugu_pipeline.settings import settings

    return explicit or settings().openrouter_base_url or OPENROUTER_BASE_URL


class CatalogError(RuntimeError):
    """The catalog could not be fetched or read; the message says why. Never holds a key."""


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    name: str = ""
    pricing: dict[str, str] = Field(default_factory=dict, description="USD per token, as OpenRouter gives it")
    context_length: int | None = None
    supported_parameters: list[str] = Field(default_factory=list)
    expiration_date: str | None = None
    fingerprint: str = ""
    max_completion_tokens: int | None = Field(None, description="top_provider.max_completion_tokens: the most "
                                              "completion tokens a request may ask for (not in the fingerprint: "
                                              "it bounds what the server asks, not what a worker answers)")


def model_fingerprint(pricing: dict[str, str], context_length: int | None,
                      supported_parameters: list[str], expiration_date: str | None) -> str:
    """16 hex digits over what changes a worker's offer. Zero prices are dropped, so OpenRouter
    adding a new free price field does not count as a change."""
    prices = {k: str(v) for k, v in pricing.items() if _float(v) != 0.0}
    return sha256_text(canonical_json({
        "pricing": prices,
        "context_length": context_length,
        "supported_parameters": sorted(set(supported_parameters)),
        "expiration_date": expiration_date,
    }))[:16]


def _float(v: object) -> float | None:
    """A finite number, else None (a price of "nan" or "inf" is no price)."""
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def entry_from_api(raw: dict) -> ModelEntry:
    """One model of the API's list. Raises ValueError naming the field when the entry is malformed."""
    pricing = raw.get("pricing") or {}
    if not isinstance(pricing, dict):
        raise ValueError(f"pricing is a {type(pricing).__name__}, not an object")
    pricing = {str(k): str(v) for k, v in pricing.items() if v is not None}
    ctx = raw.get("context_length")
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, (int, float)) or _float(ctx) is None or ctx < 0):
        raise ValueError(f"context_length {str(ctx)[:40]} is not a non-negative finite number")
    ctx = int(ctx) if ctx is not None else None
    params = raw.get("supported_parameters") or []
    if not isinstance(params, list):
        raise ValueError(f"supported_parameters is a {type(params).__name__}, not a list")
    params = [str(p) for p in params]
    exp = raw.get("expiration_date")
    top = raw.get("top_provider")
    most = top.get("max_completion_tokens") if isinstance(top, dict) else None
    if isinstance(most, bool) or not isinstance(most, (int, float)) or _float(most) is None or most < 1:
        most = None  # absent or malformed: unknown (the entry stays; this limit is not part of its offer)
    most = int(most) if most is not None else None
    return ModelEntry(
        id=str(raw["id"]),
        name=str(raw.get("name") or raw["id"]),
        pricing=pricing,
        context_length=ctx,
        supported_parameters=params,
        expiration_date=str(exp) if exp else None,
        fingerprint=model_fingerprint(pricing, ctx, params, str(exp) if exp else None),
        max_completion_tokens=most,
    )


class CatalogSnapshot(BaseModel):
    model_config = ConfigDict(extra="ignore")

    fetched_at: str = Field(description="UTC time of the fetch, ISO 8601")
    source: str = ""
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    skipped: list[str] = Field(default_factory=list, description="malformed entries left out, each with why")

    def fingerprint(self, model_id: str) -> str | None:
        m = self.models.get(model_id)
        return m.fingerprint if m else None

    def price_per_token(self, model_id: str) -> tuple[float, float] | None:
        """(prompt, completion) USD per token, or None when the model or its prices are unknown."""
        m = self.models.get(model_id)
        if m is None:
            return None
        p, c = _float(m.pricing.get("prompt")), _float(m.pricing.get("completion"))
        if p is None or c is None or p < 0 or c < 0:  # OpenRouter gives -1 for "varies" (openrouter/auto)
            return None
        return p, c

    def digest(self) -> str:
        """Hash of every model's fingerprint: equal digests, same catalog content."""
        return sha256_text(canonical_json({k: v.fingerprint for k, v in sorted(self.models.items())}))[:16]


def snapshot_from_api(payload: dict, source: str = "") -> CatalogSnapshot:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise CatalogError(f"{source or 'catalog'}: expected a JSON object with a 'data' list of models")
    models, skipped = {}, []
    for raw in data:
        if isinstance(raw, dict) and raw.get("id"):
            try:
                e = entry_from_api(raw)
            except ValueError as exc:  # one malformed entry must not block the catalog: it is left out
                skipped.append(f"{str(raw['id'])[:120]}: {exc}")
                continue
            models[e.id] = e
    return CatalogSnapshot(fetched_at=_now_iso(), source=source, models=models, skipped=skipped)


def fetch_catalog(base_url: str = OPENROUTER_BASE_URL, api_key: str | None = None, *,
                  timeout_s: float = 30.0, attempts: int = 3, deadline_s: float | None = None) -> CatalogSnapshot:
    """GET `<base_url>/models` (from synchronous code). The key is optional (the endpoint is
    public); it is sent only as a header. Retries follow the workers' one retry policy, within
    `deadline_s` in all (default: timeout_s x attempts + 5 s)."""
    return asyncio.run(fetch_catalog_async(base_url, api_key, timeout_s=timeout_s, attempts=attempts,
                                           deadline_s=deadline_s))


async def fetch_catalog_async(base_url: str = OPENROUTER_BASE_URL, api_key: str | None = None, *,
                              timeout_s: float = 30.0, attempts: int = 3,
                              deadline_s: float | None = None) -> CatalogSnapshot:
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if deadline_s is not None:
        timeout_s = min(timeout_s, deadline_s)
    policy = RetryPolicy(max_attempts=attempts, deadline_s=deadline_s or timeout_s * attempts + 5.0)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))) as http:

        async def attempt() -> CatalogSnapshot:
            try:
                async with http.stream("GET", url, headers=headers) as r:
                    body = await _read_capped(r, url)
            except httpx.HTTPError as exc:
                raise Retryable(f"{type(exc).__name__}: {exc}") from None
            if r.status_code == 200:
                try:
                    return snapshot_from_api(json.loads(body), source=url)
                except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth ("[[[[...")
                    raise Retryable("the reply is not valid JSON") from None
            if retryable_status(r.status_code):
                raise Retryable(f"HTTP {r.status_code}")
            text = "".join(c if c.isprintable() else " " for c in scrub_secrets(body.decode("utf-8", "replace"), api_key)[:2000])
            text = " ".join(text.split())  # one printable line, even from an HTML page
            raise CatalogError(f"GET {url}: HTTP {r.status_code}: {text[:300]}")

        try:
            return (await with_retries(attempt, policy, where=f"GET {url}", waiting_for="no catalog")).value
        except WorkerCallError as exc:
            raise CatalogError(f"{scrub_secrets(str(exc), api_key)}; check the network and the catalog base_url") from None


async def _read_capped(r: httpx.Response, url: str) -> bytes:
    """The body of a reply, refused past MAX_CATALOG_BYTES (declared or streamed): an endless or
    huge reply (a wrong base_url, a broken proxy) would otherwise fill the memory of the process
    that runs the sensor until the overall deadline."""
    limit_mib = MAX_CATALOG_BYTES >> 20
    declared = r.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_CATALOG_BYTES:
        raise CatalogError(f"GET {url}: the reply declares {int(declared) >> 20} MiB, over the catalog limit of "
                           f"{limit_mib} MiB; check the catalog base_url")
    chunks, size = [], 0
    async for chunk in r.aiter_bytes():
        size += len(chunk)
        if size > MAX_CATALOG_BYTES:
            raise CatalogError(f"GET {url}: the reply passed the catalog limit of {limit_mib} MiB and was cut; "
                               "check the catalog base_url")
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- storage


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, text: str) -> None:
    atomic_write(path, text)


def save_snapshot(snapshot: CatalogSnapshot, folder: str | Path) -> Path:
    """Replace `latest.json`; add a history file when the content differs from the previous
    latest. Returns the path of latest.json."""
    folder = Path(folder)
    try:
        prev = load_latest(folder)
    except CatalogError:  # an unreadable latest.json is replaced; every content it held is in history/
        prev = None
    text = snapshot.model_dump_json(indent=1)
    if prev is None or prev.digest() != snapshot.digest():
        stamp = snapshot.fetched_at.replace(":", "").replace("+0000", "Z")
        write_json_atomic(folder / "history" / f"{stamp}-{snapshot.digest()}.json", text)
    latest = folder / "latest.json"
    write_json_atomic(latest, text)
    return latest


def load_snapshot(path: str | Path) -> CatalogSnapshot:
    path = Path(path)
    try:
        return CatalogSnapshot.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise CatalogError(f"{path}: no catalog snapshot; fetch one (materialize openrouter_catalog)") from None
    except ValueError as exc:
        why = " ".join(str(exc).split())[:300]
        raise CatalogError(f"{path}: not a catalog snapshot ({why}); delete it: the next catalog fetch writes it "
                           "again (every earlier content is in history/)") from None


def load_latest(folder: str | Path) -> CatalogSnapshot | None:
    p = Path(folder) / "latest.json"
    return load_snapshot(p) if p.exists() else None


# --------------------------------------------------------------------------- comparing


class CatalogDiff(BaseModel):
    changed: dict[str, tuple[str | None, str]] = Field(
        default_factory=dict, description="worker id -> (old fingerprint, new fingerprint)")
    retired: list[str] = Field(default_factory=list, description="workers whose model left the catalog")
    added: list[str] = Field(default_factory=list, description="model ids new in the catalog")
    removed: list[str] = Field(default_factory=list, description="model ids gone from the catalog")

    @property
    def empty(self) -> bool:
        return not (self.changed or self.retired or self.added or self.removed)


def diff_snapshots(old: CatalogSnapshot | dict[str, str] | None, new: CatalogSnapshot,
                   configured: dict[str, str]) -> CatalogDiff:
    """Compare two catalogs for the configured workers (worker id -> model id). `old` may be a
    snapshot, a {model id: fingerprint} map, or None (no baseline: nothing counts as changed).
    A worker counts as changed only when its model is in both and the fingerprints differ."""
    old_fps = old if isinstance(old, dict) or old is None else {k: m.fingerprint for k, m in old.models.items()}
    old_fps = old_fps or {}
    diff = CatalogDiff()
    for worker_id, model_id in sorted(configured.items()):
        new_fp = new.fingerprint(model_id)
        if new_fp is None:
            diff.retired.append(worker_id)
        elif old_fps.get(model_id) not in (None, new_fp):
            diff.changed[worker_id] = (old_fps[model_id], new_fp)
    if old is not None:
        diff.added = sorted(set(new.models) - set(old_fps))
        diff.removed = sorted(set(old_fps) - set(new.models))
    return diff


# --------------------------------------------------------------------------- listing


def list_models(snapshot: CatalogSnapshot, contains: str | None = None, limit: int | None = 30) -> list[dict[str, str]]:
    """Printable rows (id, name, $ per million input/output tokens, context), sorted by id;
    `contains` filters id or name, case-insensitively."""
    needle = (contains or "").lower()
    rows = []
    for mid in sorted(snapshot.models):
        m = snapshot.models[mid]
        if needle and needle not in mid.lower() and needle not in m.name.lower():
            continue
        price = snapshot.price_per_token(mid)
        rows.append({
            "id": mid,
            "name": m.name,
            "in_per_mtok": f"{price[0] * 1e6:.4g}" if price else "?",
            "out_per_mtok": f"{price[1] * 1e6:.4g}" if price else "?",
            "context": str(m.context_length or "?"),
        })
        if limit is not None and len(rows) >= limit:
            break
    return rows


def format_rows(rows: list[dict[str, str]]) -> str:
    """A plain-text table of `list_models` rows."""
    cols = [("id", "model"), ("in_per_mtok", "$/M in"), ("out_per_mtok", "$/M out"), ("context", "context")]
    widths = [max([len(h)] + [len(r[k]) for r in rows]) for k, h in cols]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(cols, widths))]
    lines += ["  ".join(r[k].ljust(w) for (k, _), w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- retired workers


def update_retired(folder: str | Path, retired: list[str], configured: dict[str, str]) -> Path:
    """Rewrite `retired.json`: the configured workers whose model left the catalog, each with its
    model and since when. A worker whose model came back drops out. Partitions stay untouched."""
    path = Path(folder) / "retired.json"
    before = load_retired(folder)
    now = _now_iso()
    workers = {w: {"model": configured[w], "since": before.get(w, {}).get("since", now)} for w in sorted(retired)}
    write_json_atomic(path, canonical_json({"updated_at": now, "workers": workers}))
    return path


def load_retired(folder: str | Path) -> dict[str, dict]:
    """worker id -> {"model", "since"} for every retired worker (empty when none or no file)."""
    path = Path(folder) / "retired.json"
    if not path.exists():
        return {}
    try:
        workers = json.loads(path.read_text(encoding="utf-8")).get("workers", {})
    except (ValueError, AttributeError):
        workers = None
    if not isinstance(workers, dict) or not all(isinstance(v, dict) for v in workers.values()):
        raise CatalogError(f"{path}: not a retired-workers file (expected an object with a 'workers' object); delete "
                           "it: the next catalog fetch writes it again")
    return workers
