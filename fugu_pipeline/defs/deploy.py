"""Where the Dagster instance keeps its state, and one clear error when that service is down.

`dagster.yaml` in the repository keeps runs, event logs and sensor cursors in SQLite under
DAGSTER_HOME (one machine). `deploy/postgres/dagster.yaml` keeps them in PostgreSQL
(dagster-postgres), which every process and machine of a deployment shares; its connection comes
from DAGSTER_PG_HOST, DAGSTER_PG_PORT, DAGSTER_PG_USER, DAGSTER_PG_PASSWORD and DAGSTER_PG_DB.
When that database cannot be reached, dagster-postgres retries for a few seconds and then raises
"too many retries for DB connection"; `get_instance` turns that into one line naming the
service, where it was looked for and which settings say so.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import yaml

PG_SETTINGS = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB")


class InstanceUnavailable(RuntimeError):
    """The instance's storage service cannot be reached; the message names it and its settings."""


def instance_yaml(home: str | Path | None = None) -> Path:
    return Path(home or os.environ.get("DAGSTER_HOME", ".")) / "dagster.yaml"


def storage_kind(home: str | Path | None = None) -> str:
    """'postgres', 'mysql' or 'sqlite' (the default when dagster.yaml names no storage)."""
    path = instance_yaml(home)
    config = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    storage = config.get("storage") or {}
    for kind in ("postgres", "mysql"):
        if kind in storage:
            return kind
    return "sqlite"


def describe_storage(home: str | Path | None = None) -> str:
    """Which service holds the instance's state, in words, with the settings that say where."""
    kind = storage_kind(home)
    where = instance_yaml(home)
    if kind == "postgres":
        host, port = os.environ.get("DAGSTER_PG_HOST", "?"), os.environ.get("DAGSTER_PG_PORT", "?")
        db = os.environ.get("DAGSTER_PG_DB", "?")
        return (f"PostgreSQL at {host}:{port}, database {db!r} (storage.postgres in {where}; "
                f"set by {', '.join(PG_SETTINGS[:2])}, {PG_SETTINGS[4]})")
    if kind == "mysql":
        return f"MySQL (storage.mysql in {where})"
    return f"SQLite under {where.parent}"


def _connection_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        if any(s in text for s in ("too many retries for DB connection", "OperationalError", "Connection refused",
                                   "could not connect", "connection failed")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def get_instance() -> dg.DagsterInstance:
    """`DagsterInstance.get()`, or InstanceUnavailable naming the storage service and its settings."""
    try:
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # the first query: storage that answers now
        return instance
    except Exception as exc:
        if not _connection_failure(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InstanceUnavailable(
            f"the Dagster instance's storage, {describe_storage()}, is unreachable ({first}). Start it, "
            "or point those settings at a running one; runs and partitions live there, so nothing runs without it."
        ) from exc
