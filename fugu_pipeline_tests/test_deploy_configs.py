"""The deployment files in deploy/ load: each is validated against the config schema of the
class that reads it (dagster-postgres, dagster-k8s, dagster-celery), without a cluster or a
database."""

from __future__ import annotations

import re

import pytest
import yaml

from fugu_pipeline_tests.services import REPO

DEPLOY = REPO / "deploy"
PG_ENV = {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_USER": "dagster",
          "DAGSTER_PG_PASSWORD": "x", "DAGSTER_PG_DB": "dagster"}


def _validate(schema, value, what: str):
    from dagster._config import process_config, resolve_to_config_type

    result = process_config(resolve_to_config_type(schema), value)
    assert result.success, f"{what}: " + "; ".join(e.message for e in result.errors)
    return result.value


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@pytest.mark.parametrize("variant", ["postgres", "k8s"])
def test_instance_variants_pass_dagsters_instance_schema(variant, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config
    from dagster_postgres import DagsterPostgresStorage

    for k, v in PG_ENV.items():
        monkeypatch.setenv(k, v)
    config, _ = dagster_instance_config(str(DEPLOY / variant))
    _validate(DagsterPostgresStorage.config_type(), config["storage"]["postgres"], f"{variant}: storage.postgres")
    assert config["concurrency"]["runs"]["tag_concurrency_limits"][0]["key"] == "dagster/partition"


def test_k8s_run_launcher_and_executor_configs_match_dagster_k8s():
    from dagster_k8s import K8sRunLauncher, k8s_job_executor

    instance = yaml.safe_load((DEPLOY / "k8s" / "dagster.yaml").read_text())
    assert instance["run_launcher"]["class"] == "K8sRunLauncher"
    _validate(K8sRunLauncher.config_type(), instance["run_launcher"]["config"], "run_launcher.config")
    run_config = yaml.safe_load((DEPLOY / "k8s" / "run_config.yaml").read_text())
    executor = _validate(k8s_job_executor.config_schema.config_type, run_config["execution"]["config"], "execution.config")
    assert executor["per_step_k8s_config"]["router_sft"]["container_config"]["resources"]["requests"]["memory"] == "8Gi"


def test_helm_values_use_the_launchers_fields_and_mirror_the_instance_file():
    """The chart turns runLauncher.config.k8sRunLauncher (camelCase) into K8sRunLauncher's config:
    every key there must be one of its fields; the run queue matches deploy/k8s/dagster.yaml."""
    from dagster_k8s import K8sRunLauncher

    values = yaml.safe_load((DEPLOY / "k8s" / "values.yaml").read_text())
    fields = set(K8sRunLauncher.config_type())
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    unknown = sorted(k for k in launcher if _snake(k) not in fields)
    assert not unknown, f"not K8sRunLauncher fields: {unknown}"
    instance = yaml.safe_load((DEPLOY / "k8s" / "dagster.yaml").read_text())
    queue = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queue["maxConcurrentRuns"] == instance["concurrency"]["runs"]["max_concurrent_runs"]
    assert queue["tagConcurrencyLimits"] == instance["concurrency"]["runs"]["tag_concurrency_limits"]
    deployment = values["dagster-user-deployments"]["deployments"][0]
    assert deployment["dagsterApiGrpcArgs"][1] == "fugu_pipeline.definitions"


def test_embedding_step_asks_kubernetes_for_a_gpu_node(monkeypatch):
    from dagster_k8s.job import (
        USER_DEFINED_K8S_JOB_CONFIG_SCHEMA,
        DagsterK8sJobConfig,
        construct_dagster_k8s_job,
        get_user_defined_k8s_config,
    )

    from fugu_pipeline.defs.assemble import build_defs
    from fugu_pipeline.defs.distributed import GPU_K8S_CONFIG

    _validate(USER_DEFINED_K8S_JOB_CONFIG_SCHEMA, GPU_K8S_CONFIG, "GPU_K8S_CONFIG")
    monkeypatch.setenv("FUGU_EXECUTOR", "k8s")
    defs = build_defs(encoder="tiny")
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.executor_def.name == "k8s"
    tags = defs.resolve_assets_def("task_embeddings").op.tags
    k8s = get_user_defined_k8s_config(tags)
    assert k8s.container_config["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert k8s.pod_spec_config["node_selector"] == {"fugu/pool": "gpu"}
    assert "dagster-k8s/config" not in defs.resolve_assets_def("router_sft").op.tags  # only the embedding step
    # the pod dagster-k8s would create for the step: on a GPU node, one GPU, tolerating the taint
    pod = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="registry.example/fugu_pipeline:0.1.0", dagster_home="/opt/dagster/home",
                            instance_config_map="fugu-dagster-instance"),
        ["dagster", "api", "execute_step"], "fugu-step-task-embeddings", user_defined_k8s_config=k8s,
    ).spec.template.spec
    assert pod.node_selector == {"fugu/pool": "gpu"}
    assert pod.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert pod.tolerations[0].key == "nvidia.com/gpu"
    run_config = yaml.safe_load((DEPLOY / "k8s" / "run_config.yaml").read_text())
    assert job.run_config_schema.config_type  # the executor's schema is part of the job's
    from dagster._core.definitions.run_config import RunConfig  # noqa: F401  (the job accepts it:)
    from dagster._core.system_config.objects import ResolvedRunConfig

    ResolvedRunConfig.build(job, run_config)


def test_celery_job_and_executor_switch(monkeypatch):
    pytest.importorskip("dagster_celery")
    from fugu_pipeline.defs.assemble import build_defs
    from fugu_pipeline.defs.distributed import BrokerUnavailable, check_broker

    defs = build_defs(encoder="tiny")
    assert defs.resolve_job_def("collect_responses_celery").executor_def.name == "celery_checked"
    monkeypatch.setenv("FUGU_EXECUTOR", "celery")
    assert build_defs(encoder="tiny").resolve_implicit_global_asset_job_def().executor_def.name == "celery_checked"
    monkeypatch.setenv("FUGU_EXECUTOR", "spark")
    with pytest.raises(ValueError, match="FUGU_EXECUTOR='spark'"):
        build_defs(encoder="tiny")
    monkeypatch.delenv("FUGU_EXECUTOR")  # a bad setting stops every read of the settings, this one's too
    monkeypatch.setenv("FUGU_CELERY_BROKER", "redis://127.0.0.1:9/0")  # the discard port: nothing listens
    with pytest.raises(BrokerUnavailable, match=r"Celery broker at redis://127.0.0.1:9/0 \(FUGU_CELERY_BROKER="):
        check_broker(timeout_s=1)
