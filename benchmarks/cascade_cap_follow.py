"""A trial, not served: a cascade under a cap asked of it, its saved point following the spend,
against what serves (the spend guard that only cuts), held out.

    python benchmarks/cascade_cap_follow.py --checkpoint models/cascade/<hash> --data rows.jsonl \
        --workers configs/reward.quality.yaml [--caps 0.2,0.33,0.5] [evaluate's other options]

Each cap is evaluated twice by `fugu-lite evaluate --cap share=<cap>` in this process. First as it
serves (`policies/cascade/spend.request_point`: the most accurate saved point whose cost bound is
within the guard's allowance, never dearer than the group's chosen point). Then with that function
replaced for the run: each request gets the most accurate saved point of its group whose validation
cost is within the effective cap of `route/follow` over its guard's count (a group's
part of a shared cap, else the cap), with no margin. Printed per cap: held-out accuracy − the
strongest worker, and the actual spend as a share of its cost, each way. Serving it needs `train`
to score the cascade rows (its table at caps, its candidates at a cap) by the same replay out of
fold, which is not built: this trial is its measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import describe  # noqa: E402


def following(orig):
    """`request_point` with the saved point following the spend (the module docstring)."""
    from fugu_pipeline.cost_cap import within_cap
    from fugu_pipeline.policies.cascade import spend

    def request_point(shares, points, group, z, guard_of):
        guards, cap, _ = spend.shared_allowance(shares, group, guard_of)
        eff = guards[0].effective()
        within = [p for p in points if within_cap(float(p["cost_usd"]), eff)]
        best = max(within, key=lambda p: (p["quality"], -p["cost_usd"])) if within else \
            min(points, key=lambda p: p["cost_usd"])
        return best, guards, {"cap_usd": cap, "effective_cap_usd": eff, **guards[0].state()}
    return request_point


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--caps", default="0.2,0.33,0.5", help="shares of the strongest worker's cost")
    args, rest = ap.parse_known_args(argv)
    from fugu_pipeline.cli.main import main as cli
    from fugu_pipeline.policies.cascade import spend

    orig = spend.request_point
    print(f"{describe()}; {args.checkpoint}")
    print("| cap | as served: accuracy − strongest, share | following the spend: accuracy − strongest, share |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for share in (float(s) for s in args.caps.split(",")):
            cells = []
            for way in (orig, following(orig)):
                spend.request_point = way
                out = Path(tmp) / f"{share}_{len(cells)}" / "test.json"  # evaluate names the report by its split
                try:
                    code = cli(["evaluate", "--checkpoint", args.checkpoint, *rest, "--cap", f"share={share}",
                                "--output", str(out)])
                finally:
                    spend.request_point = orig
                if code != 0:
                    cells.append(f"evaluate exited {code}")
                    continue
                rep = json.loads(out.read_text())
                cells.append(f"{rep['minus_strongest_accuracy']['mean']:+.4f}, {rep['cost_share_of_strongest']:.3f}")
            print(f"| {share:.0%} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
