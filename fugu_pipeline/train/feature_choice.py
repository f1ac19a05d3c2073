"""Choosing the prompt rules on validation: train with the prompts as they are and with the strip
rules fitted on the training prompts (`features/prompt_rules.py`), keep the one with the better
validation utility, and say so in the checkpoint's metrics.

The rules are fitted on the TRAINING rows of the data without rules (validation and test text
never shapes them); the two candidates see the same rows, splits and trainer config, so the only
difference is the text the encoder read. Fitting finds nothing to strip on most data (then there
is nothing to choose and the prompts are used as they are, at no extra cost). A tie keeps the
prompts as they are. The choice travels in the feature contract (`prompt_rules`), so serving
strips exactly what training stripped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fugu_pipeline.features.prompt_rules import PromptRules, fit_prompt_rules
from fugu_pipeline.features.routing_data import RoutingData

Log = Callable[[str], None]
R = TypeVar("R")


def val_utility(result: Any) -> float:
    """A TrainResult's validation utility (what the SFT/RL/ES trainers keep their epoch by)."""
    return result.metrics["val_utility"]


def fit_rules_on_train(data: RoutingData, **params) -> PromptRules:
    train = data.split("train")
    return fit_prompt_rules(train.prompts, train.domains, **params)


def choose_prompt_rules(
    data: RoutingData,
    load: Callable[[PromptRules], RoutingData],
    train: Callable[[RoutingData], R],
    mode: str = "auto",
    log: Log = print,
    score: Callable[[R], float] = val_utility,
) -> tuple[R, RoutingData, dict]:
    """`data`: the routing data without rules. `load(rules)`: the same rows encoded with `rules`.
    `train(data)`: a trained result (a TrainResult, or the heads' selection), `score(result)` its
    validation utility. mode 'off' (prompts as they are), 'on' (the fitted rules), 'auto' (both,
    the better validation utility wins). Returns (result, its data, the record)."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"prompt-rules mode must be auto, on or off, got {mode!r}")
    if mode == "off":
        return train(data), data, {"mode": "off", "chosen": "none"}
    rules = fit_rules_on_train(data)
    log(rules.describe())
    if rules.is_empty():
        return train(data), data, {"mode": mode, "chosen": "none", "note": "nothing shared to strip in the training prompts"}
    stripped = load(rules)
    if mode == "on":
        return train(stripped), stripped, {"mode": "on", "chosen": rules.fingerprint(), "rules": rules.summary()}
    plain_result = train(data)
    strip_result = train(stripped)
    a, b = score(plain_result), score(strip_result)
    use = b > a + 1e-12
    log(f"prompt rules on validation: as they are {a:.4f}, stripped {b:.4f} -> {'stripped' if use else 'as they are'}")
    record = {"mode": "auto", "chosen": rules.fingerprint() if use else "none", "rules": rules.summary(),
              "val_utility": {"none": a, rules.fingerprint(): b}}
    return (strip_result, stripped, record) if use else (plain_result, data, record)


def choose_variant(variants: list[tuple[str, Callable[[], R]]], score: Callable[[R], float],
                   log: Log = print) -> tuple[R, dict]:
    """Fit every feature variant (label, fit) and keep the one whose result scores best on
    validation (`score`: the selected head's out-of-fold figure on the measure selection ranked
    by, `FitReport.val_score`); ties keep the earlier variant. Test rows play no part. Returns
    (the kept result, the record: each label's score and the chosen label)."""
    if not variants:
        raise ValueError("no feature variant to choose from")
    results, scores = [], {}
    for label, fit in variants:
        results.append(fit())
        scores[label] = float(score(results[-1]))
        log(f"features {label}: validation {scores[label]:.4f}")
    best = max(range(len(variants)), key=lambda i: (scores[variants[i][0]], -i))
    chosen = variants[best][0]
    if len(variants) > 1:
        log(f"features: {chosen} kept (the best validation figure of {len(variants)})")
    return results[best], {"chosen": chosen, "val_score": scores}
