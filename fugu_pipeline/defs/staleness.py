"""What is out of date, as Dagster's data versioning says: each asset's stale status and its causes
in words, for `fugu-lite pipeline` (what to run, what to skip and why) and for the steps themselves
(a step refuses to run on a stale input, naming it and what to materialize first).

Dagster marks an asset STALE when its code version changed since its latest materialization, or
when an input's data version (an upstream asset's, or a settings asset's observed version) is not
the one that materialization read; MISSING when it was never materialized. Staleness does not flow
further down by itself: an asset whose input is stale but not yet rebuilt is still FRESH, which is
why the main job also runs everything downstream of what it runs (each step then finds its own
record when its inputs came out the same, and trains nothing).
"""

from __future__ import annotations

import dagster as dg
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleCause, StaleStatus
from dagster._time import get_current_datetime

from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.io import first_hint

__all__ = ["StaleStatus", "resolver", "cause_text", "require_fresh_inputs"]


def resolver(instance: dg.DagsterInstance, asset_graph) -> CachingStaleStatusResolver:
    """A stale-status resolver over `asset_graph` as the instance holds it now (cached: make a new one
    after a materialization)."""
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                          instance=instance, asset_graph=asset_graph)
    return CachingStaleStatusResolver(instance=instance, asset_graph=asset_graph, loading_context=view)


def _cause(c: StaleCause) -> str:
    dep = c.dependency_asset_key.to_user_string() if c.dependency_asset_key else None
    if dep and c.dependency_partition_key:
        dep = f"{dep}[{c.dependency_partition_key}]"
    if c.reason == "has a new code version":
        return "its code changed"
    if dep and "data version" in c.reason or dep and "materialization" in c.reason:
        return f"{dep} changed"
    if dep:
        return f"{c.reason.removeprefix('has a ')} ({dep})"
    return c.reason


def cause_text(res: CachingStaleStatusResolver, key: dg.AssetKey, partition: str | None = None) -> str:
    """Why `key` is stale, in a few words: `config_train_sft changed; its code changed`."""
    causes = sorted({_cause(c) for c in res.get_stale_causes(key, partition)})
    return "; ".join(causes) or "stale"


def _graph_of(context: dg.AssetExecutionContext):
    """The whole asset graph a step runs in (its code location's): the graph a run's job is scoped to
    sees the assets it does not run as unobservable externals, whose staleness it cannot tell."""
    from dagster._core.definitions.assets.job.asset_job import JobScopedAssetGraph

    graph = context.job_def.asset_layer.asset_graph
    while isinstance(graph, JobScopedAssetGraph):
        graph = graph.source_asset_graph
    return graph


def require_fresh_inputs(context: dg.AssetExecutionContext) -> None:
    """Refuse, in one line, to run on an input (a non-settings upstream asset) that is stale or was
    never materialized: the output would be out of date the moment it is written."""
    key = context.asset_key
    graph = _graph_of(context)
    res = resolver(context.instance, graph)
    for parent in sorted(graph.get(key).parent_keys):
        node = graph.get(parent)
        if node.is_external or node.is_partitioned:
            continue
        status = res.get_status(parent)
        if status == StaleStatus.FRESH:
            continue
        name, me = parent.to_user_string(), key.to_user_string()
        why = "was never materialized" if status == StaleStatus.MISSING else f"is stale ({cause_text(res, parent)})"
        raise explained_failure(f"{me} needs {name}, which {why}; nothing was run", first_hint(name))
