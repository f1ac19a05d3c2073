"""The reward matrix's rows with the features each checkpoint was trained on.

A checkpoint's feature contract pins what its input vectors mean: the encoder model and how the
prompt became a vector (layers, pooling, template, prompt rules, lexical block, ...). Heads
trained by `fugu-lite train` or the `router_heads` asset may have chosen some of these on
validation (`train/feature_choice.py`), so two challengers, or a challenger and the king, can
read different vectors of the same prompts. Serving computes each checkpoint's own features
(`route/router.py` builds the encoder from the contract), so promotion and the reports score each
checkpoint on its own features too: same rows, same splits, same rewards.

What may differ is how the same encoder model is read. A checkpoint of another encoder model (or
revision) is not re-encoded here: that would load, or download, a model the pipeline does not
serve with. It is reported as not comparable, with the contract's differences.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fugu_pipeline.features.routing_data import RoutingData
from fugu_pipeline.features.settings import EncoderSettings

Loader = Callable[[EncoderSettings], RoutingData]


class FeatureSource:
    """`data`: the rows with the pipeline's own features. `load(settings)`: the same rows with the
    features `settings` describe (through the embedding cache); `settings`: the serving encoder's
    (its model location, device and dtype are used for every contract). Without `load`, only
    checkpoints on `data`'s own contract can be scored (the behaviour before per-checkpoint
    features)."""

    def __init__(self, data: RoutingData, load: Loader | None = None, settings: EncoderSettings | None = None):
        if (load is None) != (settings is None):
            raise ValueError("FeatureSource: give both load and settings, or neither")
        self.data, self._load, self._settings = data, load, settings
        self._memo: dict[str, RoutingData] = {data.contract.fingerprint(): data}

    @property
    def settings(self) -> EncoderSettings | None:
        """The serving encoder's settings (None for `fixed`): a checkpoint loaded to run live reads
        its model location, device and dtype."""
        return self._settings

    @classmethod
    def fixed(cls, data: RoutingData) -> "FeatureSource":
        return cls(data)

    def for_checkpoint(self, checkpoint) -> tuple[RoutingData, list[str]]:
        """(the rows with `checkpoint`'s features, []) when it can be scored; otherwise (the pipeline's
        rows, why not: the contract's differences, or workers that differ)."""
        manifest = checkpoint.manifest
        problems = []
        if list(manifest.worker_ids) != list(self.data.worker_ids):
            problems.append(f"workers {manifest.worker_ids} differ from the matrix's {self.data.worker_ids}")
        contract = manifest.feature_contract
        key = contract.fingerprint()
        if key in self._memo:
            return self._memo[key], problems
        base = self.data.contract
        if self._load is None or (contract.encoder_id, contract.revision) != (base.encoder_id, base.revision):
            return self.data, contract.differences(base) + problems
        from fugu_pipeline.route.router import encoder_settings_for

        s = self._settings
        data = self._load(encoder_settings_for(contract, s.device, s.dtype, s.model))
        left = contract.differences(data.contract)
        if left:  # e.g. a dim the serving encoder does not produce: the contract is not this model's
            return self.data, left + problems
        if list(data.task_ids) != list(self.data.task_ids) or not np.array_equal(data.splits, self.data.splits):
            raise RuntimeError("the reward matrix changed while features were loaded; run the step again")
        self._memo[key] = data
        return data, problems
