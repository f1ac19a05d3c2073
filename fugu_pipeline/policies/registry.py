"""The kinds of router, and the one place that composes them.

| kind | head kinds | contest slot (its pointer) |
|---|---|---|
| one-shot heads | layernorm_linear, normed_linear, quality, knn, domain_prior, ridge, mlp, ensemble | router (`promoted/current.json`) |
| answer-aware cascade | cascade | router, beside the one-shot heads |
| multi-turn coordinator | roles_linear, roles_linear_svf | coordinator (`promoted/roles.json`) |
| triage head | triage_linear | triage (`promoted/triage.json`) |

Each kind is whole in its own package (`policies/<kind>/`), and the kinds do not import each other
(an import-linter contract names the exceptions and why). The stages below (`evaluate/`,
`route/`, `train/`, ...) never import a kind: where they meet every kind, they receive it from here,

- `heads()`: the one head table (`train/head_base.HEADS`) with every kind's heads registered, which
  checkpoint loading and the shared gates read (`load_checkpoint` loads a checkpoint of any kind);
- `router_class`, `load_router`, `load_promoted`: a checkpoint in the router slot runs as its
  kind's `Router` (a one-step head's, or a cascade's that calls its steps);
- `router_kind`, `promote_best`: the router slot of the one contest (`evaluate/contest.py`), the
  one-shot heads' scorer with the cascade's beside it (`mates`);
- `preflight`: the submission gates on a pack of any kind (each kind's head class says its own).

The callers (`cli/`, `serve/`, `defs/`, `testing/`) go through these. Adding a kind of router adds a
package and its lines here. Nothing here imports torch until a function is called.
"""

from __future__ import annotations

from pathlib import Path

def heads() -> dict:
    """The head table with every kind's heads registered (imports torch: call it before a checkpoint
    of any kind is loaded; each kind's module registers its heads when imported)."""
    from fugu_pipeline.policies.oneshot import heads as oneshot_heads  # noqa: F401  (each registers its heads)
    from fugu_pipeline.policies.coordinator import head as coordinator_head  # noqa: F401
    from fugu_pipeline.policies.cascade import head as cascade_head  # noqa: F401
    from fugu_pipeline.policies.triage import head as triage_head  # noqa: F401
    from fugu_pipeline.train.head_base import HEADS

    return HEADS


def load_checkpoint(path: str | Path, expected_contract=None):
    """A checkpoint of any kind (`train/checkpoints.load_checkpoint`, every kind's heads registered)."""
    from fugu_pipeline.train.checkpoints import load_checkpoint as load

    heads()
    return load(path, expected_contract)


def router_class(checkpoint) -> type:
    """The `Router` class that runs a loaded checkpoint of the router slot: a cascade's `CascadeRouter`
    (it calls the plan step by step), else the one-step `Router`."""
    from fugu_pipeline.policies.cascade.route import CascadeRouter
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.policies.cascade.head import KIND

    return CascadeRouter if checkpoint.manifest.head_kind == KIND else Router


def load_router(path, **kw):
    """A `Router` for a one-step checkpoint, a `CascadeRouter` for a cascade (`Router.load`'s arguments),
    with the checkpoints of its run that serve a cap asked later (`attach_cap_routers`)."""
    router = router_class(load_checkpoint(path)).load(path, **kw)
    try:
        attach_cap_routers(router, Path(path).resolve().parent.parent, **kw)
    except BaseException:
        router.close()
        raise
    return router


def load_promoted(models_dir: str | Path = "models", **kw):
    """The promoted router for downstream code (`route/promoted.PromotedRouter`); picks up new
    promotions without a restart, whatever kind of router each is (each with `attach_cap_routers`)."""
    from fugu_pipeline.route.promoted import PromotedRouter

    heads()
    return PromotedRouter(models_dir, router_for=router_class, attach=attach_cap_routers, **kw)


def attach_cap_routers(router, models_dir, *, device: str = "auto", dtype: str = "auto", encoder: str | None = None) -> None:
    """Load the checkpoints the router's shipped description may send a cap asked later to
    (`ShippedPolicy.at_caps`: one-shot heads and cascades of the same `train` run, in `models_dir`
    by tag) into `router.cap_routers`. One with the same feature contract reads with the router's
    encoder; another loads its own. One that is missing or cannot be loaded is left out with the
    reason (`router.cap_problems`, and a warning in the log): those caps are served by the router."""
    import logging

    from fugu_pipeline.route.promoted import local_checkpoint
    from fugu_pipeline.storage import is_url
    from fugu_pipeline.train.checkpoints import CheckpointError

    for tag in sorted(router.shipped.cap_checkpoints() - {router.tag} if router.shipped is not None else ()):
        try:
            path = local_checkpoint(f"{str(models_dir).rstrip('/')}/{tag}" if is_url(models_dir) else Path(models_dir) / tag)
            ckpt = load_checkpoint(path)
            if f"{ckpt.manifest.method}/{ckpt.manifest.content_hash}" != tag:
                raise CheckpointError(f"{path} holds checkpoint {ckpt.manifest.content_hash}, not {tag}")
            kind = router_class(ckpt)
            if ckpt.manifest.feature_contract == router.checkpoint.manifest.feature_contract:
                other = kind(ckpt, router.encoder)
                other.owns_encoder = False
                other.check_probe()
            else:
                other = kind.load(path, device=device, dtype=dtype, encoder=encoder)
        except (OSError, ValueError, RuntimeError) as exc:  # CheckpointError, RouterError, a missing folder
            router.cap_problems[tag] = f"{tag}: {exc}"
            logging.getLogger("fugu_pipeline.route").warning(
                "%s: the caps its shipped description sends to %s stay with it: %s", router.tag, tag, exc)
            continue
        router.cap_routers[tag] = other


CASCADE_WITHOUT_REPLIES = ("a cascade is scored from the host's recorded replies, and none were given to this contest "
                           "(promote_best(answers=...): the reward matrix with answers)")


def router_kind(features, *, live=None, tasks=None, answers=None):
    """The router slot of the one contest: the one-shot heads' scorer (`RouterKind`), with the cascade's
    (`CascadeScorer`, from `answers`: the host's recorded replies) for a cascade entrant or king;
    without `answers` a cascade is refused at load, with the reason."""
    from fugu_pipeline.policies.cascade.contest import CascadeScorer
    from fugu_pipeline.policies.oneshot.contest import RouterKind
    from fugu_pipeline.policies.cascade.head import KIND

    heads()
    cascade = CascadeScorer(features, answers, load_router) if answers is not None else CASCADE_WITHOUT_REPLIES
    return RouterKind(features, live=live, tasks=tasks, mates={KIND: cascade})


def promote_best(checkpoint_paths: list[str], data, models_dir: str | Path, policy, *,
                 live=None, tasks: dict | None = None, submitter: str | None = None, now: float | None = None,
                 features=None, replace_broken_king: bool | str = False, key: str | None = None,
                 answers=None) -> dict:
    """One promotion attempt of one-step heads through the one contest (`contest.run_contest` with
    `router_kind`; `policy`: `evaluate/promotion.PromotionPolicy`). The rate limit first (a refusal there is recorded but is no
    attempt); every challenger through the weight, signature (a pack), contract, duplicate and
    receipt gates; among those that pass, the one with the best validation utility is scored on
    the frozen held-out rows of `data` (the composite against the king, with `live` evaluating the
    live term on `tasks`) and faces the gates of `decide`. Each checkpoint, the king included, is
    scored on its own features from `features` (`feature_source.py`: the same rows, encoded as its
    contract says, by the serving encoder model); without `features`, only checkpoints on `data`'s
    contract can be scored. `key`: the signing key a pack's attempt counts under.
    `answers` (`policies/cascade/contest.AnswerSource`: the host's recorded replies): a cascade checkpoint
    among the challengers, or as the king, is scored from them in the same contest (without it a
    cascade challenger is refused at load, and a cascade king cannot be faced).
    Returns {promoted, challenger, reasons, pointer, contest}.

    The models folder must be writable (checked before anything is scored). The whole attempt
    holds models/promoted/.lock, so a second attempt waits and then faces the king the first one
    promoted; the pointer is compare-and-swapped on the version read before the king was loaded.
    A promoted checkpoint that cannot be loaded (damaged pointer, edited or missing checkpoint)
    raises CheckpointError before scoring, recorded in the history, unless `replace_broken_king`
    (who asked, `contest.broken_king_ask`): then the challenger faces the baselines only and the
    history keeps why and who asked."""
    from fugu_pipeline.evaluate.contest import run_contest
    from fugu_pipeline.evaluate.feature_source import FeatureSource
    from fugu_pipeline.evaluate.gates import DEFAULT_SUBMITTER

    kind = router_kind(features if features is not None else FeatureSource.fixed(data), live=live, tasks=tasks,
                       answers=answers)
    return run_contest(kind, checkpoint_paths, models_dir, policy, submitter=submitter or DEFAULT_SUBMITTER, key=key,
                       now=now, replace_broken_king=replace_broken_king)


def preflight(pack_dir, models_dir, cfg, **kw):
    """`evaluate/preflight.preflight` on a pack of any kind: the shared gates read each kind's head
    class (its size cap, whether its behaviour can be probed offline) and load its king."""
    from fugu_pipeline.evaluate.preflight import preflight as run

    heads()
    return run(pack_dir, models_dir, cfg, **kw)


def cap_checkpoint(path: str | Path, cap) -> tuple[Path, str]:
    """(the checkpoint that serves `cap`, "" or the line saying it was sent there) for a saved
    checkpoint, as `Router.cap_router` sends a request naming the cap: itself where it keeps the
    cap (`cap_problem`) or has no shipped description; else the first of the description's rows at
    the nearest share whose checkpoint, found beside it by tag, keeps it; else itself (which refuses it)."""
    from fugu_pipeline.route.shipped import POLICY_FILE, checkpoint_tag, read_shipped

    path = Path(path)
    if cap is None or not (path / POLICY_FILE).is_file():
        return path, ""
    shipped = read_shipped(path, checkpoint_tag(path)[1])[0]
    choice = shipped.for_cap(cap) if shipped is not None else None
    why_not = cap_problem(path, cap) if choice is not None else ""
    if not why_not:
        return path, ""
    for row in choice.rows:
        where = path.resolve().parent.parent / row.checkpoint
        if row.checkpoint != shipped.checkpoint and (where / "manifest.json").is_file() and not cap_problem(where, cap):
            return where, (f"{cap.describe()}: served by {row.checkpoint}, as a request naming it is: {shipped.checkpoint} "
                           f"cannot keep it ({why_not}); {choice.why()}")
    return path, ""


def cap_problem(path: str | Path, cap) -> str:
    """Why the saved checkpoint at `path` cannot keep `cap` (no λ of its budget calibration, or no
    saved cascade point, within it), or "" (read from its files: nothing is encoded)."""
    from fugu_pipeline.policies.cascade.head import KIND
    from fugu_pipeline.route.budget import BudgetError, require_quality_head, usable_calibration

    ckpt = load_checkpoint(path)
    m = ckpt.manifest
    try:
        if m.head_kind == KIND:
            from fugu_pipeline.policies.cascade.evaluate import budget_reachable

            budget_reachable(ckpt, cap)
            return ""
        require_quality_head(ckpt.head, m.head_kind)
        calibration, why = usable_calibration(path, m.content_hash, list(m.worker_ids))
        if calibration is None:
            return why or "no budget calibration beside it"
        calibration.choose(cap)
    except (BudgetError, ValueError) as exc:  # CapOutOfReach is a ValueError
        return str(exc)
    return ""
