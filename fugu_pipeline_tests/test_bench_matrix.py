"""`benchmarks/bench_matrix.py` end to end on a small project: it generates the files, builds the
matrix and runs its three floors over the same files, each in a fresh process, and prints every side
of each ratio. The floors must read every line the build reads, and the build must fill every cell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_matrix_prints_the_build_beside_its_three_floors(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_matrix.py"), "--tasks", "300", "--workers", "3",
                          "--batch-size", "100", "--repeats", "1", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert re.search(r"read_json of the same files [\d.]+ s, \d+ MiB \| bulk build [\d.]+ s, \d+ MiB \| build / read_json = "
                     r"[\d.]+x", out.stdout), out.stdout
    assert re.search(r"typed floor .* [\d.]+ s, \d+ MiB \| build / typed floor = [\d.]+x", out.stdout)
    assert re.search(r"native-typed floor .* [\d.]+ s \| native-typed floor / read_json = [\d.]+x", out.stdout)
    report = json.loads(lines[-1])
    run = report["side_by_side"][0]
    assert run["floor"]["read"] == {"response lines": 900, "task lines": 300}
    for floor, used in (("typed_floor", "field_bytes"), ("native_floor", "values_sum")):  # every line read, each value used
        read = run[floor]["read"]
        assert read["response lines"]["lines"] == 900 and read["task lines"]["lines"] == 300
        assert read["response lines"][used] > 0 and read["task lines"][used] > 0
    summary = run["bulk"]["summary"]
    assert summary["cells_filled"] == summary["cells_expected"] == 900
    assert summary["skipped_lines"] == 0
