"""How the assets show things in the UI: figures rounded, files as path values, and a mark on the
assets that call live services.

- `tidy(metadata)`: every float rounded for reading (`0.13910373200000015` -> `0.1391`: four
  decimals; a value under 0.001, a small cost, keeps three significant digits), in plain values
  and in float metadata values alike. What is rounded is the display: every report keeps its
  full figures in its JSON file.
- `LIVE_KIND`, `LIVE_WORKERS`, `LIVE_API`: the kind and tag of the assets that call live services:
  on the graph a `live-calls` kind under the node, and the tag `fugu/calls` saying which
  (`live-workers`: `responses`, the evaluation reports and `promoted_router` (the composite's live
  term), `router_roles`, `eval_report_roles`; `openrouter-api`: `openrouter_catalog`), so the
  selection `tag:fugu/calls` finds them. With the mock pool they stay offline; with real
  workers each materialization spends money.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import dagster as dg

LIVE_KIND = "live-calls"
LIVE_TAG = "fugu/calls"
LIVE_WORKERS = {LIVE_TAG: "live-workers"}  # calls the configured workers
LIVE_API = {LIVE_TAG: "openrouter-api"}  # openrouter_catalog: the OpenRouter models endpoint


def rounded(value: float) -> float:
    """A figure as the UI shows it: four decimals; under 0.001 (a cost), three significant digits."""
    if not math.isfinite(value) or value == 0:
        return value
    return round(value, 4) if abs(value) >= 1e-3 else float(f"{value:.3g}")


def tidy(metadata: Mapping[str, object]) -> dict[str, object]:
    """The metadata with every float rounded (plain floats and float metadata values)."""
    out: dict[str, object] = {}
    for key, value in metadata.items():
        if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy floats too
            value = rounded(float(value))
        elif isinstance(value, dg.FloatMetadataValue) and value.value is not None:
            value = dg.MetadataValue.float(rounded(value.value))
        out[key] = value
    return out
