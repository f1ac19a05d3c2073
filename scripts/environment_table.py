"""The `FUGU_*` tables of docs/reference/environment.md, written from the settings class.

    .venv/bin/python scripts/environment_table.py           # rewrite the tables in the page
    .venv/bin/python scripts/environment_table.py --check   # exit 1 when the page differs

Each table sits between `<!-- settings: GROUP -->` and `<!-- /settings -->` and is
`fugu_pipeline.settings.markdown_table(GROUP)`: one row per field of `Settings` in that group, so a
variable added, renamed or given a new default shows up here the next time this runs (a test runs
the check).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "environment.md"
BLOCK = re.compile(r"(<!-- settings: (?P<group>[^>\n]+?) -->\n)(?P<body>(?:(?!<!--).*\n)*)(<!-- /settings -->)")


def render(text: str) -> str:
    """The page with every settings block replaced by its table."""
    from fugu_pipeline.settings import markdown_table

    return BLOCK.sub(lambda m: m.group(1) + markdown_table(m.group("group")) + "\n" + m.group(4), text)


def main(argv: list[str]) -> int:
    text = PAGE.read_text(encoding="utf-8")
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(f"{PAGE}: the variable tables differ from fugu_pipeline/settings.py; run "
                  f"scripts/environment_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
