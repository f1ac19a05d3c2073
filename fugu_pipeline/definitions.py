"""Dagster entry point: `dagster dev -w workspace.yaml` loads `defs` from here.

Thin: the Definitions are assembled in `fugu_pipeline.defs.assemble`. torch and transformers are
not imported while loading (DESIGN §2).
"""

from dotenv import load_dotenv

from fugu_pipeline.defs.assemble import build_defs

load_dotenv(override=False)  # OPENROUTER_API_KEY may live in .env; never written anywhere

defs = build_defs()
