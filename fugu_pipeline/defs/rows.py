"""How the assets read the reward matrix's rows with features: the encoder resource through the
embedding cache (shared shards pulled before, pushed after), for the resource's own settings or a
checkpoint's. Every training and evaluation asset reads them through here (`rows_for` hands the
same loader to the steps in `fugu_pipeline/steps/`)."""

from __future__ import annotations

from pathlib import Path

from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.shared import SharedStore
from fugu_pipeline.steps.inputs import Rows


def cache_root(pipeline: PipelineResource, encoder: EncoderResource) -> Path:
    return pipeline.paths.resolve(encoder.cache_dir)


def routing_data(context, pipeline: PipelineResource, encoder: EncoderResource, settings=None):
    """The reward matrix's rows with features: the resource's own settings, or `settings` (a
    checkpoint's contract, a layer setting or prompt rules being chosen) through the same cache."""
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data

    own = settings is None or settings == encoder.settings()
    lazy = encoder.encoder() if own else LazyEncoder(settings)
    try:
        with SharedEmbeddings(context, pipeline, encoder):
            data, emb = load_routing_data(pipeline.paths.reward_db, lazy, cache_root(pipeline, encoder))
    finally:
        if not own:
            lazy.close()
    context.log.info(f"{emb.encoder_description}; {emb.n_cached} cached, {emb.n_computed} encoded; splits {data.counts()}")
    return data


def prefill(context, pipeline: PipelineResource, encoder: EncoderResource, settings_list) -> None:
    """Several layer settings' features in one forward pass per prompt (features/cache.py)."""
    from fugu_pipeline.features.routing_data import prefill_layer_sets

    with SharedEmbeddings(context, pipeline, encoder):
        n = prefill_layer_sets(pipeline.paths.reward_db, settings_list, cache_root(pipeline, encoder))
    if n:
        context.log.info(f"{n} prompts encoded once for {len(settings_list)} layer settings")


def rows_for(context, pipeline: PipelineResource, encoder: EncoderResource) -> Rows:
    """What a step reads, as this asset's resources give it."""
    return Rows(settings=encoder.settings(), load=lambda s: routing_data(context, pipeline, encoder, s),
                matrix=pipeline.paths.reward_db, cache_root=cache_root(pipeline, encoder),
                prefill=lambda ss: prefill(context, pipeline, encoder, ss), model=encoder.model)


def feature_source(context, pipeline: PipelineResource, encoder: EncoderResource):
    """Each checkpoint's own features of the same rows (evaluate/feature_source.py), for the
    reports and promotion: heads may have chosen layers or prompt rules on validation."""
    from fugu_pipeline.evaluate.feature_source import FeatureSource

    return FeatureSource(routing_data(context, pipeline, encoder), lambda s: routing_data(context, pipeline, encoder, s),
                         encoder.settings())


class SharedEmbeddings:
    """Pull the shared embedding shards before a step reads features, push what it encoded after."""

    def __init__(self, context, pipeline: PipelineResource, encoder: EncoderResource):
        self.context, self.shared, self.root = context, SharedStore.of(pipeline.paths), cache_root(pipeline, encoder)

    def __enter__(self):
        if self.shared and self.shared.data_url:
            n = self.shared.pull_embeddings(self.root)
            if n:
                self.context.log.info(f"took {n} embedding file(s) from {self.shared.data_url}")
        return self

    def __exit__(self, *exc) -> None:
        if self.shared and self.shared.data_url:
            self.shared.push_embeddings(self.root)


def push_checkpoint(context, pipeline: PipelineResource, path: Path) -> None:
    shared = SharedStore.of(pipeline.paths)
    if shared and shared.models_url:
        context.log.info(f"checkpoint published to {shared.push_checkpoint(path)}")
