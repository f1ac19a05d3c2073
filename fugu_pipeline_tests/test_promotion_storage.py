"""How the promoted router is stored, promoted and loaded, when the files are damaged, edited,
hostile or raced: one-line errors that name the file and say what to do, never a traceback,
never a silently wrong router, and nothing already done lost."""

import json
import shutil
import threading
import time

import numpy as np
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.evaluate import contest, promotion_record
from fugu_pipeline.policies.oneshot import contest as router_contest
from fugu_pipeline.policies.oneshot.contest import king_or_why, load_king
from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.preflight import host_expectation, preflight
from fugu_pipeline.evaluate.promotion import PromotionPolicy, weight_gate
from fugu_pipeline.policies.registry import promote_best
from fugu_pipeline.features.contract import FeatureContract
from fugu_pipeline.policies.registry import load_promoted
from fugu_pipeline.route.router import RouterError
from fugu_pipeline.train.checkpoints import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    Manifest,
    checkpoint_hash,
    load_checkpoint,
)
from fugu_pipeline.policies.oneshot.configs import SFTConfig
from fugu_pipeline.train.exchange import import_checkpoint, pack
from fugu_pipeline.train.pointer import PointerError, read_pointer, write_pointer
from fugu_pipeline.policies.oneshot.sft import train_sft
from fugu_pipeline_tests.test_promotion import DOMAINS, synthetic

OPEN = PromotionPolicy(gates=GateConfig(rate_limit_s=0))
PROMPT = "Compute 7 plus 21 and reply with the sum."


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A models folder whose promoted pointer names an SFT head on the built-in tiny encoder."""
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.settings import EncoderSettings

    enc = Encoder.load(EncoderSettings(model="tiny", device="cpu", dtype="float32"))
    domains = [DOMAINS[i % 3] for i in range(120)]
    prompts = [{"math": f"Compute {i} plus {i * 3} and reply with the sum.",
                "code": f"Write a Python function number {i} that reverses a list.",
                "general": f"What is the capital city of country number {i}?"}[d] for i, d in enumerate(domains)]
    base = synthetic(enc.encode(prompts), domains, enc.feature_contract())
    enc.close()
    models = tmp_path_factory.mktemp("tiny") / "models"
    first = train_sft(base, SFTConfig(epochs=30)).save(models)
    second = train_sft(base, SFTConfig(epochs=30, seed=1)).save(models)
    write_pointer(models, {"checkpoint": f"sft/{first.name}", "content_hash": first.name, "method": "sft"})
    return models, first.name, second.name


@pytest.fixture
def models(tiny_models, tmp_path):
    src, first, second = tiny_models
    dst = tmp_path / "models"
    shutil.copytree(src, dst)
    return dst, first, second


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    domains = [DOMAINS[i % 3] for i in range(600)]
    centers = rng.normal(size=(3, 16))
    feats = np.stack([centers[DOMAINS.index(d)] for d in domains]) + 0.5 * rng.normal(size=(600, 16))
    return synthetic(feats.astype(np.float32), domains, FeatureContract(encoder_id="synthetic", dim=16))


def one_line_cli(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def edit_manifest(ckpt_dir, fn):
    m = json.loads((ckpt_dir / MANIFEST_FILE).read_text())
    fn(m)
    (ckpt_dir / MANIFEST_FILE).write_text(json.dumps(m))


# --------------------------------------------------------------------------- 1: a damaged pointer


DAMAGED = {
    "empty": ("", "empty file"),
    "truncated": ('{"checkpoint": "sft/', "not JSON"),
    "a list": ('["sft/x"]', "a JSON list, not an object"),
    "no checkpoint": ('{"content_hash": "0123456789abcdef"}', 'no "checkpoint" field'),
    "null checkpoint": ('{"checkpoint": null}', '"checkpoint" is null'),
    "empty checkpoint": ('{"checkpoint": "  "}', "not a non-empty path string"),
    "escapes models": ('{"checkpoint": "../../etc"}', "leaves the models folder"),
    "not utf-8": (b'{"checkpoint": "\xff"}', "not UTF-8"),
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_a_damaged_pointer_is_a_one_line_error_everywhere(models, name, capsys):
    models, _, _ = models
    text, why = DAMAGED[name]
    ptr = models / "promoted" / "current.json"
    ptr.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PointerError, match="not a valid promoted pointer") as exc:
        read_pointer(models)
    assert why in str(exc.value) and str(ptr) in str(exc.value) and "re-run promotion or restore it" in str(exc.value)
    with pytest.raises(RouterError, match="not a valid promoted pointer"):
        load_promoted(models, device="cpu", dtype="float32")
    err = one_line_cli(["route", "--models-dir", str(models), "--prompt", PROMPT, "--domain", "math"], capsys)
    assert "not a valid promoted pointer" in err and why in err
    # the king a challenger or an evaluation report faces: none, and why
    assert load_king(models) is None and why in king_or_why(models)[1]


def test_a_reader_holding_a_router_gets_a_router_error_then_recovers(models):
    models, first, _ = models
    router = load_promoted(models, device="cpu", dtype="float32")
    assert router.route(PROMPT, domain="math").worker_id
    good = (models / "promoted" / "current.json").read_text()
    (models / "promoted" / "current.json").write_text('{"checkpoint": "sft/')
    with pytest.raises(RouterError, match="not a valid promoted pointer"):
        router.route(PROMPT, domain="math")
    (models / "promoted" / "current.json").write_text(good)
    assert router.route(PROMPT, domain="math").checkpoint.endswith(first)


# --------------------------------------------------------------------------- 2: checkpoint identity


def test_an_edited_manifest_is_refused_on_load(models, capsys):
    models, first, _ = models
    ckpt = models / "sft" / first
    edit_manifest(ckpt, lambda m: m.update(worker_ids=m["worker_ids"][::-1]))  # every route to the wrong worker
    with pytest.raises(CheckpointError, match=r"manifest content_hash does not match its weights and fields \(edited\)"):
        load_checkpoint(ckpt)
    err = one_line_cli(["route", "--models-dir", str(models), "--prompt", PROMPT, "--domain", "math"], capsys)
    assert "(edited)" in err and str(ckpt / MANIFEST_FILE) in err


def test_checkpoints_saved_by_this_code_still_load(models):
    models, first, second = models
    for name in (first, second):
        assert load_checkpoint(models / "sft" / name).manifest.content_hash == name


@pytest.mark.parametrize("field, value, why", [
    ("worker_ids", ["math-w", "math-w", "gen-w"], "more than once"),
    ("worker_ids", ["math-w", "", "gen-w"], "empty worker id"),
    ("method", "../../../../tmp/x/ESCAPED", "lowercase name"),
    ("content_hash", "../../x", "16 lowercase hex digits"),
])
def test_the_manifest_refuses_what_would_misroute_or_escape(models, field, value, why):
    models, first, _ = models
    ckpt = models / "sft" / first
    edit_manifest(ckpt, lambda m: m.update({field: value}))
    with pytest.raises(CheckpointError, match=why) as exc:
        load_checkpoint(ckpt)
    assert "\n" not in str(exc.value)


def test_a_pointer_naming_another_checkpoint_than_it_promoted_is_refused(models):
    models, first, second = models
    router = load_promoted(models, device="cpu", dtype="float32")
    before = router.route(PROMPT, domain="math").checkpoint
    # the pointer promoted `first` (its content_hash) but names the folder of `second`
    write_pointer(models, {"checkpoint": f"sft/{second}", "content_hash": first, "method": "sft"})
    with pytest.raises(RouterError, match=f"content_hash {first} but sft/{second} holds checkpoint {second}"):
        router.route(PROMPT, domain="math")
    with pytest.raises(RouterError, match="not the promoted checkpoint"):
        load_promoted(models, device="cpu", dtype="float32")
    assert load_king(models) is None and "not the promoted checkpoint" in king_or_why(models)[1]
    write_pointer(models, {"checkpoint": f"sft/{first}", "content_hash": first, "method": "sft"})
    assert router.route(PROMPT, domain="math").checkpoint == before


# --------------------------------------------------------------------------- 3: two promotions at once


def test_two_promotions_at_once_the_second_faces_the_new_king(data, tmp_path, monkeypatch):
    models = tmp_path / "models"
    a = train_sft(data, SFTConfig(epochs=40)).save(tmp_path / "a")
    b = train_sft(data, SFTConfig(epochs=40, seed=1)).save(tmp_path / "b")
    slow_decide = contest.decide  # the one contest's decision, for every kind

    def slow(*args, **kw):  # scoring with a real encoder and live calls takes minutes: the race window
        time.sleep(1.5)
        return slow_decide(*args, **kw)

    monkeypatch.setattr(contest, "decide", slow)
    outcomes, errors = {}, []

    def attempt(who, path):
        try:
            outcomes[who] = promote_best([str(path)], data, models, OPEN, submitter=who)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(repr(exc))

    threads = [threading.Thread(target=attempt, args=(w, p)) for w, p in (("alice", a), ("bob", b))]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join()
    assert errors == []
    facing_nothing = [w for w, o in outcomes.items() if "PASS promoted: nothing promoted yet" in o["reasons"]]
    assert len(facing_nothing) == 1, {w: o["reasons"] for w, o in outcomes.items()}
    winner = facing_nothing[0]
    loser = next(w for w in outcomes if w != winner)
    king_line = f"sft {outcomes[winner]['pointer']['content_hash']}"
    assert any(king_line in r for r in outcomes[loser]["reasons"]), outcomes[loser]["reasons"]
    history = [json.loads(x) for x in (models / "promoted" / "history.jsonl").read_text().splitlines()]
    assert sum(r["promote"] for r in history) == sum(o["promoted"] for o in outcomes.values())


# --------------------------------------------------------------------------- 4: pointer first, history second


def test_a_symlinked_method_folder_is_promoted_and_recorded_truthfully(data, tmp_path):
    models = tmp_path / "models"
    elsewhere = tmp_path / "disk2"
    (elsewhere / "sft").mkdir(parents=True)
    models.mkdir()
    (models / "sft").symlink_to(elsewhere / "sft", target_is_directory=True)
    ckpt = train_sft(data, SFTConfig(epochs=40)).save(models)
    out = promote_best([str(ckpt)], data, models, OPEN)
    assert out["promoted"] and read_pointer(models)["checkpoint"] == f"sft/{ckpt.name}"
    last = json.loads((models / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["promote"] is True


def test_a_pointer_that_cannot_be_written_is_not_recorded_as_a_promotion(data, tmp_path, monkeypatch):
    models = tmp_path / "models"
    ckpt = train_sft(data, SFTConfig(epochs=40)).save(models)
    policy = PromotionPolicy(gates=GateConfig(rate_limit_s=3600))

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(promotion_record, "write_pointer", fail)
    with pytest.raises(CheckpointError, match="the promoted pointer was not written.*nothing was promoted") as exc:
        promote_best([str(ckpt)], data, models, policy)
    assert "\n" not in str(exc.value)
    last = json.loads((models / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["promote"] is False and last["not_an_attempt"] is True
    monkeypatch.undo()
    assert promote_best([str(ckpt)], data, models, policy)["promoted"]  # not rate-limited for 24 h


# --------------------------------------------------------------------------- 5, 8, 9: hostile packs


def test_a_pack_whose_method_escapes_the_models_folder_is_refused(models, tmp_path):
    models, first, _ = models
    p = pack(models / "sft" / first, tmp_path / "pack")
    m = json.loads((p / MANIFEST_FILE).read_text())
    m["method"] = "../../../../" + str(tmp_path / "ESCAPED").lstrip("/")
    # re-signed as a forger would: every other field a valid one, the method as written
    forged = Manifest.model_validate({**m, "method": "sft"}).model_copy(update={"method": m["method"]})
    m["content_hash"] = checkpoint_hash((p / WEIGHTS_FILE).read_bytes(), forged)
    (p / MANIFEST_FILE).write_text(json.dumps(m))
    result = preflight(p, models, OPEN.gates, host=host_expectation(models))
    gate = next(g for g in result.gates if g.name == "manifest")
    assert not result.ok and not gate.ok and "lowercase name" in gate.reason
    with pytest.raises(CheckpointError, match="not a checkpoint to import"):
        import_checkpoint(p, models)
    assert not (tmp_path / "ESCAPED").exists()


def test_an_import_of_an_edited_manifest_is_refused(models, tmp_path):
    models, first, _ = models
    p = pack(models / "sft" / first, tmp_path / "pack")
    edit_manifest(p, lambda m: m.update(worker_ids=m["worker_ids"][::-1]))
    with pytest.raises(CheckpointError, match=r"\(edited\)"):
        import_checkpoint(p, tmp_path / "other-models")


def test_a_manifest_that_is_not_utf8_is_a_one_line_error(models, tmp_path):
    models, first, _ = models
    ckpt = models / "sft" / first
    (ckpt / MANIFEST_FILE).write_bytes(b'{"method": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match="not UTF-8") as exc:
        load_checkpoint(ckpt)
    assert "\n" not in str(exc.value)
    assert weight_gate(ckpt) == []  # the manifest is the problem, not the weights
    with pytest.raises(CheckpointError, match="not a checkpoint to import"):
        import_checkpoint(ckpt, tmp_path / "other-models")


def test_pack_refuses_to_overwrite_another_pack(models, tmp_path, capsys, monkeypatch):
    models, first, second = models
    out = pack(models / "sft" / first, tmp_path / "pack")
    assert pack(models / "sft" / first, out) == out  # the same pack again: fine
    with pytest.raises(CheckpointError, match=f"holds another pack \\({first}, not {second}\\)"):
        pack(models / "sft" / second, out)
    assert json.loads((out / MANIFEST_FILE).read_text())["content_hash"] == first
    # --out where nothing can be written: one line
    from fugu_pipeline.ledger import CostLedger
    from fugu_pipeline.train.signing import KEY_ENV, new_key_pair

    (tmp_path / "a-file").write_text("x")
    with CostLedger(tmp_path / "costs.jsonl") as ledger:
        ledger.append("collection", 0.01)
    monkeypatch.setenv(KEY_ENV, new_key_pair()[0])
    err = one_line_cli(["pack", str(models / "sft" / first), "--out", str(tmp_path / "a-file" / "pack"),
                        "--ledger", str(tmp_path / "costs.jsonl")], capsys)
    assert "cannot write the pack there" in err


# --------------------------------------------------------------------------- 6: an unwritable models folder


def test_an_unwritable_models_folder_is_refused_before_anything_is_scored(data, tmp_path, monkeypatch):
    models = tmp_path / "models"
    ckpt = train_sft(data, SFTConfig(epochs=40)).save(models)
    (models / "promoted" / "history.jsonl").mkdir(parents=True)  # root ignores modes: a folder where the file goes

    def never(*a, **kw):
        raise AssertionError("scored although the result could not be recorded")

    monkeypatch.setattr(router_contest, "scored_candidate", never)
    with pytest.raises(CheckpointError, match="cannot write .*Nothing was scored") as exc:
        promote_best([str(ckpt)], data, models, OPEN)
    assert "\n" not in str(exc.value) and "history.jsonl" in str(exc.value)


# --------------------------------------------------------------------------- 7: a king that cannot be loaded


def test_a_broken_king_is_not_replaced_silently(data, tmp_path):
    models = tmp_path / "models"
    king = train_sft(data, SFTConfig(epochs=40)).save(models)
    assert promote_best([str(king)], data, models, OPEN)["promoted"]
    edit_manifest(king, lambda m: m.update(worker_ids=m["worker_ids"][::-1]))
    challenger = train_sft(data, SFTConfig(epochs=40, seed=1)).save(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=r"\(edited\).*nothing scored, nothing promoted.*--replace-broken-king"):
        promote_best([str(challenger)], data, models, OPEN)
    assert read_pointer(models)["content_hash"] == king.name
    last = json.loads((models / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["promote"] is False and "(edited)" in last["king_error"] and "(edited)" in last["reasons"][0]
    out = promote_best([str(challenger)], data, models, OPEN, replace_broken_king=True)
    assert out["promoted"] and read_pointer(models)["content_hash"] == challenger.name
    assert any("PASS promoted: the promoted checkpoint cannot be loaded" in r for r in out["reasons"])
    last = json.loads((models / "promoted" / "history.jsonl").read_text().splitlines()[-1])
    assert last["promote"] is True and "(edited)" in last["king_error"] and last["previous"] == f"sft/{king.name}"


def test_preflight_says_a_broken_king_would_stop_validate(tmp_path):
    """A damaged pointer used to read as "no king" in preflight, which then passed a pack that
    validate refuses before scoring; now the king gate fails and names the fix."""
    from fugu_pipeline.evaluate.preflight import king_gate

    models = tmp_path / "models"
    assert king_gate(models).ok and "nothing is promoted" in king_gate(models).reason
    (models / "promoted").mkdir(parents=True)
    (models / "promoted" / "current.json").write_text("[1, 2]")
    gate = king_gate(models)
    assert not gate.ok and "--replace-broken-king" in gate.reason and "not an object" in gate.reason
    assert king_gate(models, replace_broken_king=True).ok
