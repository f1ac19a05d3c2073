"""Prompt rules: boilerplate that a domain's training prompts share, stripped before encoding so the
encoder reads the question (part of the feature contract).

Why. When every prompt of a domain opens with the same few-shot block or system boilerplate, the
encoder's pooled vector is dominated by that shared text: on real data we met prompts whose
embeddings had a mean pairwise cosine of 0.97, and a head over them sent everything to the most
expensive worker. The question, the only part that differs, is a few percent of the tokens (or
is cut off by `max_length` altogether).

Two rules, fitted on TRAINING prompts only (never validation or test text), per domain:

- common prefix: the longest prefix every training prompt of the domain shares, cut back to a
  line (or else a word) boundary, kept when it is at least `min_chars` long (one fixed few-shot
  block or system preamble);
- frequent lines: lines (stripped, at least `min_line_chars` long) present in at least `min_share`
  of the domain's training prompts (few-shot examples drawn from a small pool, an answer-format
  footer); every occurrence of such a line is removed.

Domains with fewer than `min_prompts` training prompts get no rules of their own. The key `*` holds
the rules fitted on all training prompts together: they apply to a domain the rules were not
fitted on (a domain unseen in training, or a request that names none). A prompt that stripping
would leave blank is kept whole.

The fitted rules travel with the checkpoint inside its feature contract (`FeatureContract
.prompt_rules`), and `EncoderSettings.format` applies them, so the embedding cache, training,
`route` and `serve` read the same text. Whether to use them is chosen on validation
(`train/feature_choice.py`). Plain Python: no numpy, no torch.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

from pydantic import BaseModel, ConfigDict, Field

from fugu_pipeline.hashing import canonical_json, sha256_text

ALL = "*"


def _cut_to_boundary(prefix: str) -> str:
    """Shorten a common prefix to end just after a newline (or else a space), so no word is split."""
    for sep in ("\n", " "):
        k = prefix.rfind(sep)
        if k >= 0:
            return prefix[: k + 1]
    return ""


class DomainRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = ""
    lines: tuple[str, ...] = ()

    def apply(self, text: str) -> str:
        out = text
        if self.prefix and out.startswith(self.prefix):
            out = out[len(self.prefix):]
        if self.lines:
            drop = set(self.lines)
            out = "\n".join(ln for ln in out.split("\n") if ln.strip() not in drop)
        return out


class PromptRules(BaseModel):
    """Fitted strip rules: `rules[domain]`, `rules['*']` for domains not fitted on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: dict[str, DomainRules] = Field(default_factory=dict)
    fitted_domains: tuple[str, ...] = ()  # every training domain (with or without rules of its own)
    params: dict[str, float] = Field(default_factory=dict)  # the fitting thresholds, for the record

    def apply(self, prompt: str, domain: str | None) -> str:
        d = domain if domain in self.fitted_domains else ALL
        r = self.rules.get(d)
        if r is None:
            return prompt
        out = r.apply(prompt)
        return out if out.strip() else prompt

    def is_empty(self) -> bool:
        return not any(r.prefix or r.lines for r in self.rules.values())

    def fingerprint(self) -> str:
        return sha256_text(canonical_json(self.model_dump(mode="json")))[:16]

    def summary(self) -> dict[str, dict]:
        """Per domain with rules: the prefix's length in characters and the number of lines."""
        return {d: {"prefix_chars": len(r.prefix), "lines": len(r.lines)}
                for d, r in sorted(self.rules.items()) if r.prefix or r.lines}

    def describe(self) -> str:
        s = self.summary()
        if not s:
            return "prompt rules: none (nothing shared to strip)"
        parts = [f"{d}: {v['prefix_chars']}-char prefix, {v['lines']} lines" for d, v in s.items()]
        return f"prompt rules {self.fingerprint()}: " + "; ".join(parts)


def _fit_one(prompts: list[str], min_chars: int, min_share: float, min_line_chars: int) -> DomainRules:
    prefix = _cut_to_boundary(os.path.commonprefix(prompts)) if len(prompts) > 1 else ""
    if len(prefix) < min_chars or not all(p[len(prefix):].strip() for p in prompts):
        prefix = ""
    counts: Counter[str] = Counter()
    for p in prompts:
        counts.update({ln.strip() for ln in p[len(prefix):].split("\n") if len(ln.strip()) >= min_line_chars})
    need = max(2, min_share * len(prompts))
    lines = tuple(sorted(ln for ln, c in counts.items() if c >= need))
    return DomainRules(prefix=prefix, lines=lines)


def fit_prompt_rules(prompts: list[str], domains: list[str] | None = None, *, min_chars: int = 200,
                     min_share: float = 0.3, min_prompts: int = 20, min_line_chars: int = 20) -> PromptRules:
    """Rules from TRAINING prompts (pass only the train split: the rules must not see held-out text)."""
    domains = list(domains) if domains is not None else ["general"] * len(prompts)
    if len(domains) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(domains)} domains")
    by: dict[str, list[str]] = defaultdict(list)
    for p, d in zip(prompts, domains):
        by[d].append(p)
    rules: dict[str, DomainRules] = {}
    for d, ps in [(ALL, list(prompts)), *sorted(by.items())]:
        if len(ps) < min_prompts:
            continue
        r = _fit_one(ps, min_chars, min_share, min_line_chars)
        if r.prefix or r.lines:
            rules[d] = r
    return PromptRules(rules=rules, fitted_domains=tuple(sorted(by)),
                       params={"min_chars": min_chars, "min_share": min_share, "min_prompts": min_prompts,
                               "min_line_chars": min_line_chars})
