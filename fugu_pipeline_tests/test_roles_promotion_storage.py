"""The coordinator's pointer (models/promoted/roles.json) is kept by the router's code: pointer before
history, symlinked method folders stay relative, a pointer replaced meanwhile is not overwritten,
a damaged pointer does not stop the record. Each case failed on the code before this change."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fugu_pipeline.evaluate.promotion import Candidate, Decision
from fugu_pipeline.policies.coordinator.contest import HISTORY, apply_roles
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.train.pointer import ROLES_POINTER, pointer_version, read_pointer


def _candidate(path, tag: str = "a" * 16) -> Candidate:
    return Candidate(path=str(path), method="roles", content_hash=tag, test_utility=np.array([0.5, 0.7]),
                     best_fixed_utility=np.array([0.4, 0.4]), train_router_utility=0.6)


def _decision(promote: bool = True) -> Decision:
    return Decision(promote=promote, challenger="roles", reasons=["PASS all gates"], figures={"challenger_test_utility": 0.6})


def _history(models):
    path = models / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_pointer_that_cannot_be_written_is_never_recorded_as_promoted(tmp_path, monkeypatch):
    import fugu_pipeline.evaluate.promotion_record as rp  # the one pointer discipline, every kind's

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rp, "write_pointer", disk_full)
    models = tmp_path / "models"
    ckpt = models / "roles" / ("a" * 16)
    ckpt.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="not written.*nothing was promoted"):
        apply_roles(_decision(), _candidate(ckpt), models)
    (line,) = _history(models)
    assert line["promote"] is False and line["not_an_attempt"] is True
    assert any("FAIL" in r for r in line["reasons"])


def test_a_symlinked_method_folder_stays_relative_to_the_models_folder(tmp_path):
    models, elsewhere = tmp_path / "models", tmp_path / "disk2" / "roles"
    (elsewhere / ("b" * 16)).mkdir(parents=True)
    models.mkdir()
    os.symlink(elsewhere, models / "roles")
    pointer = apply_roles(_decision(), _candidate(models / "roles" / ("b" * 16), "b" * 16), models)
    assert pointer["checkpoint"] == "roles/" + "b" * 16
    assert read_pointer(models, ROLES_POINTER)["checkpoint"] == "roles/" + "b" * 16
    assert _history(models)[-1]["promote"] is True


def test_a_pointer_replaced_since_it_was_read_is_not_overwritten(tmp_path):
    models = tmp_path / "models"
    first, second = models / "roles" / ("c" * 16), models / "roles" / ("d" * 16)
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    seen = pointer_version(models, ROLES_POINTER)  # attempt 2 reads "no king", then attempt 1 promotes
    apply_roles(_decision(), _candidate(first, "c" * 16), models)
    with pytest.raises(CheckpointError, match="changed since it was read"):
        apply_roles(_decision(), _candidate(second, "d" * 16), models, expected_version=seen)
    assert read_pointer(models, ROLES_POINTER)["content_hash"] == "c" * 16
    assert [h["promote"] for h in _history(models)] == [True, False]


def test_a_damaged_pointer_is_replaced_and_the_decision_recorded(tmp_path):
    models = tmp_path / "models"
    ckpt = models / "roles" / ("e" * 16)
    ckpt.mkdir(parents=True)
    (models / ROLES_POINTER).parent.mkdir(parents=True)
    (models / ROLES_POINTER).write_text("{\"checkpo")  # truncated by a crash of some other tool
    pointer = apply_roles(_decision(), _candidate(ckpt, "e" * 16), models)
    assert pointer["previous"] is None and read_pointer(models, ROLES_POINTER)["content_hash"] == "e" * 16
    assert apply_roles(_decision(False), _candidate(ckpt, "e" * 16), models) is None
    assert [h["promote"] for h in _history(models)] == [True, False]
