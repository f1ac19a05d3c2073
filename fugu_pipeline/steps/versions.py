"""Code versions and settings versions: what makes a step's output out of date besides its data.

- `code_version(modules)`: the hash of the source of `modules` and of every `fugu_pipeline` module
  they import, transitively, imports inside functions included. A step's code version changes
  exactly when code it runs changes (a comment counts: the rule is simple and never misses one);
  a module only of the Dagster layer (`defs/`), the command line or the server never enters it.
  The imports are read from the source (one scan, then `ast` on the import statements alone), not
  by importing, so torch is never loaded; all the steps' versions take under 0.2 CPU-s at
  definitions load (`benchmarks/bench_code_versions.py`).
- `settings_version(path)`: the version of a settings file (a trainer YAML, the promotion policy):
  the hash of its parsed content, so a comment or a reordering changes nothing; `absent` when the
  file is missing (the built-in defaults apply).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from fugu_pipeline.hashing import sha256_text

PACKAGE = Path(__file__).resolve().parents[1]  # the fugu_pipeline folder
CALLERS = ("defs", "cli", "serve", "testing", "definitions")  # never part of a step's code
ABSENT = "absent"


@functools.lru_cache(maxsize=None)
def _module_file(dotted: str) -> Path | None:
    """The source file of a `fugu_pipeline...` module or package (None when it is no module)."""
    rel = dotted.split(".")[1:]
    if not rel:
        return PACKAGE / "__init__.py"
    base = PACKAGE.joinpath(*rel)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/__init__", "")


# One pass over a module's source finds its import statements: string literals and comments are
# consumed whole, so an import-shaped line inside a docstring is never read as one, and only the
# statements that name the package are parsed. Parsing every module whole (`ast`) took 0.85 CPU-s
# at each definitions load, the scan and the hash 0.18 (`benchmarks/bench_code_versions.py`), in
# every process that loads them: each step of a run, the daemon, the code server, `fugu-lite train`.
_SOURCE = re.compile(r'''
    (?:"""(?:\\.|[^\\])*?"""|\'\'\'(?:\\.|[^\\])*?\'\'\'|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | \#[^\n]*
  | (?:^|[:;])[ \t]*(?P<statement>(?:from|import)[ \t])
''', re.M | re.S | re.X)


def _statement_end(text: str, start: int) -> int:
    """Where the logical line that starts at `start` ends: its newline outside brackets and not
    after a backslash (an import statement holds no string; its comments are skipped)."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            i = text.find("\n", i)
            if i < 0:
                return n
            continue
        if c == "\\":
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "\n" and depth <= 0:
            return i
        i += 1
    return n


def _names_package(node: ast.stmt) -> bool:
    """Whether an import statement imports from `fugu_pipeline` (a relative import never does here)."""
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "fugu_pipeline"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "fugu_pipeline" for a in node.names)


def import_statements(text: str) -> list[ast.stmt]:
    """The import statements of a module's source that import from `fugu_pipeline`, wherever they
    are (inside functions, after `if ...:` or `;` too), as `ast` reads them. The whole module is
    parsed only when a statement found this way does not parse alone."""
    found: list[ast.stmt] = []
    pos = 0
    while (m := _SOURCE.search(text, pos)) is not None:
        if m.group("statement") is None:  # a string or a comment, skipped whole
            pos = m.end()
            continue
        end = _statement_end(text, m.start("statement"))
        statement = text[m.start("statement"):end]
        pos = max(end, m.end())
        if "fugu_pipeline" in statement:
            try:
                found.extend(ast.parse(statement).body)
            except SyntaxError:  # not an import after all (a line of an expression that starts with `from`)
                return [n for n in ast.walk(ast.parse(text)) if _names_package(n)]
    return [n for n in found if _names_package(n)]


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> tuple[Path, ...]:
    """The fugu_pipeline modules `path` imports (a `from package import name` counts `name` when
    it is a module of the package)."""
    out: list[Path] = []
    for node in import_statements(path.read_text(encoding="utf-8")):  # imports inside functions too
        if isinstance(node, ast.Import):
            out.extend(f for a in node.names if a.name.split(".")[0] == "fugu_pipeline"
                       for f in [_module_file(a.name)] if f is not None)
            continue
        dotted, names = node.module, [a.name for a in node.names]
        found = _module_file(dotted)
        if found is not None:
            out.append(found)
        out.extend(f for name in names if name != "*" for f in [_module_file(f"{dotted}.{name}")] if f is not None)
    return tuple(out)


def closure(modules: Iterable[str]) -> list[Path]:
    """`modules` (dotted names) and every fugu_pipeline module they import, transitively, in path order,
    leaving out the callers' layers (CALLERS)."""
    todo = [p for p in (_module_file(m) for m in modules) if p is not None]
    missing = [m for m in modules if _module_file(m) is None]
    if missing:
        raise ValueError(f"no such module: {', '.join(missing)} (a step's code lists a module that moved or is gone)")
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or _relative(path).split("/")[0] in CALLERS:
            continue
        seen.add(path)
        todo.extend(_imports(path))
    return sorted(seen)


@functools.lru_cache(maxsize=None)
def _hashed(path: Path) -> bytes:
    """What a module adds to a code version: its path in the package and its bytes (read once)."""
    return _relative(path).encode() + b"\0" + path.read_bytes() + b"\0"


def clear_caches() -> None:
    """Read the package's files again on the next call (a test that edits a package of its own)."""
    for cached in (_module_file, _imports, _hashed, code_version):
        cached.cache_clear()


@functools.lru_cache(maxsize=None)
def code_version(*modules: str) -> str:
    """The code version of the step whose work is in `modules`: 16 hex digits of the hash of every
    source file in their closure (path and text)."""
    digest = hashlib.sha256()
    for path in closure(modules):
        digest.update(_hashed(path))
    return digest.hexdigest()[:16]


def settings_version(path: str | Path) -> str:
    """The version of a settings file: 16 hex digits of its parsed content (comments and key order
    do not count), `absent` when it does not exist, and the text's own hash when it is not valid
    YAML (the step that reads it says what is wrong)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return ABSENT
    except (OSError, UnicodeDecodeError):
        return "unreadable"
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return "text-" + sha256_text(text)[:11]
    return sha256_text(json.dumps(parsed, sort_keys=True, separators=(",", ":"), default=str))[:16]
