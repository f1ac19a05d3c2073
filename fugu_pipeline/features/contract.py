"""The feature contract: everything that decides what a feature vector means.

A checkpoint pins one; loading refuses a checkpoint whose contract differs from the encoder it is
given. dtype is not part of it (a bf16-GPU checkpoint serves on an fp32 CPU); it is part of the
embedding cache's fingerprint instead.

`layer` is one hidden-states index, or several (`[-1, 3]`: each pooled and normalised on its own,
then concatenated). `lexical`: the vector ends with the lexical statistics block (`lexical.py`), so
cosine heads read only the first `embedding_dim` columns. `prompt_rules` are the strip rules fitted on the training prompts
(`prompt_rules.py`); they travel inside the contract so serving strips exactly what training did.
Fields added after the first release are left out of `fingerprint()` while they hold their
default, so the fingerprints of earlier checkpoints do not change.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fugu_pipeline.features.lexical import LEXICAL_DIM
from fugu_pipeline.features.prompt_rules import PromptRules
from fugu_pipeline.hashing import canonical_json, sha256_text

LATER_FIELDS = {"prompt_rules": None, "lexical": False}  # left out of the fingerprint while at these defaults


def normalize_layer(v):
    """An int, or a tuple of two or more distinct ints (a one-element list becomes its int)."""
    if isinstance(v, (list, tuple)):
        layers = tuple(int(x) for x in v)
        if not layers:
            raise ValueError("layer list is empty; give one or more hidden_states indices, e.g. [-1, 3]")
        if len(set(layers)) != len(layers):
            raise ValueError(f"layer list {list(layers)} repeats an index")
        return layers[0] if len(layers) == 1 else layers
    return v


TEMPLATE_FIELDS = {"prompt", "domain"}


def check_prompt_template(v: str) -> str:
    """`v` when it is a format string over {prompt} (required) and {domain} only, each plain: no
    attribute, index, conversion or format spec (`{prompt:>9999999999}` would pad every prompt to
    gigabytes; a checkpoint's contract is not trusted to be harmless). ValueError otherwise."""
    try:
        parts = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(v) if name is not None]
    except ValueError as exc:
        raise ValueError(f"prompt_template {v!r} is not a valid format string: {exc}") from None
    names = {name for name, _, _ in parts}
    if "prompt" not in names:
        raise ValueError("prompt_template must contain {prompt}")
    if names - TEMPLATE_FIELDS:
        raise ValueError(f"prompt_template may only use {sorted(TEMPLATE_FIELDS)}, got {sorted(names)}")
    if any(spec or conv for _, spec, conv in parts):
        raise ValueError(f"prompt_template {v[:80]!r} uses a conversion or format spec: write plain {{prompt}} and {{domain}}")
    return v


class FeatureContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoder_id: str
    revision: str | None = None
    pooling: Literal["last", "mean", "position"] = "mean"
    token_position: int | None = None  # for pooling="position", e.g. -2 = penultimate token
    layer: int | tuple[int, ...] = -1  # hidden_states index (-1 = last layer), or several, concatenated
    normalize: bool = True
    max_length: int = Field(512, ge=1)
    prompt_template: str = "{prompt}"
    dim: int
    prompt_rules: PromptRules | None = None  # strip rules fitted on the training prompts
    lexical: bool = False  # the last LEXICAL_DIM columns are lexical statistics (lexical.py), not the embedding

    _layer = field_validator("layer", mode="before")(classmethod(lambda cls, v: normalize_layer(v)))
    _template = field_validator("prompt_template")(classmethod(lambda cls, v: check_prompt_template(v)))

    @model_validator(mode="after")
    def _position(self) -> "FeatureContract":
        """What EncoderSettings requires, so a contract no encoder setting reproduces is refused where
        it is read (a checkpoint's manifest), not when the encoder is built from it."""
        if self.pooling == "position" and self.token_position is None:
            raise ValueError("pooling='position' needs token_position (e.g. -2 for the penultimate token)")
        if self.pooling != "position" and self.token_position is not None:
            raise ValueError(f"token_position only applies to pooling='position', not {self.pooling!r}")
        return self

    def fingerprint(self) -> str:
        body = self.model_dump(mode="json")
        for name, default in LATER_FIELDS.items():
            if body.get(name) == default:
                body.pop(name, None)
        return sha256_text(canonical_json(body))[:16]

    @property
    def embedding_dim(self) -> int:
        """Columns that come from the encoder's hidden states (all but the lexical block)."""
        return self.dim - (LEXICAL_DIM if self.lexical else 0)

    def differences(self, other: "FeatureContract") -> list[str]:
        a, b = self.model_dump(mode="json"), other.model_dump(mode="json")
        out = []
        for k in a:
            if a[k] == b[k]:
                continue
            if k == "prompt_rules":
                show = lambda r: "none" if r is None else PromptRules.model_validate(r).describe()  # noqa: E731
                out.append(f"prompt_rules: checkpoint has {show(a[k])}, encoder has {show(b[k])}")
            else:
                out.append(f"{k}: checkpoint has {a[k]!r}, encoder has {b[k]!r}")
        return out
