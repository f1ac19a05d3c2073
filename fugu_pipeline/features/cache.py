"""Content-addressed cache of task embeddings: a prompt is embedded once per encoder fingerprint
(§3).

Layout, one directory per encoder fingerprint:

    <root>/<fingerprint>/meta.json                  dim, feature contract, encoder description
    <root>/<fingerprint>/<time>-<pid>-<rand>.safetensors   one shard per write:
                                                    keys (n, 32) uint8, vectors (n, dim) float32

The key is `sha256_text(formatted prompt)`, the exact text the encoder reads (after the prompt
rules and the template), so a template, domain or strip-rule change re-keys. Shards are append-only and each carries its own keys, so the index is
the union of the shards' `keys` tensors: there is no shared index file to lock or to lose an
update to. Every file is written under a temporary name, fsynced and renamed into place, so a
reader never sees half a shard and a crash leaves at most an ignored `.tmp-*` file. Two writers
racing on the same prompts both write a shard; the vectors agree and the first one read wins.

Plain Python: numpy + safetensors; the encoder (and torch) is loaded only for missing prompts.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.encoder import Encoder, LazyEncoder
from fugu_pipeline.features.lexical import LEXICAL_DIM
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.files import atomic_write
from fugu_pipeline.hashing import sha256_text

META = "meta.json"
SHARD_SUFFIX = ".safetensors"
KEY_BYTES = 32


class EmbeddingCache:
    """The vectors of one encoder fingerprint under `<root>/<fingerprint>/`."""

    def __init__(self, root: str | Path, fingerprint: str):
        self.fingerprint = fingerprint
        self.dir = Path(root) / fingerprint
        self._index: dict[bytes, tuple[Path, int]] = {}
        self._seen: set[str] = set()
        self._meta: dict | None = None

    # ----------------------------------------------------------------- metadata

    def meta(self) -> dict | None:
        """The directory's meta.json (read once: it never changes after it is written)."""
        if self._meta is None:
            try:
                meta = json.loads((self.dir / META).read_text(encoding="utf-8"))
            except FileNotFoundError:
                return None
            except (ValueError, UnicodeDecodeError) as exc:  # truncated or overwritten
                raise ValueError(f"embedding cache {self.dir / META} is not valid JSON ({exc}); "
                                 f"delete {self.dir} to rebuild it") from None
            dim = meta.get("dim") if isinstance(meta, dict) else None
            if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
                raise ValueError(f"embedding cache {self.dir / META} has no positive integer 'dim' (holds "
                                 f"{str(meta)[:80]}); delete {self.dir} to rebuild it")
            self._meta = meta
        return self._meta

    @property
    def dim(self) -> int | None:
        meta = self.meta()
        return meta["dim"] if meta else None

    def write_meta(self, dim: int, **extra) -> None:
        """Record `dim` (and e.g. the contract) once; a different dim for this fingerprint is an error."""
        known = self.dim
        if known is not None:
            if known != dim:
                raise ValueError(f"embedding cache {self.dir} holds dim {known} vectors, encoder gives {dim}")
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"fingerprint": self.fingerprint, "dim": int(dim), "created_at": time.time(), **extra}
        atomic_write(self.dir / META, json.dumps(meta, indent=2, sort_keys=True).encode())
        self._meta = meta

    # ----------------------------------------------------------------- index

    def refresh(self) -> None:
        """Read the keys of shards written since the last look (by any process)."""
        from safetensors import safe_open

        if not self.dir.is_dir():
            return
        dim = self.dim  # read once, outside the per-shard guard: a damaged meta.json is its own error
        for path in sorted(self.dir.glob("*" + SHARD_SUFFIX)):
            if path.name in self._seen:  # temporary files end in .tmp, never in the shard suffix
                continue
            self._seen.add(path.name)
            try:
                with safe_open(str(path), framework="np") as f:
                    keys = f.get_tensor("keys")
                    shape = tuple(f.get_slice("vectors").get_shape())
                    dtype = f.get_slice("vectors").get_dtype()
                if keys.ndim != 2 or keys.shape[1] != KEY_BYTES or shape != (len(keys), dim if dim else shape[-1]) \
                        or dtype != "F32":  # e.g. a shard of another encoder copied in
                    raise ValueError(f"keys {keys.shape}, vectors {shape} {dtype}; expected vectors ({len(keys)}, {dim}) F32")
            except Exception as exc:  # a damaged shard only costs a re-computation
                warnings.warn(f"skipping unreadable embedding-cache shard {path}: {exc}", stacklevel=2)
                continue
            for row, key in enumerate(keys):
                self._index.setdefault(key.tobytes(), (path, row))

    def __len__(self) -> int:
        self.refresh()
        return len(self._index)

    def get_many(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(found mask (N,) bool, vectors (N, dim) float32); rows not found are zeros.
        With nothing cached yet the dim is unknown and vectors has shape (N, 0)."""
        from safetensors import safe_open

        self.refresh()
        found = np.zeros(len(keys), dtype=bool)
        vectors = np.zeros((len(keys), self.dim or 0), dtype=np.float32)
        by_shard: dict[Path, list[tuple[int, int]]] = {}
        for i, key in enumerate(keys):
            hit = self._index.get(bytes.fromhex(key))
            if hit is not None:
                by_shard.setdefault(hit[0], []).append((i, hit[1]))
        if by_shard and vectors.shape[1] == 0:
            raise ValueError(f"embedding cache {self.dir} has shards but no {META}; delete the directory to rebuild it")
        for path, pairs in by_shard.items():
            with safe_open(str(path), framework="np") as f:
                shard = f.get_tensor("vectors")
            rows = np.array(pairs)
            vectors[rows[:, 0]] = shard[rows[:, 1]]
            found[rows[:, 0]] = True
        return found, vectors

    def put_many(self, keys: list[str], vectors: np.ndarray) -> int:
        """Append the vectors of keys not cached yet as one new shard; returns how many were new."""
        from safetensors.numpy import save

        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(keys) != len(vectors):
            raise ValueError(f"{len(keys)} keys for vectors of shape {vectors.shape}")
        dim = self.dim
        if dim is None:
            self.write_meta(vectors.shape[1])
        elif vectors.shape[1] != dim:
            raise ValueError(f"embedding cache {self.dir} holds dim {dim} vectors, got {vectors.shape[1]}")
        self.refresh()
        new: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            raw = bytes.fromhex(key)
            if raw not in self._index and raw not in new:
                new[raw] = i
        if not new:
            return 0
        key_arr = np.frombuffer(b"".join(new), dtype=np.uint8).reshape(len(new), KEY_BYTES)
        data = save({"keys": key_arr, "vectors": np.ascontiguousarray(vectors[list(new.values())])})
        path = self.dir / f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SHARD_SUFFIX}"
        atomic_write(path, data)
        self._seen.add(path.name)
        for row, raw in enumerate(new):
            self._index[raw] = (path, row)
        return len(new)


# --------------------------------------------------------------------------- high level


@dataclass
class EmbedResult:
    """Vectors in input order and what it took to get them."""

    vectors: np.ndarray  # (N, dim) float32
    n_cached: int  # input prompts served from the cache
    n_computed: int  # distinct formatted texts encoded by this call
    fingerprint: str
    contract: FeatureContract
    keys: list[str] = field(default_factory=list)  # cache key per input prompt
    encoder_description: str = ""
    forward_passes: int = 0  # forward passes run by this call
    loaded_model: bool = False  # whether this call had to load the weights
    seconds: float = 0.0


def as_lazy_encoder(encoder_or_factory: Encoder | LazyEncoder | EncoderSettings) -> LazyEncoder:
    if isinstance(encoder_or_factory, LazyEncoder):
        return encoder_or_factory
    if isinstance(encoder_or_factory, Encoder):
        return LazyEncoder.wrap(encoder_or_factory)
    if isinstance(encoder_or_factory, EncoderSettings):
        return LazyEncoder(encoder_or_factory)
    raise TypeError(
        "embed_prompts needs an Encoder, a LazyEncoder or EncoderSettings (a bare callable cannot "
        f"tell the cache fingerprint without loading the model), got {type(encoder_or_factory).__name__}"
    )


DEFAULT_CHUNK = 512  # prompts encoded between two cache writes


def _progress_fn(progress, total: int, description: str):
    """A callable(done) from `progress`: True = a tqdm bar on stderr, a callable(done, total), or None."""
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="prompt", desc=description, mininterval=1.0, file=sys.stderr)
        return lambda done: bar.update(done - bar.n), bar.close
    if callable(progress):
        return lambda done: progress(done, total), lambda: None
    return lambda done: None, lambda: None


def embed_prompts(
    prompts: list[str],
    domains: list[str] | None,
    encoder_or_factory: Encoder | LazyEncoder | EncoderSettings,
    cache_root: str | Path,
    *,
    progress=None,
    chunk_size: int = DEFAULT_CHUNK,
) -> EmbedResult:
    """Embed prompts through the cache: encode only the distinct texts not cached under this
    encoder's fingerprint, store them, and return every vector in input order. The model is
    loaded only when something is missing.

    The missing texts are encoded in chunks of `chunk_size` (longest first, so a chunk's prompts
    share lengths and batch well), and each chunk is written to the cache as its own shard as soon
    as it is done: an interrupted run (Ctrl-C, a kill, a crash) keeps every finished chunk, and the
    next run encodes only the rest. `progress`: True for a progress bar on stderr, or a
    callable(done, total) called after each chunk."""
    t0 = time.perf_counter()
    lazy = as_lazy_encoder(encoder_or_factory)
    was_loaded = lazy.loaded
    texts = lazy.settings.format(list(prompts), domains)
    keys = [sha256_text(t) for t in texts]
    cache = EmbeddingCache(cache_root, lazy.fingerprint)
    found, vectors = cache.get_many(keys)
    missing = {keys[i]: texts[i] for i in np.flatnonzero(~found)}  # deduplicated, in order
    passes = 0
    if missing or cache.dim is None:
        encoder = lazy.get()
        if encoder.fingerprint != cache.fingerprint:
            raise RuntimeError(f"encoder fingerprint {encoder.fingerprint} != planned {cache.fingerprint}")
        before = encoder.forward_passes
        cache.write_meta(encoder.dim, contract=encoder.feature_contract().model_dump(mode="json", exclude={"prompt_rules"}),
                         encoder=encoder.describe())
        if vectors.shape[1] != encoder.dim:
            vectors = np.zeros((len(keys), encoder.dim), dtype=np.float32)
        order = sorted(missing, key=lambda k: -len(missing[k]))
        report, close = _progress_fn(progress, len(order), "embedding")
        new: dict[str, np.ndarray] = {}
        try:
            for start in range(0, len(order), max(1, chunk_size)):
                chunk = order[start : start + max(1, chunk_size)]
                got = encoder.encode_texts([missing[k] for k in chunk])
                cache.put_many(chunk, got)  # on disk before the next chunk starts
                new.update(zip(chunk, got))
                report(start + len(chunk))
        finally:
            close()
        passes = encoder.forward_passes - before
        for i in np.flatnonzero(~found):
            vectors[i] = new[keys[i]]
    dim = cache.dim
    return EmbedResult(
        vectors=vectors,
        n_cached=int(found.sum()),
        n_computed=len(missing),
        fingerprint=cache.fingerprint,
        contract=lazy.settings.feature_contract(dim),
        keys=keys,
        encoder_description=lazy.describe(),
        forward_passes=passes,
        loaded_model=lazy.loaded and not was_loaded,
        seconds=time.perf_counter() - t0,
    )


def embed_layer_sets(
    prompts: list[str],
    domains: list[str] | None,
    settings_list: list[EncoderSettings],
    cache_root: str | Path,
    *,
    progress=None,
    chunk_size: int = DEFAULT_CHUNK,
) -> int:
    """Fill the cache of every setting in `settings_list` (settings that differ only in their
    encoder layers, e.g. [-1] and [-1, 3]) with one forward pass per prompt: the model runs once
    with the union of their layers, and each setting's vector is its own layers' blocks (each layer
    is pooled and normalised on its own) plus the lexical block. Those are the vectors a separate
    run of that setting computes (within the dtype's tolerance; bit for bit where the kernels give
    it: `parity.py`, tested), stored under that setting's fingerprint, so
    `embed_prompts` then finds every one cached. Chunked and crash-safe like `embed_prompts`.
    Returns how many distinct texts were encoded."""
    if not settings_list:
        return 0
    first = settings_list[0]
    rest = first.model_dump(exclude={"layer"})
    for s in settings_list[1:]:
        if s.model_dump(exclude={"layer"}) != rest:
            raise ValueError("embed_layer_sets: the settings must differ only in their layers")
    union: list[int] = []
    for s in settings_list:
        union += [layer for layer in s.layers if layer not in union]
    texts = first.format(list(prompts), domains)  # the layers do not change the text
    keys = [sha256_text(t) for t in texts]
    caches = [EmbeddingCache(cache_root, LazyEncoder(s).fingerprint) for s in settings_list]
    missing_in = [set(np.asarray(keys, dtype=object)[~c.get_many(keys)[0]].tolist()) for c in caches]
    todo = set().union(*missing_in)
    if not todo:
        return 0
    encoder = Encoder.load(EncoderSettings.model_validate({**first.model_dump(), "layer": tuple(union)}))
    try:
        hidden = (encoder.dim - (LEXICAL_DIM if first.lexical else 0)) // len(union)
        columns = []
        for s, cache in zip(settings_list, caches):
            cols = [np.arange(union.index(layer) * hidden, (union.index(layer) + 1) * hidden) for layer in s.layers]
            if s.lexical:
                cols.append(np.arange(encoder.dim - LEXICAL_DIM, encoder.dim))
            idx = np.concatenate(cols)
            contract = s.feature_contract(len(idx))
            cache.write_meta(len(idx), contract=contract.model_dump(mode="json", exclude={"prompt_rules"}),
                             encoder=s.describe(encoder.resolved_device, encoder.resolved_dtype, len(idx))
                             + f", fingerprint {cache.fingerprint}")
            columns.append(idx)
        text_of = dict(zip(keys, texts))
        order = sorted(todo, key=lambda k: -len(text_of[k]))
        report, close = _progress_fn(progress, len(order), "embedding (layer sets)")
        try:
            for start in range(0, len(order), max(1, chunk_size)):
                chunk = order[start : start + max(1, chunk_size)]
                got = encoder.encode_texts([text_of[k] for k in chunk])
                for cache, idx, missing in zip(caches, columns, missing_in):
                    rows = [i for i, k in enumerate(chunk) if k in missing]
                    if rows:
                        cache.put_many([chunk[i] for i in rows], np.ascontiguousarray(got[np.ix_(rows, idx)]))
                report(start + len(chunk))
        finally:
            close()
    finally:
        encoder.close()
    return len(order)
