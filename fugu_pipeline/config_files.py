"""YAML config files into pydantic models, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# discriminator tags pydantic inserts into an error's location after a list index
_TAGS = ("mock", "openrouter", "openai_compatible")


def format_validation_error(exc: ValidationError) -> str:
    """One clause per problem, each naming the field path (`workers[2].model`)."""
    lines = []
    for err in exc.errors():
        parts: list[str] = []
        after_index = False
        for item in err["loc"]:
            if isinstance(item, int):
                parts[-1:] = [f"{parts[-1]}[{item}]" if parts else f"[{item}]"]
                after_index = True
                continue
            if after_index and item in _TAGS:
                after_index = False
                continue
            after_index = False
            parts.append(str(item))
        field = ".".join(parts) or "(top level)"
        lines.append(f"field '{field}': {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice (PyYAML keeps the last one
    silently, so `seed: 0` then `seed: 1` trained with seed 1 and no word)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping (line {key_node.start_mark.line + 1}); "
                    "keep one")
        return super().construct_mapping(node, deep=deep)


def load_yaml_model(path: str | Path, cls: type[M], error: type[Exception], *, what: str, empty_ok: bool = False) -> M:
    """Read `path` as YAML and validate it as `cls`; every failure raises `error` naming the file
    (and the field). An empty file means all defaults when `empty_ok`."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    if raw is None and empty_ok:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping of {cls.__name__} fields at the top level")
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{path}: {format_validation_error(exc)}") from None
