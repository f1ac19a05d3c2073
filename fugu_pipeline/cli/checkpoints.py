"""What `--checkpoint` names, for every command that takes one.

A checkpoint folder (`<output>/<method>/<hash>/`, the path a training command prints, or its
weights file), or the `--output` folder a training command wrote into: then its latest checkpoint,
said in one line on stderr. "Latest" is the one the last training command into that folder wrote:
each writes `<output>/latest.json` naming it (a re-run that lands on a checkpoint already there
still names it). A folder without that file (written by the pipeline's assets, or by hand), or
whose file names a checkpoint no longer there, falls back on the checkpoints' manifests: the
newest `created_at`, then the newest manifest file. `route`, `ask` and `serve` also take a models
folder holding a promoted pointer (`promoted/current.json`), which they follow.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from fugu_pipeline.cli.common import CLIError

LATEST_FILE = "latest.json"


def record_latest(output: str | Path, checkpoint: Path, command: str) -> None:
    """`<output>/latest.json` names `checkpoint`, which `command` wrote into `output` (a
    checkpoint outside `output` is not recorded)."""
    from fugu_pipeline.files import atomic_write

    output, checkpoint = Path(output).resolve(), Path(checkpoint).resolve()
    if not checkpoint.is_relative_to(output):
        return
    atomic_write(output / LATEST_FILE, json.dumps({
        "checkpoint": checkpoint.relative_to(output).as_posix(), "command": f"fugu-lite {command}",
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}, indent=2) + "\n")


def checkpoints_in(folder: Path) -> list[Path]:
    """The `<method>/<hash>/` checkpoints of a models folder (never the promoted pointers' folder,
    nor a training command's unfinished temporary folder)."""
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE

    return sorted(m.parent for m in folder.glob(f"*/*/{MANIFEST_FILE}")
                  if m.parent.parent.name != "promoted" and not m.parent.name.startswith("."))


def _recorded(folder: Path, found: list[Path]) -> tuple[Path, str] | None:
    try:
        record = json.loads((folder / LATEST_FILE).read_text(encoding="utf-8"))
        target = (folder / record["checkpoint"]).resolve()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    match = [p for p in found if p.resolve() == target]
    if not match:
        return None
    return match[0], f"written by {record.get('command', 'a training command')} at {record.get('written_at', '?')}"


def _created(path: Path) -> tuple[str, int]:
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE

    manifest = path / MANIFEST_FILE
    try:
        created = str(json.loads(manifest.read_text(encoding="utf-8")).get("created_at") or "")
    except (OSError, ValueError, AttributeError):
        created = ""
    try:
        stamp = datetime.fromisoformat(created).astimezone(timezone.utc).isoformat() if created else ""
    except ValueError:
        stamp = ""
    return stamp, manifest.stat().st_mtime_ns


def latest(folder: Path, found: list[Path]) -> tuple[Path, str]:
    """The latest of `found` (the checkpoints of `folder`) and, in words, why it is."""
    recorded = _recorded(folder, found)
    if recorded is not None:
        return recorded
    newest = max(found, key=_created)
    stamp = _created(newest)[0]
    return newest, f"the newest manifest{f', created {stamp}' if stamp else ''}"


def resolve_checkpoint(arg: str, flag: str = "--checkpoint", echo=None) -> Path:
    """The checkpoint folder `arg` names: a checkpoint (or its weights file), or a folder a
    training command wrote into (its latest checkpoint, said on stderr)."""
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE

    path = Path(arg)
    path = path.parent if path.is_file() else path
    if (path / MANIFEST_FILE).exists():
        return path
    if not path.is_dir():
        raise CLIError(f"{flag} {arg}: no such directory; pass the checkpoint path a training command printed "
                       "(<output>/<method>/<hash>) or the --output folder it wrote to")
    found = checkpoints_in(path)
    if not found:
        raise CLIError(f"{flag} {arg}: neither a checkpoint ({MANIFEST_FILE} + weights) nor a folder a training command "
                       "wrote one into (<output>/<method>/<hash>/); pass the path train-* printed")
    chosen, why = latest(path, found)
    others = f" (of {len(found)} there; pass another's path to use it)" if len(found) > 1 else ""
    (echo or _stderr)(f"{flag} {arg}: its latest checkpoint, {chosen} ({why}){others}")
    return chosen


def routable(arg: str, flag: str = "--checkpoint") -> tuple[Path, bool]:
    """For `route`, `ask` and `serve`: (the checkpoint, False), or (the models folder, True) when
    `arg` holds a promoted pointer, which they follow."""
    from fugu_pipeline.train.pointer import POINTER, ROLES_POINTER

    path = Path(arg)
    if path.is_dir() and ((path / POINTER).exists() or (path / ROLES_POINTER).exists()):
        return path, True
    return resolve_checkpoint(arg, flag), False


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
