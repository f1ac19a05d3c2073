"""Steps on other processes and machines: the Celery executor (Redis broker) for `responses`
partitions, and what the Kubernetes route needs (deploy/k8s/).

`collect_responses_celery` is the `collect_responses` job with dagster-celery's executor: the run
process hands each step to a Celery queue and any number of workers, on this machine or others,
pick them up (`celery -A fugu_pipeline.defs.celery_app worker`). Each `responses` partition is one
run with one step, so a batch's partitions, launched together (a backfill, the batch sensor),
spread over the workers. The broker comes from FUGU_CELERY_BROKER (e.g. redis://host:6379/0) and
the result backend from FUGU_CELERY_BACKEND (default: the broker's URL); the workers read the
same two variables. The workers and the run processes must share the Dagster instance (the
Postgres variant) and the project's files (the same folder, or the shared store:
fugu_pipeline/storage.py).

A broker that cannot be reached fails the run before any step is sent, in one line naming the
broker and the variable that set it (`checked_celery_executor`), instead of Celery's retry loop.
"""

from __future__ import annotations

import dagster as dg

from fugu_pipeline.settings import settings

BROKER_ENV = "FUGU_CELERY_BROKER"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
CELERY_JOB = "collect_responses_celery"


def celery_available() -> bool:
    try:
        import dagster_celery  # noqa: F401
    except ImportError:
        return False
    return True


def broker_url() -> str:
    return settings().celery_broker


def backend_url() -> str:
    return settings().celery_backend or broker_url()


def celery_app_args() -> dict:
    """What the executor and the workers both build their Celery app from."""
    from dagster_celery.config import DEFAULT_CONFIG

    return {"broker": broker_url(), "backend": backend_url(), "include": [],
            "config_source": {**DEFAULT_CONFIG, "broker_connection_retry_on_startup": True}}


class BrokerUnavailable(RuntimeError):
    pass


def check_broker(url: str | None = None, timeout_s: float = 3.0) -> None:
    """Connect to the broker once; BrokerUnavailable names it and the setting when it cannot."""
    from kombu import Connection

    url = url or broker_url()
    try:
        with Connection(url, connect_timeout=timeout_s) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0.2, timeout=timeout_s)
    except Exception as exc:
        set_by = f"{BROKER_ENV}={url}" if "celery_broker" in settings().model_fields_set else f"{BROKER_ENV} unset: default {url}"
        raise BrokerUnavailable(
            f"the Celery broker at {url} ({set_by}) is unreachable: {type(exc).__name__}: {exc}. Start it "
            "(bash scripts/services.sh start redis DIR PORT), or point the variable at a running one; no step was sent."
        ) from None


def checked_celery_executor() -> dg.ExecutorDefinition:
    """dagster-celery's executor with the broker from the environment, checked before any step is sent."""
    from dagster_celery import celery_executor
    from dagster_celery.executor import CELERY_CONFIG

    @dg.executor(name="celery_checked", config_schema=CELERY_CONFIG,
                 requirements=dg.multiple_process_executor_requirements())
    def _executor(init_context: dg.InitExecutorContext):
        config = dict(init_context.executor_config)
        config["broker"] = config.get("broker") or broker_url()
        config["backend"] = config.get("backend") if config.get("backend") not in (None, "rpc://") else backend_url()
        try:
            check_broker(config["broker"])
        except BrokerUnavailable as exc:
            raise dg.Failure(description=str(exc)) from None
        from dagster_celery.executor import CeleryExecutor
        from dagster._core.execution.retries import RetryMode

        return CeleryExecutor(broker=config["broker"], backend=config["backend"],
                              config_source={**celery_app_args()["config_source"], **(config.get("config_source") or {})},
                              include=config.get("include"), retries=RetryMode.from_config(config["retries"]))

    _executor.__doc__ = celery_executor.__doc__
    return _executor


def celery_jobs(responses_asset, batch_x_worker) -> list:
    """The Celery job, where dagster-celery is installed (extra `scale`)."""
    if not celery_available():
        return []
    return [dg.define_asset_job(
        CELERY_JOB, selection=[responses_asset], executor_def=checked_celery_executor(),
        description="collect_responses with each step on a Celery worker (broker: FUGU_CELERY_BROKER). "
                    "Launch a batch's partitions together and they spread over the workers.",
    )]


# ---------------------------------------------------------------------------- Kubernetes

# What the embedding step asks of a Kubernetes node: the GPU pool as a node selector and a GPU
# resource request. Read by dagster-k8s (run launcher and k8s_job_executor) from the op's tags;
# ignored everywhere else. The values are the ones in deploy/k8s/values.yaml.
GPU_NODE_SELECTOR = {"fugu/pool": "gpu"}
GPU_K8S_CONFIG = {
    "container_config": {"resources": {"limits": {"nvidia.com/gpu": "1", "memory": "24Gi"},
                                       "requests": {"cpu": "4", "memory": "16Gi"}}},
    "pod_spec_config": {"node_selector": GPU_NODE_SELECTOR,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}
GPU_OP_TAGS = {"dagster-k8s/config": GPU_K8S_CONFIG}



def default_executor() -> dg.ExecutorDefinition | None:
    """The executor of every job, from FUGU_EXECUTOR: unset or `multiprocess` (Dagster's default,
    one machine), `celery` (steps to Celery workers), `k8s` (each step a Kubernetes job,
    dagster-k8s; configured by deploy/k8s/run_config.yaml)."""
    kind = settings().executor
    if kind == "multiprocess":
        return None
    if kind == "celery":
        return checked_celery_executor()
    from dagster_k8s import k8s_job_executor  # the settings take only these three

    return k8s_job_executor


def single_step_executor() -> dg.ExecutorDefinition | None:
    """The executor of the one-step jobs the sensors launch (a batch's load, one `responses`
    partition, the matrix with its checks): on one machine Dagster's in-process executor, so a run
    is one Python process instead of a run process plus one per step (each loads the code location,
    seconds on a busy machine, paid again by every partition of a batch); with FUGU_EXECUTOR set,
    None: the job takes the definitions' executor (Celery, Kubernetes)."""
    return dg.in_process_executor if default_executor() is None else None
