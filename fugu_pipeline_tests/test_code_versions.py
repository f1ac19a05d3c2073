"""A step's code version: the hash of the modules it runs, found by reading their imports.

`steps/versions.py` reads each module's import statements with one scan of its source (strings and
comments skipped whole) and parses only those statements, not the whole module: every process that
loads the definitions (each step of a run) computes every step's version. What it finds must be
exactly what reading the whole module with `ast` finds, on every module of the package and on
modules written to trip a scan (imports in docstrings, in strings, after `if ...:`, across
brackets and backslashes, comments holding brackets).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fugu_pipeline.steps import versions


def whole_module(text: str) -> list[str]:
    """The reference: every import statement from the package, the whole module parsed."""
    return sorted(ast.dump(n) for n in ast.walk(ast.parse(text))
                  if isinstance(n, (ast.Import, ast.ImportFrom)) and reference_names_package(n))


def reference_names_package(node) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "fugu_pipeline"
    return any(a.name.split(".")[0] == "fugu_pipeline" for a in node.names)


def scanned(text: str) -> list[str]:
    return sorted(ast.dump(n) for n in versions.import_statements(text))


def test_the_scan_finds_what_parsing_each_whole_module_finds_on_every_module_of_the_package():
    modules = sorted(versions.PACKAGE.rglob("*.py"))
    assert len(modules) > 100
    differ = [str(p.relative_to(versions.PACKAGE)) for p in modules
              if scanned(p.read_text(encoding="utf-8")) != whole_module(p.read_text(encoding="utf-8"))]
    assert differ == []
    assert sum(len(scanned(p.read_text(encoding="utf-8"))) for p in modules) > 1000


HOSTILE = textwrap.dedent('''\
    """A docstring that shows code:

        from fugu_pipeline.not_imported import x
    import fugu_pipeline.nor_this
    """
    import os, fugu_pipeline.a as a  # a comment (with an open bracket
    from fugu_pipeline.b import (  # a comment ) with a closing one
        c,  # and (another)
        d,
    )
    from fugu_pipeline.e \\
        import f
    s = "import fugu_pipeline.in_a_string"
    t = 'from fugu_pipeline.g import h'  # from fugu_pipeline.in_a_comment import x
    u = """it's a 'quote' \\""" still inside
    from fugu_pipeline.i import j
    """
    v = r"\\\\"; import fugu_pipeline.after_a_semicolon
    w = {"k": 1, "from fugu_pipeline.x import y": 2}


    def fn():
        from fugu_pipeline.k import m  # inside a function
        if os: import fugu_pipeline.after_a_colon
        try: from fugu_pipeline.n import (o,
                                          p)
        except ImportError: pass


    class C:
        """from fugu_pipeline.q import r"""
        from fugu_pipeline.s import t as tt
    ''')


def test_imports_in_strings_and_comments_are_not_read_and_every_real_one_is():
    found = versions.import_statements(HOSTILE)
    assert scanned(HOSTILE) == whole_module(HOSTILE)
    modules = {n.module if isinstance(n, ast.ImportFrom) else n.names[-1].name for n in found}
    assert modules == {"fugu_pipeline.a", "fugu_pipeline.b", "fugu_pipeline.e", "fugu_pipeline.after_a_semicolon",
                       "fugu_pipeline.k", "fugu_pipeline.after_a_colon", "fugu_pipeline.n", "fugu_pipeline.s"}


def test_a_line_that_only_looks_like_an_import_falls_back_to_the_whole_module():
    text = textwrap.dedent('''\
        import fugu_pipeline.a
        def f(fugu_pipeline_error):
            raise ValueError(
                "x") \\
            from fugu_pipeline_error
        ''')
    assert scanned(text) == whole_module(text) != []


# Fragments, each a whole statement that may sit at a module's top level or in a function's body.
FRAGMENTS = [
    "import fugu_pipeline.a\n",
    "import os, fugu_pipeline.b.c as bc\n",
    "from fugu_pipeline.d import e, f as g\n",
    "from fugu_pipeline.h import (\n    i,  # (note\n    j,\n)\n",
    "from fugu_pipeline.k \\\n    import l\n",
    "from os import path  # fugu_pipeline in a comment only\n",
    "x = 'import fugu_pipeline.m'\n",
    'y = "from fugu_pipeline.n import o"\n',
    '"""\nfrom fugu_pipeline.p import q\n"""\n',
    "'''it\\'s\nimport fugu_pipeline.r\n'''\n",
    "z = r'\\\\'  # ' from fugu_pipeline.s import t\n",
    "if True: import fugu_pipeline.u\n",
    "pass; from fugu_pipeline.v import w\n",
    "d = {'a': 1, 'b': [2, (3,)]}\n",
    "# from fugu_pipeline.commented import out\n",
    "from . import sibling\n",
]


@given(st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.booleans()), max_size=12))
@settings(max_examples=300, deadline=None)
def test_any_module_built_from_hostile_fragments_reads_as_the_whole_module_does(pieces):
    top = "".join(f for f, inside in pieces if not inside)
    body = "".join(f for f, inside in pieces if inside)
    text = top + ("def fn():\n" + textwrap.indent(body, "    ") + "    return 1\n" if body else "")
    ast.parse(text)  # the fragments make valid modules
    assert scanned(text) == whole_module(text)


# ------------------------------------------------------------------------------------- the hash


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package of its own for `versions` to read, its caches emptied before and after."""
    root = tmp_path / "fugu_pipeline"
    files = {
        "__init__.py": "",
        "steps/__init__.py": "",
        "steps/a.py": "import fugu_pipeline.defs.x\n\ndef run():\n    from fugu_pipeline.core.b import go\n    return go()\n",
        "core/__init__.py": "",
        "core/b.py": '"""Uses c.\n\nfrom fugu_pipeline.core import d\n"""\nfrom fugu_pipeline.core import c\n\ndef go():\n    return c.ONE\n',
        "core/c.py": "ONE = 1\n",
        "core/d.py": "TWO = 2\n",
        "defs/__init__.py": "",
        "defs/x.py": "import fugu_pipeline.core.d\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(versions, "PACKAGE", root)
    versions.clear_caches()
    yield root
    versions.clear_caches()


def version_after(package: Path, name: str, text: str) -> str:
    (package / name).write_text(text)
    versions.clear_caches()
    return versions.code_version("fugu_pipeline.steps.a")


def test_a_steps_version_follows_exactly_the_modules_it_runs(package):
    closure = [p.relative_to(package).as_posix() for p in versions.closure(["fugu_pipeline.steps.a"])]
    # b's import inside a function counts; `from core import c` counts the module c and the package;
    # d, named only in b's docstring and imported by the callers' layer, does not
    assert closure == ["core/__init__.py", "core/b.py", "core/c.py", "steps/a.py"]
    first = versions.code_version("fugu_pipeline.steps.a")
    assert version_after(package, "core/d.py", "TWO = 3\n") == first
    assert version_after(package, "defs/x.py", "import fugu_pipeline.core.d  # edited\n") == first
    changed = version_after(package, "core/c.py", "ONE = 1  # a comment counts\n")
    assert changed != first
    assert version_after(package, "core/c.py", "ONE = 1\n") == first  # and the same text, the same version


def test_a_step_listing_a_module_that_is_gone_is_one_line_naming_it(package):
    with pytest.raises(ValueError, match=r"no such module: fugu_pipeline\.steps\.gone"):
        versions.closure(["fugu_pipeline.steps.a", "fugu_pipeline.steps.gone"])
