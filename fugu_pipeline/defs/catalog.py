"""The OpenRouter catalog in Dagster: the `openrouter_catalog` asset, the `catalog_change_sensor`
that re-collects a worker when its model's offer changes, and the `OpenRouterResource`.

The API key: `OpenRouterResource.from_env()` binds `api_key` to `dg.EnvVar("OPENROUTER_API_KEY")`
only when that variable is set. Dagster resolves an `EnvVar` when a run or sensor tick starts and
fails it when the variable is unset, even for an optional field; the catalog endpoint is public,
so offline users and users without a key still load the definitions and can fetch the catalog.
Set the key, then reload the code location. The key never enters run config or logs: an
`EnvVar` is stored by name, not by value.
"""


import json
import os
from collections.abc import Mapping

import dagster as dg

from fugu_pipeline.defs.failures import explained_failure
from fugu_pipeline.defs.metadata import LIVE_API, LIVE_KIND
from fugu_pipeline.defs.partitions import CATALOG_FRESHNESS, batch_x_worker, partition_run_request, task_batches, workers
from fugu_pipeline.defs.resources import PipelineResource, config_skip
from fugu_pipeline.defs.versions import latest_data_versions
from fugu_pipeline.settings import settings
from fugu_pipeline.workers.catalog import (
    OPENROUTER_BASE_URL,
    catalog_base_url,
    CatalogError,
    CatalogSnapshot,
    diff_snapshots,
    fetch_catalog,
    load_latest,
    save_snapshot,
    update_retired,
)
from fugu_pipeline.workers.config import WorkerConfigError, WorkersConfig, WorkerSpec

FINGERPRINT_TAG = "fugu/model_fingerprint"
RESPONSES_KEY = dg.AssetKey("responses")
DEFAULT_SENSOR_INTERVAL_S = settings().catalog_sensor_interval_s


class OpenRouterResource(dg.ConfigurableResource):
    """The OpenRouter API: where it is and the key (optional for the model catalog)."""

    api_key: str | None = None
    """Sent as a bearer header only; the model catalog is public."""
    base_url: str = OPENROUTER_BASE_URL
    """The API root whose `/models` is the catalog (default: OpenRouter; env FUGU_OPENROUTER_BASE_URL)."""
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: str = "OPENROUTER_API_KEY", **kwargs) -> "OpenRouterResource":
        """Bind `api_key` to `dg.EnvVar(env)` when the variable is set, else leave it unset (see
        the module docstring); likewise `base_url` to `$FUGU_OPENROUTER_BASE_URL` (a proxy, a
        mirror, or a local stub catalog), else OpenRouter's own API."""
        kwargs.setdefault("base_url", catalog_base_url())
        if os.environ.get(env):
            return cls(api_key=dg.EnvVar(env), **kwargs)
        return cls(**kwargs)

    def fetch_catalog(self, deadline_s: float | None = None) -> CatalogSnapshot:
        return fetch_catalog(self.base_url, self.api_key or None, timeout_s=self.timeout_s, deadline_s=deadline_s)


def sensor_fetch_deadline_s() -> float:
    """How long a sensor may spend fetching the catalog: half the time the daemon gives a sensor
    tick (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS, else DAGSTER_GRPC_TIMEOUT_SECONDS, else 60 s, as
    Dagster reads them). Past its own timeout the daemon fails the tick instead of skipping it."""
    raw = os.environ.get("DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS") or os.environ.get("DAGSTER_GRPC_TIMEOUT_SECONDS") or "60"
    try:
        return max(1.0, float(raw) / 2)
    except ValueError:
        return 30.0


def openrouter_models(config: WorkersConfig) -> dict[str, str]:
    """worker id -> OpenRouter model id, for the workers the catalog describes."""
    return {w.id: w.model for w in config.workers if w.kind == "openrouter"}


def run_model_fingerprint(tags: Mapping[str, str], pipeline: PipelineResource, spec: WorkerSpec) -> str | None:
    """The model fingerprint a `responses` run should store: the sensor's tag, else the latest
    stored catalog's fingerprint of the worker's model (None for mock and local workers)."""
    if tags.get(FINGERPRINT_TAG):
        return tags[FINGERPRINT_TAG]
    if spec.kind != "openrouter":
        return None
    snap = load_latest(pipeline.paths.catalog)
    return snap.fingerprint(spec.model) if snap else None


@dg.asset(group_name="data", kinds={"json", LIVE_KIND}, tags=LIVE_API, freshness_policy=CATALOG_FRESHNESS)
def openrouter_catalog(
    context: dg.AssetExecutionContext, openrouter: OpenRouterResource, pipeline: PipelineResource
) -> dg.MaterializeResult:
    """Calls the OpenRouter API live (its public models endpoint; needs the network, no key).
    The OpenRouter model catalog (prices, context lengths, supported parameters), stored as
    data/catalog/latest.json with a history of every change. Reports which configured workers'
    models changed or left the catalog since the previous snapshot."""
    folder = pipeline.paths.catalog
    previous = load_latest(folder)
    try:
        snap = openrouter.fetch_catalog()
    except CatalogError as exc:
        raise explained_failure(str(exc)) from None
    configured = openrouter_models(pipeline.load_workers())
    diff = diff_snapshots(previous, snap, configured)
    latest = save_snapshot(snap, folder)
    update_retired(folder, diff.retired, configured)
    if diff.retired:
        context.log.warning(f"retired (model no longer in the catalog): {', '.join(diff.retired)}")
    return dg.MaterializeResult(
        metadata={
            "model_count": len(snap.models),
            "changed_workers": dg.MetadataValue.json({w: list(fp) for w, fp in diff.changed.items()}),
            "retired_workers": dg.MetadataValue.json(diff.retired),
            "models_added": len(diff.added),
            "models_removed": len(diff.removed),
            "path": dg.MetadataValue.path(str(latest)),
        },
        data_version=dg.DataVersion(snap.digest()),
    )


def _cursor_models(context: dg.SensorEvaluationContext, sensor_name: str) -> dict[str, str] | None:
    """The {model id: fingerprint} map of the catalog sensor's cursor, or None when there is no
    cursor or it cannot be read (named in one line; the stored catalog is the baseline then)."""
    if not context.cursor:
        return None
    try:
        models = json.loads(context.cursor).get("models")
    except (ValueError, AttributeError):
        models = None
    if isinstance(models, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in models.items()):
        return models
    context.log.warning(f"{sensor_name}: cursor unreadable ({context.cursor[:80]!r}); "
                        "comparing with the stored catalog (data/catalog/latest.json) instead")
    return None


def build_catalog_change_sensor(
    minimum_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_S, name: str = "catalog_change_sensor"
) -> dg.SensorDefinition:
    """A sensor that fetches the catalog every `minimum_interval_seconds` (default hourly, or
    FUGU_CATALOG_SENSOR_INTERVAL_S) and re-collects changed workers."""

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=[RESPONSES_KEY],
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Re-collects a worker when its OpenRouter model's price, context length, parameters or expiry "
            "change: one `responses` run per batch of that worker, tagged with the new model fingerprint, so "
            "only cells answered under another offer (or under none recorded) are called again. Workers whose "
            "model left the catalog are listed in data/catalog/retired.json. Off by default: turning it on "
            "lets catalog changes spend money."
        ),
    )
    def _sensor(
        context: dg.SensorEvaluationContext, openrouter: OpenRouterResource, pipeline: PipelineResource
    ) -> dg.SensorResult:
        """See the description above (it is what the UI shows)."""
        try:
            configured = openrouter_models(pipeline.load_workers())
        except WorkerConfigError as exc:
            return dg.SensorResult(skip_reason=config_skip(exc), cursor=context.cursor)
        if not configured:
            return dg.SensorResult(skip_reason="no openrouter workers in the worker config", cursor=context.cursor)
        try:
            snap = openrouter.fetch_catalog(deadline_s=sensor_fetch_deadline_s())
        except CatalogError as exc:
            return dg.SensorResult(skip_reason=f"catalog not fetched: {exc}", cursor=context.cursor)

        folder = pipeline.paths.catalog
        old: dict[str, str] | CatalogSnapshot | None = _cursor_models(context, name)
        if old is None:
            try:
                old = load_latest(folder)
            except CatalogError as exc:  # no baseline: nothing counts as changed this tick, and the fetch replaces it
                context.log.warning(str(exc))
        diff = diff_snapshots(old, snap, configured)
        try:
            save_snapshot(snap, folder)
            update_retired(folder, diff.retired, configured)
        except (CatalogError, OSError) as exc:  # the comparison stands on the cursor; the files are written next tick
            context.log.warning(f"catalog files not updated: {exc}")

        batches = context.instance.get_dynamic_partitions(task_batches.name)
        known = set(context.instance.get_dynamic_partitions(workers.name))
        # the responses partitions' data versions go in the run keys: a price that flips back and forth
        # (A -> B -> A -> B) made the second A -> B key equal the first, and the daemon dropped it
        collected = latest_data_versions(context.instance, RESPONSES_KEY)
        requests = []
        for worker_id, (old_fp, new_fp) in sorted(diff.changed.items()):
            if worker_id not in known:
                context.log.info(f"{worker_id}: model changed but the worker has no partition yet; nothing to re-collect")
                continue
            context.log.info(f"{worker_id}: {configured[worker_id]} changed ({old_fp} -> {new_fp}); "
                             f"re-collecting {len(batches)} batch(es)")
            for batch in batches:
                key = dg.MultiPartitionKey({"batch": batch, "worker": worker_id})
                requests.append(partition_run_request(
                    batch_x_worker, key,
                    run_key=f"catalog:{worker_id}:{batch}:{old_fp}->{new_fp}@{collected.get(str(key), 'none')}",
                    asset_selection=[RESPONSES_KEY],
                    tags={FINGERPRINT_TAG: new_fp},
                ))
        if diff.retired:
            context.log.warning(f"retired (model no longer in the catalog): "
                                f"{', '.join(f'{w} ({configured[w]})' for w in diff.retired)}")

        # Keep the last fingerprint of a vanished model, so its return with a new offer counts as a change.
        prev_fps = old if isinstance(old, dict) else ({k: m.fingerprint for k, m in old.models.items()} if old else {})
        fps = {m: snap.fingerprint(m) or prev_fps.get(m) for m in sorted(set(configured.values()))}
        cursor = json.dumps({"models": {m: fp for m, fp in fps.items() if fp}, "digest": snap.digest()})
        if requests:
            return dg.SensorResult(run_requests=requests, cursor=cursor)
        if diff.changed:
            reason = f"changed: {', '.join(diff.changed)}, but no batch partitions of them to re-collect"
        else:
            reason = f"no configured model changed ({len(configured)} openrouter worker(s) checked)"
        if diff.retired:
            reason += f"; retired: {', '.join(diff.retired)}"
        return dg.SensorResult(skip_reason=reason, cursor=cursor)

    return _sensor


catalog_change_sensor = build_catalog_change_sensor()
