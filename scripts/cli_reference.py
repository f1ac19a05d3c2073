"""The command-line reference page, written from `fugu-lite`'s own argparse parser.

    .venv/bin/python scripts/cli_reference.py                # print the page (Markdown)
    .venv/bin/python scripts/cli_reference.py --out cli.md   # write it to a file

The documentation site never keeps a copy: its build hook (`scripts/mkdocs_hooks.py`) calls
`render()` and serves the result as `reference/cli.md`, so the page is the parser of the code
being documented and cannot drift from it. Each command gets its one-line description and the
exact text `fugu-lite COMMAND --help` prints, at a fixed width of 100 columns.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

WIDTH = 100

HEADER = """# Command-line reference

Generated from the `fugu-lite` argument parser each time the site is built
(`scripts/cli_reference.py`), so it lists exactly the commands and flags of this version.
The same text is what `fugu-lite COMMAND --help` prints. Every command is a thin caller of the same
core functions as the Dagster assets; the names and flags follow Fugu-Lite's. The guides explain when to use each
command: [getting started](../getting-started.md), [real routing data](../routing/real-data.md),
[training](../training/index.md), [serving](../serving.md).

"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) for every sub-command, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return []


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH, max_help_position=32)


def _escape(text: str) -> str:
    """Plain help text shown as Markdown outside a code block: nothing in it may turn into markup."""
    for ch in "\\`*_[]<>|":
        text = text.replace(ch, "\\" + ch)
    return text


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page as Markdown."""
    if parser is None:
        from fugu_pipeline.cli.main import build_parser

        parser = build_parser()
    commands = _subcommands(parser)
    out = [HEADER, "| command | what it does |", "|---|---|"]
    out += [f"| [`{name}`](#{name}) | {_escape(help_)} |" for name, help_, _ in commands]
    out.append("")
    for name, help_, sub in commands:
        _fixed_width(sub)
        out += [f"## `fugu-lite {name}` {{#{name}}}", "", _escape(help_), "", "```text",
                sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the page here (default: print it)")
    args = ap.parse_args(argv)
    page = render()
    if args.out is None:
        sys.stdout.write(page)
    else:
        Path(args.out).write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
