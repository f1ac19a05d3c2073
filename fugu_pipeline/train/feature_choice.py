"""Choosing the features on validation: the prompt rules (train with the prompts as they are and
with the strip rules fitted on the training prompts, `features/prompt_rules.py`) and, when asked,
the encoder layers (`layer_sets`); the better validation figure wins and the checkpoint's metrics
say so. `fit_choosing_features` is what `fugu-lite train`/`train-sft` and the `router_heads` asset
both call, so the command line and the assets choose the same features from the same settings.

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
from fugu_pipeline.features.settings import EncoderSettings

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


def feature_metrics(settings: EncoderSettings, record: dict | None = None) -> dict:
    """What a new checkpoint's metrics record about its features: the prompt-rule choice when rules
    were fitted (nothing to strip, or off: nothing), and the dtype the features were computed in
    (`route` and `serve` use it under --dtype auto)."""
    out = {"prompt_rules_choice": record} if record and "rules" in record else {}
    out["feature_dtype"] = settings.feature_dtype()
    return out


class LayerSetError(ValueError):
    """A layer setting that is not one or more layer indices; the message names it."""


def parse_layer_set(text: str | list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """One layer setting, from '-1 3' / '-1,3' (the command line) or [-1, 3] (a config): a tuple of
    hidden-state indices. LayerSetError (naming it, saying what to give) when it is empty or not
    integers."""
    if isinstance(text, str):
        try:
            layers = [int(x) for x in text.replace(",", " ").split()]
        except ValueError:
            raise LayerSetError(f"{text!r}: each setting is one or more layer indices, e.g. '-1' or '-1 3'") from None
    else:
        layers = list(text)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise LayerSetError(f"{text!r}: each setting is one or more layer indices, e.g. [-1] or [-1, 3]")
    if not layers:
        raise LayerSetError("an empty setting; give e.g. '-1' or '-1 3'")
    return tuple(layers)


def fit_choosing_features(
    settings: EncoderSettings,
    load: Callable[[EncoderSettings], RoutingData],
    fit: Callable[[RoutingData], R],
    score: Callable[[R], float],
    *,
    prompt_rules: str = "auto",
    layer_sets: list | None = None,
    log: Log = print,
    prefill: Callable[[list[EncoderSettings]], object] | None = None,
) -> tuple[R, RoutingData, dict]:
    """Fit on the features `settings` describe, choosing on validation what is left open: the
    prompt rules (`prompt_rules`: auto, on, off) and, with `layer_sets` (e.g. [[-1], [-1, 3]]), the
    encoder layers: each setting is fitted (prompt rules chosen within it) and the one whose result
    `score`s best is kept. `load(settings)` gives the rows with those features (through the cache);
    `fit(data)` trains. `prefill(settings_list)`, when given, encodes the prompts once for every
    layer setting before they are fitted (`routing_data.prefill_layer_sets`: one forward pass
    instead of one per setting). Returns (result, its data, the metrics to record in the
    checkpoint)."""

    def with_layers(layers: tuple[int, ...] | None) -> EncoderSettings:
        if layers is None:
            return settings
        return EncoderSettings.model_validate({**settings.model_dump(), "layer": layers})

    def one(s: EncoderSettings):
        data = load(s)
        return choose_prompt_rules(data, lambda rules: load(s.model_copy(update={"prompt_rules": rules})),
                                   fit, prompt_rules, log, score=score)

    if not layer_sets:
        result, data, record = one(settings)
        return result, data, feature_metrics(settings, record)
    sets = [parse_layer_set(x) for x in layer_sets]
    if prefill is not None and len(sets) > 1:
        prefill([with_layers(ls) for ls in sets])
        if prompt_rules != "off":  # the stripped prompts too: the rules are fitted on the text, not the layers
            rules = fit_rules_on_train(load(with_layers(sets[0])))
            if not rules.is_empty():
                prefill([with_layers(ls).model_copy(update={"prompt_rules": rules}) for ls in sets])
    variants = [(f"layers {list(ls)}", lambda ls=ls: one(with_layers(ls))) for ls in sets]
    (result, data, record), choice = choose_variant(variants, score=lambda out: score(out[0]), log=log)
    return result, data, {**feature_metrics(settings, record), "layer_choice": choice}


def auto_layer_sets(settings: EncoderSettings) -> list[tuple[int, ...]] | None:
    """`layer_sets: auto`: the last layer alone and with the middle one ([-1] and [-1, n // 2] for
    an n-layer model), when the encoder reads only its last layer; None (nothing to choose) when it
    reads other layers or the model has fewer than two."""
    if settings.layers != (-1,):
        return None
    n = settings.hidden_layers()
    return [(-1,), (-1, n // 2)] if n is not None and n >= 2 else None


def heads_features(base: EncoderSettings, cfg, *, lexical: bool | None = None, layer_sets=None,
                   prompt_rules: str | None = None) -> tuple[EncoderSettings, list[tuple[int, ...]] | None, str]:
    """The features the heads of `fugu-lite train` and the `router_heads` asset read: the encoder
    settings `base` with the lexical block of `cfg` (a FeatureChoiceConfig, `configs/train.yaml`'s
    `features:`), the layer settings to choose from and the prompt-rules mode; each argument given
    overrides the file (the command line's flags, the asset's run config). `layer_sets`: 'auto',
    'off', or settings ('-1 3' strings or lists). Returns (settings, the layer sets or None, the
    prompt-rules mode)."""
    settings = EncoderSettings.model_validate({**base.model_dump(), "lexical": cfg.lexical if lexical is None else lexical})
    spec = cfg.layer_sets if layer_sets is None else layer_sets
    if isinstance(spec, (list, tuple)) and len(spec) == 1 and isinstance(spec[0], str) and spec[0].strip() in ("auto", "off"):
        spec = spec[0].strip()
    if spec == "off":
        sets = None
    elif spec == "auto":
        sets = auto_layer_sets(settings)
    else:
        sets = [parse_layer_set(x) for x in spec]
    return settings, sets, cfg.prompt_rules if prompt_rules is None else prompt_rules


def describe_features(settings: EncoderSettings, sets: list[tuple[int, ...]] | None, prompt_rules: str) -> str:
    """One line for the log: what `heads_features` resolved."""
    layers = [list(x) for x in sets] if sets else list(settings.layers)
    return f"features: lexical block {'on' if settings.lexical else 'off'}; layer settings {layers}; prompt rules {prompt_rules}"
