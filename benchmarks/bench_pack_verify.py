"""Time and peak memory of verifying a signed pack with one large member.

    python benchmarks/bench_pack_verify.py                       # a 256 MiB member, this code
    python benchmarks/bench_pack_verify.py --size-mb 512 --before /path/to/other/checkout

Writes a pack folder (random bytes as `head.safetensors`, a small ledger, signed with a fresh
key) in a temporary folder, then runs each case in a fresh Python process (so peak RSS is the
case's own) with this checkout's code, and with `--before`'s too when given (a source tree of
another version of the project, e.g. `git archive main fugu_pipeline | tar -x -C DIR`):

    refuse-key   signed by a key the host does not accept (refused)
    verify       signed by an accepted key (accepted: every member hashed)
    over-cap     an accepted key, the member over a cap of half its size (refused; caps exist only
                 where `verify_pack` takes `member_cap`)
    import       `import_checkpoint` of a checkpoint whose weights are one tensor of about that size
                 into an empty models folder (kept: the weights copied)

Prints one line per case and code: wall seconds of the call, peak RSS of the process, and the RSS
before the call (the interpreter and its imports). Keep `--size-mb` bounded on a shared machine:
the file is written to the temporary folder and read from the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repo's packages

from benchmarks.machine import describe  # noqa: E402

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from fugu_pipeline.train.signing import AcceptedKey, AcceptedKeys, SigningError, verify_pack
from fugu_pipeline.train.exchange import import_checkpoint
folder, case, public, size = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
names = ["head.safetensors", "ledger.jsonl"]
if case == "import":
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    kept = import_checkpoint(folder, folder + "-models")
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "base_mib": before / 1024, "out": "kept " + kept.name}))
    sys.exit(0)
keys = AcceptedKeys() if case == "refuse-key" else AcceptedKeys(keys={"host": AcceptedKey(public_key=public)})
kw = {"member_cap": size // 2} if case == "over-cap" else {}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    verify_pack(folder, names, keys, **kw)
    out = "accepted"
except SigningError as exc:
    out = "refused: " + str(exc)[:90]
except TypeError:
    out = "n/a (no size caps in this version)"
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "base_mib": before / 1024, "out": out}))
"""


def make_pack(folder: Path, size: int) -> str:
    sys.path.insert(0, str(ROOT))
    from fugu_pipeline.train.signing import new_key_pair, sign_pack

    private, public = new_key_pair()
    folder.mkdir()
    with open(folder / "head.safetensors", "wb") as f:
        left = size
        while left:
            n = min(left, 2**22)
            f.write(os.urandom(n))
            left -= n
    (folder / "ledger.jsonl").write_bytes(b"")
    sign_pack(folder, ["head.safetensors", "ledger.jsonl"], private)
    return public


def make_checkpoint(folder: Path, size: int) -> Path:
    """A normed_linear checkpoint whose one float32 tensor holds about `size` bytes, written by
    streaming (random bytes: an import checks hashes, not values), so this process stays small: a
    child's peak RSS starts from its parent's."""
    import hashlib

    from fugu_pipeline.features.contract import FeatureContract
    from fugu_pipeline.train.checkpoints import Manifest, hashed_fields

    dim = max(1, size // 12)
    header = json.dumps({"__metadata__": {"format": "pt"}, "linear.weight": {
        "dtype": "F32", "shape": [3, dim], "data_offsets": [0, 12 * dim]}}).encode()
    header += b" " * (-len(header) % 8)
    out = folder / "big"
    out.mkdir(parents=True)
    whole = hashlib.sha256()
    with open(out / "head.safetensors", "wb") as f:
        for chunk in (len(header).to_bytes(8, "little"), header):
            f.write(chunk)
            whole.update(chunk)
        left = 12 * dim
        while left:
            chunk = os.urandom(min(left, 2**22))
            f.write(chunk)
            whole.update(chunk)
            left -= len(chunk)
    contract = FeatureContract(encoder_id="synthetic", dim=dim)
    m = Manifest(method="es", head_kind="normed_linear", dim=dim, n_workers=3, param_count=3 * dim,
                 worker_ids=["w0", "w1", "w2"], feature_contract=contract, contract_fingerprint=contract.fingerprint(),
                 data_version="bench", code_version="bench", tensors={"linear.weight": [3, dim]},
                 weights_sha256=whole.hexdigest())
    whole.update(hashed_fields(m))  # the content hash: sha256 of the weights' bytes, then the fields
    m.content_hash = whole.hexdigest()[:16]
    (out / "manifest.json").write_text(m.model_dump_json(indent=2))
    return out


def run_case(code: Path, folder: Path, case: str, public: str, size: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(code), str(folder), case, public, str(size)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        return {"wall_s": float("nan"), "peak_mib": float("nan"), "base_mib": float("nan"),
                "out": "error: " + (out.stderr.strip().splitlines() or ["?"])[-1][:90]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=256, help="the large member's size in MiB (default 256)")
    ap.add_argument("--before", default=None, help="a source tree of another version to compare with")
    args = ap.parse_args(argv)
    if not 1 <= args.size_mb <= 4096:
        ap.error("--size-mb: from 1 to 4096")
    size = args.size_mb * 2**20
    codes = ([("before", Path(args.before).resolve())] if args.before else []) + [("this", ROOT)]
    print(f"machine: {describe()}; Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        folder = Path(tmp) / "pack"
        public = make_pack(folder, size)
        print(f"pack: head.safetensors of {size:,} bytes (random), signed")
        print(f"{'case':<11} {'code':<7} {'wall s':>7} {'peak RSS MiB':>13} {'RSS before':>11}  result")
        for case in ("refuse-key", "verify", "over-cap"):
            for label, code in codes:
                r = run_case(code, folder, case, public, size)
                print(f"{case:<11} {label:<7} {r['wall_s']:>7.3f} {r['peak_mib']:>13.1f} {r['base_mib']:>11.1f}  {r['out']}")
        shutil.rmtree(folder)
        ckpt = make_checkpoint(Path(tmp) / "ckpt", size)
        print(f"checkpoint: {(ckpt / 'head.safetensors').stat().st_size:,} bytes of weights")
        for label, code in codes:
            r = run_case(code, ckpt, "import", public, size)
            print(f"{'import':<11} {label:<7} {r['wall_s']:>7.3f} {r['peak_mib']:>13.1f} {r['base_mib']:>11.1f}  {r['out']}")
            shutil.rmtree(str(ckpt) + "-models", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
