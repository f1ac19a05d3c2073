"""A shared cap when the mix of kinds drifts: held-out rows of one domain served `--times` times as
often, through a checkpoint whose plans per group share the cap it was trained under.

    python benchmarks/cap_mix_drift.py --checkpoint models/cascade/<hash> --data rows.jsonl \
        --workers configs/reward.quality.yaml --domain llmbar [--times 4] [evaluate's other options]

The drifted import is the same rows with each test row of `--domain` copied `--times − 1` more times
under new task ids (`<id>#k`; traffic order interleaves them with the rest, as
`route/follow.traffic_order` serves any rows). Each import (as given, and drifted) is evaluated
twice by `fugu-lite evaluate` in this process: as it serves (each group's part shared again as the
mix of requests moves: `spend.RequestShares.parts_for`), and with the parts kept as first shared
(`parts_for` replaced for the run by the parts of the rows the plans were chosen on). Printed per
import: its test rows, then each way's held-out accuracy and spend as a share of the trained cap.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import describe  # noqa: E402


def drifted(src: Path, domain: str, times: int, out: Path) -> int:
    """Write `src` with each test row of `domain` copied `times − 1` more times; the number of test rows."""
    n = 0
    with src.open() as f, out.open("w") as g:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            copies = times if row.get("split") == "test" and row.get("domain") == domain else 1
            for k in range(copies):
                g.write(json.dumps(row if k == 0 else {**row, "task_id": f"{row['task_id']}#{k}"}) + "\n")
            n += copies if row.get("split") == "test" else 0
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--domain", required=True, action="append", help="a domain to serve more often (repeatable)")
    ap.add_argument("--times", type=int, default=4)
    args, rest = ap.parse_known_args(argv)
    if args.times < 2:
        ap.error(f"--times {args.times}: give 2 or more (how many times as often the domain's rows are served)")
    from benchmarks.evaluate_as import evaluated
    from fugu_pipeline.policies.cascade.evaluate import load_cascade
    from fugu_pipeline.policies.cascade.spend import RequestShares

    head = load_cascade(args.checkpoint).head
    if head.cap_usd is None or not head.group_caps:
        print(f"{args.checkpoint}: not a checkpoint whose plans per group share a trained cap; train one with "
              "`fugu-lite train --cap share=<s>` on an import with domains", file=sys.stderr)
        return 2
    shared = RequestShares.parts_for
    print(f"{describe()}; {args.checkpoint}; trained cap ${head.cap_usd * 1000:.4g} per 1,000 requests")
    print("| import | test rows | shared again as the mix moves: accuracy, spend / cap | parts kept as first shared: "
          "accuracy, spend / cap |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        imports = [("as given", args.data, None)]
        for d in args.domain:
            path = Path(tmp) / f"{d}.jsonl"
            imports.append((f"{d} × {args.times}", path, drifted(args.data, d, args.times, path)))
        for label, path, _ in imports:
            cells, rows = [], "—"
            for way in (shared, lambda self, mix: self.group_caps):
                out = Path(tmp) / f"{label}_{len(cells)}" / "test.json"  # evaluate names the report by its split
                rep = evaluated(["--checkpoint", args.checkpoint, "--data", str(path), *rest], out, RequestShares,
                                "parts_for", way)
                if isinstance(rep, str):
                    cells.append(rep)
                    continue
                cells.append(f"{rep['accuracy']['mean']:.4f}, {rep['cost_usd_per_1k'] / 1000 / head.cap_usd:.1%}")
                rows = rep.get("n_tasks")
            print(f"| {label} | {rows} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
