"""The trajectory store: compressed, turn texts kept once, opened without reading its records,
looked up by index, durable across a kill, one writer at a time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from fugu_pipeline.collect.store import PartitionBusyError
from fugu_pipeline.session.callers import ClientCaller
from fugu_pipeline.session.loop import SessionSpec, run_sessions
from fugu_pipeline.session.policy import FixedPolicy
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.session.store import TrajectoryStore, trajectory_key
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.workers.config import load_workers_config

from .conftest import REPO

WORKERS = REPO / "configs" / "workers.mock-roles.yaml"


def sessions(n: int = 10):
    config = load_workers_config(WORKERS)
    tasks = [Task.model_validate(r) for r in roles_batch(n)]
    pol = FixedPolicy(config.worker_ids, "checker", "verifier", one_step=False)

    async def go():
        caller = ClientCaller.from_config(config)
        try:
            return await run_sessions([SessionSpec.for_task(pol, t, seed=3) for t in tasks], caller)
        finally:
            await caller.aclose()

    return tasks, asyncio.run(go())


def test_round_trip_texts_kept_once_and_smaller_than_json_lines(tmp_path):
    _, trs = sessions(10)
    copies = [t.model_copy(update={"head": f"cand-{k}"}) for k in range(20) for t in trs]  # a population sharing turns
    with TrajectoryStore(tmp_path, "ctx") as store:
        store.append(copies)
    with TrajectoryStore(tmp_path, "ctx") as store:
        assert len(store) == len(copies)
        back = store.get(trajectory_key(trs[3].task_id, "cand-7", trs[3].seed, True))
        assert back.model_dump() == copies[7 * len(trs) + 3].model_dump()  # texts re-attached, every field equal
        sha = trs[0].turns[0].request_sha
        assert store.completion(sha).answer == trs[0].turns[0].text
    json_lines = sum(len(t.model_dump_json()) + 1 for t in copies)
    size = sum(p.stat().st_size for p in tmp_path.glob("ctx.sqlite*"))
    assert size < json_lines / 4, (size, json_lines)


def test_opening_reads_no_record(tmp_path, monkeypatch):
    """before: `SessionRunner` read the whole store (every trajectory, parsed) when it opened; now it
    looks up what it is about to run."""
    tasks, trs = sessions(6)
    with TrajectoryStore(tmp_path, "ctx") as store:
        store.append(trs)
    decoded = []
    orig = TrajectoryStore._trajectory
    monkeypatch.setattr(TrajectoryStore, "_trajectory", lambda self, blob: decoded.append(1) or orig(self, blob))
    store = TrajectoryStore(tmp_path, "ctx")
    runner = SessionRunner(caller=None, store=store)  # type: ignore[arg-type]
    assert decoded == []
    pol = FixedPolicy(load_workers_config(WORKERS).worker_ids, "checker", "verifier", one_step=False)
    got = runner.stored(tasks[2], pol, 3, True)
    assert got is not None and got.task_id == tasks[2].task_id and decoded == [1]
    assert runner.stored(tasks[2], pol, 4, True) is None  # another seed: not stored
    store.close()


KILL = """
import sys
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.store import TrajectoryStore
trs = [Trajectory.model_validate_json(x) for x in open(sys.argv[1])]
store = TrajectoryStore(sys.argv[2], "ctx").open()
store.append(trs[:5])
print("COMMITTED", flush=True)
import os, signal
db = store._db
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO trajectories (task_id, head, seed, greedy, status, prompt_hash, data) VALUES ('x','y',1,1,'ok','p',x'00')")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_mid_write_keeps_every_committed_trajectory_and_the_lock_frees(tmp_path):
    _, trs = sessions(5)
    src = tmp_path / "trs.jsonl"
    src.write_text("".join(t.model_dump_json() + "\n" for t in trs))
    out = subprocess.run([sys.executable, "-c", KILL, str(src), str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert "COMMITTED" in out.stdout and out.returncode == -9
    with TrajectoryStore(tmp_path, "ctx") as store:  # the killed writer's lock went with it
        assert len(store) == 5
        assert store.get(("x", "y", 1, True)) is None  # the torn transaction rolled back
        assert all(store.get(trajectory_key(t.task_id, t.head, t.seed, t.greedy)) for t in trs[:5])


def test_a_second_writer_is_refused_and_records_stay_readable_as_json(tmp_path):
    _, trs = sessions(3)
    first = TrajectoryStore(tmp_path, "ctx").open()
    with pytest.raises(PartitionBusyError, match="another run"):
        TrajectoryStore(tmp_path, "ctx").open()
    first.append(trs)
    done, every = first.read()
    assert len(every) == len(trs) == 9 and json.loads(every[0].model_dump_json())["turns"][0]["text"]
    first.close()
