"""fugu_pipeline: a learned LLM router built as a Dagster asset pipeline.

Downstream code: `from fugu_pipeline import load_promoted` (see `fugu_pipeline.route.promoted`; any kind of
router, through `fugu_pipeline.policies.registry`).
"""

__all__ = ["load_promoted"]


def __getattr__(name: str):
    if name == "load_promoted":  # lazy: importing the package stays cheap
        from fugu_pipeline.policies.registry import load_promoted

        return load_promoted
    raise AttributeError(f"module 'fugu_pipeline' has no attribute {name!r}")
