"""The serving fault matrix: every worker failure kind on every path (one-step, cascade, multi-turn,
each plain and streamed), and what the client gets: a fallback to another worker, a 502 naming the
workers, or an error event in a stream that had begun; never a 500. In brackets, the kind under
which `/metrics` counted the faulted worker's error (`fugu_worker_errors_total`).

    python benchmarks/fault_matrix.py                       # every cell, both modes: about 4 minutes
    python benchmarks/fault_matrix.py --faults 401,402,403 --paths cascade,cascade_stream

The same cells as `fugu_pipeline_tests/test_serve_fault_matrix.py` (`fugu_pipeline/testing/fault_matrix.py`):
the official `openai` client, the real app under uvicorn on 127.0.0.1, the stub LLM server as the
workers, a fresh server per cell. Mode `one`: the worker that answers when nothing fails is faulted;
`all`: every worker is. A cell is flagged `!!` when it is not the expected outcome, or when the
client's next request was not answered over the same connection."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.machine import describe  # noqa: E402

from fugu_pipeline.serve import create_app  # noqa: E402
from fugu_pipeline.testing.fault_matrix import FAULTS, MODES, PATHS, FaultMatrix, expected, run_all, table  # noqa: E402
from fugu_pipeline.testing.stub_llm import StubLLMServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--modes", default=",".join(MODES), help="one, all, or both")
    args = ap.parse_args()
    paths, faults, modes = args.paths.split(","), args.faults.split(","), args.modes.split(",")
    unknown = sorted((set(paths) - set(PATHS)) | (set(faults) - set(FAULTS)) | (set(modes) - set(MODES)))
    if unknown:
        ap.error(f"unknown {unknown}")
    print(f"machine: {describe()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, StubLLMServer() as stub:
        t = time.perf_counter()
        matrix = FaultMatrix.build(create_app, stub, Path(tmp))
        print(f"routers trained in {time.perf_counter() - t:.0f} s; cells:", flush=True)
        cells = run_all(matrix, paths, faults, modes)
    bad = 0
    for (path, fault, mode), out in cells.items():
        wrong = out.kind != expected(path, fault, mode) or out.status == 500 or out.reused_connection is False
        if wrong:
            bad += 1
            out.kind = "!! " + out.cell()
            out.error_kinds = []
    for mode in modes:
        who = "the worker that answers when nothing fails" if mode == "one" else "every worker"
        print(f"\n{who} faulted:\n\n{table(cells, mode)}")
    print(f"\n{len(cells)} cells, {bad} not as expected, "
          f"{sum(o.status == 500 for o in cells.values())} answered 500")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
