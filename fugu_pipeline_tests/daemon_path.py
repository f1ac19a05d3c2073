"""Sensors the way the daemon runs them: `SensorDefinition.evaluate_tick` with the definitions'
own resources on a real (temporary) instance, then what the daemon does with the result: add the
requested dynamic partitions and launch each run request (here in process, same instance)."""

from __future__ import annotations

import dagster as dg


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, sensor_name: str, cursor: str | None = None):
    """One tick of a sensor, evaluated as the daemon does; its dynamic partition requests are
    applied to the instance. Returns the SensorExecutionData (run_requests, skip_message, cursor)."""
    repo = defs.get_repository_def()
    sensor = repo.get_sensor_def(sensor_name)
    with dg.build_sensor_context(instance=instance, repository_def=repo, cursor=cursor,
                                 resources=repo.get_top_level_resources()) as ctx:
        result = sensor.evaluate_tick(ctx)
    for req in result.dynamic_partitions_requests or []:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def launch(defs: dg.Definitions, instance: dg.DagsterInstance, requests, *, may_fail: bool = False) -> dict[str, dict]:
    """Run each request to completion: its job (or the asset job over its selection), its
    partition, its tags. Returns each run's last materialization metadata by partition key.
    `may_fail`: a run that fails is left failed (as the daemon's would be) instead of raising."""
    metas: dict[str, dict] = {}
    for req in requests:
        if req.job_name and not req.asset_selection:
            job = defs.resolve_job_def(req.job_name)
            kwargs = {}
        else:
            job = defs.resolve_implicit_global_asset_job_def()
            kwargs = {"asset_selection": list(req.asset_selection)}
        res = job.execute_in_process(instance=instance, partition_key=req.partition_key, tags=dict(req.tags),
                                     run_config=req.run_config or None, raise_on_error=not may_fail, **kwargs)
        mats = res.get_asset_materialization_events()
        if mats:
            metas[str(req.partition_key)] = {k: v.value for k, v in mats[-1].materialization.metadata.items()}
    return metas


def materialize(defs: dg.Definitions, instance: dg.DagsterInstance, key: str, partition_key=None, **kwargs):
    """Materialize one asset (one partition) through the definitions' asset job."""
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey(key)], partition_key=partition_key, **kwargs)
