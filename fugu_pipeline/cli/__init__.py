"""The `fugu-lite` command line (`fugu_pipeline.cli:main`)."""

from fugu_pipeline.cli.main import main

__all__ = ["main"]
