"""Checkpoints a user did not write: damaged or crafted manifests, weights, neighbour sets,
ensembles, promoted pointers and budget calibrations. Each gets one clear error (library: a
CheckpointError / RouterError naming the file and field; CLI: exit 2, one line, no traceback), and
nothing is routed from a checkpoint that does not say what it holds.

A crafted checkpoint is re-signed (`_resign`: weights_sha256 and content_hash recomputed, the
folder renamed to the new hash) so the checks behind the hash are what is tested, not the hash."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.hashing import canonical_json
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    UNHASHED_FIELDS,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from fugu_pipeline.policies.oneshot.ensemble import EnsembleHead
from fugu_pipeline.policies.oneshot.predictors import DomainPriorHead, KNNHead

DIM = 16
WORKERS = ["w1", "w2", "w3"]
CONTRACT = FeatureContract(encoder_id="synthetic", dim=DIM)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """A kNN and an ensemble checkpoint, saved the ordinary way."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, DIM)).astype(np.float32)
    q = rng.uniform(size=(30, 3))
    doms = ["a", "b", "c"] * 10
    knn = KNNHead.fit(x, q, q, doms, k=5)
    prior = DomainPriorHead.fit(DIM, q, q, doms)
    ens = EnsembleHead.from_members([knn, prior], [0.5, 0.5], [(1.0, 0.0), (1.0, 0.0)])
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for kind, head in (("knn", knn), ("ensemble", ens)):
        out[kind] = save_checkpoint(root, kind, kind, head.state_dict(), {
            "worker_ids": WORKERS, "feature_contract": CONTRACT, "data_version": "d1",
            "head_params": head.head_params()})
    return out


@pytest.fixture
def models(tmp_path, pristine) -> Path:
    root = tmp_path / "models"
    for kind, path in pristine.items():
        shutil.copytree(path, root / kind / path.name)
    return root


def _ckpt(models: Path, kind: str = "knn") -> Path:
    return next((models / kind).iterdir())


def _resign(path: Path) -> Path:
    """Recompute the weights digest and content hash of an edited checkpoint, as a forger would,
    and move it to the folder its new hash names."""
    m = json.loads((path / MANIFEST_FILE).read_text())
    raw = (path / WEIGHTS_FILE).read_bytes()
    m["weights_sha256"] = hashlib.sha256(raw).hexdigest()
    body = {k: v for k, v in m.items() if k not in UNHASHED_FIELDS and not (k in ("head_params", "head_shape") and not v)}
    m["content_hash"] = hashlib.sha256(raw + canonical_json(body).encode()).hexdigest()[:16]
    (path / MANIFEST_FILE).write_text(json.dumps(m))
    target = path.parent / m["content_hash"]
    path.rename(target)
    return target


def _edit_manifest(path: Path, fn) -> Path:
    m = json.loads((path / MANIFEST_FILE).read_text())
    fn(m)
    (path / MANIFEST_FILE).write_text(json.dumps(m))
    return _resign(path)


def _edit_tensors(path: Path, fn, record_shapes: bool = True) -> Path:
    t = dict(st_load((path / WEIGHTS_FILE).read_bytes()))
    t = fn(t)
    (path / WEIGHTS_FILE).write_bytes(st_save(t, metadata={"format": "pt"}))
    if record_shapes:
        m = json.loads((path / MANIFEST_FILE).read_text())
        m["tensors"] = {k: list(v.shape) for k, v in t.items()}
        (path / MANIFEST_FILE).write_text(json.dumps(m))
    return _resign(path)


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, expected_contract=CONTRACT)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_the_pristine_checkpoints_load_and_re_signing_alone_changes_nothing(models):
    for kind in ("knn", "ensemble"):
        path = _edit_manifest(_ckpt(models, kind), lambda m: None)
        assert load_checkpoint(path, expected_contract=CONTRACT).manifest.head_kind == kind


# --------------------------------------------------------------------------- already refused well


def _set(**kv):
    def fn(m):
        for k, v in kv.items():
            m[k] = v
    return fn


@pytest.mark.parametrize("text, words", [
    ('{"format_version": 1, "meth', ["manifest.json", "Invalid JSON"]),
    ("[]", ["manifest.json", "object"]),
    ("", ["manifest.json", "Invalid JSON"]),
])
def test_a_manifest_that_is_not_a_json_object_is_refused(models, text, words):
    path = _ckpt(models)
    (path / MANIFEST_FILE).write_text(text)
    _refused(path, *words)


@pytest.mark.parametrize("edit, words", [
    (_set(head_kind="evil"), ["unknown head kind 'evil'"]),
    (_set(head_kind="ridge"), ["do not build a ridge head"]),
    (_set(evil=1), ["evil", "Extra inputs"]),
    (lambda m: m.pop("tensors"), ["tensors", "Field required"]),
    (_set(worker_ids=["w1", "w1", "w3"]), ["worker_ids", "more than once"]),
    (_set(worker_ids=["w1", "w2", "w3", "w4"], n_workers=4), ["with 4 workers needs"]),
    (_set(dim=DIM + 1), ["dim=17", "dim=16"]),
])
def test_a_crafted_manifest_is_refused_naming_the_field(models, edit, words):
    _refused(_edit_manifest(_ckpt(models), edit), *words)


@pytest.mark.parametrize("raw, words", [
    (b"", ["head.safetensors", "header too small"]),
    ((2 ** 62).to_bytes(8, "little") + b"{}", ["head.safetensors", "header too large"]),
])
def test_unreadable_weights_are_refused(models, raw, words):
    path = _ckpt(models)
    (path / WEIGHTS_FILE).write_bytes(raw)
    _refused(path, *words)


def test_truncated_weights_are_refused(models):
    path = _ckpt(models)
    (path / WEIGHTS_FILE).write_bytes((path / WEIGHTS_FILE).read_bytes()[:200])
    _refused(path, "head.safetensors", "not a readable safetensors file")


def _zero_first_neighbour(t):
    nb = t["neighbours"].clone()
    nb[0] = 0
    return {**t, "neighbours": nb}


@pytest.mark.parametrize("fn, words", [
    (lambda t: {k: v.to(torch.int8) for k, v in t.items()}, ["dtype torch.int8"]),
    (lambda t: {**t, "neighbour_utility": t["neighbour_utility"] * float("nan")}, ["neighbour_utility", "non-finite"]),
    (lambda t: {**t, "neighbours": t["neighbours"] * float("inf")}, ["neighbours", "non-finite"]),
    (lambda t: {k: v for k, v in t.items() if k != "neighbour_utility"}, ["missing tensor(s) ['neighbour_utility']"]),
    (lambda t: {**t, "evil": torch.zeros(2)}, ["unexpected tensor(s) ['evil']"]),
    (_zero_first_neighbour, ["neighbours must be L2-normalised"]),
    (lambda t: {**t, "neighbour_quality": t["neighbour_quality"][:-1].clone()}, ["neighbour_quality has shape [29, 3]"]),
    (lambda t: {**t, "neighbour_utility": t["neighbour_utility"].flip(1).contiguous()}, ["routing_map does not match"]),
])
def test_crafted_knn_tensors_are_refused(models, fn, words):
    _refused(_edit_tensors(_ckpt(models), fn), *words)


@pytest.mark.parametrize("members, words", [
    ([{"kind": "ensemble", "params": {}}], ["members cannot be ensembles"]),
    ([{"kind": "../../etc", "params": {}}], ["unknown head kind '../../etc'"]),
    ([], ["at least one member"]),
])
def test_crafted_ensemble_members_are_refused(models, members, words):
    def edit(m):
        m["head_params"]["members"] = members
    _refused(_edit_manifest(_ckpt(models, "ensemble"), edit), *words)


def test_a_contract_for_another_encoder_or_dim_is_refused_naming_each_field(models):
    other = CONTRACT.model_copy(update={"encoder_id": "other/model", "dim": 32})
    with pytest.raises(CheckpointError, match="encoder_id.*dim|dim.*encoder_id"):
        load_checkpoint(_ckpt(models), expected_contract=other)


# --------------------------------------------------------------------------- hyper-parameters


@pytest.mark.parametrize("key, value", [("k", float("inf")), ("prior_weight", float("nan")),
                                        ("same_domain_bonus", float("-inf")), ("temperature", float("nan"))])
def test_a_non_finite_hyper_parameter_is_refused_naming_it(models, key, value):
    def edit(m):
        m["head_params"][key] = value
    _refused(_edit_manifest(_ckpt(models), edit), "manifest.json", f"head_params.{key}", "finite")


def test_a_non_finite_member_hyper_parameter_is_refused_naming_it(models):
    def edit(m):
        m["head_params"]["members"][0]["params"]["k"] = float("inf")
    _refused(_edit_manifest(_ckpt(models, "ensemble"), edit), "head_params.members.0.params.k", "finite")


@pytest.mark.parametrize("kind, edit", [
    ("knn", lambda m: m["head_params"].update(n_neighbours=10 ** 12)),
    ("knn", lambda m: m.update(head_shape={"svf_size": 10 ** 12})),
    ("ensemble", lambda m: m["head_params"]["members"][0]["params"].update(n_neighbours=10 ** 12)),
])
def test_a_size_the_weights_do_not_hold_is_refused_without_allocating_it(models, kind, edit):
    """10**12 neighbours would be a 64 TB buffer: the shapes are compared before any is allocated."""
    _refused(_edit_manifest(_ckpt(models, kind), edit), "refusing these weights")


@pytest.mark.parametrize("members, words", [
    ([{"params": {}}], ["member 0", '"kind"']),
    (["knn"], ["member 0", "object"]),
    ([{"kind": "knn", "params": [1]}], ["member 0", '"params"']),
    ({"kind": "knn"}, ["members", "list"]),
])
def test_a_malformed_ensemble_member_is_refused_naming_it(models, members, words):
    def edit(m):
        m["head_params"]["members"] = members
    _refused(_edit_manifest(_ckpt(models, "ensemble"), edit), "do not build a ensemble head", *words)


# --------------------------------------------------------------------------- dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_weights_in_another_float_dtype_are_refused_naming_it(models, dtype):
    """Checkpoints are saved in float32; a float16 copy loaded silently (rounded weights) and a
    bfloat16 one was refused as 'tensors edited after saving'."""
    path = _edit_tensors(_ckpt(models), lambda t: {k: v.to(dtype) for k, v in t.items()})
    _refused(path, f"dtype {dtype}", "float32")


# --------------------------------------------------------------------------- worker ids


@pytest.mark.parametrize("bad", ["../../etc/passwd", 'a"b', "x" * 5000, "w\nx", "w 1"])
def test_a_crafted_worker_id_is_refused(models, bad):
    """Worker ids follow the import rule (letters, digits, _ . - : /, 128 at most): a manifest is not
    a way around it (the ids reach HTTP headers, logs and the worker config lookup)."""
    _refused(_edit_manifest(_ckpt(models), _set(worker_ids=["w1", "w2", bad])), "manifest.json", "worker_ids")


# --------------------------------------------------------------------------- files and folders


def test_a_manifest_or_weights_path_that_is_a_folder_is_refused(models):
    path = _ckpt(models)
    (path / MANIFEST_FILE).unlink()
    (path / MANIFEST_FILE).mkdir()
    _refused(path, "manifest.json", "cannot read")
    path = _ckpt(models, "ensemble")
    (path / WEIGHTS_FILE).unlink()
    (path / WEIGHTS_FILE).mkdir()
    _refused(path, "head.safetensors", "cannot read")


def test_a_hash_named_folder_holding_another_checkpoint_is_refused(models):
    """models/knn/<A>/ holding checkpoint B's files (swapped or copied over) loaded B under A's
    name; without a pointer's content_hash nothing noticed."""
    a, b = _ckpt(models, "knn"), _ckpt(models, "ensemble")
    for f in (MANIFEST_FILE, WEIGHTS_FILE):
        shutil.copy(b / f, a / f)
    _refused(a, a.name, b.name, "content_hash")


def test_a_checkpoint_filed_under_another_method_is_refused(models):
    a = _ckpt(models, "knn")
    moved = models / "sft" / a.name
    moved.parent.mkdir()
    a.rename(moved)
    _refused(moved, "sft", "method", "knn")


def test_a_hash_named_copy_outside_a_method_folder_still_loads(models, tmp_path):
    """A user's copy keeps its hash-named folder (`/tmp/mine/<hash>/`): only a folder named like one
    of this product's methods claims what is filed in it."""
    a = _ckpt(models, "knn")
    dst = tmp_path / "mine" / a.name
    shutil.copytree(a, dst)
    assert load_checkpoint(dst, expected_contract=CONTRACT).manifest.head_kind == "knn"


def test_a_checkpoint_in_a_folder_of_any_other_name_still_loads(models, tmp_path):
    """A pack folder (`submission/`) or any copy not named by a hash is a checkpoint too."""
    dst = tmp_path / "submission"
    shutil.copytree(_ckpt(models), dst)
    assert load_checkpoint(dst, expected_contract=CONTRACT).manifest.head_kind == "knn"


# --------------------------------------------------------------------------- the promoted pointer


def _point(models: Path, checkpoint: str, **extra) -> Path:
    from fugu_pipeline.train.pointer import write_pointer

    return Path(write_pointer(models, {"checkpoint": checkpoint, **extra}))


def _promoted_error(models: Path, *words: str) -> str:
    from fugu_pipeline.policies.registry import load_promoted
    from fugu_pipeline.route.router import RouterError

    with pytest.raises(RouterError) as e:
        load_promoted(models, device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "current.json" in msg and all(w in msg for w in words), msg
    return msg


def test_a_pointer_to_a_missing_or_damaged_checkpoint_names_the_pointer_and_what_to_do(models):
    """It raised the bare CheckpointError '<dir> is not a checkpoint', naming neither the pointer
    nor the fix (the module promises a RouterError naming the file)."""
    _point(models, "knn/0123456789abcdef", content_hash="0123456789abcdef")
    _promoted_error(models, "knn/0123456789abcdef", "is not a checkpoint", "re-run promotion")
    path = _ckpt(models)
    (path / WEIGHTS_FILE).write_bytes(b"")
    _point(models, f"knn/{path.name}", content_hash=path.name)
    _promoted_error(models, f"knn/{path.name}", "header too small", "re-run promotion")


def test_a_pointer_loop_escape_or_wrong_hash_is_refused(models):
    (models / "loop").symlink_to(models / "loop")
    _point(models, "loop")
    _promoted_error(models, "loop", "is not a checkpoint")
    _point(models, "knn/../../../etc")
    _promoted_error(models, "leaves the models folder")
    path = _ckpt(models)
    _point(models, f"knn/{path.name}", content_hash="f" * 16)
    _promoted_error(models, "content_hash ffffffffffffffff", path.name, "not the promoted checkpoint")


# --------------------------------------------------------------------------- the command line


def _cli_one_line(argv, capsys) -> str:
    from fugu_pipeline.cli.main import main

    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    return err


def _damage_each_way(models: Path) -> dict[str, tuple[Path, str]]:
    """name -> (checkpoint folder, a word its one-line error must hold)."""
    out = {}
    path = _ckpt(models)
    out["inf k"] = (_edit_manifest(path, lambda m: m["head_params"].update(k=float("inf"))), "head_params.k")
    path = _ckpt(models, "ensemble")
    out["member without kind"] = (_edit_manifest(path, lambda m: m["head_params"].update(members=[{"params": {}}])),
                                  '"kind"')
    return out


def test_route_pack_and_serve_refuse_each_crafted_checkpoint_in_one_line(models, capsys, tmp_path):
    for name, (path, word) in _damage_each_way(models).items():
        for argv in (["route", "--checkpoint", str(path), "--prompt", "hi", "--device", "cpu"],
                     ["pack", str(path), "--out", str(tmp_path / "pack")],
                     ["serve", "--checkpoint", str(path), "--workers", "configs/workers.mock.yaml", "--device", "cpu"]):
            err = _cli_one_line(argv, capsys) if argv[0] != "pack" or name == "inf k" else None
            if err is None:  # pack checks the manifest and the hashes; the gates (preflight) load the head
                continue
            assert word in err and str(path) in err, (name, argv[0], err)


def test_route_through_a_pointer_to_a_missing_checkpoint_is_one_line(models, capsys):
    _point(models, "knn/0123456789abcdef", content_hash="0123456789abcdef")
    err = _cli_one_line(["route", "--models-dir", str(models), "--prompt", "hi", "--device", "cpu"], capsys)
    assert "current.json" in err and "knn/0123456789abcdef" in err and "re-run promotion" in err


# --------------------------------------------------------------------------- budget.json


class _NoEncoder:
    def close(self):
        pass


@pytest.mark.parametrize("text, words", [
    ('{"checkpoint": ', ["budget.json", "not valid JSON"]),
    ("[1]", ["budget.json", "object"]),
])
def test_a_damaged_budget_calibration_leaves_plain_routing_and_names_itself_in_budget_mode(models, text, words):
    """A truncated budget.json beside the checkpoint made every load (budget or not) fail with a raw
    pydantic ValidationError (a CLI traceback)."""
    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import BudgetUnavailable, Router

    path = _ckpt(models)
    (path / "budget.json").write_text(text)
    router = Router(load_checkpoint(path), _NoEncoder())
    assert router.calibration is None
    with pytest.raises(BudgetUnavailable) as e:
        router.budget_point(Budget(share=0.5))
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_budget_calibration_for_other_workers_is_not_used(models):
    from fugu_pipeline.route.budget import Budget
    from fugu_pipeline.route.router import BudgetUnavailable, Router

    path = _ckpt(models)
    cal = _calibration(path)
    (path / "budget.json").write_text(cal.model_copy(update={"checkpoint": "", "worker_ids": ["w3", "w2", "w1"]})
                                      .model_dump_json())
    router = Router(load_checkpoint(path), _NoEncoder())
    assert router.calibration is None
    with pytest.raises(BudgetUnavailable, match="worker"):
        router.budget_point(Budget(share=0.5))


def _calibration(path: Path):
    from fugu_pipeline.route.budget import BudgetCalibration

    return BudgetCalibration.model_validate({
        "checkpoint": path.name, "worker_ids": WORKERS, "reference_worker": "w1", "reference_cost_usd": 0.01,
        "cost_model": {"worker_ids": WORKERS, "per_token": [1e-6, 2e-6, 3e-6], "offset": {"*": [0.0, 0.0, 0.0]}}, "n_val": 10,
        "val_reference_cost_usd": 0.01,
        "curve": [{"lam": 0.0, "cost_usd": 0.01, "cost_se": 0.001, "share": 1.0, "share_se": 0.1}]})


# --------------------------------------------------------------------------- the feature contract


def _edit_contract(path: Path, **changes) -> Path:
    def edit(m):
        m["feature_contract"].update(changes)
        m["contract_fingerprint"] = FeatureContract.model_construct(**m["feature_contract"]).fingerprint()
    return _edit_manifest(path, edit)


@pytest.mark.parametrize("template, words", [
    ("{prompt:>9999999999}", ["format spec"]),
    ("{prompt!r}", ["conversion"]),
    ("{prompt} {answer}", ["may only use"]),
    ("{prompt.__class__}", ["must contain {prompt}"]),
])
def test_a_contract_prompt_template_that_is_not_plain_is_refused_on_load(models, template, words):
    """`{prompt:>9999999999}` in a re-signed contract passed loading and padded every routed prompt
    to ~10 GB; `{prompt} {answer}` passed loading and then crashed Router.load with a raw pydantic
    ValidationError (CLI traceback)."""
    _refused(_edit_contract(_ckpt(models), prompt_template=template), "manifest.json", "prompt_template", *words)


@pytest.mark.parametrize("changes, words", [
    ({"pooling": "position", "token_position": None}, ["needs token_position"]),
    ({"pooling": "mean", "token_position": -2}, ["token_position only applies"]),
    ({"max_length": 0}, ["max_length"]),
])
def test_a_contract_no_encoder_setting_can_reproduce_is_refused_on_load(models, changes, words):
    """These loaded, then crashed Router.load (`fugu-lite route`) with a raw pydantic ValidationError."""
    path = _edit_contract(_ckpt(models), **changes)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)  # no expected contract: what Router.load's first look does
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in ["manifest.json", "feature_contract", *words]), str(e.value)


def test_route_on_a_contract_no_encoder_setting_can_reproduce_is_one_line(models, capsys):
    path = _edit_contract(_ckpt(models), pooling="position", token_position=None)
    err = _cli_one_line(["route", "--checkpoint", str(path), "--prompt", "hi", "--device", "cpu"], capsys)
    assert "token_position" in err and str(path) in err


# --------------------------------------------------------------------------- files that are not files


@pytest.mark.parametrize("name", [MANIFEST_FILE, WEIGHTS_FILE])
def test_a_checkpoint_file_that_links_to_a_device_is_refused_without_reading_it(models, name):
    """head.safetensors -> /dev/zero was read until memory ran out (MemoryError, or the OOM killer)."""
    path = _ckpt(models)
    (path / name).unlink()
    (path / name).symlink_to("/dev/zero")
    _refused(path, name, "not a regular file")


def test_a_checkpoint_file_that_links_to_a_regular_file_still_loads(models, tmp_path):
    """Symlinked regular files (a content store, a snapshot folder) are read as usual."""
    path = _ckpt(models)
    store = tmp_path / "store"
    store.mkdir()
    for name in (MANIFEST_FILE, WEIGHTS_FILE):
        (path / name).rename(store / name)
        (path / name).symlink_to(store / name)
    assert load_checkpoint(path, expected_contract=CONTRACT).manifest.head_kind == "knn"


def test_a_pointer_that_links_to_a_device_is_refused_without_reading_it(models):
    (models / "promoted").mkdir()
    (models / "promoted" / "current.json").symlink_to("/dev/zero")
    _promoted_error(models, "not a regular file")


# --------------------------------------------------------------------------- stop 25


def test_a_fractional_whole_number_parameter_is_refused_not_truncated(models):
    # k 2.5 loaded as a head with k 2, a different head than any that was saved
    path = _edit_manifest(_ckpt(models), lambda m: m["head_params"].update(k=2.5))
    _refused(path, "head_params.k is 2.5", "whole number")
    path = _edit_manifest(_ckpt(models), lambda m: m["head_params"].update(k=True))
    _refused(path, "head_params.k is True")
    path = _edit_manifest(_ckpt(models), lambda m: m["head_params"].update(k=5.0))  # JSON's 5.0 is 5
    assert load_checkpoint(path, expected_contract=CONTRACT).head.k == 5


@pytest.mark.parametrize("version, words", [(2, ("format_version 2", "newer fugu_pipeline", "upgrade")),
                                            (0, ("format_version 0", "not a checkpoint format"))])
def test_a_checkpoint_format_this_code_does_not_read_is_refused(models, version, words):
    path = _edit_manifest(_ckpt(models), lambda m: m.update(format_version=version))
    _refused(path, MANIFEST_FILE, *words)


def test_a_weights_file_larger_than_its_tensors_is_refused_unread(models, monkeypatch):
    path = _ckpt(models)
    with (path / WEIGHTS_FILE).open("ab") as fh:  # a sparse 3 GB tail: nothing is written to disk
        fh.truncate(3 * 2**30)
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or b"")
    msg = _refused(path, WEIGHTS_FILE, "3,221,225,472 bytes", "more than the manifest's tensors can take")
    assert not read, msg


def test_a_huge_manifest_is_refused_unread(models):
    path = _ckpt(models)
    with (path / MANIFEST_FILE).open("ab") as fh:
        fh.truncate(65 * 2**20)
    _refused(path, MANIFEST_FILE, "more than a manifest can take")
