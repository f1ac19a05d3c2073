"""PNG plots of an evaluation report: utilities against the baselines, routes, per-domain bars, and
the APGR or cost–quality curve. matplotlib is imported inside, with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
    axes[0].set_title(f"held-out utility (n={rep['n_tasks']}); router−fixed {ci['mean']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]", fontsize=9)
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
        ax.set_xticks(x, [r["domain"] for r in rows], rotation=45, ha="right", fontsize=7)
        ax.legend(fontsize=8)
        ax.set_title("utility per domain", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / f"{prefix}_per_domain.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)

    if rep.get("cost_quality_points") or rep.get("apgr"):
        fig, ax = plt.subplots(figsize=(6, 4))
        if rep.get("apgr"):
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
    return paths
