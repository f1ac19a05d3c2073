"""The triage head as a kind of the one contest (`contest.py`), with its own king,
`models/promoted/triage.json`, and history, `models/promoted/triage-history.jsonl`.

TinyRouter's milestone-1 rules, through the same gates, composite and pointer discipline as every
kind: a head under 1M parameters (`MAX_PARAMS`, a gate before scoring), scored king versus
challenger on the host's fixed test rows, replaced only at composite ≥ king + 0.02 (with a
significant paired difference), one attempt a day per submitter (per key for a pack).

The composite of a triage head is its per-task score 0.7 × (domain right) + 0.3 × (difficulty
right), averaged over the test rows pooled into one benchmark: the cached term alone (no worker is
called, so there is no live, efficiency or novelty term), with the overfit gate on its eval and
audit rows. The labels are the host's: the domain of each task, and the difficulty bucket of its
solve share under the host's `TriageConfig` (compared by name with the head's prediction, so a head
with another vocabulary cannot grade itself). The baseline to beat is the majority label of the
training rows.
"""

from __future__ import annotations

import numpy as np

from fugu_pipeline.evaluate.composite import CompositeConfig, HeldOut, held_rows
from fugu_pipeline.evaluate.contest import KIND_FILES, Entrant, KindBase, Outcomes
from fugu_pipeline.evaluate.gates import GateResult
from fugu_pipeline.train.checkpoints import CheckpointError

DOMAIN_WEIGHT, DIFFICULTY_WEIGHT = 0.7, 0.3


class TriageKind(KindBase):
    """The triage head's scorer (module docstring). `data`: the host's RoutingData."""

    name = "triage"
    pointer, history, lock = KIND_FILES["triage"]

    def __init__(self, data, labels=None):
        from fugu_pipeline.policies.triage.train import TriageConfig, difficulty_labels

        self.data = data
        self.labels = labels or TriageConfig()
        self.row = {t: i for i, t in enumerate(data.task_ids)}
        if data.quality is None or np.isnan(data.quality).any():
            raise ValueError("a triage head is judged on difficulty labels from each worker's quality; this matrix has none")
        buckets = difficulty_labels(data.quality, self.labels)[0]
        self.true_domain = list(data.domains)
        self.true_difficulty = [self.labels.difficulty_names[int(b)] for b in buckets]

    def composite_config(self, cfg: CompositeConfig) -> CompositeConfig:
        return cfg.model_copy(update={"cached_weight": 1.0, "live_weight": 0.0, "efficiency_weight": 0.0,
                                      "novelty_weight": 0.0})

    def load(self, path: str) -> Entrant:
        from fugu_pipeline.policies.triage.train import load_triage

        t = load_triage(path)
        return Entrant(str(t.path), t.manifest.method, t.manifest.content_hash, t.checkpoint, t.manifest)

    def own_gates(self, entrant: Entrant) -> list[GateResult]:
        from fugu_pipeline.policies.triage.train import MAX_PARAMS

        n = entrant.manifest.param_count
        return [GateResult("size", n < MAX_PARAMS, f"{n:,} parameters ({'<' if n < MAX_PARAMS else 'not <'} {MAX_PARAMS:,})")]

    def contract_problems(self, entrant: Entrant) -> list[str]:
        m = entrant.manifest
        problems = m.feature_contract.differences(self.data.contract)
        if list(m.worker_ids) != list(self.data.worker_ids):
            problems.append(f"its difficulty labels come from workers {m.worker_ids}, the host's from {self.data.worker_ids}")
        return problems

    def rank(self, entrant: Entrant) -> float | None:
        m = entrant.manifest.metrics
        if m.get("val_domain_accuracy") is None:
            return None
        return DOMAIN_WEIGHT * m["val_domain_accuracy"] + DIFFICULTY_WEIGHT * m.get("val_difficulty_accuracy", 0.0)

    def receipt_data(self):
        return self.data

    def held_out(self, cfg: CompositeConfig) -> HeldOut:
        test = self.data.split("test")
        return held_rows(list(test.task_ids), list(test.domains), cfg, one_benchmark="all",
                         measure_name=f"{DOMAIN_WEIGHT} domain + {DIFFICULTY_WEIGHT} difficulty accuracy")

    def _labels(self, entrant: Entrant, rows: np.ndarray) -> tuple[list[str], list[str]]:
        from fugu_pipeline.policies.triage.train import triage_probabilities

        p = entrant.manifest.head_params
        d, h = triage_probabilities(entrant.head.head, self.data.features[rows])
        return [p["domains"][int(i)] for i in d.argmax(1)], [p["difficulty_names"][int(j)] for j in h.argmax(1)]

    def _score(self, rows: np.ndarray, doms: list[str], diffs: list[str], task_ids: list[str]) -> Outcomes:
        ok_d = np.array([a == self.true_domain[i] for a, i in zip(doms, rows)], float)
        ok_h = np.array([b == self.true_difficulty[i] for b, i in zip(diffs, rows)], float)
        n = len(rows)
        return Outcomes(list(task_ids), DOMAIN_WEIGHT * ok_d + DIFFICULTY_WEIGHT * ok_h, np.ones(n), np.zeros(n),
                        [f"{a}/{b}" for a, b in zip(doms, diffs)])

    def outcomes(self, entrant: Entrant, task_ids: list[str], *, live: bool) -> Outcomes:
        if live:
            raise CheckpointError("a triage head is not run live")
        rows = np.array([self.row[t] for t in task_ids], int)
        return self._score(rows, *self._labels(entrant, rows), task_ids)

    def baseline(self, task_ids: list[str]) -> Outcomes | None:
        train = np.flatnonzero(self.data.splits == "train")
        if not len(train):
            return None
        major = lambda labels: max(sorted(set(labels)), key=labels.count)  # noqa: E731
        d = major([self.true_domain[i] for i in train])
        h = major([self.true_difficulty[i] for i in train])
        rows = np.array([self.row[t] for t in task_ids], int)
        return self._score(rows, [d] * len(rows), [h] * len(rows), task_ids)

    def train_figure(self, entrant: Entrant) -> float | None:
        train = np.flatnonzero(self.data.splits == "train")
        if not len(train):
            return None
        ids = [self.data.task_ids[i] for i in train]
        return float(np.mean(self._score(train, *self._labels(entrant, train), ids).quality))

    def behaviour(self, entrant: Entrant):
        from fugu_pipeline.evaluate.probe import checkpoint_behaviour, probe_fingerprint, probe_ids, save_probe

        ids = probe_ids([t for t, s in zip(self.data.task_ids, self.data.splits) if s != "test"])
        rows = np.array([self.row[t] for t in ids], int)
        probe = probe_fingerprint(self.name, ids)
        domains = [self.data.domains[i] for i in rows]
        if self.models_dir is not None:
            save_probe(self.models_dir, self.name, entrant.manifest.contract_fingerprint, probe, self.data.features[rows], domains)
        return checkpoint_behaviour(probe, entrant.head, self.data.features[rows], domains)
