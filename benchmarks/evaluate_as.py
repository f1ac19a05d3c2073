"""`fugu-lite evaluate` run in this process with one function replaced for the run: how the
benchmarks compare a rule as it serves against another (`cascade_cap_follow.py`, `cap_mix_drift.py`)."""

from __future__ import annotations

import json
from pathlib import Path


def evaluated(args: list[str], out: Path, owner, name: str, way) -> dict | str:
    """The report of `fugu-lite evaluate <args> --output <out>` with `owner.name` replaced by `way`
    (put back after), or the line saying how it exited."""
    from fugu_pipeline.cli.main import main as cli

    served = getattr(owner, name)
    setattr(owner, name, way)
    try:
        code = cli(["evaluate", *args, "--output", str(out)])
    finally:
        setattr(owner, name, served)
    return json.loads(out.read_text()) if code == 0 else f"evaluate exited {code}"
