"""MkDocs hooks of the documentation site (`mkdocs.yml` names this file under `hooks:`).

`on_files` adds `reference/cli.md`, rendered from the `fugu-lite` parser at build time by
`scripts/cli_reference.py`: the reference is never a committed copy, so it cannot drift from the
flags the code accepts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

CLI_PAGE = "reference/cli.md"


def _renderer():
    path = Path(__file__).with_name("cli_reference.py")
    spec = importlib.util.spec_from_file_location("fugu_cli_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, CLI_PAGE, content=_renderer()()))
    return files
