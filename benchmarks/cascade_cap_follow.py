"""A cascade under a cap asked of it, held out: what serves (the saved point following the spend)
against a spend guard that only cuts.

    python benchmarks/cascade_cap_follow.py --checkpoint models/cascade/<hash> --data rows.jsonl \
        --workers configs/reward.quality.yaml [--caps 0.2,0.33,0.5] [evaluate's other options]

Each cap is evaluated twice by `fugu-lite evaluate --cap share=<cap>` in this process. First as it
serves (`policies/cascade/spend.request_point`: each request the most accurate saved point of its
group whose validation cost is within the effective cap of `route/follow` over its guard's count).
Then with that function replaced for the run by the rule that only cuts: the most accurate saved
point whose cost bound (the cap's margin of standard errors) is within the guard's allowance
`min(cap, cap − (spent − n · 0.95 · cap) / 50)`, the cheapest where none is (under a cap shared
among groups: the point chosen for the group while the allowance is its whole part, never a point
dearer than that one). Printed per cap:
held-out accuracy − the strongest worker, and the actual spend as a share of its cost, each way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import describe  # noqa: E402


def cut_only(checkpoint: str, margin_z: float):
    """`request_point` with the rule that only cuts (the module docstring), as it served before the
    spend was followed: under a cap shared among groups, the point `spend.share_parts` chose for
    the group while its allowance is its whole part."""
    from fugu_pipeline.cost_cap import within_cap
    from fugu_pipeline.policies.cascade import spend
    from fugu_pipeline.policies.cascade.evaluate import load_cascade

    ckpt = load_cascade(checkpoint)
    parts = spend.group_parts(ckpt.head.head_params(), ckpt.manifest.metrics or {})
    chosen: dict = {}

    def pick(points, allowance, own):
        within = [p for p in points if within_cap(float(p["cost_usd"]) + margin_z * float(p.get("cost_se") or 0.0),
                                                  allowance) and (own is None or within_cap(float(p["cost_usd"]), own))]
        return max(within, key=lambda p: (p["quality"], -p["cost_usd"])) if within else None

    def request_point(shares, points, group, guard_of, own=None):
        guards, cap = spend.shared_guards(shares, group, guard_of)
        allowance = guards[0].allowance(band=0.05)
        if len(guards) > 1:
            allowance = min(allowance, cap * guards[1].allowance(band=0.05) / guards[1].cap if guards[1].cap > 0 else 0.0)
        if parts is not None and shares.cap_usd not in chosen:
            got = spend.share_parts(parts, shares.cap_usd, margin_z)
            chosen[shares.cap_usd] = got[1] if got else {}
        mine = chosen.get(shares.cap_usd, {}).get(str(group)) if len(guards) > 1 else None
        if mine is not None and within_cap(cap, allowance):
            best = mine
        else:
            best = pick(points, allowance, None if mine is None else float(mine["cost_usd"])) or \
                min(points, key=lambda p: float(p["cost_usd"]) + margin_z * float(p.get("cost_se") or 0.0))
        return best, guards, {"cap_usd": cap, "allowance_usd": allowance, **guards[0].state()}
    return request_point


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--caps", default="0.2,0.33,0.5", help="shares of the strongest worker's cost")
    args, rest = ap.parse_known_args(argv)
    from benchmarks.evaluate_as import evaluated
    from fugu_pipeline.cost_cap import DEFAULT_MARGIN_Z
    from fugu_pipeline.policies.cascade import spend

    served = spend.request_point
    print(f"{describe()}; {args.checkpoint}")
    print("| cap | what serves (following the spend): accuracy − strongest, share | a guard that only cuts: "
          "accuracy − strongest, share |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for share in (float(s) for s in args.caps.split(",")):
            cells = []
            for way in (served, cut_only(args.checkpoint, DEFAULT_MARGIN_Z)):
                out = Path(tmp) / f"{share}_{len(cells)}" / "test.json"  # evaluate names the report by its split
                rep = evaluated(["--checkpoint", args.checkpoint, *rest, "--cap", f"share={share}"], out, spend,
                                "request_point", way)
                if isinstance(rep, str):
                    cells.append(rep)
                    continue
                cells.append(f"{rep['minus_strongest_accuracy']['mean']:+.4f}, {rep['cost_share_of_strongest']:.3f}")
            print(f"| {share:.0%} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
