"""No regular expression of the package backtracks more than linearly (tasks/regex_safety.py): every
pattern written in the package's source, compiled where it stands, is free of nested quantifiers and
of adjacent repeats that share a character; a pattern that is searched (not only matched at a chosen
place) does not rescan a run from each of its starts. A pattern the source builds at run time, or one
with a reason to be as it is, is listed below with that reason."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import fugu_pipeline
from fugu_pipeline.tasks.regex_safety import problems

ROOT = Path(fugu_pipeline.__file__).parent
_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "findall", "finditer", "split"}
_SEARCHING = {"search", "sub", "subn", "findall", "finditer", "split"}
# (file, name) -> (the one shape it may have, why)
ALLOWED = {
    ("policies/cascade/answer_checks.py", "_LEFT"): ("leading", "searched only within the 160 characters before an `=` (_WINDOW)"),
    ("matrix/read.py", "_HOLDER"): ("leading", "reads DuckDB's own lock error, not untrusted text"),
    ("steps/versions.py", "_SOURCE"): ("leading", "reads the package's own source, and its repeat starts only at a line's "
                                                  "start, a `:` or a `;`, which a run of blanks holds once"),
}
DYNAMIC = {
    ("api_keys.py", "f\"[{re.escape(''.join(sorted(set(secret))))}]{{{n},}}\""): "one character class, repeated",
    ("cli/training.py", "rf\"\\b{field}\\b(?!=)\""): "the project's own field names",
    ("collect/grading.py", "pattern"): "a task file's grader pattern: `_regex_matches` runs the risky ones in a child",
    ("matrix/import_table.py", "re.escape(t).replace(re.escape(\"{worker}\"), \".+\")"): "a column-name template, fullmatch",
    ("matrix/import_table.py", "\"|\".join(f\"(?:{t.pattern})\" for t in templates)"): "those templates, fullmatch",
    ("tasks/converters.py", "g.pattern or t.reference_answer or \"\""): "a task's grader pattern, on its own prompt",
    ("tasks/schema.py", "v"): "a task file's grader pattern, compiled to validate it",
    ("tasks/schema.py", "ref"): "a task file's reference used as a pattern, compiled to validate it",
    ("workers/mock.py", "g.pattern"): "a task's grader pattern on a mock worker's short answer",
    ("tasks/regex_safety.py", "_CATEGORIES[cat]"): "one character class",
}


def _text(node: ast.AST, names: dict) -> str | bytes | None:
    """The pattern a source expression builds, with an escaped value standing for one literal; None
    when it is built at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value
    if isinstance(node, ast.Name):
        v = names.get(node.id)
        return v if isinstance(v, (str, bytes)) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _text(node.left, names), _text(node.right, names)
        return a + b if isinstance(a, str) and isinstance(b, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "escape":
        return "x"
    if isinstance(node, ast.JoinedStr):
        parts = [_text(v.value if isinstance(v, ast.FormattedValue) else v, names) for v in node.values]
        return "".join(parts) if all(isinstance(p, str) for p in parts) else None
    return None


def _flags(node: ast.Call, names: dict) -> int:
    exprs = [k.value for k in node.keywords if k.arg == "flags"]
    if node.func.attr == "compile" and len(node.args) > 1:
        exprs.append(node.args[1])
    return sum(eval(compile(ast.Expression(e), "<flags>", "eval"), {"re": re, **names}) for e in exprs)


@dataclass
class _Module:
    """One module's syntax tree, walked once: its nodes, what it imports by name, the method each
    called attribute's owner is called with, and where each name is read."""

    nodes: list[ast.AST]
    imported: set[tuple[str, str]] = field(default_factory=set)
    called: dict[int, str] = field(default_factory=dict)
    reads: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, tree: ast.Module) -> _Module:
        m = cls(list(ast.walk(tree)))
        for n in m.nodes:
            if isinstance(n, ast.ImportFrom):
                m.imported |= {(n.module, a.name) for a in n.names}
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                m.called[id(n.func.value)] = n.func.attr
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                m.reads.setdefault(n.id, []).append(id(n))
        return m


def _uses(name: str, module: str, walked: dict[str, _Module]) -> set[str]:
    """The methods a module-level pattern is called with, in its module and the modules importing it;
    any other use (put in a tuple, passed on) counts as searched."""
    dotted = "fugu_pipeline." + module[:-3].replace("/", ".")
    out: set[str] = set()
    for rel, m in walked.items():
        if rel == module or (dotted, name) in m.imported:
            out |= {m.called.get(i, "search") for i in m.reads.get(name, [])}
    return out


@functools.cache
def patterns() -> list[tuple]:
    """(file, name or source text, pattern, flags, searched) of every pattern the package writes;
    found once, by the tests that need them (not at collection, in every test process)."""
    return list(_patterns())


def _patterns():
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}
    walked = {rel: _Module.of(ast.parse(src)) for rel, src in sources.items()}
    for rel, src in sources.items():
        if "re." not in src:
            continue
        module = "fugu_pipeline." + rel[:-3].replace("/", ".").removesuffix(".__init__")
        names = vars(importlib.import_module(module))
        nodes = walked[rel].nodes
        assigned = {id(n.value): n.targets[0].id for n in nodes
                    if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
        for node in nodes:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.func.attr in _CALLS):
                continue
            pattern = _text(node.args[0], names)
            if pattern is None:
                yield rel, ast.get_source_segment(src, node.args[0]), None, 0, True
                continue
            name = assigned.get(id(node)) if node.func.attr == "compile" else None
            searched = (node.func.attr in _SEARCHING if node.func.attr != "compile"
                        else name is None or bool(_uses(name, rel, walked) - {"match", "fullmatch"}))
            yield rel, name or ast.get_source_segment(src, node.args[0]), pattern, _flags(node, names), searched


def test_every_pattern_of_the_package_is_read_in_linear_time():
    found = []
    for rel, what, pattern, flags, searched in patterns():
        if pattern is None:
            if (rel, what) not in DYNAMIC:
                found.append(f"{rel}: the pattern {what} is built at run time: check it by hand and list it in DYNAMIC")
            continue
        shapes = [p for p in problems(pattern, flags) if searched or not p.startswith("leading")]
        shapes = [p for p in shapes if not p.startswith(ALLOWED.get((rel, what), ("-",))[0])]
        if shapes:
            found.append(f"{rel} {what} {pattern!r}: " + "; ".join(shapes))
    assert not found, "\n".join(found)
    assert len(patterns()) > 60  # the walk found the package's patterns


def test_the_listed_exceptions_still_exist():
    seen = {(rel, what) for rel, what, *_ in patterns()}
    assert not (set(ALLOWED) | set(DYNAMIC)) - seen


@pytest.mark.parametrize("pattern, shape", [
    (r"(?:\d[\d,]*(?:\.\d+)?%?|[-+*/x ]|\*\*)+$", "nested quantifier"),  # the reply checks' old left-hand side
    (r"(\d+)+$", "nested quantifier"),
    (r"(?:\d+|[a-z])+$", "nested quantifier"),
    (r"(?:\dx|\wy)+$", "alternatives inside"),
    (r"VERDICT\s*[:=]?\s*\**\s*(ACCEPT|REVISE)", "adjacent repeats"),
    (r"\d[\d,]*\.?\d*", "adjacent repeats"),
    (r"\d+\.\d+", "leading"),
    (r"(?m)^\s*\(?[A-H][).:]\s", "leading"),  # a run of newlines: each line start rescans the rest
    (r"(-?\d[\d,]*)\s*[-+*/]\s*(-?\d+)\s*=", "leading"),
])
def test_a_backtracking_shape_is_named(pattern, shape):
    assert any(p.startswith(shape) for p in problems(pattern)), problems(pattern)


@pytest.mark.parametrize("pattern", [
    r"(?:\s*,)*", r"(?:\s*,\s*x)*", r"(?<!\d)\d+\.\d+", r"(?m)^[^\S\n]*\(?[A-H][).:]\s", r"\d[\d,]*(?:\.\d*)?",
    r"VERDICT\s*(?:[:=]\s*)?(?:\*+\s*)?(ACCEPT|REVISE)", r"<think>.*?(?:</think>|\Z)",
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?", r"\\(?:boxed|fbox)\s*\{|[{}]",
])
def test_a_linear_pattern_is_not_named(pattern):
    assert problems(pattern, re.DOTALL if "think" in pattern else 0) == ()
