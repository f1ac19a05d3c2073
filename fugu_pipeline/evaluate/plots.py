"""PNG plots of an evaluation report: utilities against the baselines, routes, per-domain bars, and
the APGR or cost–quality curve. matplotlib is imported inside, with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.metrics import ci_text


def shown_name(name: str, width: int) -> str:
    """A domain or tag as a table or axis shows it: one line, at most `width` characters; a blank one,
    or one holding a line break or another control character, as its repr (`''`, `' '`, `'a\\nb'`), so
    two such names stay apart and no row breaks in two."""
    text = name if name.strip() and name.isprintable() else repr(name)
    return text if len(text) <= width else text[:width - 1] + "…"


def plot_report(rep: dict, out_dir, prefix: str = "report") -> list:
    """Write PNG plots beside the JSON report. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = ["router", f"best fixed\n({rep['best_fixed_worker']})", "random", "oracle"]
    vals = [rep["router_utility"], rep["best_fixed_utility"], rep["random_utility"], rep["oracle_utility"]]
    axes[0].bar(names, vals, color=["#2a7", "#888", "#bbb", "#47c"])
    ci = rep["router_minus_best_fixed"]
    axes[0].set_title(f"held-out utility (n={rep['n_tasks']}); router−fixed {ci_text(ci, '+.3f')}", fontsize=9)
    dist = rep["route_distribution"]
    axes[1].bar(list(dist), list(dist.values()), color="#2a7")
    axes[1].set_title("route distribution", fontsize=9)
    axes[1].tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    paths.append(out_dir / f"{prefix}_summary.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)

    if rep.get("per_domain"):
        rows = rep["per_domain"]
        fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 3.8))
        x = np.arange(len(rows))
        for k, (key, c) in enumerate((("router", "#2a7"), ("best_fixed", "#888"), ("oracle", "#47c"))):
            ax.bar(x + (k - 1) * 0.27, [r[key] for r in rows], 0.27, label=key, color=c)
        ax.set_xticks(x, [shown_name(r["domain"], 28) for r in rows], rotation=45, ha="right", fontsize=7)
        ax.legend(fontsize=8)
        ax.set_title("utility per domain", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / f"{prefix}_per_domain.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

    curve = rep.get("apgr", {}).get("curve")  # none where APGR is undefined (no gap between the two workers)
    if rep.get("cost_quality_points") or curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        if curve:
            c = rep["apgr"]["curve"]
            ax.plot(c["strong_share"], c["pgr"], label=f"router (APGR {rep['apgr']['apgr']:.3f})", color="#2a7")
            ax.plot([0, 1], [0, 1], "--", color="#bbb", label="random (APGR 0.5)")
            ax.set_xlabel(f"share of calls to {rep['apgr']['strong_worker']}")
            ax.set_ylabel("performance gap recovered")
        else:
            for p in rep["cost_quality_points"]:
                ax.scatter(p["mean_cost_usd"], p["mean_quality"], label=p["name"])
            if rep.get("cost_quality_curve"):
                cv = rep["cost_quality_curve"]
                ax.plot([p["mean_cost_usd"] for p in cv], [p["mean_quality"] for p in cv], "-", color="#2a7", label="quality head, λ sweep")
            ax.set_xlabel("mean cost per task (USD)")
            ax.set_ylabel("mean quality")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out_dir / f"{prefix}_curve.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

    if rep.get("budget"):
        paths.append(plot_budget(rep["budget"], out_dir / f"{prefix}_budget.png", rep.get("split", "test")))
    return paths


def plot_budget(sec: dict, path: Path, split: str = "test") -> Path:
    """Quality against cost (share of the reference worker's cost) on the held-out split: every
    worker as a point, the router's λ curve and its Pareto points, the cap and the operating point
    chosen on validation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.6))
    for w in sec["workers"]:
        ax.scatter(w["share"], w["quality"], s=28, color="#888")
        ax.annotate(w["name"][:28], (w["share"], w["quality"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
    cv = sorted(sec["router_curve"], key=lambda p: p["share"])
    ax.plot([p["share"] for p in cv], [p["quality"] for p in cv], "-", color="#9c9", lw=1, label="router, λ sweep")
    front = sec["router_pareto"]
    ax.plot([p["share"] for p in front], [p["quality"] for p in front], "o-", color="#2a7", ms=3, label="router Pareto points")
    op = sec.get("operating_point")
    if op:
        t = op[split]
        cap = op["budget"]["share"] if op["budget"].get("share") is not None else \
            op["budget"]["usd_per_1k"] / sec["reference_cost_usd_per_1k"]
        ax.axvline(cap, ls="--", color="#c44", lw=1, label=f"cap ({op['describe'].split(' (')[0]})")
        ax.scatter([t["share"]], [t["quality"]], marker="*", s=160, color="#c44", zorder=5,
                   label=f"chosen on validation: λ={op['lambda']:.3g}, {split} {t['quality']:.3f} at {t['share']:.3f}")
    ax.set_xlabel(f"mean cost per request / {sec['reference_worker']}'s ({split}, realised)")
    ax.set_ylabel(f"mean quality ({split})")
    ax.set_title("budget mode: accuracy against cost (routes use expected cost only)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
