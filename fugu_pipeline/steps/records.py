"""Step records: what a step made from which inputs, so the same inputs never run it twice.

A step's fingerprint is the hash of everything its output depends on: its code version
(`versions.code_version`), the data versions of its inputs (the reward matrix's, a warm start's
content hash, the heads a cascade competes with), the encoder's fingerprint and the resolved config
(every field, defaults included). Its record is `<models>/.steps/<step>/<fingerprint>/record.json`:
the output (paths relative to the models folder, figures for the UI) and the files the step kept beside it
(out-of-fold scores a cascade competes with). `find` returns a record only while every output it
needs is still on disk; a record is written after its outputs, into a temporary folder
renamed into place, so a crash leaves either the whole record or none.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fugu_pipeline.files import fsync_dir
from fugu_pipeline.hashing import canonical_json, sha256_text

STEPS_FOLDER = ".steps"
RECORD_FILE = "record.json"


def fingerprint(**parts: Any) -> str:
    """16 hex digits of the canonical JSON of `parts` (each a version, a config dump, a path name)."""
    return sha256_text(canonical_json(parts))[:16]


@dataclass
class StepRecord:
    step: str
    fingerprint: str
    output: dict[str, Any]  # JSON; paths in it relative to the models folder
    summary: dict[str, Any] = field(default_factory=dict)  # JSON figures the caller shows
    created_at: float = 0.0
    folder: Path | None = None  # where the record and the files kept beside it lie
    reused: bool = False  # True when `find` returned it (nothing was computed this time)

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created_at))


def relative(path: str | Path, models_dir: str | Path) -> str:
    """`path` (under the models folder) relative to it, as a record stores it."""
    return Path(path).resolve().relative_to(Path(models_dir).resolve()).as_posix()


def record_folder(models_dir: str | Path, step: str, fp: str) -> Path:
    return Path(models_dir) / STEPS_FOLDER / step / fp


def find(models_dir: str | Path, step: str, fp: str) -> StepRecord | None:
    """The record of `step` for inputs `fp`, when it exists and every checkpoint it names is on disk."""
    folder = record_folder(models_dir, step, fp)
    try:
        raw = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("fingerprint") != fp:
        return None
    models = Path(models_dir)
    if not all((models / rel).exists() for rel in raw.get("needs", [])):
        return None  # a checkpoint or report was deleted: the step runs again
    return StepRecord(step, fp, raw.get("output", {}), raw.get("summary", {}), raw.get("created_at", 0.0), folder, True)


def scratch(models_dir: str | Path, step: str) -> Path:
    """A temporary folder for a record being made (files kept beside it go there first)."""
    parent = Path(models_dir) / STEPS_FOLDER / step
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))


def keep(models_dir: str | Path, step: str, fp: str, output: dict, *, needs: list[str | Path] = (),
         summary: dict | None = None, folder: Path | None = None) -> StepRecord:
    """Write the record of `step` for inputs `fp` (after its outputs are on disk): `folder` is the
    `scratch` folder holding the files kept beside it, renamed into place with the record. `needs`:
    the outputs (under the models folder) without which the record is not used."""
    models = Path(models_dir)
    rel = [relative(c, models) for c in needs]
    tmp = folder or scratch(models, step)
    created = time.time()
    body = {"step": step, "fingerprint": fp, "output": output, "summary": summary or {}, "needs": rel,
            "created_at": created}
    (tmp / RECORD_FILE).write_text(json.dumps(body, indent=1, sort_keys=True, default=str), encoding="utf-8")
    target = record_folder(models, step, fp)
    if target.exists():  # the same inputs made again (a record whose checkpoint had been deleted)
        shutil.rmtree(target)
    tmp.rename(target)
    fsync_dir(target.parent)
    return StepRecord(step, fp, output, summary or {}, created, target, False)


def discard(folder: Path | None) -> None:
    """Remove a `scratch` folder a failed step leaves."""
    if folder is not None and folder.name.startswith(".tmp-"):
        shutil.rmtree(folder, ignore_errors=True)
