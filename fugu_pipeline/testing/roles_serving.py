"""A multi-turn coordinator checkpoint with a known behaviour, for serving tests and demos: its
roles head is fitted by least squares to follow a script of (worker, role) per turn on the tiny
encoder's features of the scripted transcripts (behaviour cloning), then saved as an ordinary
`roles_linear` checkpoint. Real training is `policies/coordinator/train.py`; this only makes a coordinator whose
sessions a test can predict."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.session.policy import Step
from fugu_pipeline.session.records import TurnRecord
from fugu_pipeline.session.roles import ROLES


def scripted_turns(script: list[tuple[str, str]], replies: dict[str, str]) -> list[TurnRecord]:
    return [TurnRecord(index=k + 1, role=r, chosen_worker=w, served_by=w, text=replies[r], extractable=r != "verifier",
                       verdict="revise" if r == "verifier" else None) for k, (w, r) in enumerate(script)]


def imitation_checkpoint(models_dir: str | Path, worker_ids: list[str], script: list[tuple[str, str]],
                         prompts: list[tuple[str, str]], replies: dict[str, str], *, encoder: str = "tiny",
                         max_length: int = 256) -> Path:
    """Save a roles checkpoint whose greedy policy plays `script[k]` at turn k+1 on sessions like
    these (`prompts` as (prompt, domain), worker texts `replies[role]`). Returns its directory."""
    from fugu_pipeline.policies.coordinator.project import roles_encoder_settings
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.session.featurize import TranscriptFeaturizer
    from fugu_pipeline.policies.coordinator.train import SHIFT, RolesTrainResult, session_info

    enc = Encoder.load(roles_encoder_settings(encoder, max_length, device="cpu", dtype="float32"))
    try:
        f = TranscriptFeaturizer(enc)
        turns = scripted_turns(script, replies)
        steps = [Step(p, d, turns[:k]) for p, d in prompts for k in range(len(script))]
        x = f.features([s.head for s in steps]).astype(np.float64)
        scale = np.where(x.std(axis=0) > 1e-6, x.std(axis=0), 1.0)
        center = x.mean(axis=0) - SHIFT * scale
        z = (x - center) / scale
        target = np.zeros((len(steps), len(worker_ids) + len(ROLES)))
        for i in range(len(steps)):
            w, r = script[i % len(script)]
            target[i, worker_ids.index(w)] = 8.0
            target[i, len(worker_ids) + ROLES.index(r)] = 8.0
        weight, *_ = np.linalg.lstsq(z, target, rcond=None)
        result = RolesTrainResult(
            weight=weight.T.astype(np.float32), center=center.astype(np.float32), scale=scale.astype(np.float32),
            worker_ids=list(worker_ids), featurizer=f,
            config={"imitation_of": [list(s) for s in script], "session": session_info(5)},
            curves={}, best_generation=0, metrics={"method": "least-squares imitation of a script (test fixture)"},
            data_version="imitation", wall_s=0.0)
        return result.save(models_dir)
    finally:
        enc.close()


class ScriptPolicy:
    """Plays `script[k]` (worker, role) at turn k + 1 (the last entry from then on), whatever the transcript."""

    featurizer = None
    max_turns = None

    def __init__(self, worker_ids: list[str], script: list[tuple[str, str]]):
        self.worker_ids, self.script = list(worker_ids), list(script)
        self.name = "script:" + ">".join(f"{r}:{w}" for w, r in script)

    def distributions(self, steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
        pw, pr = np.zeros((len(steps), len(self.worker_ids))), np.zeros((len(steps), len(ROLES)))
        for i, s in enumerate(steps):
            w, r = self.script[min(len(s.turns), len(self.script) - 1)]
            pw[i, self.worker_ids.index(w)], pr[i, ROLES.index(r)] = 1.0, 1.0
        return pw, pr


def scripted_coordinator(models_dir: str | Path, run, tasks: list, script: list[tuple[str, str]], *,
                         data_cost_usd: float = 0.05, curve: tuple[float, ...] = (0.1, 0.2, 0.3)) -> Path:
    """A roles checkpoint that plays `script` on the transcripts the run's workers really produce:
    the script is run as a policy on `tasks` (through `run.runner`, so its sessions are stored and
    paid once), and the head is fitted by least squares to pick the script's (worker, role) in
    every state those sessions met (behaviour cloning). `run`: an open `policies/coordinator/project.RolesRun`.
    Its receipt records `curve` as fitness and `data_cost_usd` as training cost."""
    from fugu_pipeline.policies.coordinator.train import SHIFT, RolesTrainResult, session_info

    ids = run.config.worker_ids
    trs = run.runner.run([ScriptPolicy(ids, script)], [(t, 7) for t in tasks], greedy=True)[0]
    by_id = {t.task_id: t for t in tasks}
    steps = [Step(by_id[tr.task_id].prompt, tr.domain, tr.turns[:k]) for tr in trs for k in range(len(tr.turns) + 1)]
    x = run.featurizer.features([s.head for s in steps]).astype(np.float64)
    scale = np.where(x.std(axis=0) > 1e-6, x.std(axis=0), 1.0)
    center = x.mean(axis=0) - SHIFT * scale
    z = (x - center) / scale
    target = np.zeros((len(steps), len(ids) + len(ROLES)))
    for i, s in enumerate(steps):
        w, r = script[min(len(s.turns), len(script) - 1)]
        target[i, ids.index(w)] = 8.0
        target[i, len(ids) + ROLES.index(r)] = 8.0
    weight, *_ = np.linalg.lstsq(z, target, rcond=None)
    result = RolesTrainResult(
        weight=weight.T.astype(np.float32), center=center.astype(np.float32), scale=scale.astype(np.float32),
        worker_ids=list(ids), featurizer=run.featurizer,
        config={"imitation_of": [list(s) for s in script], "session": session_info(5)},
        curves={"train_best": list(curve)}, best_generation=len(curve),
        metrics={"method": "least-squares imitation of a script (test fixture)", "data_cost_usd": data_cost_usd},
        data_version="scripted", wall_s=0.0)
    return result.save(models_dir)
