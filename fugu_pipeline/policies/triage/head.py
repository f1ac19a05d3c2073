"""The triage head's module (`triage_linear`): two bias-free linear maps over the L2-normalised
features, each with its own softmax (`policies/triage/train.py` trains, saves and loads it). Registered in
the head registry, so a triage checkpoint is written and loaded by the one checkpoint code."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fugu_pipeline.train.head_base import register

HEAD_KIND = "triage_linear"
MAX_PARAMS = 1_000_000  # TinyRouter's milestone-1 rule: a triage head under 1M parameters


class TriageHead(nn.Module):
    kind = HEAD_KIND

    def __init__(self, dim: int, n_domains: int, n_difficulty: int):
        super().__init__()
        self.dim = dim
        if dim < 1 or n_domains < 1 or n_difficulty < 2:
            raise ValueError(f"a triage head needs dim >= 1, n_domains >= 1, n_difficulty >= 2; got {dim}, {n_domains}, {n_difficulty}")
        self.domain = nn.Linear(dim, n_domains, bias=False)
        self.difficulty = nn.Linear(dim, n_difficulty, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(domain logits, difficulty logits); each its own softmax."""
        z = F.normalize(x, dim=-1)
        return self.domain(z), self.difficulty(z)

    def probabilities(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d, h = self(x)
        return torch.softmax(d, dim=-1), torch.softmax(h, dim=-1)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())


@register
class TriageCheckpointHead(TriageHead):
    """`triage_linear` in the head registry: a TriageHead built from a checkpoint manifest (its
    `head_params` hold the label vocabulary; `n_workers` is the pool that defined difficulty)."""

    uses_domains = False
    final_layers = ("domain.weight", "difficulty.weight")
    max_params = MAX_PARAMS  # the size gate (`evaluate/preflight.py`)

    def __init__(self, dim: int, n_workers: int, domains: list[str], difficulty_names: list[str],
                 difficulty_edges: list[float], solve_threshold: float):
        super().__init__(dim, len(domains), len(difficulty_names))
        if len(difficulty_edges) != len(difficulty_names) - 1:
            raise ValueError(f"{len(difficulty_names)} difficulty names need {len(difficulty_names) - 1} edges")
        self.domains, self.difficulty_names = list(domains), list(difficulty_names)
        self.difficulty_edges, self.solve_threshold = list(difficulty_edges), float(solve_threshold)

    def head_params(self) -> dict[str, Any]:
        return {"domains": self.domains, "difficulty_names": self.difficulty_names,
                "difficulty_edges": self.difficulty_edges, "solve_threshold": self.solve_threshold}

    def sanity(self) -> list[str]:
        return []


