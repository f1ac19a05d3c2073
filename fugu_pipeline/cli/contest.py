"""The contest on the command line: `keygen`, `accept-key`, `collector-key`, `pack`, `preflight`, `validate`. Thin:
each calls the core (`train/signing.py`, `train/exchange.py`, `evaluate/preflight.py`, the one
contest in `evaluate/contest.py`). Every kind of head packs and validates the same way; `validate`
reads the kind from the pack's manifest: a one-step router or a triage head is scored on the
host's reward matrix (`--data`, default the project's), a coordinator on the project's graded
tasks through the session loop."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, asked_by, encoder_name
from fugu_pipeline.cli.reporting import live_for, policy as load_policy_arg


def add_commands(add, data_opts) -> None:
    p = add("keygen", cmd_keygen, "make a signing key pair for packs (ed25519): the private key goes into the "
            "environment, the public key to the hosts you submit to")
    p.add_argument("--public", action="store_true", help="print only the public key of $FUGU_SIGNING_KEY")

    p = add("accept-key", cmd_accept_key, "let a submitter's packs in: keep their public key under a name "
            "(models/promoted/keys.json); the rate limit counts per key")
    p.add_argument("name", help="who the key belongs to (letters, digits, - _ .)")
    p.add_argument("public_key", help="the public key fugu-lite keygen printed (base64)")
    p.add_argument("--models-dir", default="models")

    p = add("collector-key", cmd_collector_key, "show the host's collector key, which signs every cost-ledger line "
            "(made on first use), trust another collector's key, or rotate it")
    p.add_argument("--trust", nargs=2, metavar=("NAME", "PUBLIC_KEY"), default=None,
                   help="trust a collector public key under a name (models/promoted/collector_keys.json)")
    p.add_argument("--rotate", action="store_true", help="keep trusting the current key, then make a new one in the key file")
    p.add_argument("--models-dir", default="models")

    p = add("pack", cmd_pack, "write a head (any kind), its receipt, its feature contract and the cost ledger "
            "to one folder, signed with $FUGU_SIGNING_KEY")
    p.add_argument("checkpoint", help="the checkpoint train-* printed, or the --output folder it wrote to (its latest)")
    p.add_argument("--out", required=True, help="the pack folder to write")
    p.add_argument("--submitter", default="", help="a name for the receipt (the host counts attempts per signing key)")
    p.add_argument("--ledger", default=None, help="the cost ledger of the project that trained it (default "
                   "data/ledger/costs.jsonl); the receipt cites its head hash and totals")

    def judge_opts(p):
        p.add_argument("--models-dir", default="models", help="holds the kings (models/promoted/*.json), the "
                       "histories, the accepted keys and the registry of judged heads")
        p.add_argument("--policy", default=None, help="promotion policy YAML (default: configs/promotion.yaml if present)")
        p.add_argument("--submitter", default=None, help="rate-limit name of an unsigned attempt (a signed pack counts "
                       "under its key)")

    p = add("preflight", cmd_preflight, "run the submission gates on a pack folder, offline (nothing is scored or recorded)")
    p.add_argument("pack", help="the folder fugu-lite pack wrote")
    judge_opts(p)
    p.add_argument("--workers", dest="host_workers", default=None, metavar="YAML",
                   help="the host's worker YAML: the head must route exactly these workers (default: the king's)")
    p.add_argument("--encoder", default=None, help="the host's encoder: the head's feature contract must match it "
                   "(default: the king's contract)")
    p.add_argument("--data", default=None, help="the host's reward matrix: tells which workers are paid (for the receipt)")
    p.add_argument("--work-dir", default="data/imports")
    p.add_argument("--replace-broken-king", action="store_true", help="check as validate --replace-broken-king would: a "
                   "promoted head that cannot be loaded is to be replaced (default: the king gate fails and says why)")

    p = add("validate", cmd_validate, "score a pack folder (any kind) against its kind's king and promote it or "
            "refuse it, through every gate")
    p.add_argument("--challenger", required=True, help="the folder fugu-lite pack wrote (relative to where you are)")
    data_opts(p)
    next(a for a in p._actions if a.dest == "data").required = False
    judge_opts(p)
    next(a for a in p._actions if a.dest == "models_dir").default = None
    p.add_argument("--project-dir", default=".", help="the host project: everything the host keeps is read from it and "
                   "written into it (models/ with the kings, histories, keys and registry; configs/; data/ with the "
                   "matrix, tasks, caches, trajectories and ledger). Relative host paths (--models-dir, --data, --workers, "
                   "--policy, --tasks, --roles-config, --cache-dir, --work-dir) are read inside it")
    p.add_argument("--roles-config", default="configs/train_roles.yaml", help="a coordinator: the session rules and "
                   "reward penalties (relative to the project)")
    p.add_argument("--tasks", default=None, help="BenchGen batch file or folder holding the held-out tasks (graders): "
                   "the live term calls the routed worker on a sample of them (default: the project's data/benchgen, only when "
                   "--data is its data/reward_matrix.duckdb)")
    p.add_argument("--replace-broken-king", action="store_true", help="when the promoted head cannot be loaded "
                   "(damaged pointer, edited or missing checkpoint), let the challenger replace it facing the baselines "
                   "only (default: refuse before scoring and say why)")


# --------------------------------------------------------------------------- keys


def cmd_keygen(args) -> int:
    from fugu_pipeline.train.signing import KEY_ENV, fingerprint, key_from_env, new_key_pair, public_of

    if args.public:
        pub = public_of(key_from_env())
        print(f"public key: {pub}  (key {fingerprint(pub)})")
        return 0
    private, pub = new_key_pair()
    print(f"public key: {pub}  (key {fingerprint(pub)})")
    print("give the public key to the host (fugu-lite accept-key NAME PUBLIC_KEY). Keep the private key in the "
          "environment or a .env file; it is not written anywhere:", file=sys.stderr)
    print(f"{KEY_ENV}={private}")
    return 0


def cmd_accept_key(args) -> int:
    from fugu_pipeline.train.signing import accept_key, fingerprint, keys_path

    keys = accept_key(args.models_dir, args.name, args.public_key)
    print(f"accepted {args.name} (key {fingerprint(args.public_key.strip())}) in {keys_path(args.models_dir)}: "
          f"{len(keys.keys)} key(s)")
    return 0


def cmd_collector_key(args) -> int:
    from fugu_pipeline.collector_key import (
        fingerprint, load_collector_key, read_trusted, rotate_key_file, trust_key, trusted_path,
    )

    if args.trust:
        name, public = args.trust
        trust_key(args.models_dir, name, public)
        print(f"trusted collector key {fingerprint(public.strip())} as {name} in {trusted_path(args.models_dir)}")
        return 0
    if args.rotate:
        old = load_collector_key(create=False)
        if old is not None:
            trust_key(args.models_dir, f"retired-{old.fingerprint}", old.public_key)
            print(f"kept trusting the old key {old.fingerprint} (ledgers it signed) in {trusted_path(args.models_dir)}")
        old, new = rotate_key_file()
        print(f"new collector key {new.fingerprint} in {new.source}: new ledger lines are signed with it")
        return 0
    key = load_collector_key(create=True)
    print(f"collector key {key.fingerprint} ({key.source}); public key: {key.public_key}")
    trusted = read_trusted(args.models_dir)
    print(f"also trusted ({trusted_path(args.models_dir)}): "
          + (", ".join(f"{n} {fingerprint(k['public_key'])}" for n, k in sorted(trusted.items())) or "none"))
    return 0


# --------------------------------------------------------------------------- pack and preflight


def cmd_pack(args) -> int:
    from fugu_pipeline.cli.checkpoints import resolve_checkpoint
    from fugu_pipeline.ledger import LEDGER_FILE
    from fugu_pipeline.train.exchange import pack, read_receipt
    from fugu_pipeline.train.signing import fingerprint, key_from_env, public_of

    from fugu_pipeline.policies.registry import load_checkpoint

    src = resolve_checkpoint(args.checkpoint)
    load_checkpoint(src)  # a checkpoint that cannot be loaded is refused first, naming its file
    ledger = Path(args.ledger) if args.ledger else LEDGER_FILE
    if not ledger.is_file():
        raise CLIError(f"no cost ledger at {ledger}: pack from the project folder that trained the head (its "
                       "data/ledger/costs.jsonl), or pass --ledger")
    key = key_from_env()  # before anything is written: an unsigned pack is refused by every host
    out = pack(src, args.out, submitter=args.submitter, ledger=ledger, signing_key=key)
    r = read_receipt(out)
    cost = "none recorded" if r.data_cost_usd is None else f"${r.data_cost_usd:.4f}"
    print(f"packed {r.method} {r.content_hash} ({r.head_kind}, {r.param_count:,} params, workers {r.worker_ids}, "
          f"encoder {r.encoder_id}): {r.steps} fitness steps ({r.fitness_curve}), training cost {cost}; "
          f"ledger {r.ledger_lines} line(s), head {r.ledger_head[:12]}…; signed with key {fingerprint(public_of(key))}")
    print(f"{out}  ({', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))})")
    return 0


def pack_kind(pack_dir) -> str:
    """The contest a pack enters (from its manifest's head kind); "router" when it cannot be read."""
    from fugu_pipeline.evaluate.contest import kind_of
    from fugu_pipeline.train.checkpoints import MANIFEST_FILE, Manifest

    try:
        return kind_of(Manifest.model_validate_json((Path(pack_dir) / MANIFEST_FILE).read_bytes()).head_kind)
    except (OSError, ValueError):
        return "router"


def cmd_preflight(args) -> int:
    from fugu_pipeline.evaluate.contest import KIND_FILES
    from fugu_pipeline.evaluate.preflight import host_expectation
    from fugu_pipeline.policies.registry import preflight

    policy = load_policy_arg(args)
    data = None
    if args.data:  # the matrix alone (no features): its worker order and which workers are paid
        from fugu_pipeline.cli.training import matrix_db
        from fugu_pipeline.matrix.read import read_arrays

        args.reward_config = args.host_workers  # its reward: block, for a JSONL whose rows carry quality
        data = read_arrays(matrix_db(args))
    kind = pack_kind(args.pack)
    host = host_expectation(args.models_dir, workers_yaml=args.host_workers, encoder=args.encoder if kind != "coordinator"
                            else None, data=data, pointer_file=KIND_FILES[kind][0])
    result = preflight(args.pack, args.models_dir, policy.gates, host=host, data=data if kind != "coordinator" else None,
                       submitter=args.submitter, replace_broken_king=args.replace_broken_king)
    print(f"preflight {args.pack} ({kind}): host expectation from {host.source}")
    for g in result.gates:
        print(f"  {g.line()}")
    print("PASSED: ready for fugu-lite validate" if result.ok else "REFUSED")
    return 0 if result.ok else 1


# --------------------------------------------------------------------------- validate


def _refuse(args, pack_dir: Path, pre, kind: str) -> int:
    from fugu_pipeline.evaluate.contest import KIND_FILES
    from fugu_pipeline.evaluate.promotion import append_history

    rate_limited = any(g.name == "rate limit" and not g.ok for g in pre.gates)
    king = next((g for g in pre.gates if g.name == "king" and not g.ok), None)
    # a refusal only for the host's broken king is not the submitter's attempt (the rate limit skips it)
    hosts_fault = all(g.ok or g.name == "king" for g in pre.gates)
    append_history(args.models_dir, {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "promote": False,
                                     "challenger": str(pack_dir), "reasons": [g.line() for g in pre.gates],
                                     "submitter": pre.submitter, "kind": kind, **({"key": pre.key} if pre.key else {}),
                                     **({"method": pre.manifest.method, "content_hash": pre.manifest.content_hash}
                                        if pre.manifest is not None else {}),
                                     "rate_limited": rate_limited, "not_an_attempt": hosts_fault,
                                     **({"king_error": king.reason} if king else {})}, KIND_FILES[kind][1])
    failed = [g for g in pre.gates if not g.ok]
    print(f"REFUSED before scoring ({', '.join(g.name for g in failed)}): {failed[0].line()}")
    return 1


def host_args(args) -> None:
    """Every host path of `validate` inside --project-dir: the defaults are the project's own files
    and folders, and a relative path given is read in the project, never in the current folder."""
    from fugu_pipeline.paths import ProjectPaths

    host = ProjectPaths(Path(args.project_dir).resolve())
    if not host.root.is_dir():
        raise CLIError(f"--project-dir {args.project_dir}: no such folder; give the host project (it holds models/, "
                       "configs/ and data/)")
    args.project_dir = str(host.root)
    args.models_dir = str(host.resolve(args.models_dir) if args.models_dir else host.models)
    for name in ("reward_config", "data", "tasks", "cache_dir", "work_dir", "roles_config"):
        if getattr(args, name, None):
            setattr(args, name, str(host.resolve(getattr(args, name))))
    if args.tasks is None and host.benchgen.is_dir():
        args.tasks = str(host.benchgen)


def cmd_validate(args) -> int:
    from fugu_pipeline.evaluate.preflight import host_expectation, king_manifest
    from fugu_pipeline.policies.registry import preflight
    host_args(args)
    policy = load_policy_arg(args)  # --policy read inside --project-dir; never the rule of the project's own runs
    pack_dir = Path(args.challenger).resolve()  # the history names it wherever validate was run from
    kind = pack_kind(pack_dir)
    if kind == "coordinator":
        return _validate_coordinator(args, pack_dir, policy)
    if args.data is None:
        default = Path(args.project_dir) / "data" / "reward_matrix.duckdb"
        if not default.exists():
            raise CLIError(f"--data: give the host's reward matrix (no {default})")
        args.data = str(default)
    from fugu_pipeline.cli.training import encoder_settings, routing_data
    from fugu_pipeline.evaluate.contest import KIND_FILES

    # the host's features: --encoder, else the king's encoder, else the default; never the pack's own claim
    encoder = args.encoder
    king = king_manifest(args.models_dir, KIND_FILES[kind][0]) or king_manifest(args.models_dir)
    if encoder is None and king is not None:
        encoder = king[1].feature_contract.encoder_id
    data = routing_data(args, encoder)
    host = host_expectation(args.models_dir, data=data, pointer_file=KIND_FILES[kind][0])
    pre = preflight(pack_dir, args.models_dir, policy.gates, host=host, data=data, submitter=args.submitter,
                    replace_broken_king=args.replace_broken_king)
    for g in pre.gates:
        print(f"  {g.line()}")
    if not pre.ok:
        return _refuse(args, pack_dir, pre, kind)
    if kind == "triage":
        from fugu_pipeline.evaluate.contest import run_contest
        from fugu_pipeline.policies.triage.contest import TriageKind

        outcome = run_contest(TriageKind(data), [str(pack_dir)], args.models_dir, policy, submitter=pre.submitter,
                              key=pre.key, replace_broken_king=asked_by(args, "validate"))
    else:
        from fugu_pipeline.policies.cascade.contest import AnswerSource
        from fugu_pipeline.evaluate.feature_source import FeatureSource
        from fugu_pipeline.policies.registry import promote_best

        live, tasks = live_for(args, data)
        # the pack and the king each scored on their own features of the host's encoder model
        features = FeatureSource(data, lambda s: routing_data(args, settings=s), encoder_settings(args, encoder))
        # a cascade (the pack or the king) is scored from the host's recorded replies
        answers = AnswerSource.from_matrix(args.data, encoder_settings(args, encoder), Path(args.cache_dir))
        outcome = promote_best([str(pack_dir)], data, args.models_dir, policy, live=live, tasks=tasks,
                               submitter=pre.submitter, features=features, replace_broken_king=asked_by(args, "validate"),
                               key=pre.key, answers=answers)
    return _print_outcome(outcome, pre, kind, args.models_dir)


def _print_outcome(outcome: dict, pre, kind: str, models_dir) -> int:
    shown = {g.line() for g in pre.gates}
    for line in outcome["reasons"]:
        if line not in shown:  # the gates the contest ran again agree with preflight: printed once
            print(line)
    if outcome["promoted"]:
        from fugu_pipeline.evaluate.contest import KIND_FILES

        print(f"promoted: {Path(models_dir) / KIND_FILES[kind][0]} -> {outcome['pointer']['checkpoint']}")
    return 0 if outcome["promoted"] else 1


def _validate_coordinator(args, pack_dir: Path, policy) -> int:
    """A coordinator pack: preflight, then the one contest with the coordinator's scorer on the
    project's graded tasks, sessions through the session loop with the host's workers."""
    from fugu_pipeline.evaluate.contest import KIND_FILES
    from fugu_pipeline.evaluate.preflight import host_expectation, king_manifest
    from fugu_pipeline.policies.registry import preflight
    from fugu_pipeline.policies.coordinator.project import evaluate_coordinator, open_run, project_tasks, roles_encoder_settings
    from fugu_pipeline.paths import ProjectPaths
    from fugu_pipeline.policies.coordinator.train import load_roles_config
    from fugu_pipeline.workers.config import load_workers_config

    paths = ProjectPaths(Path(args.project_dir).resolve())
    workers_yaml = paths.resolve(args.reward_config or "configs/workers.mock.yaml")
    pointer = KIND_FILES["coordinator"][0]
    host = host_expectation(args.models_dir, workers_yaml=str(workers_yaml), pointer_file=pointer)
    pre = preflight(pack_dir, args.models_dir, policy.gates, host=host, submitter=args.submitter,
                    replace_broken_king=args.replace_broken_king)
    for g in pre.gates:
        print(f"  {g.line()}")
    if not pre.ok:
        return _refuse(args, pack_dir, pre, "coordinator")
    config = load_workers_config(workers_yaml)
    cfg = load_roles_config(paths.resolve(args.roles_config))
    king = king_manifest(args.models_dir, pointer)
    # the host's encoder: --encoder, else the promoted coordinator's, else the project's default; never the pack's claim
    encoder = args.encoder or (king[1].feature_contract.encoder_id if king else encoder_name(args))
    settings = roles_encoder_settings(encoder, cfg.max_length, device=args.device)
    refused: list = []  # a batch file the reward matrix left out is left out here too, said in one line
    tasks = project_tasks(paths.benchgen, paths.reward_db, refused)
    for exc in refused:
        print(f"{exc.path} left out as the matrix leaves it out: {exc.first_problem()}", file=sys.stderr)
    with open_run(config, settings, paths.data / "trajectories", tasks, cfg, ledger=paths.data / "ledger" / "costs.jsonl") as run:
        rep = evaluate_coordinator(run, pack_dir, tasks, cfg, Path(args.models_dir), policy=policy, submitter=pre.submitter,
                                   key=pre.key, report=False, replace_broken_king=asked_by(args, "validate"),
                                   log=lambda m: None)
        calls = dict(run.caller.calls)
    print(f"worker calls this run: {calls or 'none (every session read from the trajectory store)'}")
    return _print_outcome(rep["promotion"], pre, "coordinator", args.models_dir)
