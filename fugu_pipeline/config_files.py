"""YAML config files into pydantic models, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

# A random seed in a config or a flag: numpy's and torch's generators take any integer in [0, 2**32)
# here; a negative one was a ValueError traceback from inside the first draw.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="random seed (0 to 2**32 - 1)")]

M = TypeVar("M", bound=BaseModel)

# discriminator tags pydantic inserts into an error's location after a list index
_TAGS = ("mock", "openrouter", "openai_compatible")


def format_validation_error(exc: ValidationError) -> str:
    """One clause per problem, each naming the field path (`workers[2].model`)."""
    return "; ".join(f"field '{_field(err)}'{_named(err)}: {_message(err)}" for err in exc.errors())


def first_validation_error(exc: ValidationError) -> str:
    """The first problem alone, as `field: message` (pydantic's text is one line per problem, and
    a hostile file can hold millions), and how many more there are."""
    err = exc.errors(include_url=False)[0]
    more = exc.error_count() - 1
    return f"{_field(err)}: {_message(err)[:200]}" + (f" (and {more} more problem(s))" if more else "")


def _field(err) -> str:
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
    return ".".join(parts) or "(top level)"


def _named(err) -> str:
    """` (id 'x')` for an entry of a list that has an id (a worker), else nothing."""
    entry = err.get("input")
    ident = entry.get("id") if isinstance(entry, dict) and err["loc"] and isinstance(err["loc"][-1], int) else None
    return f" (id {str(ident)[:64]!r})" if isinstance(ident, str) and ident else ""


def _message(err) -> str:
    """pydantic's message, with what to do where pydantic says only what is wrong: an entry of a
    tagged union (a worker's `kind`) without its tag, or with one that is not known."""
    if err["type"] == "union_tag_not_found":
        tag = str(err.get("ctx", {}).get("discriminator", "")).strip("'")
        known = f" ({', '.join(_TAGS)})" if tag == "kind" else ""
        return f"no `{tag}:` given; add `{tag}:` with one of the known kinds{known}"
    if err["type"] == "union_tag_invalid":
        ctx = err.get("ctx", {})
        tag = str(ctx.get("discriminator", "")).strip("'")
        return f"`{tag}: {str(ctx.get('tag'))[:64]}` is not a known kind; use one of {ctx.get('expected_tags')}"
    return err["msg"].removeprefix("Value error, ")


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


# files that are not YAML whatever they hold (a reward matrix, a task file, a table): named as such
NOT_YAML = {".jsonl": "JSON Lines", ".ndjson": "JSON Lines", ".csv": "CSV", ".tsv": "TSV", ".parquet": "Parquet",
            ".duckdb": "DuckDB", ".gz": "compressed", ".safetensors": "safetensors"}


def load_yaml_model(path: str | Path, cls: type[M], error: type[Exception], *, what: str, empty_ok: bool = False,
                    hint: str = "") -> M:
    """Read `path` as YAML and validate it as `cls`; every failure raises `error` in one line naming
    the file (and the line or field) and what to do. An empty file means all defaults when
    `empty_ok`. `hint`: what to pass instead, said when the file is missing or is not YAML."""
    path = Path(path)
    instead = f"; {hint}" if hint else ""
    kind = NOT_YAML.get(path.suffix.lower())
    if kind is not None:
        raise error(f"{path}: a {kind} file, not a YAML {what}{instead or f'; pass the {what}'}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found{instead}") from None
    except IsADirectoryError:
        raise error(f"{path}: a folder, not a YAML {what}{instead}") from None
    except NotADirectoryError:
        raise error(f"{path}: {what} not found (a folder on its path is a file){instead}") from None
    except PermissionError:
        raise error(f"{path}: not readable by this user (permission denied); give it read access or pass another "
                    f"{what}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file, so not a YAML {what}{instead}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}{_where(exc)}: not valid YAML ({_problem(exc)}); correct the file there") from None
    if raw is None and empty_ok:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping of {cls.__name__} fields at the top level{instead}")
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise error(f"{path}: {format_validation_error(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    """PyYAML's problem in one line, without its excerpt of the file."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    text = f"{context}, {problem}" if context and problem else problem or str(exc).splitlines()[0]
    return " ".join(str(text).split())[:200]


class ConfigError(ValueError):
    """A training config file is broken; the message names the file and the field."""


def load_config(path: str | Path, cls: type[BaseModel]) -> Any:
    """A trainer config from YAML (an empty file means all defaults); errors name file and field."""
    return load_yaml_model(path, cls, ConfigError, what="config file", empty_ok=True)
