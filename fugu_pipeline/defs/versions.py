"""Data versions computed from content, and reading them back from the instance.

`tasks[batch]` and `responses[batch × worker]` carry the hash of their file as their data version,
so a re-run that changed nothing keeps the version, and the sensors and the matrix's automation
compare what is on disk (or what the matrix was built from) with what was materialized.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

DATA_VERSION_TAG = "dagster/data_version"
EMPTY_VERSION = "empty"
RESPONSES = dg.AssetKey("responses")
RESPONSES_VERSION = "responses_version"  # metadata key on reward_matrix materializations: what it was built from


def file_version(path: Path) -> str:
    """The content version of a file: the first 16 hex digits of its SHA-256 (`empty` if absent)."""
    if not path.exists():
        return EMPTY_VERSION
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def latest_data_versions(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, str]:
    """partition key -> data version of its latest materialization, in one storage query."""
    tags = instance.event_log_storage.get_latest_tags_by_partition(
        key, dg.DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG]
    )
    return {p: t[DATA_VERSION_TAG] for p, t in tags.items() if DATA_VERSION_TAG in t}


def combined_version(versions: Mapping[str, str]) -> str:
    """One version for a set of partition versions (order-free)."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(versions.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def responses_version(instance: dg.DagsterInstance) -> str:
    """The combined data version of every materialized `responses` partition, now."""
    return combined_version(latest_data_versions(instance, RESPONSES))
