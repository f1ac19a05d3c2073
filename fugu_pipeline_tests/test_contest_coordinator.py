"""The multi-turn coordinator in the one contest, on the mock pool with role behaviour and the tiny
encoder: coordinators whose behaviour is known (fitted to play a script on the transcripts the
workers really produce) are promoted, replaced and refused through the same gates, composite and
pointer discipline as the one-step router; the composite's live and efficiency terms come from
the session loop; a re-judgement calls no worker; a disguised copy is a duplicate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fugu_pipeline.evaluate.composite import CompositeConfig
from fugu_pipeline.evaluate.contest import run_contest, score_pair
from fugu_pipeline.evaluate.gates import GateConfig
from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.coordinator.project import evaluate_coordinator, open_run, roles_encoder_settings
from fugu_pipeline.policies.coordinator.contest import HISTORY, RolesKind
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch
from fugu_pipeline.testing.roles_serving import scripted_coordinator
from fugu_pipeline.train.pointer import ROLES_POINTER, read_pointer
from fugu_pipeline.policies.coordinator.train import RolesConfig
from fugu_pipeline.workers.config import load_workers_config

from .conftest import REPO

WORKERS = REPO / "configs" / "workers.mock-roles.yaml"
CFG = RolesConfig(max_length=256)
QUIET = lambda s: None  # noqa: E731
# 30 held-out tasks, a few audit rows a family: the guarded overfit rule (the literal one judges chance there)
SMALL = CompositeConfig(overfit_rule="guarded")
# a weak first king: facing nothing, it is let in without beating the best fixed worker significantly
LENIENT = PromotionPolicy(min_gain_over_best_fixed=-1.0, require_significant=False, gates=GateConfig(rate_limit_s=0),
                          composite=SMALL)
STRICT = PromotionPolicy(gates=GateConfig(rate_limit_s=0), composite=SMALL)  # significance, king + 0.02
WEAK = [("checker", "worker")]  # one turn, the checker answers alone
PLAN = [("planner", "thinker"), ("fast-solver", "worker"), ("fast-solver", "worker")]  # a plan, an answer, commit
POOR_PLAN = [("checker", "thinker"), ("checker", "worker"), ("checker", "worker")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An open run over the mock pool (trajectory store, ledger) and three scripted coordinators."""
    from fugu_pipeline.features.encoder import Encoder

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("roles-contest")
    tasks = [Task.model_validate(r) for r in roles_batch(120)]
    enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
    config = load_workers_config(WORKERS)
    with open_run(config, enc.settings, root / "trajectories", tasks, CFG, encoder=enc, ledger=root / "ledger.jsonl") as run:
        fit_on = [t for t in tasks if t.split == "train"][:24]
        heads = {name: scripted_coordinator(root / "elsewhere", run, fit_on, script)
                 for name, script in (("A", WEAK), ("B", PLAN), ("C", POOR_PLAN))}
        yield run, tasks, heads, root
    enc.close()


def roles_history(models) -> list[dict]:
    return [json.loads(x) for x in (models / HISTORY).read_text().splitlines()]


@pytest.mark.slow
def test_a_second_coordinator_replaces_the_first_and_a_worse_one_is_refused(world, tmp_path):
    """Before: the second promotion crashed (`decide()` without the composite contest), on every
    later run. Now: A promoted, B (better) replaces it, C (worse than B) is refused with its
    reasons; all three in the coordinator's history, each with its composite."""
    run, tasks, heads, _ = world
    models = tmp_path / "models"
    first = evaluate_coordinator(run, heads["A"], tasks, CFG, models, policy=LENIENT, log=QUIET)
    assert first["promotion"]["promoted"], first["promotion"]["reasons"]
    second = evaluate_coordinator(run, heads["B"], tasks, CFG, models, policy=STRICT, log=QUIET)
    reasons = second["promotion"]["reasons"]
    print("\n" + "\n".join(reasons))
    assert second["promotion"]["promoted"], reasons
    assert read_pointer(models, ROLES_POINTER)["content_hash"] == heads["B"].name
    assert any(r.startswith(f"PASS promoted (roles {heads['A'].name}): composite") for r in reasons)
    third = evaluate_coordinator(run, heads["C"], tasks, CFG, models, policy=STRICT, log=QUIET)
    assert not third["promotion"]["promoted"]
    assert any(r.startswith(f"FAIL promoted (roles {heads['B'].name}): composite") for r in third["promotion"]["reasons"])
    assert read_pointer(models, ROLES_POINTER)["content_hash"] == heads["B"].name
    hist = roles_history(models)
    assert [(h["content_hash"], h["promote"]) for h in hist] == [
        (heads["A"].name, True), (heads["B"].name, True), (heads["C"].name, False)]
    assert all(h["kind"] == "coordinator" and h["contest"]["challenger"]["composite"] > 0 for h in hist)
    assert hist[2]["contest"]["king"] is not None and hist[2]["contest"]["difference"]["mean"] < 0.02


def test_the_live_and_efficiency_terms_come_from_the_session_loop_and_a_rejudgement_calls_nothing(world, tmp_path):
    """Before: the composite's live term was one worker call per task, so efficiency equalled
    live for every head. Now the coordinator's live sample runs its sessions; efficiency is
    correct answers per turn, and a plan-then-answer coordinator takes two turns a task."""
    run, tasks, heads, _ = world
    kind = RolesKind(run, tasks, CFG)
    b, a = kind.load(str(heads["B"])), kind.load(str(heads["A"]))
    cfg = STRICT.composite.model_copy(update={"live_sample": 8})
    contest = score_pair(kind, b, a, cfg)
    rows = contest["challenger"]["benchmarks"]
    print("\n" + "\n".join(f"{r['benchmark']}: cached {r['cached']:.4f} live {r['live']:.4f} efficiency "
                            f"{r['efficiency']:.4f} turns {r['live_turns']:.0f} of {r['n_live']}" for r in rows))
    assert contest["live"].startswith("live: the session loop") and all(r["efficiency_source"] == "live" for r in rows)
    assert all(r["n_live"] == min(8, r["n_eval"]) > 0 for r in rows)  # the fixed sample of eval rows
    assert all(r["live_turns"] >= 2 * r["n_live"] - 1 for r in rows)  # plan, then answer: two turns a session
    assert any(r["efficiency"] < r["live"] - 0.2 for r in rows)  # so efficiency is not live
    king_rows = contest["king"]["benchmarks"]
    assert all(r["efficiency"] == pytest.approx(r["live"]) for r in king_rows)  # one turn a task: equal
    calls = sum(run.caller.calls.values())
    again = score_pair(RolesKind(run, tasks, CFG), b, a, cfg)  # the same heads judged again
    assert sum(run.caller.calls.values()) == calls  # every session is in the trajectory store
    assert again["challenger"]["composite"] == contest["challenger"]["composite"]


def test_a_disguised_copy_of_a_coordinator_is_a_duplicate(world, tmp_path):
    """One random vector added to every worker row (and another to every role row) changes no
    decision: the centred logits on the probe set are the same, so it is refused as a duplicate."""
    from fugu_pipeline.train.checkpoints import load_checkpoint, save_checkpoint

    run, tasks, heads, root = world
    models = tmp_path / "models"
    assert run_contest(RolesKind(run, tasks, CFG), [str(heads["B"])], models, LENIENT)["promoted"]
    src = load_checkpoint(heads["B"])
    w = src.state_dict["linear.weight"].clone()
    rng = torch.Generator().manual_seed(3)
    w[:3] += torch.randn(w.shape[1], generator=rng) * 5  # every worker row
    w[3:] += torch.randn(w.shape[1], generator=rng) * 5  # every role row
    raw_cos = float(torch.nn.functional.cosine_similarity(w.ravel(), src.state_dict["linear.weight"].ravel(), dim=0))
    m = src.manifest
    copy = save_checkpoint(root / "copies", "roles", m.head_kind, {**src.state_dict, "linear.weight": w}, {
        "worker_ids": m.worker_ids, "feature_contract": m.feature_contract, "data_version": m.data_version,
        "training_config": m.training_config, "metrics": m.metrics, "curves": m.curves})
    out = run_contest(RolesKind(run, tasks, CFG), [str(copy)], models, LENIENT)
    refusal = next(r for r in out["reasons"] if r.startswith("REFUSED"))
    print(f"\nraw weight cosine {raw_cos:.3f}\n{refusal}")
    assert raw_cos < 0.9 and not out["promoted"] and out["contest"] is None
    assert f"FAIL duplicate: behaves like roles {heads['B'].name} (promoted): cosine 1.0000" in refusal


def test_the_coordinator_is_rate_limited_and_its_receipt_is_checked(world, tmp_path):
    """Before: the same checkpoint was judged twice in 19 minutes, and a coordinator's receipt
    recorded no cost although every turn was paid. Now one attempt a day per submitter, and the
    training cost is in the receipt."""
    from fugu_pipeline.train.checkpoints import load_checkpoint
    from fugu_pipeline.train.exchange import receipt_from_manifest

    run, tasks, heads, _ = world
    models = tmp_path / "models"
    daily = LENIENT.model_copy(update={"gates": GateConfig()})
    assert run_contest(RolesKind(run, tasks, CFG), [str(heads["A"])], models, daily)["promoted"]
    out = run_contest(RolesKind(run, tasks, CFG), [str(heads["B"])], models, daily)
    assert not out["promoted"] and out["reasons"][0].startswith("FAIL rate limit: 'pipeline' made an attempt at")
    receipt = receipt_from_manifest(load_checkpoint(heads["B"]).manifest)
    assert receipt.data_cost_usd and receipt.data_cost_usd > 0 and receipt.steps == 3
    hist = roles_history(models)
    assert hist[-1]["rate_limited"] is True and np.isclose(len(hist), 2)


@pytest.mark.slow
def test_a_coordinator_pack_goes_through_pack_preflight_and_validate(world, tmp_path, monkeypatch, capsys):
    """Before: a roles head could not go through pack -> preflight -> validate: its receipt had no
    cost, and with that gate off validate crashed (IndexError: it took the argmax over worker and
    role logits as a worker index). Now it is packed with its ledger, signed, checked and judged
    by the coordinator's scorer on the host project's tasks; the same key again is rate limited."""
    import shutil

    import yaml

    from fugu_pipeline.cli import main
    from fugu_pipeline.testing.roles_batch import write_roles_batch
    from fugu_pipeline.train.signing import KEY_ENV, accept_key, new_key_pair

    run, tasks, heads, root = world
    project = tmp_path / "host"
    shutil.copytree(REPO / "configs", project / "configs")
    write_roles_batch(project / "data" / "benchgen" / "roles.jsonl", n_per_family=80)
    (project / "configs" / "train_roles.yaml").write_text(yaml.safe_dump({"max_length": 256}))
    (project / "lenient.yaml").write_text(yaml.safe_dump(
        {"min_gain_over_best_fixed": -1.0, "require_significant": False, "composite": {"overfit_rule": "guarded"}}))
    private, public = new_key_pair()
    monkeypatch.chdir(project)
    monkeypatch.setenv(KEY_ENV, private)
    accept_key(project / "models", "bob", public)
    assert main(["pack", str(heads["B"]), "--out", "packB", "--ledger", str(root / "ledger.jsonl")]) == 0
    assert "roles_linear" in capsys.readouterr().out
    host = ["--workers", "configs/workers.mock-roles.yaml"]
    assert main(["preflight", "packB", *host]) == 0
    out = capsys.readouterr().out
    assert "(coordinator)" in out and "PASS receipt: 3 fitness steps (train_best), training cost $0.0500" in out
    assert main(["validate", "--challenger", "packB", *host, "--encoder", "tiny", "--device", "cpu",
                 "--policy", "lenient.yaml"]) == 0
    out = capsys.readouterr().out
    print("\n" + out)
    assert "live: the session loop" in out and "PROMOTED" in out
    pointer = read_pointer(project / "models", ROLES_POINTER)
    assert pointer["content_hash"] == heads["B"].name and pointer["submitter"] == "bob"
    assert (project / "models" / pointer["checkpoint"] / "head.safetensors").is_file()  # copied in from the pack
    assert main(["validate", "--challenger", "packB", *host, "--encoder", "tiny", "--device", "cpu",
                 "--policy", "lenient.yaml"]) == 1
    out = capsys.readouterr().out
    refused = next(x for x in out.splitlines() if x.startswith("REFUSED before scoring"))
    assert refused.startswith("REFUSED before scoring (duplicate, rate limit): FAIL duplicate: behaves like roles")
    assert "  FAIL rate limit: 'bob' (key " in out


def test_a_broken_coordinator_king_is_replaced_only_when_asked_and_the_history_says_who(world, tmp_path):
    """Before: `evaluate_coordinator` (the `eval_report_roles` asset, `evaluate-roles --promote`)
    replaced a coordinator king that cannot be loaded without being asked, and recorded "replaced
    as asked". Now it refuses in one line (the king is broken, why, how to ask), the king stays;
    asked, the history names who asked."""
    from fugu_pipeline.train.checkpoints import CheckpointError
    from fugu_pipeline.train.pointer import pointer_target

    run, tasks, heads, _ = world
    models = tmp_path / "models"
    assert evaluate_coordinator(run, heads["A"], tasks, CFG, models, policy=LENIENT, log=QUIET,
                                report=False)["promotion"]["promoted"]
    (pointer_target(models, read_pointer(models, ROLES_POINTER)) / "head.safetensors").unlink()  # the king is broken
    with pytest.raises(CheckpointError) as exc:
        evaluate_coordinator(run, heads["B"], tasks, CFG, models, policy=LENIENT, log=QUIET, report=False)
    line = str(exc.value)
    print("\n" + line)
    assert "\n" not in line and line.startswith("the promoted coordinator is broken (") and "head.safetensors" in line
    assert "--replace-broken-king" in line and "replace_broken_king: true" in line
    assert read_pointer(models, ROLES_POINTER)["content_hash"] == heads["A"].name
    refused = roles_history(models)[-1]
    assert refused["promote"] is False and refused["not_an_attempt"] and "head.safetensors" in refused["king_error"]
    who = "asset config replace_broken_king of run 1234 (eval_report_roles)"
    out = evaluate_coordinator(run, heads["B"], tasks, CFG, models, policy=LENIENT, log=QUIET, report=False,
                               replace_broken_king=who)["promotion"]
    assert out["promoted"] and read_pointer(models, ROLES_POINTER)["content_hash"] == heads["B"].name
    assert any(r.startswith("PASS promoted: the promoted coordinator cannot be loaded") and f"replaced as asked by {who}" in r
               for r in out["reasons"])
    replaced = roles_history(models)[-1]
    assert replaced["promote"] is True and replaced["replace_broken_king"] == who and replaced["king_error"]


def _host_project(tmp_path, world):
    """A host project with a promoted coordinator (A) and bob's key accepted; B packed elsewhere."""
    import yaml

    from fugu_pipeline.cli import main
    from fugu_pipeline.testing.roles_batch import write_roles_batch
    from fugu_pipeline.train.signing import accept_key, new_key_pair

    run, tasks, heads, root = world
    import shutil

    project = tmp_path / "host"
    shutil.copytree(REPO / "configs", project / "configs")
    write_roles_batch(project / "data" / "benchgen" / "roles.jsonl", n_per_family=80)
    (project / "configs" / "train_roles.yaml").write_text(yaml.safe_dump({"max_length": 256}))
    (project / "lenient.yaml").write_text(yaml.safe_dump(
        {"min_gain_over_best_fixed": -1.0, "require_significant": False, "composite": {"overfit_rule": "guarded"},
         "gates": {"rate_limit_s": 0}}))
    assert run_contest(RolesKind(run, tasks, CFG), [str(heads["A"])], project / "models", LENIENT)["promoted"]
    private, public = new_key_pair()
    accept_key(project / "models", "bob", public)
    return project, private, main


@pytest.mark.slow
def test_validate_reads_and_writes_the_host_folder_from_any_current_folder(world, tmp_path, monkeypatch, capsys):
    """Before: `validate --project-dir HOST` read ./models and the policy of the current folder:
    run elsewhere it judged against no king and wrote its history there. Now every host path is
    the project's: the pack faces the host's king, and the history is the host's; the current
    folder stays empty."""
    from fugu_pipeline.train.signing import KEY_ENV

    run, tasks, heads, root = world
    project, private, main = _host_project(tmp_path, world)
    monkeypatch.setenv(KEY_ENV, private)
    pack = tmp_path / "submitter" / "packB"
    assert main(["pack", str(heads["B"]), "--out", str(pack), "--ledger", str(root / "ledger.jsonl")]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    code = main(["validate", "--challenger", str(pack), "--project-dir", str(project), "--workers",
                 "configs/workers.mock-roles.yaml", "--encoder", "tiny", "--device", "cpu", "--policy",
                 str(project / "lenient.yaml")])
    out = capsys.readouterr()
    print("\n" + out.out + out.err)
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # nothing read or written in the current folder
    assert code == 0 and f"PASS promoted (roles {heads['A'].name}): composite" in out.out  # it faced the host's king
    hist = roles_history(project / "models")
    assert hist[-1]["content_hash"] == heads["B"].name and hist[-1]["promote"] and hist[-1]["submitter"] == "bob"
    assert hist[-1]["contest"]["king"] is not None and hist[-1]["previous"] == read_pointer(
        project / "models", ROLES_POINTER)["previous"]
    assert read_pointer(project / "models", ROLES_POINTER)["content_hash"] == heads["B"].name

    # the king broken: refused in one line until the user asks, and the history says who asked
    from fugu_pipeline.train.pointer import pointer_target

    (pointer_target(project / "models", read_pointer(project / "models", ROLES_POINTER)) / "head.safetensors").unlink()
    assert main(["pack", str(heads["C"]), "--out", str(tmp_path / "submitter" / "packC"), "--ledger",
                 str(root / "ledger.jsonl")]) == 0
    judge = ["validate", "--challenger", str(tmp_path / "submitter" / "packC"), "--project-dir", str(project), "--workers",
             "configs/workers.mock-roles.yaml", "--encoder", "tiny", "--device", "cpu", "--policy", "lenient.yaml"]  # the host's
    capsys.readouterr()
    assert main(judge) == 1
    refused = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("REFUSED"))
    assert refused.startswith("REFUSED before scoring (king): FAIL king: the promoted coordinator cannot be loaded (")
    assert "--replace-broken-king" in refused and roles_history(project / "models")[-1]["not_an_attempt"] is True
    assert main([*judge, "--replace-broken-king"]) == 0
    last = roles_history(project / "models")[-1]
    assert last["promote"] and last["content_hash"] == heads["C"].name and "head.safetensors" in last["king_error"]
    assert last["replace_broken_king"].startswith("--replace-broken-king (fugu-lite validate, user ")
    assert sorted(p.name for p in elsewhere.iterdir()) == []


def test_validate_host_paths_are_the_projects(tmp_path, monkeypatch):
    """Every host path `validate` reads for a one-step router or a triage head (matrix, worker YAML,
    tasks, policy, caches, models) is inside --project-dir, given or by default."""
    from fugu_pipeline.cli.contest import host_args
    from fugu_pipeline.cli.main import build_parser

    project = tmp_path / "host"
    (project / "data" / "benchgen").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["validate", "--challenger", "pack", "--project-dir", "host", "--workers", "w.yaml",
                                      "--data", "data/r.duckdb"])
    host_args(args)
    root = str(project.resolve())
    paths = {k: getattr(args, k) for k in ("models_dir", "policy", "reward_config", "data", "tasks", "cache_dir",
                                           "work_dir", "roles_config", "project_dir")}
    print(paths)
    # (policy None: the project's configs/promotion.yaml, read inside --project-dir, else the built-in rules)
    assert args.policy is None and all(str(v).startswith(root) for v in paths.values() if v is not None), paths
    assert args.models_dir == f"{root}/models" and args.tasks == f"{root}/data/benchgen" and args.challenger == "pack"



def _save_like(src, weight, out_dir):
    from fugu_pipeline.train.checkpoints import save_checkpoint

    m = src.manifest
    return save_checkpoint(out_dir, "roles", m.head_kind, {**src.state_dict, "linear.weight": weight}, {
        "worker_ids": m.worker_ids, "feature_contract": m.feature_contract, "data_version": m.data_version,
        "training_config": m.training_config, "metrics": m.metrics, "curves": m.curves})


def _later_turns_differ(src, run, kind, out_dir):
    """A copy of coordinator `src` whose logits are the source's exactly on every probe task's first
    transcript state (turn 1), and whose worker rows lean to the checker on the transcripts its
    later turns read: along a direction orthogonal to every first state, taken from the source's
    own later states (sessions at another seed than any the contest runs)."""
    from fugu_pipeline.evaluate.probe import probe_ids
    from fugu_pipeline.session.policy import Step
    from fugu_pipeline.policies.coordinator.train import policy_from_checkpoint

    ids = probe_ids([t.task_id for t in kind.probe_pool])
    firsts = [Step(kind.by_id[t].prompt, kind.by_id[t].domain, []) for t in ids]
    trs = run.runner.run([policy_from_checkpoint(src, run.featurizer)], [(kind.by_id[t], 11) for t in ids], greedy=True)[0]
    laters = [Step(kind.by_id[tr.task_id].prompt, tr.domain, tr.turns[:k]) for tr in trs for k in range(1, len(tr.turns) + 1)]
    sd = src.state_dict
    center, scale = sd["feature_center"].double().numpy(), sd["feature_scale"].double().numpy()
    z1 = (run.featurizer.features([s.head for s in firsts]).astype(np.float64) - center) / scale
    zl = (run.featurizer.features([s.head for s in laters]).astype(np.float64) - center) / scale
    basis = np.linalg.svd(z1, full_matrices=False)[2]  # the span of the first states (fewer probes than dims)
    v = zl.mean(axis=0)
    v -= basis.T @ (basis @ v)
    assert np.abs(z1 @ v).max() < 1e-6 * np.abs(zl @ v).max()  # turn 1 reads nothing of it
    lean = np.zeros(sd["linear.weight"].shape[0])
    workers = list(src.manifest.worker_ids)
    lean[workers.index("checker")], lean[workers.index("fast-solver")] = 1.0, -1.0
    w = sd["linear.weight"].double().numpy() + np.outer(lean, v) * (40.0 / (zl @ v).mean())
    return _save_like(src, torch.tensor(w, dtype=torch.float32), out_dir)


def test_the_coordinators_duplicate_check_compares_whole_sessions(world, tmp_path):
    """Before: the duplicate gate read a coordinator's logits on the first transcript state only,
    so two coordinators that open alike were copies whatever they did next (two heads of held-out
    accuracy 0.58 and 0.84 were refused as copies of each other). Now it compares every turn's
    role and worker choice of the whole greedy sessions on the probe tasks: a head that agrees on
    turn 1 and differs later is not a duplicate; one that agrees on every turn still is."""
    from fugu_pipeline.evaluate.gates import duplicate_gate
    from fugu_pipeline.evaluate.probe import checkpoint_behaviour, probe_ids
    from fugu_pipeline.session.policy import Step
    from fugu_pipeline.train.checkpoints import load_checkpoint

    run, tasks, heads, root = world
    pool = [t for t in tasks if t.split in ("train", "val")][:24]  # fewer probe tasks than feature dims
    kind = RolesKind(run, pool + [t for t in tasks if t.split == "test"], CFG)
    src = load_checkpoint(heads["B"])
    later = load_checkpoint(_later_turns_differ(src, run, kind, root / "later"))
    w = src.state_dict["linear.weight"].clone()
    w[:3] += torch.randn(w.shape[1], generator=torch.Generator().manual_seed(5)) * 5  # changes no decision
    same = load_checkpoint(_save_like(src, w, root / "same"))
    ids = probe_ids([t.task_id for t in kind.probe_pool])
    first = run.featurizer.features([Step(kind.by_id[t].prompt, kind.by_id[t].domain, []).head for t in ids])
    opening = {k: checkpoint_behaviour("turn 1", c, first) for k, c in (("B", src), ("later", later), ("same", same))}
    assert opening["later"].cosine(opening["B"]) > 0.9999 and opening["later"].agreement(opening["B"]) == 1.0

    b, lt, sm = (kind.behaviour(kind.load(str(c.path))) for c in (src, later, same))
    differ = duplicate_gate(lt, tmp_path / "models", 0.99, kind="coordinator", king=(f"roles {src.manifest.content_hash}", b))
    copy = duplicate_gate(sm, tmp_path / "models", 0.99, kind="coordinator", king=(f"roles {src.manifest.content_hash}", b))
    print(f"\n{differ.line()}\n{copy.line()}\nB: {b.decisions[0]}\nlater: {lt.decisions[0]}")
    assert differ.ok, differ.line()
    assert not copy.ok and "cosine 1.0000" in copy.reason and "same whole session on 100%" in copy.reason
    assert all(x.split(">")[0] == y.split(">")[0] for x, y in zip(lt.decisions, b.decisions))  # turn 1 alike
    assert np.mean([x != y for x, y in zip(lt.decisions, b.decisions)]) > 0.5  # later turns not


def test_who_asked_for_a_broken_king_to_be_replaced():
    """The history's `replace_broken_king`: the flag and the command, or the asset config and the
    run; nothing when nobody asked (the promotion assets and `evaluate-roles` do not ask by default)."""
    import argparse

    import dagster as dg

    from fugu_pipeline.cli.common import asked_by
    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.defs.harness import broken_king_ask
    from fugu_pipeline.defs.roles import RolesAssetConfig
    from fugu_pipeline.defs.triage import TriagePromotionConfig
    from fugu_pipeline.evaluate.contest import broken_king_ask as core_ask

    assert asked_by(argparse.Namespace(replace_broken_king=False), "validate") is None
    assert asked_by(argparse.Namespace(replace_broken_king=True), "validate").startswith(
        "--replace-broken-king (fugu-lite validate, user ")
    args = build_parser().parse_args(["evaluate-roles", "--promote"])
    assert asked_by(args, "evaluate-roles --promote") is None
    assert broken_king_ask(dg.build_asset_context(), False) is None
    assert broken_king_ask(dg.build_asset_context(), True).startswith("asset config replace_broken_king of ")
    assert RolesAssetConfig().replace_broken_king is False and TriagePromotionConfig().replace_broken_king is False
    assert core_ask(False) is None and core_ask("me") == "me" and "replace_broken_king=True" in core_ask(True)
