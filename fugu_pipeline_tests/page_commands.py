"""The shell commands of the README and the site's pages, as a reader would copy them.

Every fenced ```bash block is a command to run, in the page's order, from the project folder after
the README's set-up. A block that cannot run offline says so with a marker on the line right before
it (an HTML comment, invisible on the site):

- `<!-- page-test: skip REASON -->`: needs what a test machine has not (an API key, a GPU, the
  network, a data set to download, the whole test suite); REASON says which;
- `<!-- page-test: same-as PAGE -->`: the very same block is on PAGE, where it runs;
- `<!-- page-test: background URL -->`: a server that runs until stopped (`serve`, `dagster dev`,
  `mkdocs serve`): started in the background, ready when URL (on loopback) answers, stopped when the
  page is done.

The test never takes the docs' own ports (a reader may be serving on them): each port a page's
background URLs name is moved to a free one the test picks, in every block of the page (`with_ports`:
the URLs, and the server command's port flag, `SERVER_PORT_FLAGS`).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARK = re.compile(r"^\s*<!--\s*page-test:\s*(\S+)\s*(.*?)\s*-->\s*$")
KINDS = ("skip", "same-as", "background")
# the main job: run once for every page (`test_page_commands.py` shares its project folder)
MAIN_JOB = ".venv/bin/fugu-lite pipeline --encoder tiny"
# a program of the project's environment at a command's start (a line's start after VAR=value
# settings, or after && || ; | $( ( ): it must be called as .venv/bin/<name>, as the README's set-up
# leaves it, never bare (a bare `python` is the system's, without the project)
VENV_PROGRAMS = ("fugu-lite", "python", "python3", "pip", "dagster", "dagster-webserver", "mkdocs", "pytest", "ruff",
                 "lint-imports", "celery")
BARE = re.compile(r"(?:^|&&|\|\||;|\||\$\(|\()\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(" +
                  "|".join(re.escape(p) for p in VENV_PROGRAMS) + r")(?=\s|$)")


# how each server a background block may start is told its port, after the program's name
SERVER_PORT_FLAGS = {"fugu-lite serve": "--port {port}", "dagster dev": "--port {port}",
                     "mkdocs serve": "--dev-addr 127.0.0.1:{port}"}
SERVER = re.compile(r"\.venv/bin/(" + "|".join(re.escape(k) for k in SERVER_PORT_FLAGS) + r")(?=\s|$)")


@dataclass(frozen=True)
class Block:
    page: str          # relative to the project
    line: int          # the fence's line, 1-based
    lang: str
    text: str
    mark: str | None   # skip, same-as, background
    arg: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages(repo: Path) -> list[Path]:
    site = sorted(p for p in (repo / "docs").rglob("*.md") if "_incoming" not in p.relative_to(repo).parts)
    return [repo / "README.md", *site]


def blocks(repo: Path, page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line right before it (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i, rel = [], 0, str(page.relative_to(repo))
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        mark = MARK.match(lines[i - 1]) if i > 0 else None
        body = textwrap.dedent("\n".join(lines[i + 1:j]))
        out.append(Block(rel, i + 1, m.group(2), body, mark.group(1) if mark else None, mark.group(2) if mark else ""))
        i = j + 1
    return out


def stray_marks(repo: Path, page: Path) -> list[str]:
    """Markers that do not sit right before a ```bash block, or that name no kind, reason or URL."""
    lines = page.read_text(encoding="utf-8").splitlines()
    bad = []
    for n, line in enumerate(lines):
        m = MARK.match(line)
        if not m:
            continue
        where = f"{page.relative_to(repo)}:{n + 1}"
        nxt = FENCE.match(lines[n + 1]) if n + 1 < len(lines) else None
        if not nxt or nxt.group(2) != "bash":
            bad.append(f"{where}: a page-test marker not right before a ```bash block")
        elif m.group(1) not in KINDS:
            bad.append(f"{where}: page-test kind {m.group(1)!r}; use one of {', '.join(KINDS)}")
        elif not m.group(2):
            bad.append(f"{where}: page-test {m.group(1)} needs {'a URL' if m.group(1) == 'background' else 'a reason' if m.group(1) == 'skip' else 'a page'}")
        elif m.group(1) == "background" and urlparse(m.group(2)).hostname not in ("127.0.0.1", "localhost"):
            bad.append(f"{where}: a background server is probed on loopback (http://127.0.0.1:PORT/...)")
    return bad


def bare_programs(block: Block) -> list[str]:
    """Lines of a bash block that call a program of the project's environment without `.venv/bin/`."""
    found = []
    for n, line in enumerate(block.text.splitlines()):
        code = re.sub(r"(^|\s)#.*$", "", line)  # a comment is not a command
        for m in BARE.finditer(code):
            found.append(f"{block.page}:{block.line + 1 + n}: `{m.group(1)}` without .venv/bin/: {line.strip()[:90]}")
    return found


def page_ports(blocks_: list[Block]) -> list[int]:
    """The loopback ports a page's background servers answer on (their markers' URLs)."""
    return sorted({urlparse(b.arg).port or 80 for b in blocks_ if b.mark == "background"})


def with_ports(text: str, ports: dict[int, int]) -> str:
    """`text` with each loopback port of `ports` (old: new) replaced by its new one
    (`127.0.0.1:8080` and `localhost:8080` alike)."""
    for old, new in ports.items():
        text = re.sub(rf"\b(127\.0\.0\.1|localhost):{old}\b", rf"\g<1>:{new}", text)
    return text


def with_server_port(text: str, port: int) -> str:
    """A background block's server command with the port flag for `port` after its program's name
    (`.venv/bin/fugu-lite serve` -> `.venv/bin/fugu-lite serve --port N`); ValueError when the block
    starts no server this knows how to move."""
    new, n = SERVER.subn(lambda m: f"{m.group(0)} {SERVER_PORT_FLAGS[m.group(1)].format(port=port)}", text, count=1)
    if not n:
        raise ValueError(f"no server the page test can move to another port ({', '.join(SERVER_PORT_FLAGS)})")
    return new
