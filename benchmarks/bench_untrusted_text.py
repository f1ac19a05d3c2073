"""Every reader of untrusted text on every hostile text, timed against a floor measured in the same
run: one `str.count` over the same text (a single C-level pass, the least any reader must do).

    python benchmarks/bench_untrusted_text.py                   # 10^4, 10^5 and 10^6 characters
    python benchmarks/bench_untrusted_text.py --sizes 100000 --all
    PYTHONPATH=../base python benchmarks/bench_untrusted_text.py --sizes 100000 --skip answer_checks.check_stats

`--hang S` ends the run with the stuck reader's traceback when one call takes S seconds (a hang);
`--skip` leaves readers out (to see the others of a checkout where one hangs).

The readers and the texts are `fugu_pipeline/testing/hostile_text.py` (the property tests draw from
the same pieces): long digit runs, a 40-digit literal before an `=` (the request that stopped a
server), thousands of `=`, deep brackets, a megabyte of one character, runs mixed with the readers'
own trigger tokens, lone surrogates. Each call runs once (before the readers were rewritten, `answer_checks` on the 40-digit literal
did not return).
Prints, per size, each reader's slowest text with its time, the floor and their ratio; `--all`
prints every (reader, text) pair.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import describe  # noqa: E402


def timed(fn, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--all", action="store_true", help="print every (reader, text) pair, not each reader's slowest")
    ap.add_argument("--hang", type=float, default=600.0, help="a call this long is a hang: print where, and stop")
    ap.add_argument("--skip", nargs="*", default=[], help="readers left out")
    args = ap.parse_args()
    import faulthandler

    from fugu_pipeline.testing.hostile_text import READERS, hostile_texts

    print(describe())
    for fn in READERS.values():  # imports and compiled patterns, before anything is timed
        fn("warm up 1 + 1 = 2")
    for n in args.sizes:
        texts = hostile_texts(n)
        floors = {name: timed(lambda t: t.count("\x00"), t) for name, t in texts.items()}
        print(f"\n{n:,} characters: reader | slowest hostile text | seconds | floor (str.count) | ratio")
        for reader, fn in READERS.items():
            if reader in args.skip:
                continue
            rows = []
            for name, text in texts.items():
                faulthandler.dump_traceback_later(args.hang, exit=True)
                s = timed(fn, text)
                faulthandler.cancel_dump_traceback_later()
                rows.append((s, name, floors[name], s / max(floors[name], 1e-7)))
                if args.all:
                    print(f"  {reader} | {name} | {s:.4f} | {floors[name]:.6f} | {rows[-1][3]:,.0f}")
            s, name, floor, ratio = max(rows)
            print(f"{reader} | {name} | {s:.4f} | {floor:.6f} | {ratio:,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
