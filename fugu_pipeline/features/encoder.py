"""The frozen encoder that turns a task prompt into a feature vector.

`Encoder` loads the model its `EncoderSettings` name once (tokenizer + `transformers.AutoModel`,
frozen, eval mode) and encodes prompts in batches of one padded length under a token budget
(`plan_batches`: a prompt runs at the same padded length alone or in any batch, so its vector
agrees within the dtype's tolerance everywhere, and bit for bit where the CPU's kernels give a row
the same bits in any batch shape: `parity.py`).
`LazyEncoder` holds settings and loads the weights only on first use, so a call whose prompts are
all cached never loads them.

Bounded cost per prompt. The encoder reads at most `max_length` tokens, so a prompt is cut to
`max_length * MAX_CHARS_PER_TOKEN` characters BEFORE it is tokenized (`cut_text`): a 2 MB prompt
costs what an 8 KB one costs. Why 16 characters per token is safe: over 5,989 real router prompts
(the sample batch, LLMRouter's dcrouter queries, RouteLLM's GSM8K and MMLU), all-MiniLM-L6-v2's
WordPiece tokenizer averages 4.3 characters per token (99th percentile 5.9, worst 9.0) and the
tiny encoder's BPE 2.1 (worst 4.3); the longest entry of either vocabulary is 18 characters. So
the first `max_length * 16` characters hold far more than `max_length` tokens, the cut falls in
tokens that truncation drops anyway, and the token ids (hence the features) are exactly those of
the uncut prompt: cached training features stay valid. Only text averaging over 16 characters
per token for its first `max_length` tokens (a long run of one repeated symbol, an over-long
"word" a WordPiece vocabulary reads as one [UNK]) can tokenize differently, and then identically
in training and serving, because both go through `Encoder.tokenize`. Lone UTF-16 surrogates
(valid in JSON, not encodable as UTF-8) become U+FFFD there too, so such text can never crash a
batch of prompts.

Native caches (`bound_native_caches`). In bfloat16 on a CPU, every new input shape makes oneDNN
and PyTorch's ideep layer build and cache a matmul primitive with its buffers (about 1 MB each
for the tiny encoder; 1,024 entries per cache by default), so a server seeing prompts of many
lengths grew from 0.35 GB to 1.2 GB. `Encoder.load` caps both caches for bf16 on CPU (unless the
variables are already set); fp32 uses other kernels and stays flat without it.

Plain Python: no dagster; torch and transformers are imported inside functions, so importing this
module is cheap.
"""

from __future__ import annotations

import gc
import os

import numpy as np

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.features.hf_logging import quiet_transformers
from fugu_pipeline.features.lexical import LEXICAL_DIM, lexical_features
from fugu_pipeline.features.settings import (
    PAD_MULTIPLE,
    EncoderLoadError,
    EncoderSettings,
    hub_offline,
    offline_help,
)


MAX_CHARS_PER_TOKEN = 16
NATIVE_CACHE_CAPACITY = 32  # entries in oneDNN's primitive cache and ideep's LRU cache (bf16 on CPU)
NATIVE_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def cut_text(text: str, max_length: int) -> str:
    """`text` cut to `max_length * MAX_CHARS_PER_TOKEN` characters, lone surrogates replaced by
    U+FFFD: what the tokenizer reads (see the module docstring for why the cut is exact)."""
    text = text[: max_length * MAX_CHARS_PER_TOKEN]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): the tokenizer cannot take it
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def bound_native_caches(capacity: int = NATIVE_CACHE_CAPACITY) -> dict[str, str]:
    """Cap oneDNN's primitive cache and ideep's LRU cache (read when they are first used), unless
    the environment already sets them. Returns the values in force."""
    for name in NATIVE_CACHE_VARIABLES:
        os.environ.setdefault(name, str(capacity))
    return {name: os.environ[name] for name in NATIVE_CACHE_VARIABLES}


def padded_length(n: int, max_length: int, multiple: int = PAD_MULTIPLE) -> int:
    """The length a sequence of `n` tokens is padded to, wherever it is encoded: the next multiple
    of `multiple` above `n` (one pad at least, so that nearly every batch runs the same masked
    attention), never past `max_length` (where a sequence cut to max_length runs unpadded)."""
    return min((n // multiple + 1) * multiple, max(max_length, n))


def plan_batches(lengths: list[int], token_budget: int, max_batch_size: int, max_length: int,
                 multiple: int = PAD_MULTIPLE) -> list[list[int]]:
    """Batches of sequences that share a padded length (`padded_length`) and whether they are
    padded at all, longest first, cut so that padded length x batch size <= token_budget (a longer
    sequence gets a batch of its own) and at most max_batch_size.

    Why this makes a prompt's vector independent of the prompts it happens to be batched with (so
    the cache, `route` and `serve`, which encode one prompt or a micro-batch, compute the same
    vector): a prompt is always run at its own padded length, alone or in any batch, and always
    through the same attention path. A batch with no padding at all runs causal attention without
    a mask (transformers then skips it), any other with an explicit mask; a sequence is padded by
    one token at least, and the few that cannot be (cut to max_length) never share a batch with
    padded ones. What is left is the batch size: the code gives it no say, but a CPU's matmul kernels may pick
    another order of additions for another number of rows (oneDNN/AMX on Intel Xeons do), which
    moves the last bits: within `parity.vector_tolerance`, bit-equal where the kernels are
    batch-invariant (`parity.batch_invariance` probes it; tested for the tiny Qwen3 and MiniLM, in
    bf16 and fp32, alone, in micro-batches and in the cache's batches). Exact-length batches would
    avoid padding too, but cut 18k prompts of many lengths into many small forward passes; padding to a multiple of 8 costs 4.5
    tokens a sequence on average and fills the batches again."""
    by_shape: dict[tuple[int, bool], list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        width = padded_length(lengths[i], max_length, multiple)
        by_shape.setdefault((width, width == lengths[i]), []).append(i)
    batches: list[list[int]] = []
    for (width, _), rows in sorted(by_shape.items(), key=lambda kv: (-kv[0][0], not kv[0][1])):
        size = max(1, min(max_batch_size, token_budget // max(width, 1)))
        batches += [rows[k : k + size] for k in range(0, len(rows), size)]
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
        self.dim = int(model.config.hidden_size) * len(settings.layers) + (LEXICAL_DIM if settings.lexical else 0)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.forward_passes = 0
        self.prompts_encoded = 0

    @classmethod
    def load(cls, settings: EncoderSettings) -> "Encoder":
        """Load tokenizer and model once; raise EncoderLoadError (with the offline options) when
        they cannot be loaded."""
        local_only = settings.check_loadable()  # fails at once when a hub model can be neither found nor fetched
        import torch
        from transformers import AutoModel, AutoTokenizer

        device = settings.resolve_device()
        dtype = settings.resolve_dtype(device)
        if device == "cpu" and dtype == "bfloat16":
            bound_native_caches()
        directory = settings.local_dir()
        source = str(directory) if directory is not None else settings.model
        kwargs: dict = {"local_files_only": local_only}
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
        for layer in settings.layers:
            if n_layers is not None and not -(n_layers + 1) <= layer <= n_layers:
                raise EncoderLoadError(f"layer {layer} out of range for a {n_layers}-layer model "
                                       f"(hidden_states has {n_layers + 1} entries: 0 = embeddings, -1 = last)")
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos is not None and settings.max_length > max_pos:
            raise EncoderLoadError(
                f"max_length {settings.max_length} exceeds the model's {max_pos} positions; lower it"
            )
        fingerprint = settings.fingerprint(dtype, settings.model_identity())
        return cls(settings, tokenizer, model, device=device, dtype=dtype, fingerprint=fingerprint)

    # ----------------------------------------------------------------- encoding

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, truncated to max_length; an empty text becomes one pad token. Each
        text is cut to a bounded number of characters first (`cut_text`), in training and serving."""
        n = self.settings.max_length
        ids = self.tokenizer(
            [cut_text(t, n) for t in texts], add_special_tokens=True, truncation=True, max_length=self.settings.max_length,
            return_attention_mask=False, return_token_type_ids=False,
        )["input_ids"]
        return [seq if seq else [self.pad_id] for seq in ids]

    def encode(self, prompts: list[str], domains: list[str] | None = None) -> np.ndarray:
        """Feature vectors (N, dim) float32 for prompts, in input order."""
        return self.encode_texts(self.settings.format(prompts, domains))

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """Feature vectors for already formatted texts: tokenize once, batch sequences of one padded
        length under the token budget (`plan_batches`), pool, restore input order."""
        if self.model is None:
            raise RuntimeError("encoder is closed")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        s = self.settings
        if s.lexical:  # the statistics of exactly what the tokenizer reads
            out[:, self.dim - LEXICAL_DIM:] = lexical_features([cut_text(t, s.max_length) for t in texts])
        ids = self.tokenize(texts)
        for batch in plan_batches([len(x) for x in ids], s.token_budget, s.max_batch_size, s.max_length):
            width = padded_length(max(len(ids[i]) for i in batch), s.max_length)  # the batch's one padded length
            vec = self.encode_ids([ids[i] for i in batch], width)
            out[batch, : vec.shape[1]] = vec
        self.prompts_encoded += len(texts)
        return out

    def batches(self, texts: list[str]) -> list[tuple[list[list[int]], int]]:
        """The forward passes `encode_texts(texts)` makes: (token ids of each sequence, padded width)."""
        s = self.settings
        ids = self.tokenize(texts)
        return [([ids[i] for i in batch], padded_length(max(len(ids[i]) for i in batch), s.max_length))
                for batch in plan_batches([len(x) for x in ids], s.token_budget, s.max_batch_size, s.max_length)]

    def encode_ids(self, seqs: list[list[int]], width: int) -> np.ndarray:
        """One forward pass: the pooled (normalised) vectors of token id sequences padded on the
        right to `width` (a causal model's real tokens never see the pads); no lexical block."""
        import torch

        tokens = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(tokens)
        for row, seq in enumerate(seqs):
            tokens[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        with torch.inference_mode():
            return self._forward(torch.from_numpy(tokens), torch.from_numpy(mask)).cpu().numpy()

    def _forward(self, tokens, mask):
        import torch

        tokens, mask = tokens.to(self.resolved_device), mask.to(self.resolved_device)
        s = self.settings
        if s.layers == (-1,):
            states = [self.model(input_ids=tokens, attention_mask=mask).last_hidden_state]
        else:
            out = self.model(input_ids=tokens, attention_mask=mask, output_hidden_states=True).hidden_states
            states = [out[i] for i in s.layers]
        self.forward_passes += 1
        vecs = []
        for hidden in states:  # each layer pooled and normalised on its own, then concatenated
            vec = pool_hidden(hidden, mask, s.pooling, s.token_position).to(torch.float32)
            if s.normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            vecs.append(vec)
        return vecs[0] if len(vecs) == 1 else torch.cat(vecs, dim=-1)

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
