"""The reward matrix's automation: when `reward_matrix` rebuilds by itself, and the sensor that
decides it.

Dagster's `eager()` condition requests the matrix when a `responses` partition is newly updated
since the matrix was last requested or updated. "Since" is edge-triggered: when a re-collection
and a matrix build land between the same two ticks, the matrix's update resets the trigger
(Dagster keeps no order between them), the matrix is never requested again, and it stays
"Unsynced" until some other partition changes. So the matrix also rebuilds, level-triggered,
while the responses it was built from differ from the materialized ones: each `responses`
partition's data version is the hash of its file, the matrix records the combined version it
read (`responses_version` in its metadata, taken before it reads a file, so a race can only
cause one extra build, never a missed one), and `BuiltFromOtherResponses` compares the two on
every tick. The condition runs user code, so the sensor evaluates on the code server
(`use_user_code_server=True`), which also lets `SensorDefinition.evaluate_tick` run it in tests.
"""

from __future__ import annotations

import os
import warnings

import dagster as dg

from fugu_pipeline.defs.versions import combined_version, latest_data_versions

RESPONSES = dg.AssetKey("responses")
REWARD_MATRIX = dg.AssetKey("reward_matrix")
RESPONSES_VERSION = "responses_version"  # metadata key on reward_matrix materializations
IMPORT_SOURCE_PREFIX = "import:"  # how an imported matrix's `source` metadata starts (matrix/build.py)
AUTOMATION_INTERVAL_S = int(os.environ.get("FUGU_AUTOMATION_INTERVAL_S", "30"))


def responses_version(instance: dg.DagsterInstance) -> str:
    """The combined data version of every materialized `responses` partition, now."""
    return combined_version(latest_data_versions(instance, RESPONSES))


class BuiltFromOtherResponses(dg.AutomationCondition):
    """True while the responses the latest matrix build read differ from the materialized ones,
    or while there is no matrix yet but responses are materialized."""

    @property
    def name(self) -> str:
        return "built_from_other_responses"

    @property
    def description(self) -> str:
        return "the latest build read other responses than the materialized ones (or there is none yet)"

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        instance = context.asset_graph_view.instance
        versions = latest_data_versions(instance, RESPONSES)
        event = instance.get_latest_materialization_event(context.key)
        if event is None:
            behind = bool(versions)
        else:  # a build that recorded nothing (an older version of this code) is left alone
            recorded = event.asset_materialization.metadata.get(RESPONSES_VERSION)
            behind = recorded is not None and recorded.value != combined_version(versions)
        return dg.AutomationResult(context, context.candidate_subset if behind else context.get_empty_subset())


class BuiltFromAnImport(dg.AutomationCondition):
    """True while the latest matrix was built from imported routing data (its `source` metadata
    starts with `import:`): the collected responses are not what it holds, so their changes must not
    replace it. Building the matrix from the collection by hand (no `import_path`) ends this."""

    @property
    def name(self) -> str:
        return "built_from_an_import"

    @property
    def description(self) -> str:
        return "the latest build imported routing data (build it once from the collection to resume)"

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        event = context.asset_graph_view.instance.get_latest_materialization_event(context.key)
        source = event.asset_materialization.metadata.get("source") if event is not None else None
        imported = source is not None and str(source.value).startswith(IMPORT_SOURCE_PREFIX)
        return dg.AutomationResult(context, context.candidate_subset if imported else context.get_empty_subset())


def reward_matrix_condition() -> dg.AutomationCondition:
    """eager(), plus a (first) build while the matrix is behind its responses. Never while a
    responses partition is in progress (a queued collection counts), or the matrix is in progress;
    after a failed build, only a new responses update (eager) tries again. A partition that is
    missing and not in progress does not hold it back: a retired worker's partition of a later batch
    is never collected, and a bad batch file's collection fails (the build leaves that batch out and
    lists it); waiting on every missing partition stopped the matrix following for good. Never
    while the matrix holds imported routing data: a change of the collected responses would replace
    it with the collection's matrix."""
    ac = dg.AutomationCondition
    updated = (ac.newly_missing() | ac.any_deps_updated()).since_last_handled()
    behind = (BuiltFromOtherResponses() & ~ac.execution_failed() & ~ac.newly_requested()).with_label(
        "behind its responses"
    )
    return ((updated | behind) & ~ac.any_deps_in_progress() & ~ac.in_progress() & ~BuiltFromAnImport()).with_label(
        "eager, or behind its responses"
    )


with warnings.catch_warnings():  # `use_user_code_server` is marked beta; it is what custom conditions need
    warnings.simplefilter("ignore", dg.BetaWarning)
    reward_matrix_automation = dg.AutomationConditionSensorDefinition(
        "reward_matrix_automation",
        target=dg.AssetSelection.assets(REWARD_MATRIX),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=AUTOMATION_INTERVAL_S,
        use_user_code_server=True,
        description="Rebuilds the reward matrix once no responses partition is being collected, and again "
                    "whenever the responses it was built from have changed since; never over a matrix imported from "
                    "routing data (evaluated on the code server).",
    )
