"""What every step reads: the rows with their features, and its config file, found one way.

- `Rows`: how a step reads the reward matrix's rows with features for given encoder settings
  (through the embedding cache). The assets give their encoder resource's loader, the command line
  its flags' (with a progress bar); the step decides which settings it needs (a warm start's
  contract, a layer setting being chosen).
- `config_file`: the config a step reads is the one named (relative to the project), else the
  project's `configs/<name>` when it exists, else none (the built-in defaults, which equal the
  shipped files). `fugu-lite train-*` and the assets find it the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fugu_pipeline.steps.versions import settings_version


@dataclass
class Rows:
    """The reward matrix a step reads and how to get its rows with features."""

    settings: Any  # EncoderSettings: the command's own (the resource's, or the flags')
    load: Callable[[Any], Any]  # EncoderSettings -> RoutingData, through the cache
    matrix: Path  # the DuckDB reward matrix
    cache_root: Path  # the embedding cache
    prefill: Callable[[list], None] | None = None  # several layer settings' features in one pass
    model: str | None = None  # where a warm start's encoder is loaded from (None: its contract's id)
    _read: dict = field(default_factory=dict, repr=False)

    def read(self, settings):
        """The rows with `settings`' features (`load`), read once per settings for this command: the
        head set and the cascade after it read the same rows."""
        key = settings.model_dump_json()
        if key not in self._read:
            self._read[key] = self.load(settings)
        return self._read[key]

    def matrix_version(self) -> str:
        """The matrix's data version (the `reward_matrix` asset's), read from the file itself."""
        from fugu_pipeline.matrix.read import read_data_version

        return read_data_version(self.matrix)

    def encoder_version(self, settings=None) -> dict:
        """What changes the vectors of `settings` (default: the command's), without loading the model:
        the fields of the cache fingerprint as configured, and the model's identity."""
        s = settings or self.settings
        fields = s.model_dump(mode="json", exclude={"device", "token_budget", "max_batch_size"})
        return {**fields, "model": s.model_identity()}


def config_file(root: Path, given: str | Path | None, default_name: str) -> Path | None:
    """The config file a step reads: `given` (relative to `root`; it must exist: the loader says so
    when not), else `root/configs/<default_name>` when it exists, else None (the built-in defaults)."""
    if given is not None:
        return Path(root) / given if not Path(given).is_absolute() else Path(given)
    default = Path(root) / "configs" / default_name
    return default if default.exists() else None


def load_step_config(path: Path | None, cls: type) -> tuple[Any, str]:
    """(the config, its settings version) from `path`, or the built-in defaults when it is None.
    A bad file raises ConfigError naming the file and the field."""
    from fugu_pipeline.config_files import load_config

    if path is None:
        return cls(), "absent"
    return load_config(path, cls), settings_version(path)


def unchanged_since_read(path: Path | None, version: str) -> str | None:
    """None when the config file still holds what the step read; else one line saying it changed
    under the step (nothing is recorded: the step runs again with the new content next time)."""
    if path is None or settings_version(path) == version:
        return None
    return (f"{path} changed while this step ran (it had read version {version}, it now holds "
            f"{settings_version(path)}): nothing was recorded; run the step again to use the new settings")
