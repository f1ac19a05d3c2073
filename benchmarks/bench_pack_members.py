"""Peak memory of reading a pack's small members when they are hostile: a huge receipt.json, a
huge ledger.jsonl.

    python benchmarks/bench_pack_members.py                          # 500 MB members, this code
    python benchmarks/bench_pack_members.py --size-mb 500 --before DIR

Writes, in a temporary folder, a pack folder holding only the member under test, then runs each
case in a fresh Python process (so peak RSS is the case's own) with this checkout's code, and
with `--before`'s too when given (a source tree of another version, e.g.
`git archive BASE fugu_pipeline | tar -x -C DIR`):

    receipt      receipt.json: a valid receipt whose `fitness` list runs to the size (0.5, 0.5, ...):
                 `exchange.read_receipt`, what `preflight` and `validate` call
    ledger-line  ledger.jsonl: one line of that size: `exchange.pack_ledger`, what the ledger gate calls
    receipt-bad  receipt.json: a small receipt with fields missing and of the wrong type (its message)

Prints one line per case and code: peak RSS of the process, the RSS before the call (the
interpreter and its imports), wall seconds, and the outcome (its first line, and how many lines
the message has). Keep `--size-mb` bounded on a shared machine: the old code holds several times
the file in memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repo's packages

from benchmarks.machine import describe  # noqa: E402

CHILD = r"""
import inspect, json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from fugu_pipeline.train.exchange import pack_ledger, read_receipt
folder, case = sys.argv[2], sys.argv[3]
cap = {"max_bytes": 512 * 2**20} if "max_bytes" in inspect.signature(pack_ledger).parameters else {}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    got = pack_ledger(folder, None, **cap) if case == "ledger-line" else read_receipt(folder)
    out = str(got) if case == "ledger-line" else "read"
except Exception as exc:
    out = f"{type(exc).__name__}: {exc}"
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "base_mib": before / 1024, "out": out.splitlines()[0][:220] if out else "",
                  "out_lines": len(out.splitlines()), "size": os.path.getsize(os.path.join(folder, "ledger.jsonl" if case == "ledger-line" else "receipt.json"))}))
"""

RECEIPT_HEAD = {"content_hash": "0" * 16, "weights_sha256": "0" * 64, "method": "es", "head_kind": "linear",
                "param_count": 1, "worker_ids": ["a"], "contract_fingerprint": "x", "encoder_id": "tiny",
                "data_version": "v"}


def write_receipt(path: Path, size: int) -> None:
    head = json.dumps(RECEIPT_HEAD)[:-1] + ', "fitness": ['
    chunk = ("0.5, " * 200_000).encode()
    with open(path, "wb") as f:
        f.write(head.encode())
        n = len(head)
        while n + len(chunk) < size:
            f.write(chunk)
            n += len(chunk)
        f.write(b"0.5]}\n")


def write_ledger(path: Path, size: int) -> None:
    chunk = b"x" * 2**20
    with open(path, "wb") as f:
        f.write(b'{"seq": 1, "note": "')
        for _ in range(max(1, size // len(chunk))):
            f.write(chunk)
        f.write(b'"}\n')


def run(code: Path, folder: Path, case: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(code), str(folder), case], capture_output=True, text=True)
    if out.returncode != 0:
        return {"peak_mib": float("nan"), "base_mib": float("nan"), "wall_s": float("nan"),
                "out": (out.stderr.strip().splitlines() or ["killed"])[-1][:150], "out_lines": 0}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--before", default=None, help="a source tree of another version (holds fugu_pipeline/)")
    ap.add_argument("--cases", default="receipt,ledger-line,receipt-bad")
    args = ap.parse_args()
    size = args.size_mb * 10**6
    print(describe())
    codes = [("this", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
    with tempfile.TemporaryDirectory(prefix="bench-members-") as tmp:
        for case in args.cases.split(","):
            folder = Path(tmp) / case
            folder.mkdir()
            if case == "receipt":
                write_receipt(folder / "receipt.json", size)
            elif case == "receipt-bad":
                (folder / "receipt.json").write_text(json.dumps({**RECEIPT_HEAD, "param_count": "many", "method": None}))
            else:
                write_ledger(folder / "ledger.jsonl", size)
            for name, code in codes:
                r = run(code, folder, case)
                print(f"{case:12s} {r.get('size', 0) / 1e6:5.0f} MB  {name:6s}  peak {r['peak_mib']:8.1f} MiB (before the call "
                      f"{r['base_mib']:.1f})  {r['wall_s']:7.2f} s  {r['out_lines']} line(s): {r['out']}")
            for p in folder.iterdir():
                p.unlink()


if __name__ == "__main__":
    main()
