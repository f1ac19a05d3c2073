"""What every definitions load spends on the steps' code versions (not a test).

Each process that loads the Dagster definitions (each step of a run, the daemon, the code server)
and each `fugu-lite train` computes the code version of every step: the hash of the modules the
step imports, transitively. This loads the definitions once to record which versions they ask for,
then computes them again from empty caches, several times, and prints the CPU of one load's worth:

- the scan (`steps/versions.py`: one pass over each module's source, `ast` on its import
  statements alone);
- the floor measured in the same run: reading the same files' bytes, which the hash needs anyway;
- the whole-module parse the scan replaced (`ast.parse` and a walk of every node of the same files),
  and whether it finds the same imports (it must: the figures compare the same work).

    python benchmarks/bench_code_versions.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: the repo's benchmarks package
from benchmarks.machine import describe  # noqa: E402


def asked_versions() -> list[tuple[str, ...]]:
    """The module lists the definitions ask code versions of, recorded while they load."""
    from fugu_pipeline.steps import versions

    asked: list[tuple[str, ...]] = []
    real = versions.code_version

    def recording(*modules: str) -> str:
        asked.append(modules)
        return real(*modules)

    versions.code_version = recording  # before any module binds it by name
    try:
        from fugu_pipeline.defs.assemble import build_defs

        build_defs()
    finally:
        versions.code_version = real
    return sorted(set(asked))


def cpu(fn, repeats: int) -> float:
    """The least process CPU seconds of `repeats` calls of `fn`."""
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed passes of each (the least is printed)")
    args = ap.parse_args()
    from fugu_pipeline.steps import versions

    asked = asked_versions()
    files = sorted({p for modules in asked for p in versions.closure(modules)})

    def scan() -> None:
        versions.clear_caches()
        for modules in asked:
            versions.code_version(*modules)

    def read_only() -> None:
        for p in files:
            p.read_bytes()

    def whole_parse() -> None:
        for p in files:
            [n for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, (ast.Import, ast.ImportFrom))]

    differ = [p for p in files if sorted(map(ast.dump, versions.import_statements(p.read_text(encoding="utf-8"))))
              != sorted(ast.dump(n) for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                        if isinstance(n, (ast.Import, ast.ImportFrom)) and versions._names_package(n))]
    t_scan, t_floor, t_parse = cpu(scan, args.repeats), cpu(read_only, args.repeats), cpu(whole_parse, args.repeats)
    print(f"machine: {describe()}")
    print(f"{len(asked)} code versions over {len(files)} module files ({sum(p.stat().st_size for p in files) / 1e6:.2f} MB); "
          f"least of {args.repeats} passes, CPU seconds per definitions load:")
    print("| what | CPU s | × the floor |")
    print("|---|---|---|")
    for name, t in (("floor: read the files' bytes", t_floor), ("the code versions (scan, then hash)", t_scan),
                    ("whole-module parse of the same files (what the scan replaced)", t_parse)):
        print(f"| {name} | {t:.3f} | {t / t_floor:.1f} |")
    print(f"modules whose imports the scan and the whole parse read differently: {len(differ)}"
          + (": " + ", ".join(str(p.relative_to(versions.PACKAGE)) for p in differ) if differ else ""))


if __name__ == "__main__":
    main()
