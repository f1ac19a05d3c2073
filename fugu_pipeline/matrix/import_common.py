"""What every importer shares: file reading with errors that name the file, the deterministic
split draw from (seed, task id), and the id/ood tags."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from fugu_pipeline.matrix.import_format import RewardRow
from fugu_pipeline.tasks.loading import TaskFileError


def fail(path: Path, msg: str, line: int = 0) -> TaskFileError:
    return TaskFileError(Path(path), [(line, msg)])


def read_bytes(path: Path, what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise fail(path, f"file not found; pass the path of {what}")
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except OSError as exc:
            raise fail(path, f"not a valid gzip file: {exc}") from None
    return data


def read_text(path: Path, what: str) -> str:
    try:
        return read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(path, f"not UTF-8 text: {exc}") from None


def unit(seed: int, task_id: str) -> float:
    """A uniform number in [0, 1) that depends only on (seed, task_id)."""
    h = hashlib.sha256(f"{seed}\x00{task_id}".encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def assign_split(task_id: str, seed: int = 0, test_fraction: float = 0.3, val_fraction: float = 0.1) -> str:
    if test_fraction < 0 or val_fraction < 0 or test_fraction + val_fraction >= 1:
        raise ValueError(f"need test_fraction >= 0, val_fraction >= 0 and a sum below 1; got {test_fraction} and {val_fraction}")
    u = unit(seed, task_id)
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def tag_in_distribution(rows: list[RewardRow]) -> list[RewardRow]:
    """Add `id` to rows whose domain occurs among the training rows, `ood` to the others."""
    seen = {r.domain for r in rows if r.split == "train"}
    return [r.model_copy(update={"tags": [t for t in r.tags if t not in ("id", "ood")]
                                 + ["id" if r.domain in seen else "ood"]}) for r in rows]


# What to do when a reward-matrix JSONL holds no test rows (said by `fugu-lite train` and `evaluate`).
HOLD_OUT_HINT = ("rows without a 'split' field count as train; hold some out with `fugu-lite import jsonl R.jsonl "
                 "--output R2.jsonl --test-fraction 0.3`, or give rows \"split\": \"test\"")
