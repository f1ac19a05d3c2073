"""The multi-turn coordinator's trajectory CMA-ES on the mock pool with role behaviour and the tiny
encoder: the same seed gives the same checkpoint bytes, a re-run calls nothing, a SIGKILLed run
resumes from the trajectory store without calling its finished trajectories again, candidates share
minibatch and seeds, checkpoints of the new head kinds pass (and fail) weight sanity, and the
coordinator learns to delegate where that helps and to stop at one turn where it only costs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from fugu_pipeline.policies.coordinator.project import open_run, split
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint, save_checkpoint, weight_sanity
from fugu_pipeline.policies.coordinator.train import RolesConfig, train_roles, warm_start_weight
from fugu_pipeline.workers.config import load_workers_config

from . import roles_fixtures
from .conftest import REPO

WORKERS = REPO / "configs" / "workers.mock-roles.yaml"
QUIET = lambda s: None  # noqa: E731
SMALL = dict(generations=4, tasks_per_generation=6, explore_tasks=6, val_every=2, val_tasks=10, max_length=256)


encoder = roles_fixtures.encoder


def tasks_of(n: int = 30) -> list[Task]:
    return [Task.model_validate(r) for r in roles_batch(n)]


def train_in(store: Path, encoder, cfg: RolesConfig, tasks: list[Task] | None = None):
    """Train in a run whose trajectories live in `store`; returns (result, worker calls made, runner stats)."""
    tasks = tasks or tasks_of()
    config = load_workers_config(WORKERS)
    with open_run(config, encoder.settings, store, tasks, cfg, encoder=encoder) as run:
        res = train_roles(run.runner, run.featurizer, config.worker_ids, split(tasks, "train"), split(tasks, "val"),
                          cfg, log=QUIET)
        return res, sum(run.caller.calls.values()), run.runner.stats


def stored(store_dir: Path) -> list[dict]:
    """Every record of the (closed) trajectory store in `store_dir`, oldest first, as JSON objects."""
    from fugu_pipeline.session.store import TrajectoryStore

    path = next(store_dir.glob("*.sqlite"))
    with TrajectoryStore(store_dir, path.stem) as s:
        return [t.model_dump(mode="json") for t in s.iter_all()]


def count_rows(path: Path) -> int:
    """Committed trajectories in a store another process is writing (SQLite readers do not block it)."""
    import sqlite3

    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return int(db.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def checkpoint_bytes(path: Path) -> tuple[bytes, dict]:
    manifest = json.loads((path / "manifest.json").read_text())
    return (path / "head.safetensors").read_bytes(), {k: v for k, v in manifest.items() if k not in ("created_at", "wall_s")}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, encoder):
    """One SMALL training run shared by the tests that read it (result, worker calls, its store):
    they only read the store (a re-run on it runs no session, so it appends nothing)."""
    store = tmp_path_factory.mktemp("small-run") / "store"
    res, calls, _ = train_in(store, encoder, RolesConfig(**SMALL))
    return res, calls, store


# --------------------------------------------------------------------------- reproducibility and resuming


@pytest.mark.slow
def test_same_seed_same_checkpoint_bytes_and_a_rerun_calls_nothing(tmp_path, encoder, small_run):
    cfg = RolesConfig(**SMALL)
    a, calls_a, store_a = small_run
    b, calls_b, _ = train_in(tmp_path / "store-b", encoder, cfg)
    pa, pb = a.save(tmp_path / "models-a"), b.save(tmp_path / "models-b")
    assert pa.name == pb.name and checkpoint_bytes(pa) == checkpoint_bytes(pb)
    assert calls_a == calls_b > 0
    c, calls_c, stats = train_in(store_a, encoder, cfg)  # the same store again: all of it is stored
    assert calls_c == 0 and stats.sessions_run == 0 and stats.sessions_stored > 0
    assert checkpoint_bytes(c.save(tmp_path / "models-c")) == checkpoint_bytes(pa)
    other, _, _ = train_in(tmp_path / "store-d", encoder, RolesConfig(**{**SMALL, "seed": 1}))
    assert not np.array_equal(other.weight, a.weight)


def test_candidates_share_minibatch_and_seeds(small_run):
    """Common random numbers: in a generation every candidate runs the same (task, seed) pairs."""
    lines = stored(small_run[2])
    training = [t for t in lines if t["greedy"] and t["seed"] < 10**9 and not t["head"].startswith(("fixed:", "script:"))]
    pairs_by_head = defaultdict(set)
    for t in training:
        pairs_by_head[t["head"]].add((t["task_id"], t["seed"]))
    groups = defaultdict(list)  # heads of one generation share their pair set
    for head, pairs in pairs_by_head.items():
        groups[frozenset(pairs)].append(head)
    sizes = sorted(len(v) for v in groups.values())
    # SMALL's 4 generations, each ~17 candidates + the mean on one pair set
    assert len(sizes) == SMALL["generations"] and sizes[0] >= 10


KILL_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from pathlib import Path
from fugu_pipeline.policies.coordinator.project import open_run, roles_encoder_settings, split
from fugu_pipeline.features.encoder import Encoder
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.policies.coordinator.train import RolesConfig, train_roles
from fugu_pipeline.workers.config import load_workers_config
cfg = RolesConfig(**{cfg!r})
tasks = [Task.model_validate(r) for r in roles_batch(30)]
config = load_workers_config({workers!r})
enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
with open_run(config, enc.settings, Path({store!r}), tasks, cfg, encoder=enc) as run:
    train_roles(run.runner, run.featurizer, config.worker_ids, split(tasks, "train"), split(tasks, "val"), cfg,
                log=lambda s: print(s, flush=True))
print("FINISHED", flush=True)
"""


@pytest.mark.slow
def test_killed_training_resumes_without_calling_stored_trajectories_again(tmp_path, encoder, small_run):
    cfg = RolesConfig(**SMALL)
    full, calls_full, uninterrupted = small_run  # the uninterrupted run
    full_lines = len(stored(uninterrupted))

    store = tmp_path / "killed"
    script = KILL_SCRIPT.format(cfg=cfg.model_dump(), workers=str(WORKERS), store=str(store))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        files = list(store.glob("*.sqlite"))
        if files and count_rows(files[0]) >= full_lines // 2:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    out = proc.stdout.read()
    assert proc.returncode == -signal.SIGKILL and "FINISHED" not in out, out[-2000:]
    before = stored(store)
    paid = {turn["request_sha"] for t in before for turn in t["turns"] if turn["status"] == "ok"}  # requests answered before the kill

    resumed, calls_resumed, stats = train_in(store, encoder, cfg)
    assert stats.sessions_stored >= len(before)  # every finished trajectory is read back, none run again
    # Runs are deterministic and a run calls each distinct request once: the resumed run calls exactly
    # the requests the killed run had not stored, so nothing already paid for is paid again.
    assert calls_resumed == calls_full - len(paid) and 0 < calls_resumed < calls_full
    after = stored(store)[len(before):]
    recalled = {turn["request_sha"] for t in after for turn in t["turns"] if not turn["reused"]} & paid
    assert not recalled
    assert np.array_equal(resumed.weight, full.weight) and resumed.best_generation == full.best_generation
    print(f"\nuninterrupted run: {calls_full} worker calls, {full_lines} trajectories stored")
    print(f"killed (SIGKILL) after {len(before)} stored trajectories holding {len(paid)} answered requests")
    print(f"resumed run: {calls_resumed} worker calls (= {calls_full} - {len(paid)}), {stats.sessions_stored} "
          f"trajectories read from the store, {stats.sessions_run} sessions run; same weights as the uninterrupted run")


# --------------------------------------------------------------------------- checkpoints of the new head kinds


def test_roles_checkpoint_round_trip_and_weight_sanity(tmp_path, encoder, small_run):
    res = small_run[0]
    path = res.save(tmp_path / "models")
    ckpt = load_checkpoint(path, expected_contract=encoder.feature_contract())
    m = ckpt.manifest
    assert (m.method, m.head_kind, m.param_count) == ("roles", "roles_linear", 12 * 64)  # a worker softmax per role
    assert m.head_shape == {"worker_sets": 3}
    assert ckpt.manifest.feature_contract.pooling == "position" and m.feature_contract.token_position == -2
    assert m.training_config["session"]["max_turns"] == 5 and not weight_sanity(ckpt.state_dict, m)
    state = {k: v.clone() for k, v in ckpt.state_dict.items()}
    bad = {**state, "linear.weight": torch.full_like(state["linear.weight"], float("nan"))}
    assert any("non-finite" in p for p in weight_sanity(bad, m))
    assert any("all zero" in p for p in weight_sanity({**state, "linear.weight": torch.zeros_like(state["linear.weight"])}, m))
    assert any("shape" in p for p in weight_sanity({**state, "linear.weight": torch.ones(5, 64)}, m))
    assert any("feature_scale" in p for p in weight_sanity({**state, "feature_scale": torch.zeros(64)}, m))
    fields = {"worker_ids": m.worker_ids, "feature_contract": m.feature_contract, "data_version": "x"}
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint(tmp_path / "m2", "roles", "roles_linear", bad, fields)


@pytest.mark.slow
def test_svf_adapter_head_has_tinyrouters_shape_and_changes_the_features(tmp_path, encoder):
    from fugu_pipeline.session.featurize import TranscriptFeaturizer
    from fugu_pipeline.session.transcript import HeadInput
    from fugu_pipeline.policies.oneshot.heads import build_head
    from fugu_pipeline.session.svf import SVFAdapter

    assert build_head("roles_linear_svf", 1024, 3, svf_size=7 * 1024).param_count() == 13_312  # TinyRouter's head
    adapter = SVFAdapter(encoder.model)
    assert adapter.size == 64 + 32 + 32 + 64 + 64 + 64 + 64 and len(adapter.names) == 7  # q k v o gate up down
    base = TranscriptFeaturizer(encoder)
    x = [HeadInput("Task (math):\nWhat is 2 + 2?", "")]
    ones = base.with_scales(adapter, np.ones(adapter.size)).features(x)
    assert np.allclose(ones, base.features(x), atol=1e-5)  # z = 1 is the original encoder
    z = np.random.default_rng(0).uniform(0.5, 1.5, adapter.size)
    assert np.abs(base.with_scales(adapter, z).features(x) - ones).max() > 1e-3
    assert np.array_equal(base.features(x), ones) or np.allclose(base.features(x), ones, atol=1e-5)  # restored after use
    # the batched runner (layers below cached, per-row scales) gives what the in-place adapter gives
    inputs = [HeadInput(f"Task (math):\nWhat is {i} + {i}?", f"[Turn 1 · Worker · a]\n{2 * i}" if i % 2 else "")
              for i in range(6)]
    with adapter.applied(z):
        direct = TranscriptFeaturizer(encoder).features(inputs)
    assert np.allclose(base.with_scales(adapter, z).features(inputs), direct, atol=2e-5)
    res, _, _ = train_in(tmp_path / "store", encoder, RolesConfig(**{**SMALL, "generations": 2, "svf": True}))
    # before: scales = 1 + u with the head's step (sigma 0.5 per coordinate): std 0.62 after 5 generations,
    # 7% negative. Now z = exp(u) with its own step of 0.1: the candidates' encoders stay near the original
    assert (res.svf_scales > 0).all()
    assert 0.05 < res.metrics["svf_candidate_log_scale_std"] < 0.2 and res.metrics["svf_candidate_min_scale"] > 0.4
    path = res.save(tmp_path / "models")
    m = load_checkpoint(path).manifest
    assert m.head_kind == "roles_linear_svf" and m.head_shape == {"svf_size": adapter.size, "worker_sets": 3}
    assert m.param_count == 12 * 64 + adapter.size


def test_warm_start_copies_worker_rows_only_where_the_encoders_match(tmp_path, encoder):
    from fugu_pipeline.features.contract import FeatureContract
    from fugu_pipeline.session.featurize import TranscriptFeaturizer

    f = TranscriptFeaturizer(encoder)
    ids = load_workers_config(WORKERS).worker_ids
    rows = torch.randn(3, 64)

    def one_step(kind: str, contract) -> Path:
        state = {"linear.weight": rows} if kind == "normed_linear" else {
            "norm.weight": torch.ones(64), "norm.bias": torch.zeros(64), "linear.weight": rows, "linear.bias": torch.zeros(3)}
        return save_checkpoint(tmp_path / "models", kind.replace("_", "-"), kind, state,
                               {"worker_ids": ids[::-1], "feature_contract": contract, "data_version": "x"})

    same = encoder.feature_contract().model_copy(update={"prompt_template": "{prompt}", "max_length": 512})
    w, why = warm_start_weight(f, ids, load_checkpoint(one_step("normed_linear", same)))
    assert w is not None and "warm start" in why
    assert np.allclose(w[0], rows[2].numpy()) and np.allclose(w[2], rows[0].numpy())  # matched by worker id
    assert not w[3:].any()  # role rows start at zero
    mean_pooled = FeatureContract(**{**same.model_dump(), "pooling": "mean", "token_position": None})
    w, why = warm_start_weight(f, ids, load_checkpoint(one_step("normed_linear", mean_pooled)))
    assert w is None and "pooling" in why
    w, why = warm_start_weight(f, ids, load_checkpoint(one_step("layernorm_linear", same)))
    assert w is None and "layernorm_linear" in why


# --------------------------------------------------------------------------- it learns what it should


@pytest.mark.slow
def test_coordinator_delegates_where_it_helps_and_stops_at_one_turn_where_it_only_costs(tmp_path, encoder):
    """Held-out, live, against the best fixed worker (chosen on train) with the same seeds: on
    `multistep` the coordinator is far more accurate (Thinker, Worker, Verifier); on `lookup` it
    answers in about one turn and loses no significant accuracy."""
    from fugu_pipeline.policies.coordinator.evaluate import evaluate_roles, report_lines
    from fugu_pipeline.policies.coordinator.train import reward

    tasks = tasks_of(200)
    cfg = RolesConfig(generations=40, max_length=256)
    config = load_workers_config(WORKERS)
    with open_run(config, encoder.settings, tmp_path / "store", tasks, cfg, encoder=encoder) as run:
        res = train_roles(run.runner, run.featurizer, config.worker_ids, split(tasks, "train"), split(tasks, "val"), cfg,
                          log=QUIET)
        rep = evaluate_roles(run.runner, res.policy(), split(tasks, "test"), split(tasks, "train"), config.worker_ids,
                             lambda t: reward(t, cfg), seeds=2)
    print("\n" + "\n".join(report_lines(rep)))
    dom = {d["domain"]: d for d in rep["per_domain"]}
    ms, lk = dom["multistep"], dom["lookup"]
    assert ms["coordinator_vs_best_fixed"]["low"] > 0.05  # significantly more accurate where a plan and a check help
    assert ms["policies"]["coordinator"]["mean_turns"] > 1.5  # ... because it delegates there
    assert lk["policies"]["coordinator"]["mean_turns"] < 1.35  # one turn, mostly, where more turns only cost
    assert lk["coordinator_vs_best_fixed"]["low"] > -0.15  # and no significant loss there
    assert rep["paired"]["coordinator_vs_best_fixed"]["reward"]["mean"] > 0  # worth its turns overall


@pytest.mark.slow
def test_uniform_start_that_nothing_beats_still_saves(tmp_path, encoder):
    """init: uniform (the all-zero start) on a pool where every answer is wrong and turns are free:
    no generation beats generation 0 on validation. Before: the kept head was the zero head, and
    saving it failed ("linear.weight is all zero"). Now the best trained head is kept and saved,
    and the manifest says it did not beat the start."""
    import yaml

    raw = yaml.safe_load(WORKERS.read_text())
    for w in raw["workers"]:
        w["mock"]["strengths"] = {k: 0.0 for k in w["mock"]["strengths"]}
        w["mock"]["roles"]["plan_boost"] = {}
        w["mock"]["roles"]["revise_boost"] = {}
    hopeless = tmp_path / "hopeless.yaml"
    hopeless.write_text(yaml.safe_dump(raw))
    cfg = RolesConfig(**{**SMALL, "generations": 2, "init": "uniform", "turn_penalty": 0.0, "cost_penalty": 0.0})
    config = load_workers_config(hopeless)
    tasks = tasks_of()
    with open_run(config, encoder.settings, tmp_path / "store", tasks, cfg, encoder=encoder) as run:
        res = train_roles(run.runner, run.featurizer, config.worker_ids, split(tasks, "train"), split(tasks, "val"),
                          cfg, log=QUIET)
    assert res.metrics["selected"].endswith("_not_better_than_uniform_start") and res.weight.any()
    path = res.save(tmp_path / "models")
    ckpt = load_checkpoint(path)
    assert not weight_sanity(ckpt.state_dict, ckpt.manifest)
