"""The cost-accuracy frontier of a cascade in its report: the out-of-fold points its training recorded
(`policies/cascade/frontier.py`, kept in the checkpoint's metrics as `frontier_oof`), printed and plotted.

`add_frontier(rep, checkpoint, out_dir)` puts the points into a cascade report (`frontier`) with the
lines (`frontier_lines`) and writes `frontier.png` beside it: out-of-fold accuracy against $ per 1,000
requests, every cap's point, the non-dominated ones joined, the strongest worker alone. The PNG is
6.4 x 4 inches at 100 dpi (fits the Dagster UI's Markdown dialog) and, as every report plot, is drawn
once per content (`plots.reused`).
"""

from __future__ import annotations

from pathlib import Path

from fugu_pipeline.evaluate.plots import COLORS, plotted, reused, shown_name
from fugu_pipeline.policies.cascade.frontier import frontier_lines

WIDTH, HEIGHT = 6.4, 4.0


@reused("levels", "frontier", "strongest", "strongest_quality", "strongest_cost_usd", "rows")
def plot_frontier(front: dict, path: Path, key: str | None = None) -> Path:
    """Out-of-fold accuracy against $ per 1,000 requests (see the module docstring)."""
    with plotted(path, WIDTH, HEIGHT, key=key) as (fig, ax):
        lv, fr = front["levels"], front["frontier"]
        ax.scatter([p["cost_usd"] * 1000 for p in lv], [p["quality"] for p in lv], s=14, color=COLORS["random"],
                   zorder=2, label="best plan under a cap")
        ax.plot([p["cost_usd"] * 1000 for p in fr], [p["quality"] for p in fr], "o-", ms=4, lw=1.2, color=COLORS["curve"],
                zorder=3, label="non-dominated")
        for p in fr:
            ax.annotate(f"{p['share']:.0%}", (p["cost_usd"] * 1000, p["quality"]), xytext=(4, -9), textcoords="offset points",
                        fontsize=7)
        ax.scatter([front["strongest_cost_usd"] * 1000], [front["strongest_quality"]], marker="s", s=30,
                   color=COLORS["best_fixed"], zorder=4, label=f"{shown_name(front['strongest'], 24)} alone")
        ax.set_xlabel("expected $ per 1,000 requests (out of fold)")
        ax.set_ylabel("accuracy (out of fold)")
        ax.set_title(f"cascade frontier, {front['rows']} rows; labels: cap as a share of the strongest's cost", fontsize=9)
        ax.grid(axis="x", alpha=0.35)
        ax.margins(x=0.08, y=0.08)
        fig.legend(loc="outside lower center", ncols=3)
    return path


def add_frontier(rep: dict, checkpoint, out_dir: Path | None) -> dict:
    """`rep` with the checkpoint's out-of-fold frontier (`frontier`, `frontier_lines`) and, when
    `out_dir` is given, its plot (`frontier_png`); a checkpoint without one leaves `rep` as it is."""
    front = (checkpoint.manifest.metrics or {}).get("frontier_oof") or {}
    if not front.get("frontier"):
        return rep
    rep["frontier"] = front
    rep["frontier_lines"] = frontier_lines(front)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        rep["frontier_png"] = str(plot_frontier(front, Path(out_dir) / "frontier.png"))
    return rep
