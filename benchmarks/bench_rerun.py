"""What a re-run of the main job costs: `fugu-lite pipeline --encoder tiny` three times in a fresh
clone of the repository (not a test).

1. cold: an empty project (every step runs);
2. re-run: nothing changed (every step should be skipped as fresh: no run, no worker call, no
   encoding, no training);
3. changed: the utility's cost weight in the worker YAML's `reward:` block raised by 0.05 (the
   matrix and everything downstream of it run again; the batch and the collection are skipped).

Prints each step's wall and CPU seconds in each run (from the command's own step lines), each
run's total CPU (user + system, the command and its children) and wall, and the floor measured in
the same session: the CPU of a process that only loads the code location's definitions, the least
any `fugu-lite pipeline` spends before it decides anything.

    python benchmarks/bench_rerun.py                 # clones this repository into a temporary folder
    python benchmarks/bench_rerun.py --keep          # and leaves the clone there
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: the repo's benchmarks package
from benchmarks.machine import describe  # noqa: E402

DONE = re.compile(r"^\s+(\S+)\s+done in\s+([\d.]+)s \(CPU\s+([\d.]+)s\)")
SKIPPED = re.compile(r"^\s+(\S+)\s+skipped, fresh")


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished command, its CPU seconds with its children's, its wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, cpu, wall


def steps(stdout: str) -> dict[str, str]:
    """step -> "wall / CPU" or "skipped", from the command's step lines."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        if m := DONE.match(line):
            out[m.group(1)] = f"{float(m.group(2)):6.1f} / {float(m.group(3)):5.1f}"
        elif m := SKIPPED.match(line):
            out[m.group(1)] = "skipped"
    return out


def raise_cost_weight(path: Path) -> str:
    text = path.read_text()
    m = re.search(r"^(\s*cost_weight:\s*)([\d.]+)", text, re.MULTILINE)
    if m is None:
        raise SystemExit(f"{path}: no cost_weight in its reward: block")
    new = round(float(m.group(2)) + 0.05, 4)
    path.write_text(text[:m.start(2)] + str(new) + text[m.end(2):])
    return f"cost_weight {m.group(2)} -> {new}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="the repository to clone (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args()
    fugu = str(REPO / ".venv" / "bin" / "fugu-lite")
    python = str(REPO / ".venv" / "bin" / "python")
    work = Path(tempfile.mkdtemp(prefix="fugu-rerun-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(args.repo), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "FUGU_ENCODER", "FUGU_PROJECT_DIR")}
    env.setdefault("OMP_NUM_THREADS", "1")
    print(f"machine: {describe()}")
    print(f"clone: {clone}")

    _, floor, floor_wall = timed([python, "-W", "ignore", "-c", "from fugu_pipeline.defs.assemble import build_defs; "
                                  "build_defs()"], clone, env)
    runs: list[tuple[str, dict[str, str], float, float]] = []
    for name in ("cold", "re-run", "changed"):
        note = raise_cost_weight(clone / "configs" / "workers.mock.yaml") if name == "changed" else ""
        out, cpu, wall = timed([fugu, "pipeline", "--encoder", "tiny"], clone, env)
        if out.returncode != 0:
            print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name}: fugu-lite pipeline exited {out.returncode}")
        runs.append((name + (f" ({note})" if note else ""), steps(out.stdout), cpu, wall))

    names = [n for n in runs[0][1]] + [n for r in runs[1:] for n in r[1] if n not in runs[0][1]]
    print("\nper step: wall s / CPU s of the command's process (steps after the matrix share one run), "
          "'skipped' = fresh, not run")
    print(f"| step | {' | '.join(r[0] for r in runs)} |")
    print("|---|" + "---|" * len(runs))
    for n in names:
        print(f"| {n} | " + " | ".join(r[1].get(n, "-") for r in runs) + " |")
    print("| **total (CPU incl. children / wall)** | "
          + " | ".join(f"{r[2]:.1f} / {r[3]:.1f}" for r in runs) + " |")
    cold = runs[0][2]
    print(f"\nre-run: {runs[1][2]:.1f} s CPU = {100 * runs[1][2] / cold:.0f} % of the cold run's {cold:.1f} s; "
          f"steps run: {sum(v != 'skipped' for v in runs[1][1].values())}")
    print(f"changed: {runs[2][2]:.1f} s CPU = {100 * runs[2][2] / cold:.0f} % of the cold run's; steps run: "
          f"{', '.join(k for k, v in runs[2][1].items() if v != 'skipped')}")
    print(f"floor (a process that only loads the definitions): {floor:.1f} s CPU, {floor_wall:.1f} s wall")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
