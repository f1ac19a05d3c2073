"""The settings the pipeline's steps read, as observable source assets (group `settings`).

Each is a root of the graph with a data version: the reward block and worker order of the worker
YAML (`config_reward`, read by `reward_matrix`), the encoder resource's settings (`config_encoder`,
read by `task_embeddings`), each trainer YAML (`config_train_sft`, ...: its parsed content, so a
comment changes nothing; `absent` while the file is missing and the built-in defaults apply) and
the promotion policy. Dagster records the version each materialization read, so an asset whose
settings changed since is STALE, in the UI and for `fugu-lite pipeline`, and so is nothing else.

Observed by `fugu-lite pipeline` before it decides what to run, by `settings_sensor` (running by
default: the UI shows an edited YAML's downstream as stale within its interval) and by the UI's
"Observe sources". A materialization records the versions observed when its step started: a file
edited and materialized before the next observation is recorded under the version before (the
asset then shows stale, and materializing it again finds the step's record: nothing is retrained).
A file that changes while its step runs fails the step in one line, and nothing is recorded.
"""


import warnings
from dataclasses import dataclass

import dagster as dg

from fugu_pipeline.defs.embeddings import EncoderResource
from fugu_pipeline.defs.resources import PipelineResource
from fugu_pipeline.defs.versions import DATA_VERSION_TAG
from fugu_pipeline.hashing import canonical_json, sha256_text
from fugu_pipeline.settings import settings
from fugu_pipeline.steps.versions import settings_version

GROUP = "settings"


@dataclass(frozen=True)
class SettingsFile:
    key: str
    path: str  # relative to the project
    what: str


FILES = [
    SettingsFile("config_train_sft", "configs/train_sft.yaml", "the SFT trainer's settings (router_sft)"),
    SettingsFile("config_train_rl", "configs/train_rl.yaml", "the RL trainer's settings (router_rl)"),
    SettingsFile("config_train_es", "configs/train_es.yaml", "the CMA-ES trainer's settings (router_es)"),
    SettingsFile("config_train", "configs/train.yaml", "the head set, its features and the cascade block "
                                                       "(router_heads, router_cascade)"),
    SettingsFile("config_promotion", "configs/promotion.yaml", "the promotion policy: the composite the reports "
                                                              "show and the gates promotion applies"),
    SettingsFile("config_train_roles", "configs/train_roles.yaml", "the coordinator's trainer settings (router_roles)"),
]
BY_KEY = {f.key: f for f in FILES}
REWARD_KEY, ENCODER_KEY = "config_reward", "config_encoder"


def reward_version(pipeline: PipelineResource) -> str:
    """The worker YAML's reward block and worker order (what the matrix's utility and columns are made of)."""
    try:
        config = pipeline.load_workers()
    except Exception as exc:  # noqa: BLE001  (a broken file: reward_matrix says what is wrong when it runs)
        return "unreadable-" + sha256_text(type(exc).__name__ + str(exc))[:8]
    return sha256_text(canonical_json({"reward": config.reward.model_dump(mode="json"),
                                       "workers": list(config.worker_ids)}))[:16]


def encoder_version(encoder: EncoderResource) -> str:
    """The encoder resource's settings that change vectors (not device or batch sizes)."""
    fields = encoder.settings().model_dump(mode="json", exclude={"device", "token_budget", "max_batch_size"})
    return sha256_text(canonical_json(fields))[:16]


def current_versions(pipeline: PipelineResource, encoder: EncoderResource) -> dict[str, str]:
    """Every settings asset's version now."""
    out = {f.key: settings_version(pipeline.paths.resolve(f.path)) for f in FILES}
    out[REWARD_KEY] = reward_version(pipeline)
    out[ENCODER_KEY] = encoder_version(encoder)
    return out


def observed_version(instance: dg.DagsterInstance, key: str | dg.AssetKey) -> str | None:
    record = instance.get_latest_data_version_record(dg.AssetKey.from_coercible(key), is_source=True)
    return (record.event_log_entry.tags or {}).get(DATA_VERSION_TAG) if record is not None else None


def changed_observations(instance: dg.DagsterInstance, versions: dict[str, str]) -> list[dg.AssetObservation]:
    """An observation for each settings asset whose version differs from its latest one."""
    return [dg.AssetObservation(asset_key=key, tags={DATA_VERSION_TAG: v}, metadata={"version": v})
            for key, v in versions.items() if observed_version(instance, key) != v]


def observe(instance: dg.DagsterInstance, pipeline: PipelineResource, encoder: EncoderResource) -> list[str]:
    """Record the settings that changed since their last observation; returns their keys."""
    events = changed_observations(instance, current_versions(pipeline, encoder))
    for event in events:
        instance.report_runless_asset_event(event)
    return [e.asset_key.to_user_string() for e in events]


def _file_asset(spec: SettingsFile) -> dg.SourceAsset:
    @dg.observable_source_asset(name=spec.key, group_name=GROUP, description=f"{spec.path}: {spec.what}.")
    def _observe(pipeline: PipelineResource) -> dg.DataVersion:
        return dg.DataVersion(settings_version(pipeline.paths.resolve(spec.path)))

    return _observe


def _reward_asset() -> dg.SourceAsset:
    @dg.observable_source_asset(name=REWARD_KEY, group_name=GROUP,
                                description="The worker YAML's reward: block (the utility's weights) and its worker order.")
    def _observe(pipeline: PipelineResource) -> dg.DataVersion:
        return dg.DataVersion(reward_version(pipeline))

    return _observe


def _encoder_asset() -> dg.SourceAsset:
    @dg.observable_source_asset(name=ENCODER_KEY, group_name=GROUP,
                                description="The encoder resource's settings that change the vectors (model, pooling, "
                                            "layer, template, max length, dtype as configured).")
    def _observe(encoder: EncoderResource) -> dg.DataVersion:
        return dg.DataVersion(encoder_version(encoder))

    return _observe


with warnings.catch_warnings():  # beta in Dagster; it is the way a root's version is observed
    warnings.simplefilter("ignore", dg.BetaWarning)
    SETTINGS_FILES = {f.key: _file_asset(f) for f in FILES}
    config_reward, config_encoder = _reward_asset(), _encoder_asset()


SETTINGS_ASSETS = [*SETTINGS_FILES.values(), config_reward, config_encoder]


@dg.sensor(minimum_interval_seconds=settings().settings_sensor_interval_s, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Observes the settings assets (trainer YAMLs, the promotion policy, the worker YAML's reward "
                       "block, the encoder's settings) and records those that changed: the UI then shows what depends on "
                       "them as stale. Requests no run.")
def settings_sensor(context: dg.SensorEvaluationContext, pipeline: PipelineResource,
                    encoder: EncoderResource) -> dg.SensorResult:
    """See the description above (it is what the UI shows)."""
    events = changed_observations(context.instance, current_versions(pipeline, encoder))
    if not events:
        return dg.SensorResult(skip_reason="no settings changed since their last observation")
    return dg.SensorResult(asset_events=events)
