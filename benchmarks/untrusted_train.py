"""`fugu-lite train` on a reply import with long literals: the sample routing set (`fugu-lite
sample-data`, the offline mock pool's graded replies) with four replies that also write a long
binary or numeric literal before an `=`, as real code-generation replies do, timed.

    python benchmarks/untrusted_train.py                        # this checkout
    python benchmarks/untrusted_train.py --tree ../base --timeout 600   # the code of another checkout

Four replies get one of: `x = 0b1010…10 y = 1` (40 binary digits), `n = 777…7 so k = 3` (10,000
digits), `0x` + 40 hex digits `= mask`, and a 10,000-digit product `2 * 333…3 = 666…6` (which holds),
each before the reply's own final sentence, so every final answer and grade is as it was. Then
`fugu-lite train --data D/routing.jsonl --workers D/workers.yaml --encoder tiny` runs in a subprocess
(from `--tree` when given) and its wall time is printed, or that it did not finish in `--timeout`.
Before the readers were rewritten, the cascade step's reply statistics did not return on the first
of these replies (the left-hand side of an `=` took 2^n steps on a run of n digits).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import describe  # noqa: E402

LITERALS = (
    "Let x = 0b" + "10" * 20 + " y = 1 in the test. ",
    "Let n = " + "7" * 10_000 + " so k = 3 here. ",
    "The mask 0x" + "f" * 40 + " = mask. ",
    "Check: 2 * " + "3" * 10_000 + " = " + "6" * 10_000 + ". ",
)


def build(out: Path) -> Path:
    """The sample set in `out`, four replies with a literal; returns the routing file."""
    from fugu_pipeline.cli import main as cli

    if cli(["sample-data", "--out", str(out), "--force"]) != 0:
        raise SystemExit("fugu-lite sample-data failed")
    path = out / "routing.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for k, literal in enumerate(LITERALS):
        row = rows[k * len(rows) // len(LITERALS)]
        row["answers"][0] = literal + row["answers"][0]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=None, help="run `fugu-lite train` from this checkout")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory() as tmp:
        data = build(Path(tmp) / "sample")
        print(f"{data}: {sum(1 for _ in data.open())} rows, {len(LITERALS)} replies with a long literal "
              f"({', '.join(str(len(lit)) for lit in LITERALS)} characters added)")
        env = {**os.environ, **({"PYTHONPATH": str(args.tree.resolve())} if args.tree else {})}
        cmd = [sys.executable, "-m", "fugu_pipeline.cli", "train", "--data", str(data), "--workers",
               str(data.parent / "workers.yaml"), "--encoder", "tiny", "--output", str(Path(tmp) / "models"),
               "--cache-dir", str(Path(tmp) / "cache"), "--work-dir", str(Path(tmp) / "work")]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=args.tree or Path.cwd(), env=env, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"fugu-lite train ({args.tree or 'this checkout'}): did not finish in {args.timeout:g} s")
            return 1
        took = time.perf_counter() - t0
        print(done.stdout[-1500:])
        print(f"fugu-lite train ({args.tree or 'this checkout'}): exit {done.returncode} in {took:.1f} s")
        if done.returncode:
            print(done.stderr[-2000:])
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
