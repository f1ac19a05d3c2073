"""The house rules, checked with the project's own tools: the layer contracts
(import-linter), no import loops, no module over 500 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def test_layer_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)  # no cache in the checkout
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_no_import_loops():
    r = subprocess.run([sys.executable, "scripts/import_cycles.py"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert r.stdout.strip().endswith("0 import loop(s)")


def test_no_module_over_500_lines():
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in (REPO / "fugu_pipeline").rglob("*.py")}
    big = {str(p.relative_to(REPO)): n for p, n in sizes.items() if n > 500}
    assert not big, f"split these by what their parts do: {big}"
