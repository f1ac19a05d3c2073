"""Partition sets, defined once and imported everywhere else."""

import dagster as dg

task_batches = dg.DynamicPartitionsDefinition(name="task_batches")
workers = dg.DynamicPartitionsDefinition(name="workers")
batch_x_worker = dg.MultiPartitionsDefinition({"batch": task_batches, "worker": workers})

# Dagster pools (concurrency limits live in dagster.yaml / `dagster instance concurrency set`).
WORKER_CALLS_POOL = "worker_calls"
DUCKDB_WRITER_POOL = "duckdb_writer"
GPU_POOL = "gpu"
