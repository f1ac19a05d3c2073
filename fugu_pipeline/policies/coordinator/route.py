"""The multi-turn coordinator at work: a roles checkpoint plus the encoder its contract names,
running sessions (`session/loop.py`) against whatever workers a caller reaches.

    coordinator = RolesCoordinator.load("models/roles/<hash>")      # or load_promoted_roles("models")
    tr = asyncio.run(coordinator.session("Prove that ...", "math", caller))
    tr.answer, tr.turns, tr.stop_reason

`PromotedRoles` follows `models/promoted/roles.json` (the coordinator's own pointer, swapped
atomically by `policies/coordinator/contest.py`), picking up a new promotion without a restart.
`OneStepPolicy` plays a one-step router (`route/router.py`) inside the session loop, so the
multi-turn report compares both on the same tasks, seeds and workers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from fugu_pipeline.route.promoted import check_identity
from fugu_pipeline.route.router import RouterError, encoder_settings_for
from fugu_pipeline.session.loop import SessionSpec, run_sessions
from fugu_pipeline.session.policy import Step
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.roles import PROMPT_VERSION, ROLES
from fugu_pipeline.session.transcript import TRANSCRIPT_VERSION
from fugu_pipeline.train.pointer import ROLES_POINTER, pointer_target, read_pointer
from fugu_pipeline.policies.coordinator.train import policy_from_checkpoint

ROLES_HEAD_KINDS = ("roles_linear", "roles_linear_svf")


def check_session_format(manifest) -> None:
    """Refuse a checkpoint trained on other role prompts or another transcript format: its head
    would read vectors that mean something else."""
    s = (manifest.training_config or {}).get("session") or {}
    wrong = [f"{k}: checkpoint has {s.get(k)!r}, this code has {v!r}"
             for k, v in (("prompt_version", PROMPT_VERSION), ("transcript_version", TRANSCRIPT_VERSION)) if s.get(k) != v]
    if wrong:
        raise RouterError(f"the coordinator was trained on another session format ({'; '.join(wrong)}); train it again")


class RolesCoordinator:
    """A loaded roles checkpoint and its featurizer. Sessions may run concurrently (the featurizer
    serialises encoder use)."""

    def __init__(self, checkpoint, featurizer):
        m = checkpoint.manifest
        if m.head_kind not in ROLES_HEAD_KINDS:
            raise RouterError(f"{checkpoint.path} holds a {m.head_kind!r} head, not a multi-turn coordinator "
                              f"({', '.join(ROLES_HEAD_KINDS)}); the one-step router is `route/router.py`")
        check_session_format(m)
        self.checkpoint = checkpoint
        self.featurizer = featurizer
        self.worker_ids = list(m.worker_ids)
        self.max_turns = int(((m.training_config or {}).get("session") or {}).get("max_turns", 5))
        self.policy = policy_from_checkpoint(checkpoint, featurizer)
        self.path = str(checkpoint.path)

    @classmethod
    def load(cls, checkpoint_path: str | Path, *, device: str = "auto", dtype: str = "auto",
             encoder: str | None = None) -> "RolesCoordinator":
        from fugu_pipeline.features.encoder import Encoder
        from fugu_pipeline.session.featurize import TranscriptFeaturizer
        from fugu_pipeline.policies.coordinator import head  # noqa: F401  (registers the coordinator's heads)
        from fugu_pipeline.train.checkpoints import load_checkpoint

        probe = load_checkpoint(checkpoint_path)
        settings = encoder_settings_for(probe.manifest.feature_contract, device, dtype, encoder)
        enc = Encoder.load(settings)
        expected = enc.feature_contract()
        if encoder is not None:
            expected = expected.model_copy(update={"encoder_id": probe.manifest.feature_contract.encoder_id})
        return cls(load_checkpoint(checkpoint_path, expected_contract=expected), TranscriptFeaturizer(enc))

    @property
    def tag(self) -> str:
        m = self.checkpoint.manifest
        return f"{m.method}/{m.content_hash or Path(self.path).name}"

    async def session(self, prompt: str, domain: str | None, caller, *, task=None, seed: int = 0,
                      allowed: list[str] | None = None, budget=None, judge=None) -> Trajectory:
        """One greedy session on `prompt` (graded when `task` is given)."""
        if allowed is not None:
            unknown = [w for w in allowed if w not in self.worker_ids]
            if unknown or not allowed:
                raise RouterError(f"unknown worker(s) {unknown}; this coordinator knows {self.worker_ids}",
                                  param="fugu_allowed_workers", code="unknown_worker")
        spec = SessionSpec(self.policy, prompt, domain, task=task, seed=seed, greedy=True, allowed=allowed)
        return (await run_sessions([spec], caller, max_turns=self.max_turns, budget=budget, judge=judge))[0]

    def close(self) -> None:
        self.featurizer.encoder.close()


class PromotedRoles:
    """Follows `models/promoted/roles.json`; reloads when it changes (module docstring)."""

    def __init__(self, models_dir: str | Path, **opts):
        self.models_dir = Path(models_dir)
        self._opts = opts
        self._current: RolesCoordinator | None = None
        self._key = None
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> RolesCoordinator:
        ptr = read_pointer(self.models_dir, ROLES_POINTER)
        if ptr is None:
            raise RouterError(f"no promoted multi-turn coordinator in {self.models_dir} ({ROLES_POINTER} is missing): "
                              "materialize `eval_report_roles`, or pass a roles checkpoint")
        key = (ptr.get("content_hash"), ptr.get("checkpoint"))
        with self._lock:
            if self._current is None or key != self._key:
                # the old coordinator is not closed: sessions still running keep using it until they end
                coord = RolesCoordinator.load(pointer_target(self.models_dir, ptr), **self._opts)
                try:  # the pointer's content_hash must be the checkpoint's: else not the promoted one
                    check_identity(self.models_dir, ptr, coord.checkpoint.manifest, ROLES_POINTER)
                except RouterError:
                    coord.close()
                    raise
                self._current, self._key = coord, key
            return self._current


def load_roles(checkpoint_or_models_dir: str | Path, **opts) -> RolesCoordinator | PromotedRoles:
    """A roles checkpoint directory gives a fixed coordinator; a models directory with
    `promoted/roles.json` follows the promoted one."""
    path = Path(checkpoint_or_models_dir)
    if (path / ROLES_POINTER).exists():
        return PromotedRoles(path, **opts)
    if (path / "manifest.json").exists():
        return RolesCoordinator.load(path, **opts)
    raise RouterError(f"{path} is neither a roles checkpoint nor a models directory with {ROLES_POINTER}")


class OneStepPolicy:
    """A one-step router as a session policy: its worker distribution for the task, the Worker role,
    one turn. Its trajectories are stored under `onestep:<checkpoint hash>`."""

    featurizer = None
    max_turns = 1

    def __init__(self, router, worker_ids: list[str]):
        missing = [w for w in router.worker_ids if w not in worker_ids]
        if missing:
            raise RouterError(f"the one-step router routes to {missing}, which these sessions cannot call")
        self.router = router
        self.worker_ids = list(worker_ids)
        self.name = f"onestep:{router.checkpoint.manifest.content_hash or Path(router.path).name}"

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
        decisions = self.router.route_batch([s.prompt for s in steps], [s.domain for s in steps], default_point=False)
        pw = np.array([[d.softmax_scores().get(w, 0.0) for w in self.worker_ids] for d in decisions])
        pr = np.zeros((len(steps), len(ROLES)))
        pr[:, ROLES.index("worker")] = 1.0
        return pw, pr
