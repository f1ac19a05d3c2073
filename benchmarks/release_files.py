"""Reading a public release of recorded model replies where it lies: a checkout of its repository,
or the bare git directory `fetch` gives (files read with `git show HEAD:<path>`). Nothing is copied
into this repository. Shared by the converters of `benchmarks/` (`mot_data.py`, `choice_sets.py`,
`code_sets.py`, `zeroeval_sets.py`).

A file or row that is not in the release's format is a `ReleaseFormatError`: one line naming the
file, the line the row starts on, the field, and what to do (restore an untouched copy).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

_SPACE = re.compile(r"\s*")


class ReleaseFormatError(ValueError):
    """A released file or row not in its documented format (one line: file, line, field, what to do)."""


def read_file(root: Path, rel: str, repo: str = "the release") -> str:
    """A file of the repository: from a checkout, or from a bare git directory's HEAD."""
    root = Path(root)
    if (root / rel).is_file():
        return (root / rel).read_text(encoding="utf-8")
    if (root / "HEAD").is_file() and (root / "objects").is_dir():
        out = subprocess.run(["git", "--git-dir", str(root), "show", f"HEAD:{rel}"], capture_output=True, check=False)
        if out.returncode == 0:
            return out.stdout.decode("utf-8")
        raise FileNotFoundError(f"{root}: HEAD has no readable {rel} ({out.stderr.decode(errors='replace').strip()[:200]}); "
                                "a file over the snapshot's size limit may be absent: fetch a full clone of "
                                f"{repo}")
    raise FileNotFoundError(f"{root}: no {rel} (pass a checkout of {repo} or its git directory)")


def commit_of(root: Path) -> str | None:
    root = Path(root)
    git = ["git", "--git-dir", str(root)] if (root / "HEAD").is_file() else ["git", "-C", str(root)]
    out = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, check=False)
    return out.stdout.decode().strip() if out.returncode == 0 else None


def array_rows(text: str, rel: str, fix: str) -> list[tuple[int, object]]:
    """(line the row starts on, row) of every element of a JSON array file, parsed one element at a
    time so a broken row is named by its line; anything else is a ReleaseFormatError."""
    decoder, seen = json.JSONDecoder(), [0, 1]  # (position, its line): lines counted once, not from the start per row

    def line_at(pos: int) -> int:
        if pos >= seen[0]:
            seen[:] = [pos, seen[1] + text.count("\n", seen[0], pos)]
            return seen[1]
        return text.count("\n", 0, pos) + 1
    pos = _SPACE.match(text).end()
    if not text.startswith("[", pos):
        raise ReleaseFormatError(f"{rel} line {line_at(pos)}: not a JSON array of rows; {fix}")
    pos, out = pos + 1, []
    while True:
        pos = _SPACE.match(text, pos).end()
        if text.startswith("]", pos):
            return out
        if out:
            if not text.startswith(",", pos):
                raise ReleaseFormatError(f"{rel} line {line_at(pos)}: expected ',' or ']' after row {len(out)}; {fix}")
            pos = _SPACE.match(text, pos + 1).end()
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ReleaseFormatError(f"{rel} line {exc.lineno}: not JSON ({exc.msg}); {fix}") from None
        out.append((line_at(pos), item))
        pos = end


def jsonl_rows(text: str, rel: str, fix: str) -> list[tuple[int, object]]:
    """(line, row) of every non-blank line of a JSON-lines file; a line that is not JSON is a
    ReleaseFormatError naming it."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ReleaseFormatError(f"{rel} line {n}: not JSON ({exc.msg}); {fix}") from None
    return out


def field(row, name: str, want: type | tuple, rel: str, line: int, fix: str, path: str = ""):
    """`row[name]` when `row` is an object holding it with a value of type `want` (a non-blank one
    for a string), else a ReleaseFormatError naming the file, the row's line and the field (`path`
    + `name`: where a nested object sits in the row)."""
    label = repr(path + name)
    if not isinstance(row, dict):
        where = f"{path.rstrip('.')!r}" if path else "row"
        raise ReleaseFormatError(f"{rel} line {line}: {where} is a JSON {type(row).__name__}, not an object; {fix}")
    if name not in row:
        raise ReleaseFormatError(f"{rel} line {line}: {label} is missing; {fix}")
    value, wants = row[name], want if isinstance(want, tuple) else (want,)
    if not isinstance(value, wants) or isinstance(value, bool) and bool not in wants:  # JSON true is not a number
        raise ReleaseFormatError(f"{rel} line {line}: {label} is a {type(value).__name__}, not "
                                 f"{' or '.join(t.__name__ for t in wants)}; {fix}")
    if isinstance(value, str) and not value.strip():
        raise ReleaseFormatError(f"{rel} line {line}: {label} is blank; {fix}")
    return value


def call_cost(prompt_chars: int, reply_chars: int, price: tuple[float, float]) -> float:
    """USD of one call when the data has no token counts: (prompt chars / 4) input tokens and
    (reply chars / 4) output tokens at `price` = (input, output) USD per million tokens."""
    return (prompt_chars / 4 * price[0] + reply_chars / 4 * price[1]) / 1e6
