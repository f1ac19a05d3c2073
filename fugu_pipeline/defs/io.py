"""How assets hand their outputs on: Dagster's own pickled files under the instance's storage
folder, with one difference. An asset materialized before its input ever was (`router_es` on a
fresh instance, before `router_rl`) used to fail with a raw FileNotFoundError from inside Dagster;
it now fails in one line naming the input and what to materialize first."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.fs_io_manager import PickledObjectFilesystemIOManager

from fugu_pipeline.defs.failures import explained_failure


def first_hint(name: str) -> str:
    """What to do about an input `name` that is missing or stale."""
    return (f"materialize it first (fugu-lite materialize {name}; dagster asset materialize -m fugu_pipeline.definitions "
            f"--select {name}; or \"Materialize stale and missing\" in the UI) or run the main job (fugu-lite pipeline)")


class NamedUpstream(dg.IOManager):
    """The default filesystem IO manager, naming a missing input instead of a missing file."""

    def __init__(self, inner: PickledObjectFilesystemIOManager):
        self.inner = inner

    def handle_output(self, context: dg.OutputContext, obj) -> None:
        self.inner.handle_output(context, obj)

    def load_input(self, context: dg.InputContext):
        try:
            return self.inner.load_input(context)
        except FileNotFoundError:
            upstream = context.asset_key.to_user_string() if context.has_asset_key else context.name
            me = context.op_def.name if context.op_def else "this step"
            raise explained_failure(f"{me} needs {upstream}, which was never materialized on this instance; nothing was run",
                                    first_hint(upstream)) from None


@dg.io_manager(description="Pickled outputs under the instance's storage folder (Dagster's default); a missing input "
                           "is one line naming what to materialize first.")
def step_outputs(init_context: dg.InitResourceContext) -> NamedUpstream:
    return NamedUpstream(PickledObjectFilesystemIOManager(base_dir=init_context.instance.storage_directory()))
