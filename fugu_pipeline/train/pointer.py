"""The promoted pointer: `models/promoted/current.json` names the promoted checkpoint (DESIGN §3).

It is replaced atomically (temporary file, fsync, rename, fsync of the folder), so a reader sees
the old pointer or the new one, never half of one. `checkpoint` is relative to the models folder
(or absolute when the checkpoint lives elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

from fugu_pipeline.files import atomic_write

POINTER = Path("promoted") / "current.json"
ROLES_POINTER = Path("promoted") / "roles.json"  # the promoted multi-turn coordinator (its own king)


def read_pointer(models_dir: str | Path, pointer_file: Path = POINTER) -> dict | None:
    path = Path(models_dir) / pointer_file
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def write_pointer(models_dir: str | Path, pointer: dict, pointer_file: Path = POINTER) -> Path:
    """Atomically replace models/promoted/current.json (or `pointer_file`): a reader sees the old
    or the new one."""
    return atomic_write(Path(models_dir) / pointer_file, json.dumps(pointer, indent=2, sort_keys=True) + "\n")


def pointer_target(models_dir: str | Path, pointer: dict) -> Path:
    """The checkpoint directory a pointer names."""
    p = Path(pointer["checkpoint"])
    return p if p.is_absolute() else Path(models_dir) / p
