"""One contest for every promotable kind: one-step routers, the multi-turn coordinator, the triage
head, and any later policy kind (a cascade) go through the same code path, `run_contest`:

1. **gates**, before anything is scored (`contest_entry.py`): the rate limit (per submitter, or
   per signing key for a pack, per kind), then for each challenger its signature, key and size
   caps when it is a pack (before any of its weights is read), its weights (a checkpoint that
   cannot be loaded is refused with the weight gate's reason), the kind's own rules (a size cap),
   its contract (its features and workers are the host's), a duplicate by behaviour on the
   host's probe set (`probe.py`), and its training receipt with the cost ledger behind it
   (`gates.py`; a pack's weights hashed by streaming);
2. the challenger (the best on validation among those that passed) and the **king** (the kind's
   promoted pointer) are scored on the **same held-out rows**: their outcomes per task, as the
   kind computes them;
3. the **composite** (`composite.py`) of both, with the overfit gate, and the paired bootstrap of
   their difference; the live term runs each head as it serves, on a fixed sample;
4. `promotion.decide`: king + margin with a significant paired difference, the best fixed
   alternative beaten, the train − held-out gap bounded;
5. the kind's pointer is swapped by **compare-and-swap** on the version read before the king was
   loaded, under the kind's lock (a second attempt waits, then faces the new king); every attempt
   is appended to the kind's history, and every head scored joins the registry of judged heads.

A kind supplies only how to read and score its heads. The interface (`Kind`, below) is one small
class:

    class SomeKind(KindBase):
        name = "some"                                     # its history, pointer and lock follow
        pointer = Path("promoted") / "some.json"
        history = "some-history.jsonl"

        def load(self, path) -> Entrant: ...              # verified load (CheckpointError when it cannot)
        def held_out(self, cfg) -> HeldOut:               # its test tasks (ids, domains)
            return held_rows(ids, domains, cfg)
        def outcomes(self, entrant, task_ids, *, live) -> Outcomes: ...
            # per task, in order: quality in [0, 1], turns (worker calls), cost, the decision
            # (comparable across heads: novelty), utility (its reward; None: quality)
        def behaviour(self, entrant) -> Behaviour: ...    # decisions + centred scores on a probe set
        def baseline(self, task_ids) -> Outcomes | None   # "always the best worker" (optional)
        def check_live(self, entrant) -> None             # LiveUnavailable: this head is not run live
        def live_label(self, entrant) -> str              # how it is run live (the composite's note)
        live_tasks = None                                 # task ids it can run live (None: no live term)

Two policy kinds may share one slot: the router slot (`policies/oneshot/contest.RouterKind`, the pointer
`promoted/current.json` that `load_promoted`, `route`, `ask` and `serve` follow) holds a one-step
head or an answer-aware cascade, and its scorer answers for each entrant by what it is (a
cascade: `policies/cascade/contest.CascadeScorer`, from the recorded replies). King and challenger are
then scored alike on the same rows whatever each is; a cascade's turns are its worker calls, so
its efficiency term counts them, and its cost per task is what its steps paid.

`KindBase` builds the decision's figures (`candidate`) from `outcomes`, reads the receipt the same
way for every kind, and leaves the composite as configured (`composite_config` can change the
weights: the triage head is judged on 0.7 domain + 0.3 difficulty accuracy alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fugu_pipeline.evaluate.composite import (
    CompositeConfig,
    HeldOut,
    LiveRows,
    composite_lines,
    paired_outcomes,
    score_outcomes,
)
from fugu_pipeline.evaluate.contest_entry import admit
from fugu_pipeline.evaluate.decision import decide
from fugu_pipeline.evaluate.gates import DEFAULT_SUBMITTER, GateResult, SeenHeads, rate_limit_gate
from fugu_pipeline.evaluate.probe import Behaviour
from fugu_pipeline.evaluate.promotion_record import _now, append_history, apply, check_writable, promotion_lock
from fugu_pipeline.train.checkpoints import CheckpointError
from fugu_pipeline.train.pointer import (
    POINTER,
    ROLES_POINTER,
    TRIAGE_POINTER,
    PointerError,
    pointer_location,
    pointer_target,
    pointer_version,
    read_pointer,
)

# each kind's king, history and lock under models/ (a new kind adds its line)
KIND_FILES = {"router": (POINTER, "history.jsonl", ".lock"),
              "coordinator": (ROLES_POINTER, "roles-history.jsonl", ".roles.lock"),
              "triage": (TRIAGE_POINTER, "triage-history.jsonl", ".triage.lock")}


def kind_of(head_kind: str) -> str:
    """The contest a checkpoint of this head kind enters."""
    return "coordinator" if head_kind.startswith("roles") else "triage" if head_kind.startswith("triage") else "router"


class LiveUnavailable(RuntimeError):
    """The live term cannot be measured for a head (budget, a worker that refuses every call):
    then for neither head, since a live term for one only would weigh the two differently."""


@dataclass
class Outcomes:
    """What a head did on a list of tasks, in that order."""

    task_ids: list[str]
    quality: np.ndarray  # graded quality in [0, 1]
    turns: np.ndarray  # turns taken (a one-step head: 1 per task)
    cost_usd: np.ndarray
    decisions: list  # what it decided per task, comparable across heads (novelty)
    utility: np.ndarray | None = None  # the kind's own figure per task (utility, shaped reward); None: quality
    errors: int = 0

    @property
    def figure(self) -> np.ndarray:
        return self.quality if self.utility is None else self.utility

    def rows(self, idx: np.ndarray) -> "Outcomes":
        idx = np.asarray(idx, int)
        return Outcomes([self.task_ids[i] for i in idx], self.quality[idx], self.turns[idx], self.cost_usd[idx],
                        [self.decisions[i] for i in idx], None if self.utility is None else self.utility[idx])


@dataclass
class Entrant:
    """A loaded head of some kind."""

    path: str
    method: str
    content_hash: str
    head: Any  # what the kind scores with (a checkpoint, a session policy, a triage checkpoint)
    manifest: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.method} {self.content_hash}"


class Kind(Protocol):
    name: str
    pointer: Path
    history: str
    lock: str
    live_tasks: set[str] | None

    def load(self, path: str) -> Entrant: ...
    def held_out(self, cfg: CompositeConfig) -> HeldOut: ...
    def outcomes(self, entrant: Entrant, task_ids: list[str], *, live: bool) -> Outcomes: ...
    def behaviour(self, entrant: Entrant) -> Behaviour: ...
    def candidate(self, entrant: Entrant, held: HeldOut, cfg: CompositeConfig): ...
    def contract_problems(self, entrant: Entrant) -> list[str]: ...
    def receipt(self, entrant: Entrant, policy) -> GateResult: ...
    def own_gates(self, entrant: Entrant) -> list[GateResult]: ...
    def composite_config(self, cfg: CompositeConfig) -> CompositeConfig: ...
    def check_live(self, entrant: Entrant) -> None: ...
    def live_label(self, entrant: Entrant) -> str: ...
    def end_live(self) -> None: ...


class KindBase:
    """Defaults every kind shares (module docstring)."""

    name = "head"
    pointer = Path("promoted") / "head.json"
    history = "head-history.jsonl"
    lock = ".head.lock"
    live_tasks: set[str] | None = None
    models_dir: Path | None = None  # set by the contest: where the probe inputs are kept for preflight

    def composite_config(self, cfg: CompositeConfig) -> CompositeConfig:
        return cfg

    def contract_problems(self, entrant: Entrant) -> list[str]:
        return []

    def own_gates(self, entrant: Entrant) -> list[GateResult]:
        return []

    def baseline(self, task_ids: list[str]) -> Outcomes | None:
        return None

    def train_figure(self, entrant: Entrant) -> float | None:
        return None

    def rank(self, entrant: Entrant) -> float | None:
        return (entrant.manifest.metrics or {}).get("val_reward") if entrant.manifest is not None else None

    def check_live(self, entrant: Entrant) -> None:
        """Raise LiveUnavailable when this head cannot be run live (then neither head is)."""

    def live_label(self, entrant: Entrant) -> str:
        """How this head is run live, for the composite's note."""
        return getattr(self, "live_name", self.name)

    def end_live(self) -> None:
        """The live term is done (or left out): let go of what `check_live` loaded for it."""

    def receipt_data(self):
        """The host's matrix (which workers are paid), or None: the receipt's own cost then says."""
        return None

    def receipt(self, entrant: Entrant, policy) -> GateResult:
        """The receipt gate (`contest_entry.receipt_result`: a pack's weights hashed by streaming
        under the pack caps), with this kind's host data."""
        from fugu_pipeline.evaluate.contest_entry import receipt_result

        return receipt_result(entrant, policy, data=self.receipt_data(), models_dir=self.models_dir)

    def candidate(self, entrant: Entrant, held: HeldOut, cfg: CompositeConfig):
        """The figures `decide` reads, from the kind's outcomes on the held-out eval rows."""
        from fugu_pipeline.evaluate.decision import Candidate

        problems = self.contract_problems(entrant)
        ev = np.flatnonzero(~held.audit)
        if problems:
            nan = np.full(len(ev), np.nan)
            return Candidate(entrant.path, entrant.method, entrant.content_hash, nan, nan, float("nan"),
                             contract_problems=problems)
        out = self.outcomes(entrant, [held.task_ids[i] for i in ev], live=False)
        base = self.baseline([held.task_ids[i] for i in ev])
        train = self.train_figure(entrant)
        return Candidate(entrant.path, entrant.method, entrant.content_hash, out.figure,
                         None if base is None else base.figure, float("nan") if train is None else train,
                         val_router_utility=self.rank(entrant))


# --------------------------------------------------------------------------- the king


def king_or_why(models_dir: str | Path, kind) -> tuple[Entrant | None, str | None]:
    """(the kind's promoted head, None); (None, None) when nothing is promoted; (None, why) when
    the pointer is damaged, names a head that cannot be loaded, or another head than it promoted."""
    try:
        ptr = read_pointer(models_dir, kind.pointer)
        if ptr is None:
            return None, None
        king = kind.load(str(pointer_target(models_dir, ptr)))
    except (CheckpointError, OSError) as exc:
        return None, str(exc)
    want = ptr.get("content_hash")
    if want and want != king.content_hash:
        return None, (f"{pointer_location(models_dir, kind.pointer)}: content_hash {want} but {ptr['checkpoint']} holds "
                      f"{king.content_hash}: not the promoted head; re-run promotion or restore it")
    return king, None


def _pointer_or_none(models_dir, kind) -> dict | None:
    try:
        return read_pointer(models_dir, kind.pointer)
    except PointerError:
        return None


# --------------------------------------------------------------------------- scoring both on the same rows


def live_rows(kind, entrant: Entrant, held: HeldOut, cfg: CompositeConfig) -> tuple[dict[str, LiveRows] | None, str]:
    """One head's live outcomes per benchmark on the fixed live sample, and a note saying what ran."""
    if cfg.live_sample == 0:
        return None, "live term off (live_sample: 0)"
    if cfg.live_weight == 0 and cfg.efficiency_weight == 0:
        return None, f"no live term: a {kind.name} head's composite has none"
    if kind.live_tasks is None:
        return None, getattr(kind, "live_note", None) or f"live term not measured: a {kind.name} head is not run live"
    samples = {b: held.live_sample(b, cfg.live_sample, cfg.seed, available=kind.live_tasks) for b in held.names()}
    ids = [t for b in held.names() for t in samples[b]]
    if not ids:
        return None, "live term not measured: none of the held-out tasks can be run live (no task file with graders)"
    got = kind.outcomes(entrant, ids, live=True)  # LiveUnavailable propagates
    at = {t: i for i, t in enumerate(got.task_ids)}
    out: dict[str, LiveRows] = {}
    for b, tids in samples.items():
        if not tids:
            continue
        rows = np.array([at[t] for t in tids])
        out[b] = LiveRows(quality=got.quality[rows], calls=got.turns[rows], turns=got.turns[rows],
                          cost_usd=float(got.cost_usd[rows].sum()), errors=0)
    return out, f"live: {kind.live_label(entrant)}, {len(ids)} tasks ({cfg.live_sample} a benchmark at most)"


def score_pair(kind, challenger: Entrant, king: Entrant | None, cfg: CompositeConfig) -> dict:
    """The composite of the challenger and of the king (when it can be scored on these rows) on
    the same held-out rows, and the paired bootstrap of their difference."""
    held = kind.held_out(cfg)
    ids = held.task_ids
    ch_out = kind.outcomes(challenger, ids, live=False)
    king_out, king_note = None, "no king"
    if king is not None:
        problems = kind.contract_problems(king)
        if problems:
            king_note = "the king uses other features or workers (" + "; ".join(problems) + "): not scored on these rows"
        else:
            king_out, king_note = kind.outcomes(king, ids, live=False), f"king {king.label}"
    try:
        for entrant in (challenger, king if king_out is not None else None):
            if entrant is not None and kind.live_tasks is not None:
                kind.check_live(entrant)  # before any call: a head that cannot run live spares the other's calls
        live_c, note = live_rows(kind, challenger, held, cfg)
        live_k = live_rows(kind, king, held, cfg)[0] if king_out is not None and live_c is not None else None
    except LiveUnavailable as exc:  # no partial live term: both heads or neither
        live_c, live_k, note = None, None, f"live term not measured: {exc}"
    finally:
        kind.end_live()  # what `check_live` loaded for a head whose live run never came is let go
    kd = None if king_out is None else king_out.decisions
    ch = score_outcomes(ch_out.quality, ch_out.decisions, held, cfg, king_decisions=kd, live=live_c, turns=ch_out.turns)
    out = {"challenger": ch, "king": None, "difference": None, "live": note, "king_note": king_note,
           "audit": {"fraction": cfg.audit_fraction, "rows": int(held.audit.sum()), "of": int(len(held.audit))},
           "kind": kind.name}
    if king_out is not None:
        kg = score_outcomes(king_out.quality, king_out.decisions, held, cfg, live=live_k, is_king=True, turns=king_out.turns)
        out["king"] = kg
        out["difference"] = paired_outcomes(ch_out.quality, king_out.quality, ch_out.decisions, king_out.decisions,
                                            held, cfg, ch, kg, live_c, live_k, turns_c=ch_out.turns, turns_k=king_out.turns)
        out["cost"] = {"challenger": _spend(ch_out, held), "king": _spend(king_out, held)}
    else:
        out["cost"] = {"challenger": _spend(ch_out, held), "king": None}
    return out


def _spend(out: Outcomes, held: HeldOut) -> dict:
    """What a head paid and called on the held-out eval rows (the recorded costs of its calls)."""
    ev = np.flatnonzero(~held.audit)
    return {"usd_per_1k": float(out.cost_usd[ev].mean() * 1000) if len(ev) else 0.0,
            "calls_per_task": float(out.turns[ev].mean()) if len(ev) else 0.0,
            "quality": float(out.quality[ev].mean()) if len(ev) else float("nan")}


def cost_line(contest: dict) -> str | None:
    """One line: each head's held-out quality, what it paid and how many calls it made a task."""
    c = contest.get("cost") or {}
    parts = [f"{who} quality {s['quality']:.4f}, ${s['usd_per_1k']:.4g} per 1,000 requests, {s['calls_per_task']:.2f} "
             "calls a task" for who, s in (("challenger", c.get("challenger")), ("king", c.get("king"))) if s]
    return "held-out eval rows: " + "; ".join(parts) if parts else None


def contest_record(contest: dict | None) -> dict | None:
    """The composites for the history line: totals, the difference and each benchmark's terms."""
    if contest is None:
        return None
    slim = lambda sc: None if sc is None else {  # noqa: E731
        "composite": sc["composite"], "rejected": sc["rejected"],
        "benchmarks": {r["benchmark"]: {k: r[k] for k in ("cached", "live", "efficiency", "novelty", "score")}
                       | {"overfit": r["overfit"]["verdict"]} for r in sc["benchmarks"]}}
    return {"challenger": slim(contest["challenger"]), "king": slim(contest["king"]), "difference": contest["difference"],
            "live": contest["live"], "cost": contest.get("cost")}


# --------------------------------------------------------------------------- the contest


def run_contest(kind, paths: list[str], models_dir: str | Path, policy, *, submitter: str = DEFAULT_SUBMITTER,
                key: str | None = None, now: float | None = None, replace_broken_king: bool | str = False) -> dict:
    """One promotion attempt of `kind` (module docstring). Returns {promoted, challenger, reasons,
    pointer, contest}. The models folder must be writable (checked before anything is scored).
    `replace_broken_king`: who asked for a king that cannot be loaded to be replaced
    (`broken_king_ask`); not asked, such a king stops the attempt before scoring."""
    check_writable(models_dir)
    kind.models_dir = Path(models_dir)
    with promotion_lock(models_dir, kind.lock):
        return _contest(kind, paths, Path(models_dir), policy, submitter=submitter, key=key, now=now,
                        replace_broken_king=replace_broken_king)


def broken_king_ask(replace_broken_king: bool | str) -> str | None:
    """Who asked for a promoted head that cannot be loaded to be replaced, as the history records
    it (the flag and the command, the asset config and the run), or None: nobody asked. A string
    is that record; True is an unnamed caller of the core function."""
    if not replace_broken_king:
        return None
    return replace_broken_king if isinstance(replace_broken_king, str) else "a caller of the contest (replace_broken_king=True)"


def _record(models_dir: Path, kind, rec: dict) -> None:
    append_history(models_dir, {"at": _now(), "kind": kind.name, **rec}, kind.history)


def _contest(kind, paths, models_dir: Path, policy, *, submitter, key, now, replace_broken_king) -> dict:
    who = {"submitter": submitter, **({"key": key} if key else {})}
    rate = rate_limit_gate(models_dir, submitter, policy.gates.rate_limit_s, now, history_name=kind.history, key=key)
    if not rate.ok:
        _record(models_dir, kind, {"promote": False, "challenger": None, "reasons": [rate.line()], "rate_limited": True,
                                   "paths": list(paths), **who})
        return {"promoted": False, "challenger": None, "reasons": [rate.line(), "NOT PROMOTED: rate limited"],
                "pointer": _pointer_or_none(models_dir, kind), "contest": None}
    reasons: list[str] = [rate.line()]
    version = pointer_version(models_dir, kind.pointer)  # the king this attempt faces: the pointer write is conditional on it
    king, king_error = king_or_why(models_dir, kind)
    noun = "checkpoint" if kind.name == "router" else kind.name
    asked = broken_king_ask(replace_broken_king)
    if king_error and asked is None:
        line = (f"FAIL promoted: the promoted {noun} cannot be loaded ({king_error}); a challenger cannot face it: "
                "restore it, or replace it on purpose with --replace-broken-king (asset config replace_broken_king)")
        _record(models_dir, kind, {"promote": False, "challenger": None, "reasons": [line], "king_error": king_error,
                                   "not_an_attempt": True, "paths": list(paths), **who})
        raise CheckpointError(f"the promoted {noun} is broken ({king_error}) -- nothing scored, nothing promoted: restore "
                              "it, or ask for it to be replaced (--replace-broken-king; asset config replace_broken_king: "
                              "true) to let the challenger face the baselines only")
    # a pack's signature, key and size caps first: nothing of a pack refused there is read (contest_entry.py)
    passed, refused = admit(kind, paths, models_dir, policy, king=king, key=key, who=who)
    reasons.extend(refused)
    if not passed:
        return {"promoted": False, "challenger": None, "reasons": reasons or ["no challenger"],
                "pointer": _pointer_or_none(models_dir, kind), "contest": None}
    cfg = kind.composite_config(policy.composite)
    held = kind.held_out(cfg)
    scored = [(kind.candidate(e, held, cfg), e, g) for e, g in passed]
    usable = [t for t in scored if not t[0].contract_problems] or scored
    best, ent, gates = max(usable, key=lambda t: t[0].val_router_utility if t[0].val_router_utility is not None else -np.inf)
    reasons.append(f"challenger: {best.method} {best.content_hash} (best validation figure "
                   f"{best.val_router_utility if best.val_router_utility is not None else float('nan'):.4f} of {len(scored)})")
    reasons.extend(g.line() for g in gates if g.name != "weights")
    champion = None
    if king is not None:
        champion = kind.candidate(king, held, cfg)
    elif king_error:
        reasons.append(f"the promoted {noun} cannot be loaded ({king_error}); its replacement was asked by {asked}: "
                       "the challenger faces the baselines only")
    contest = None
    if not best.contract_problems:
        contest = score_pair(kind, ent, king, cfg)
        reasons.extend(composite_lines(contest["challenger"], "challenger composite"))
        if contest["king"] is not None:
            reasons.extend(composite_lines(contest["king"], "king composite"))
        reasons.append(contest["live"])
        if cost_line(contest):
            reasons.append(cost_line(contest))
    decision = decide(best, champion, policy.model_copy(update={"composite": cfg}), contest, king_error=king_error,
                      noun=noun, asked_by=asked)
    reasons.extend(decision.reasons)
    report = Path(best.path) / "reports" / "test.json"
    extra = {"gates": [g.line() for g in gates], "contest": contest_record(contest), "kind": kind.name,
             **({"key": key} if key else {})}
    if king_error:
        extra.update(king_error=king_error, replace_broken_king=asked)
    pointer = apply(decision, best, models_dir, report_path=str(report) if report.exists() else None, submitter=submitter,
                    extra=extra, expected_version=version, pointer_file=kind.pointer, history=kind.history)
    seen = ent.extra.get("behaviour")
    if seen is not None:
        SeenHeads(models_dir).add(best.content_hash, seen, method=best.method, kind=kind.name,
                                  outcome="promoted" if pointer else "refused", submitter=submitter)
    reasons.append("PROMOTED" if pointer else f"NOT PROMOTED: the promoted {noun} stays")
    return {"promoted": pointer is not None, "challenger": best.path, "reasons": reasons,
            "pointer": pointer or _pointer_or_none(models_dir, kind), "contest": contest}
