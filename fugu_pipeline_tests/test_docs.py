"""The documentation speaks for itself and follows the code:

- the README stays a front page (at most 250 lines) whose two commands are the ones CI runs;
- README, ARCHITECTURE and the site cite no outside design page, no issue number and no seed README
  (a user who clones the project has none of them);
- every page the site's navigation names exists, and notes from other branches are left out;
- the command-line reference is rendered from the parser: every command and every flag is in it.
`mkdocs build --strict` (in CI, `.ci/run`) checks every link and anchor.
"""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from fugu_pipeline.cli.main import build_parser
from fugu_pipeline_tests.conftest import REPO

# an outside design page (upper case: the project's own docs/design.md is fine), an issue number, the
# seed README; spelt in pieces so that this file does not match itself
_SEED = "the " + "seed"
CITATION = re.compile(r"\b" + "DES" + r"IGN(\.md\b| ?§)|(?i:\b" + "iss" + r"ue[- ]\d|\b" + _SEED + r"\b|\b" + "seed" + r"'s\b)")


def doc_files() -> list:
    site = [p for p in (REPO / "docs").rglob("*.md") if "_incoming" not in p.parts]
    return [REPO / "README.md", REPO / "ARCHITECTURE.md", *site]


def test_the_readme_is_a_front_page_with_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    # the first command sets up and runs the main job; the tests are a command of their own
    assert "```bash\nbash scripts/setup.sh && .venv/bin/fugu-lite pipeline --encoder tiny\n```" in text
    assert "```bash\n.venv/bin/python -m pytest\n```" in text
    assert text.index("bash scripts/setup.sh &&") < text.index(".venv/bin/python -m pytest")
    assert ".venv/bin/mkdocs serve" in text
    assert "bash scripts/setup.sh" in (REPO / ".ci" / "run").read_text()


def test_the_documentation_cites_no_outside_page():
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}"
             for p in doc_files() for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if CITATION.search(line)]
    assert not found, "\n".join(found)


def test_every_page_in_the_navigation_exists_and_incoming_notes_stay_out():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    listed = set(pages(config["nav"]))
    generated = {"reference/cli.md"}  # rendered by scripts/mkdocs_hooks.py
    for page in listed - generated:
        assert (REPO / "docs" / page).is_file(), page
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md") if "_incoming" not in p.parts}
    assert written <= listed, f"pages outside the navigation: {sorted(written - listed)}"
    assert "_incoming/" in config["exclude_docs"]
    assert not (REPO / "docs" / "reference" / "cli.md").exists()  # never a copy that could drift


def _reference():
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> str:
    return _reference().render()


def test_the_cli_reference_lists_every_command_and_every_flag(reference):
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices
    for name, p in sub.choices.items():
        assert f"## `fugu-lite {name}` {{#{name}}}" in reference
        section = reference.split(f"## `fugu-lite {name}`", 1)[1].split("\n## ", 1)[0]
        for action in p._actions:
            for flag in action.option_strings:
                assert flag in section, f"{name}: {flag} missing from the reference"


def test_the_cli_reference_follows_a_changed_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    sub.choices["route"].add_argument("--a-new-flag", help="added after the page was written")
    page = _reference().render(parser)
    assert "--a-new-flag" in page.split("## `fugu-lite route`", 1)[1].split("\n## ", 1)[0]


# What a user's clone cannot follow: the team's internal design page, its issue tracker, the
# systems' internal nickname for where this grew from. Built from parts so this file does not match.
_CITATION = re.compile("|".join([r"\bDESI" + r"GN\b(?!ER)", r"\biss" + r"ue[- ]?#?\d", r"\bthe se" + r"ed\b", r"\bse" + r"ed's\b"]))
_PROJECT_TEXT = ("fugu_pipeline", "fugu_pipeline_tests", "benchmarks", "scripts", "configs", "deploy", "docs", ".ci")


def _project_files():
    root = Path(__file__).resolve().parents[1]
    for top in _PROJECT_TEXT:
        for p in sorted((root / top).rglob("*")):
            if p.is_file() and p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ""} and "__pycache__" not in p.parts:
                yield p
    for name in ("README.md", "ARCHITECTURE.md", "pyproject.toml", "dagster.yaml", "workspace.yaml", "mkdocs.yml"):
        if (root / name).is_file():
            yield root / name


def test_no_project_file_cites_what_a_user_does_not_have():
    """The project speaks for itself: a rule is explained where it lives, or names the published
    system it comes from (TinyRouter, Fugu-Lite, RouteLLM, ...), never an internal page or ticket."""
    found = []
    for p in _project_files():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if _CITATION.search(line):
                found.append(f"{p.relative_to(Path(__file__).resolve().parents[1])}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
