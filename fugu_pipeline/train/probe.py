"""Load-time probes of a head's scores: a checkpoint whose scores are not finite (or so large that
they overflow on slightly other inputs) is refused when it is loaded, with one line naming it,
instead of being served and failing request after request.

Finite weights do not make finite scores: a re-signed checkpoint whose weights are ±3e38 (the
largest float32) passes every check on the tensors themselves, and its scores overflow to
infinity, then NaN, on any input. So every head kind is called on a probe set:

- at `load_checkpoint` (`checkpoints.weight_sanity`): `PROBE_ROWS` random unit vectors of the
  feature dimension (with the head's domains and none, for heads that take a domain);
- at `Router.load` and on every reload of the promoted pointer: the encoder's own features of
  `PROBE_PROMPTS`, so a head is also tried on what it will really see.

On each, `score_problems` requires the routing scores to be finite and within `SCORE_LIMIT` (a
bound 1e8 times below float32's overflow: inputs that much larger still give finite scores), the
scores of a head with a cost term finite at cost weight 0 and at `reward.MAX_COST_WEIGHT` (the
largest a request may send), and predicted quality finite and in [0, 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fugu_pipeline.reward import MAX_COST_WEIGHT
from fugu_pipeline.train.head_base import RoutingHead, call_head, head_quality

PROBE_ROWS = 64
SCORE_LIMIT = 1e30
PROBE_PROMPTS = (
    "What is 17 times 23?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarise the causes of the First World War in two sentences.",
    "Translate 'good morning, how are you?' into French.",
    "hi",
    "Prove that the square root of 2 is irrational, and explain every step so that a student can follow it.",
)


def random_probe(head: RoutingHead) -> tuple[torch.Tensor, list[str | None] | None]:
    """`PROBE_ROWS` random unit vectors of the head's dimension (seeded), and the domains to send
    with them: alternately one of the head's and none, for heads that take a domain."""
    g = torch.Generator().manual_seed(0)
    z = F.normalize(torch.randn(PROBE_ROWS, head.dim, generator=g), dim=-1)
    if not head.uses_domains:
        return z, None
    vocab = list(getattr(head, "domains", None) or [])
    return z, [vocab[i % len(vocab)] if vocab and i % 2 == 0 else None for i in range(PROBE_ROWS)]


def score_problems(head: RoutingHead, x: torch.Tensor, domains: list[str | None] | None = None) -> list[str]:
    """What is wrong with the head's scores on features `x` (see the module docstring); [] when sane."""
    problems: list[str] = []
    with torch.inference_mode():
        probe = getattr(head, "probe_scores", None)  # a kind that routes step by step (a cascade): its own scores
        scores = probe(x) if probe is not None else call_head(head, x, domains)
        for i, part in enumerate(scores if isinstance(scores, tuple) else (scores,)):  # a triage head: two softmax groups
            problems += _bounded("routing scores" if not isinstance(scores, tuple) else f"scores (output {i})", part)
        if hasattr(head, "route_scores") and hasattr(head, "expected_cost"):
            for lam in (0.0, MAX_COST_WEIGHT):
                problems += _bounded(f"scores at cost weight {lam:g}", head.route_scores(x, lam, head.expected_cost))
        q = head_quality(head, x, domains)
        if q is not None:
            q = q.double()
            if not bool(torch.isfinite(q).all()):
                problems.append(f"predicted quality not finite ({_count(~torch.isfinite(q))} values)")
            elif q.numel() and (float(q.min()) < -1e-6 or float(q.max()) > 1 + 1e-6):
                problems.append(f"predicted quality outside [0, 1] ({float(q.min()):.3g}..{float(q.max()):.3g})")
    return problems


def _bounded(what: str, s: torch.Tensor) -> list[str]:
    s = s.double()
    bad = ~torch.isfinite(s)
    if bool(bad.any()):
        return [f"{what} not finite ({_count(bad)} of {s.numel()} values)"]
    top = float(s.abs().max()) if s.numel() else 0.0
    if top > SCORE_LIMIT:
        return [f"{what} as large as {top:.3g} (the limit is {SCORE_LIMIT:g}: they would overflow on other inputs)"]
    return []


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum())
