"""The multi-turn coordinator for a project: train it, evaluate it against the one-step router, the
answer-aware cascade and the best fixed worker, promote it. One place for the Dagster assets (`defs/roles.py`) and the
command line (`cli/roles.py`), so both compute the same thing from the same settings.

- Tasks: the graded BenchGen tasks (all batch files) that have a complete row in the reward matrix,
  split by their own `split`. An imported matrix has no graders, so it cannot train a coordinator.
- Workers: the worker config's clients (mock, OpenRouter, OpenAI-compatible), with the judge for
  `llm_judge` tasks and the budget guard for every turn.
- Encoder: the project's encoder model read TinyRouter's way (final layer, penultimate position,
  L2-normalised, transcript + head-input marker), window `max_length` of the roles config.
- Trajectories: `data/trajectories/<context>.jsonl` (`session/store.py`).
- Costs: every turn a session pays for (and its judge call) is appended to the project's cost
  ledger (`fugu_pipeline/ledger.py`, kinds `session` and `judge`), which a pack's receipt cites.
- Promotion: the one contest (`evaluate/contest.py`) with the coordinator's scorer (`contest.RolesKind`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fugu_pipeline.evaluate.promotion import PromotionPolicy
from fugu_pipeline.policies.coordinator.evaluate import evaluate_roles, report_lines
from fugu_pipeline.policies.coordinator.contest import DEFAULT_MARGIN, RolesKind
from fugu_pipeline.features.settings import EncoderSettings
from fugu_pipeline.files import atomic_write
from fugu_pipeline.session.callers import ClientCaller, SessionBudget
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.session.store import TrajectoryStore, context_key
from fugu_pipeline.session.transcript import HEAD_TEMPLATE
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.policies.coordinator.train import RolesConfig, reward
from fugu_pipeline.workers.config import WorkersConfig

Log = Callable[[str], None]


def roles_encoder_settings(model: str, max_length: int, *, revision: str | None = None, device: str = "auto",
                           dtype: str = "auto") -> EncoderSettings:
    """TinyRouter's transcript encoding: final layer, penultimate position, L2-normalised, with the
    head-input marker in the template (all of it pinned by the feature contract)."""
    return EncoderSettings(model=model, revision=revision, device=device, dtype=dtype, max_length=max_length,
                           pooling="position", token_position=-2, layer=-1, normalize=True,
                           prompt_template=HEAD_TEMPLATE)


def project_tasks(benchgen_dir: Path, reward_db: Path | None, refused: list | None = None) -> list[Task]:
    """Every graded BenchGen task, restricted to the reward matrix's complete rows when there is one.
    A batch file that cannot be loaded raises `TaskFileError`; with `refused` (a list) it is appended
    there and left out, as the reward matrix leaves it out."""
    from fugu_pipeline.tasks.loading import load_all_batches

    tasks = [t for _, t in load_all_batches(benchgen_dir, refused)]
    if reward_db is not None and Path(reward_db).exists():
        from fugu_pipeline.matrix.read import read_arrays

        keep = set(read_arrays(Path(reward_db)).task_ids)
        tasks = [t for t in tasks if t.task_id in keep]
    if not tasks:
        raise ValueError(f"no graded tasks in {benchgen_dir} (with a complete reward-matrix row): a multi-turn "
                         "coordinator trains on BenchGen tasks, whose graders score its answers; an imported "
                         "reward matrix has none")
    return tasks


def split(tasks: list[Task], name: str) -> list[Task]:
    return [t for t in tasks if t.split == name]


class LedgeredClient:
    """A worker client whose every answered call goes to the cost ledger. A call someone bills (not
    the mock pool) is announced in the ledger's in-flight journal first, with its worst case; each
    answer's line is kept by the ledger (`CostLedger.defer`, shared by every client of the run) and
    appended (one write, one fsync) every `FLUSH_EVERY` lines, before the trajectory store commits
    sessions (its `before_commit`), and when the run closes: a turn a stored session used is never
    missing from the ledger. Nothing is awaited between the answer and its line, so a call answered
    at once (the mock pool) does not give way to another session, and the turn memo still sees
    every repeated request."""

    FLUSH_EVERY = 256

    def __init__(self, client, ledger, kind: str, ref: str = "", spec=None, catalog=None):
        self.client, self.ledger, self.kind, self.ref = client, ledger, kind, ref
        self.spec, self.catalog = spec, catalog
        self.worker_id = getattr(client, "worker_id", "")

    async def complete(self, messages, task=None, **kw):
        task_id = getattr(task, "task_id", "") or ""
        billed = self.spec is not None and self.spec.kind != "mock"
        if billed:
            import asyncio
            from types import SimpleNamespace

            from fugu_pipeline.workers.budget import cost_ceiling

            text = "\n".join(str(m.get("content") or "") for m in messages)
            call = await asyncio.to_thread(self.ledger.begin, self.kind, worker_id=self.worker_id, task_id=task_id,
                                           ref=self.ref, worst_usd=cost_ceiling(self.spec, SimpleNamespace(prompt=text),
                                                                                self.catalog))
        else:
            call = self.ledger.begin(self.kind, announce=False)
        try:
            comp = await self.client.complete(messages, task=task, **kw)
        except Exception:
            if billed:
                self.ledger.void(call)
            raise
        if self.ledger.defer(self.kind, comp.cost_usd, worker_id=self.worker_id, task_id=task_id, ref=self.ref,
                             call=call) >= self.FLUSH_EVERY:
            self.ledger.flush()
        return comp

    async def aclose(self) -> None:
        self.ledger.flush()
        await self.client.aclose()


@dataclass
class RolesRun:
    """Everything a coordinator run needs, open; close it with `close()` (or use `open_run`)."""

    config: WorkersConfig
    featurizer: object
    runner: SessionRunner
    caller: ClientCaller
    judge: object
    ledger: object = None

    def close(self) -> None:
        if self.runner.store is not None:
            self.runner.store.close()

        async def shut() -> None:
            await self.caller.aclose()  # the clients' last ledger lines are written here
            if self.judge is not None:
                await self.judge.aclose()

        try:  # on the loop the sessions ran on: the HTTP clients belong to it
            self.runner.call(shut())
        finally:
            self.runner.close()
            if self.ledger is not None:
                self.ledger.close()


@contextlib.contextmanager
def open_run(config: WorkersConfig, settings: EncoderSettings, trajectories_dir: Path, tasks: list[Task],
             cfg: RolesConfig, *, catalog=None, encoder=None, ledger: Path | None = None) -> Iterator[RolesRun]:
    """Load the encoder (or use `encoder`), make the worker clients, open the trajectory store.
    `ledger`: the project's cost ledger file (default: `data/ledger/costs.jsonl` beside
    `trajectories_dir`), where every paid turn is appended."""
    from fugu_pipeline.collect.store import PartitionBusyError
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.session.featurize import TranscriptFeaturizer
    from fugu_pipeline.workers.factory import make_client

    enc = encoder or Encoder.load(settings)
    context = context_key([w.answer_fields() for w in config.workers],
                          config.judge.answer_fields() if config.judge else None, cfg.max_turns, enc.fingerprint)
    try:  # the store's lock first: a second run on it stops before any client exists or any call is made
        store = TrajectoryStore(trajectories_dir, context).open()
    except PartitionBusyError:
        if encoder is None:
            enc.close()
        raise
    from fugu_pipeline.ledger import CostLedger

    featurizer = TranscriptFeaturizer(enc)
    book = CostLedger(ledger if ledger is not None else Path(trajectories_dir).parent / "ledger" / "costs.jsonl")
    try:
        book.check()  # settled and appendable before any call
    except BaseException:
        store.close()
        if encoder is None:
            enc.close()
        raise
    store.before_commit = book.flush  # a stored session's turns are in the ledger before it
    specs = {w: config.worker(w) for w in config.worker_ids}
    caller = ClientCaller({w: LedgeredClient(make_client(s, config, catalog=catalog), book, "session", spec=s,
                                             catalog=catalog) for w, s in specs.items()}, specs, own=True)
    needs_judge = config.judge is not None and any(t.grader.type == "llm_judge" for t in tasks)
    judge = LedgeredClient(make_client(config.judge, config, judge=True, catalog=catalog), book, "judge", "session",
                           spec=config.judge, catalog=catalog) if needs_judge else None
    budget = SessionBudget(cfg.max_usd if cfg.max_usd is not None else config.max_usd_per_run, catalog)
    runner = SessionRunner(caller, store, max_turns=cfg.max_turns, budget=budget, judge=judge,
                           judge_spec=config.judge)
    run = RolesRun(config, featurizer, runner, caller, judge, book)
    try:
        yield run
    finally:
        run.close()
        if encoder is None:
            enc.close()


def train_coordinator(run: RolesRun, tasks: list[Task], cfg: RolesConfig, models_dir: Path, *,
                      one_step_checkpoint: Path | None = None, log: Log = print):
    """Train (warm-started from the one-step checkpoint's worker rows where the encoders match) and
    save under models/roles/<hash>/. Returns (checkpoint path, train result)."""
    from fugu_pipeline.policies.coordinator.train import train_roles, warm_start_weight

    init = None
    if cfg.warm_start and one_step_checkpoint is not None:
        from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

        try:
            init, why = warm_start_weight(run.featurizer, run.config.worker_ids, load_checkpoint(one_step_checkpoint))
        except (CheckpointError, FileNotFoundError) as exc:
            init, why = None, f"no warm start: the one-step checkpoint cannot be loaded ({exc})"
        log(why)
    result = train_roles(run.runner, run.featurizer, run.config.worker_ids, split(tasks, "train"), split(tasks, "val"),
                         cfg, init_weight=init, log=log)
    return result.save(models_dir), result


def _policy_of(checkpoint, featurizer):
    from fugu_pipeline.policies.coordinator.train import policy_from_checkpoint

    return policy_from_checkpoint(checkpoint, featurizer)


def promoted_or_fallback(models_dir: Path, fallback: Path | None, fallback_is: str, load: Callable[[Path], object]):
    """`load` of the promoted checkpoint, else of `fallback`: (what it returned, where it came
    from), or (None, why neither loaded)."""
    from fugu_pipeline.route.promoted import promoted_checkpoint_path
    from fugu_pipeline.route.router import RouterError
    from fugu_pipeline.train.checkpoints import CheckpointError

    tries = [("promoted", lambda: promoted_checkpoint_path(models_dir))]
    if fallback is not None:
        tries.append((f"not promoted: {fallback_is}", lambda: Path(fallback)))
    reasons = []
    for what, where in tries:
        try:
            path = where()
            return load(path), f"{what} ({path})"
        except (RouterError, CheckpointError, FileNotFoundError, ValueError) as exc:
            reasons.append(f"{what}: {exc}")
    return None, "; ".join(reasons)


def one_step_policy(models_dir: Path, worker_ids: list[str], log: Log = print, fallback: Path | None = None):
    """The one-step router to compare with, as a session policy: the promoted one, else `fallback`
    (the pipeline's latest one-step checkpoint), else None. Returns (policy or None, where it came from)."""
    from fugu_pipeline.policies.coordinator.route import OneStepPolicy
    from fugu_pipeline.route.router import Router

    policy, source = promoted_or_fallback(models_dir, fallback, "the latest one-step checkpoint",
                                          lambda path: OneStepPolicy(Router.load(path), worker_ids))
    if policy is None:
        log("no one-step router to compare with: " + source)
        return None, None
    return policy, source


class CascadeBaselineError(ValueError):
    """The cascade a user named cannot be the report's baseline (one line: the path and why)."""


def cascade_baseline(models_dir: Path, worker_ids: list[str], *, path: Path | None = None,
                     fallback: Path | None = None, device: str = "auto", log: Log = print):
    """The answer-aware cascade to compare with, as a `policies.cascade.route.CascadeRouter`: `path` when
    given (the user's choice: one that is not a cascade over this worker pool is a
    CascadeBaselineError), else the promoted router when it is a cascade, else `fallback` (the
    pipeline's latest cascade), else None. Returns (router or None, where it came from or why
    there is none); close the router when done."""
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.route.router import RouterError
    from fugu_pipeline.policies.cascade.head import KIND
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

    def load(where: Path) -> CascadeRouter:
        manifest = load_checkpoint(where).manifest
        if manifest.head_kind != KIND:
            raise ValueError(f"{where} holds a {manifest.head_kind!r} head, not a cascade")
        router = CascadeRouter.load(where, device=device)
        missing = [w for w in router.head.policy.workers if w not in worker_ids]
        if missing:
            router.close()
            raise ValueError(f"{where}: the cascade calls {missing}, which the worker pool ({worker_ids}) does not define")
        return router

    errors = (RouterError, CheckpointError, FileNotFoundError, ValueError)
    if path is not None:
        try:
            return load(Path(path)), f"given ({path})"
        except errors as exc:
            raise CascadeBaselineError(f"--cascade {path}: {exc}; pass a cascade checkpoint (models/cascade/<hash>) "
                                       "over this worker pool, or leave it out") from None
    router, source = promoted_or_fallback(models_dir, fallback, "the latest cascade", load)
    if router is None:
        log(f"no answer-aware cascade to compare with: {source}")
    return router, source


def evaluate_coordinator(run: RolesRun, checkpoint_path: Path, tasks: list[Task], cfg: RolesConfig, models_dir: Path, *,
                         seeds: int = 1, promote: bool = True, policy: PromotionPolicy | None = None,
                         one_step_fallback: Path | None = None, cascade: Path | None = None,
                         cascade_fallback: Path | None = None, device: str = "auto", log: Log = print,
                         submitter: str = "pipeline", key: str | None = None, report: bool = True,
                         replace_broken_king: bool | str = False) -> dict:
    """The held-out report (`policies/coordinator/evaluate.py`), written to <checkpoint>/reports/roles-test.json
    (unless `report` is False: a pack being validated), and (with `promote`) the one contest on
    models/promoted/roles.json (`contest.RolesKind`). The cascade baseline: `cascade`, else
    the promoted cascade, else `cascade_fallback` (`cascade_baseline`), loaded on `device`. A promoted
    coordinator that cannot be loaded stops the contest (CheckpointError, recorded in the history)
    unless `replace_broken_king` names who asked for its replacement (`evaluate/contest.broken_king_ask`)."""
    from fugu_pipeline.policies.coordinator.route import check_session_format
    from fugu_pipeline.train.checkpoints import load_checkpoint

    refused = promote and _refused_pack(checkpoint_path, models_dir, policy, key)
    if not report or refused:  # a pack the host would refuse: no report, the contest refuses it unread
        rep: dict = {"checkpoint": str(checkpoint_path)}
        return _promote(run, checkpoint_path, tasks, cfg, models_dir, rep, seeds=seeds, policy=policy, log=log,
                        submitter=submitter, key=key, replace_broken_king=replace_broken_king) if promote else rep
    contract = run.featurizer.contract()
    ckpt = load_checkpoint(checkpoint_path, expected_contract=contract)
    check_session_format(ckpt.manifest)
    coordinator = _policy_of(ckpt, run.featurizer)
    worker_ids = run.config.worker_ids
    cascade_router, cascade_source = cascade_baseline(models_dir, worker_ids, path=cascade, fallback=cascade_fallback,
                                                      device=device, log=log)
    one_step, one_step_source = one_step_policy(models_dir, worker_ids, log, one_step_fallback)
    test, train = split(tasks, "test"), split(tasks, "train")
    r = lambda t: reward(t, cfg)  # noqa: E731
    try:
        rep = evaluate_roles(run.runner, coordinator, test, train, worker_ids, r, one_step=one_step, seeds=seeds,
                             cascade=cascade_router, cascade_source=cascade_source)
    finally:
        if cascade_router is not None:
            cascade_router.close()
    rep.update({"checkpoint": str(checkpoint_path), "content_hash": ckpt.manifest.content_hash, "one_step_router": one_step_source,
                "reward": {"turn_penalty": cfg.turn_penalty, "cost_penalty": cfg.cost_penalty}})
    for line in report_lines(rep):
        log(line)
    out = atomic_write(Path(checkpoint_path) / "reports" / "roles-test.json",
                       json.dumps(rep, indent=2, sort_keys=True, default=float))
    rep["report_path"] = str(out)
    if not promote:
        return rep
    return _promote(run, checkpoint_path, tasks, cfg, models_dir, rep, seeds=seeds, policy=policy, log=log,
                    submitter=submitter, key=key, replace_broken_king=replace_broken_king)


def _refused_pack(checkpoint_path: Path, models_dir: Path, policy: PromotionPolicy | None, key: str | None) -> bool:
    """Whether `checkpoint_path` is a pack the contest refuses before reading its weights (its
    signature, key or size caps: `contest_entry.signature_gate`)."""
    from fugu_pipeline.evaluate.contest_entry import signature_gate

    sig = signature_gate(checkpoint_path, models_dir, key, (policy or PromotionPolicy(margin=DEFAULT_MARGIN)).gates)
    return sig is not None and not sig.ok


def _promote(run: RolesRun, checkpoint_path: Path, tasks: list[Task], cfg: RolesConfig, models_dir: Path, rep: dict, *,
             seeds: int, policy: PromotionPolicy | None, log: Log, submitter: str, key: str | None,
             replace_broken_king: bool | str) -> dict:
    """The one contest for the coordinator; the outcome goes under rep["promotion"]."""
    from fugu_pipeline.evaluate.contest import run_contest

    policy = policy or PromotionPolicy(margin=DEFAULT_MARGIN)
    kind = RolesKind(run, tasks, cfg, seeds=seeds)
    outcome = run_contest(kind, [str(checkpoint_path)], models_dir, policy, submitter=submitter, key=key,
                          replace_broken_king=replace_broken_king)
    for line in outcome["reasons"]:
        log(line)
    rep["promotion"] = outcome
    return rep
