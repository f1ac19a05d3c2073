"""`kill -9` during a write of the promoted pointer left `.current.json.<random>.tmp` beside it for
good. The next pointer write now removes such leftovers, and never the temporary file of a writer
that is still alive (it holds a lock on it until its rename). Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fugu_pipeline.files import STALE_TEMP_AGE_S, remove_stale_temps
from fugu_pipeline.train.pointer import POINTER, read_pointer, write_pointer

# A writer that stops after writing and syncing its temporary file, just before the rename, and
# says so; it renames when told to on stdin (or waits there to be killed).
WRITER = """
import os, sys
from fugu_pipeline.train.pointer import write_pointer
real = os.replace
def paused(src, dst):
    print("paused", flush=True)
    if sys.stdin.readline().strip() == "go":
        real(src, dst)
os.replace = paused
write_pointer(sys.argv[1], {"checkpoint": sys.argv[2], "content_hash": "abc"})
print("done", flush=True)
"""


def start_writer(models: Path, checkpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(models), checkpoint], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "paused"
    return proc


def temps(models: Path) -> list[Path]:
    return sorted((models / POINTER).parent.glob(".current.json.*.tmp"))


def age(paths: list[Path], seconds: float) -> None:
    then = time.time() - seconds
    for p in paths:
        os.utime(p, (then, then))


def test_a_writer_killed_mid_write_leaves_nothing_after_the_next_promotion(tmp_path):
    models = tmp_path / "models"
    write_pointer(models, {"checkpoint": "sft/first", "content_hash": "first"})
    proc = start_writer(models, "sft/killed")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = temps(models)
    assert len(left) == 1 and json.loads(left[0].read_text())["checkpoint"] == "sft/killed"
    assert read_pointer(models)["checkpoint"] == "sft/first"  # the pointer itself is whole
    age(left, STALE_TEMP_AGE_S + 60)  # the next promotion comes later
    write_pointer(models, {"checkpoint": "sft/second", "content_hash": "second"})
    assert temps(models) == [] and read_pointer(models)["checkpoint"] == "sft/second"


def test_a_live_writers_temporary_file_is_never_removed(tmp_path):
    models = tmp_path / "models"
    proc = start_writer(models, "sft/slow")  # alive, holding its lock, as a writer stuck in a slow fsync
    try:
        mine = temps(models)
        age(mine, STALE_TEMP_AGE_S + 60)  # old, yet alive
        write_pointer(models, {"checkpoint": "sft/other", "content_hash": "other"})  # a second writer at once
        assert remove_stale_temps(models / POINTER) == [] and temps(models) == mine
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
    finally:
        proc.kill()
        proc.wait()
    assert temps(models) == [] and read_pointer(models)["checkpoint"] == "sft/slow"  # its rename went through


def test_a_young_leftover_is_kept_until_it_is_old_enough(tmp_path):
    """The instant between a writer creating its file and locking it: a fresh, unlocked file stays."""
    models = tmp_path / "models"
    write_pointer(models, {"checkpoint": "sft/first", "content_hash": "first"})
    fresh = (models / POINTER).parent / ".current.json.abcd1234.tmp"
    fresh.write_text("{}")
    assert remove_stale_temps(models / POINTER) == [] and fresh.exists()
    age([fresh], STALE_TEMP_AGE_S + 1)
    assert remove_stale_temps(models / POINTER) == [fresh] and not fresh.exists()
