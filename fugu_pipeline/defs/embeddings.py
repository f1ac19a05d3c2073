"""Task embeddings: the frozen encoder as a Dagster resource, and the materialization helper the
`task_embeddings` asset calls. The work is in `fugu_pipeline.features.encoder` and
`fugu_pipeline.features.cache`; this module only configures, logs and reports.

Every asset that requires this resource can load the encoder (a cold cache embeds), so each
runs in the Dagster pool `gpu` (limit 1): one step at a time holds the accelerator.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import dagster as dg
from pydantic import Field, PrivateAttr

from fugu_pipeline.features.cache import EmbedResult, embed_prompts
from fugu_pipeline.features.encoder import LazyEncoder
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.paths import ProjectPaths

_DEFAULTS = EncoderSettings()


class EncoderResource(dg.ConfigurableResource):
    """The frozen encoder that turns task prompts into feature vectors. Its weights are loaded at
    most once per run, and only when some prompt is not in the embedding cache; they are freed
    (GPU memory included) when the run's step finishes."""

    model: str = Field(_DEFAULTS.model, description="hub id, local model directory, or 'tiny'")
    revision: str | None = Field(_DEFAULTS.revision, description="hub revision; pin it for reproducible features")
    device: str = Field(_DEFAULTS.device, description="auto, cpu, cuda, cuda:N or mps")
    dtype: str = Field(_DEFAULTS.dtype, description="auto, float32, bfloat16 or float16")
    max_length: int = Field(_DEFAULTS.max_length, description="tokens kept per prompt")
    token_budget: int = Field(_DEFAULTS.token_budget, description="padded tokens per forward pass")
    max_batch_size: int = _DEFAULTS.max_batch_size
    pooling: str = Field(_DEFAULTS.pooling, description="last, mean or position")
    token_position: int | None = Field(_DEFAULTS.token_position, description="for pooling=position, e.g. -2")
    layer: int = Field(_DEFAULTS.layer, description="hidden_states index; -1 = last layer")
    layers: list[int] | None = Field(None, description="several hidden_states indices (e.g. [-1, 3]), each pooled and "
                                     "normalised, then concatenated; overrides `layer`")
    normalize: bool = _DEFAULTS.normalize
    prompt_template: str = Field(_DEFAULTS.prompt_template, description="may use {prompt} and {domain}")
    lexical: bool = Field(_DEFAULTS.lexical, description="append 16 lexical statistics (length, numbers, structure) "
                          "to each vector; the quality predictors read them")
    cache_dir: str = Field("data/embeddings", description="embedding cache root, relative to FUGU_PROJECT_DIR")

    _lazy: LazyEncoder | None = PrivateAttr(default=None)

    def settings(self) -> EncoderSettings:
        # the settings this resource configures (prompt rules are fitted per checkpoint, not configured here)
        given = {name: getattr(self, name) for name in EncoderSettings.model_fields if name in type(self).model_fields}
        if self.layers:
            given["layer"] = tuple(self.layers)
        return EncoderSettings(**given)

    def cache_root(self) -> Path:
        return ProjectPaths.from_env().resolve(self.cache_dir)

    def encoder(self) -> LazyEncoder:
        """The run's encoder: settings now, weights on first use, one load per run."""
        if self._lazy is None:
            self._lazy = LazyEncoder(self.settings())
        return self._lazy

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._lazy = LazyEncoder(self.settings())

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._lazy is not None:
            self._lazy.close()
            self._lazy = None


def materialize_embeddings(
    context: dg.AssetExecutionContext | dg.OpExecutionContext,
    resource: EncoderResource,
    prompts: list[str],
    domains: list[str] | None = None,
    cache_root: Path | None = None,
) -> dg.MaterializeResult:
    """Embed prompts through the cache and report what it took (cached vs computed, forward
    passes, seconds) and which encoder ran, as materialization metadata."""
    lazy = resource.encoder()
    context.log.info(lazy.describe())
    cache_root = cache_root or resource.cache_root()
    result: EmbedResult = embed_prompts(prompts, domains, lazy, cache_root)
    context.log.info(
        f"{len(prompts)} prompts: {result.n_cached} from the cache, {result.n_computed} encoded "
        f"in {result.forward_passes} forward passes, {result.seconds:.1f}s"
    )
    version = hashlib.sha256((result.fingerprint + "".join(result.keys)).encode()).hexdigest()[:16]
    return dg.MaterializeResult(
        metadata={
            "n_prompts": len(prompts),
            "n_cached": result.n_cached,
            "n_computed": result.n_computed,
            "fingerprint": result.fingerprint,
            "encoder": result.encoder_description,
            "dim": result.contract.dim,
            "forward_passes": result.forward_passes,
            "seconds": round(result.seconds, 3),
            "contract": dg.MetadataValue.json(result.contract.model_dump()),
            "cache_dir": dg.MetadataValue.path(str(cache_root / result.fingerprint)),
        },
        data_version=dg.DataVersion(version),
    )
