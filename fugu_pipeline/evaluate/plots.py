"""PNG plots of an evaluation report (utilities against the baselines, routes, per-domain bars, the
APGR or cost–quality curve, the budget plot) and of a training run, in one style.

The style, for every plot of every report (the assets embed them in their metadata, the command
line writes them beside the JSON report): at most 640 pixels wide (`MAX_WIDTH_PX`: the Dagster UI
shows a metadata image at its own size, and its "Show Markdown" dialog is at most 80% of the
window wide, so a plot fits it in a window 850 pixels wide or wider), 100 dpi, so titles 10 pt
(14 px), labels 9 pt, ticks 8 pt (11 px); two panels one above the other; every
axis labelled; light horizontal grid behind the data, no top or right frame; the same colour for
the same thing everywhere (router green, best fixed worker grey, random light grey, oracle blue,
caps and chosen points red); values written on the bars; x labels rotated only when there are
more than four or any is long; legends outside the data; every point of a scatter named beside it.
Figures are drawn on matplotlib's Agg canvas through its object API (no pyplot global state), so
threads and processes can plot at once; matplotlib is imported inside.

A plot is drawn once per content: each PNG carries, in a text chunk, the hash of what drew it (its
inputs, the source of the module that draws it, the style and matplotlib's version). When a report
is written again with the same inputs (a re-run of the main job over unchanged data), the PNG
already there is kept as it is: the same bytes a fresh draw gives, for no drawing (a quarter of a
re-run's CPU before). Any other input the plot shows, code or style draws it again.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import struct
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.metrics import ci_text

DPI = 100
MAX_WIDTH_PX = 640  # the widest plot: it fits the Dagster UI's "Show Markdown" dialog (see above)
MAX_WIDTH_IN = MAX_WIDTH_PX / DPI
COLORS = {"router": "#2a9d6f", "best_fixed": "#7f7f7f", "random": "#c7c7c7", "oracle": "#3f6fc4",
          "worker": "#9a9a9a", "curve": "#2a9d6f", "mark": "#c44e52"}
STYLE = {
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8,
    "legend.fontsize": 8, "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "axes.grid.axis": "y", "grid.alpha": 0.35, "axes.axisbelow": True,
    "savefig.dpi": DPI, "figure.dpi": DPI,
}


def shown_name(name: str, width: int) -> str:
    """A domain or tag as a table or axis shows it: one line, at most `width` characters; a blank one,
    or one holding a line break or another control character, as its repr (`''`, `' '`, `'a\\nb'`), so
    two such names stay apart and no row breaks in two."""
    text = name if name.strip() and name.isprintable() else repr(name)
    return text if len(text) <= width else text[:width - 1] + "…"


KEY_FIELD = "fugu-plot-key"  # the PNG text chunk holding the hash of what drew the plot


@contextmanager
def plotted(target, width: float, height: float, nrows: int = 1, key: str | None = None):
    """A figure in the report style, at most `MAX_WIDTH_IN` wide; yields its axes (one, or a list of
    `nrows`, one above the other) and writes the PNG to `target` (a path or a binary file) when the
    block ends, with `key` (`plot_key`) in it."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(min(width, MAX_WIDTH_IN), height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, 1)
        yield fig, (list(axes) if nrows > 1 else axes)
        fig.savefig(target, format="png", dpi=DPI, metadata={KEY_FIELD: key} if key else None)


def png_bytes(draw, width: float, height: float, nrows: int = 1, key: str | None = None) -> bytes:
    """`draw(fig, axes)` in the report style, as PNG bytes (for metadata)."""
    buf = io.BytesIO()
    with plotted(buf, width, height, nrows, key) as (fig, axes):
        draw(fig, axes)
    return buf.getvalue()


@functools.cache
def _source_digest(module: str) -> str:
    """The hash of a module's source file: a change to how a plot is drawn draws it again."""
    path = getattr(sys.modules.get(module), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else module


def _plain(value):
    """numpy values as JSON (arrays whole: never the summary `repr` gives a long one)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not plot data")


def plot_key(what: str, module: str, *inputs) -> str | None:
    """The hash of a plot's inputs, the source of `module` (the code that draws it), this module's
    (the style), matplotlib's version and the DPI; None when an input is not plain data (the plot is
    then always drawn)."""
    import matplotlib

    try:
        text = json.dumps([what, inputs, _source_digest(module), _source_digest(__name__), matplotlib.__version__, DPI],
                          sort_keys=True, default=_plain, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def stored_key(png: Path | bytes) -> str | None:
    """The `plot_key` a PNG written by `plotted` carries (None: absent, unreadable or not a PNG)."""
    try:
        data = png if isinstance(png, bytes) else Path(png).read_bytes()
    except OSError:
        return None
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    at, field = 8, KEY_FIELD.encode("latin-1") + b"\0"
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + size]
        if kind == b"tEXt" and body.startswith(field):
            return body[len(field):].decode("latin-1")
        if kind in (b"IDAT", b"IEND"):  # text chunks written by matplotlib come before the image
            return None
        at += 12 + size
    return None


def reused(*fields: str):
    """A plot function `fn(data, path, *more, key=None) -> path` that keeps the PNG already at `path`
    when it was drawn from the same inputs by the same code (its `plot_key`). `fields`: the keys of
    `data` the plot reads (none: all of `data`), so that a figure the plot does not show (the king's
    composite, which a first run has not got yet) does not draw it again; a test holds each list to
    what its plot reads."""

    def wrap(fn):
        @functools.wraps(fn)
        def draw_unless_same(data, path: Path, *more, **options):
            shown = {k: data.get(k) for k in fields} if fields else data
            key = plot_key(fn.__qualname__, __name__, shown, more, options)
            if key is not None and stored_key(path) == key:
                return path
            return fn(data, path, *more, **options, key=key)

        draw_unless_same.fields = fields
        return draw_unless_same

    return wrap


def x_labels(ax, positions, labels: list[str]) -> None:
    """Category labels under the bars: horizontal while they fit (four or fewer, none long)."""
    crowded = len(labels) > 4 or max((len(line) for x in labels for line in x.splitlines()), default=0) > 16
    ax.set_xticks(positions, labels, rotation=30 if crowded else 0, ha="right" if crowded else "center")


def plot_report(rep: dict, out_dir, prefix: str = "report") -> list:
    """Write PNG plots beside the JSON report. Returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [_summary(rep, out_dir / f"{prefix}_summary.png")]
    if rep.get("per_domain"):
        paths.append(_per_domain(rep, out_dir / f"{prefix}_per_domain.png"))
    curve = rep.get("apgr", {}).get("curve")  # none where APGR is undefined (no gap between the two workers)
    if curve:
        paths.append(_apgr(rep, out_dir / f"{prefix}_curve.png"))
    elif rep.get("cost_quality_points"):
        paths.append(_cost_quality(rep, out_dir / f"{prefix}_curve.png"))
    if rep.get("budget"):
        paths.append(plot_budget(rep["budget"], out_dir / f"{prefix}_budget.png", rep.get("split", "test")))
    return paths


@reused("best_fixed_worker", "router_utility", "best_fixed_utility", "random_utility", "oracle_utility", "split",
        "n_tasks", "router_minus_best_fixed", "route_distribution")
def _summary(rep: dict, path: Path, key: str | None = None) -> Path:
    with plotted(path, MAX_WIDTH_IN, 6.6, nrows=2, key=key) as (fig, (left, right)):
        names = ["router", f"best fixed\n({shown_name(rep['best_fixed_worker'], 24)})", "random", "oracle"]
        vals = [rep["router_utility"], rep["best_fixed_utility"], rep["random_utility"], rep["oracle_utility"]]
        bars = left.bar(range(4), vals, color=[COLORS[k] for k in ("router", "best_fixed", "random", "oracle")])
        left.bar_label(bars, fmt="%.3f", padding=2, fontsize=8)
        x_labels(left, range(4), names)
        left.set_ylabel(f"mean utility ({rep.get('split', 'test')})")
        left.set_title(f"held-out utility, n={rep['n_tasks']}; router − best fixed "
                       f"{ci_text(rep['router_minus_best_fixed'], '+.3f')}")
        left.margins(y=0.12)
        dist = rep["route_distribution"]
        labels = [shown_name(w, 24) for w in dist]
        bars = right.bar(range(len(dist)), list(dist.values()), color=COLORS["router"])
        right.bar_label(bars, padding=2, fontsize=8)
        x_labels(right, range(len(dist)), labels)
        right.set_ylabel("tasks routed to the worker")
        right.set_title("route distribution")
        right.margins(y=0.12)
    return path


@reused("per_domain", "best_fixed_worker", "split")
def _per_domain(rep: dict, path: Path, key: str | None = None) -> Path:
    rows = rep["per_domain"]
    series = (("router", "router"), ("best_fixed", f"best fixed ({shown_name(rep['best_fixed_worker'], 24)})"),
              ("oracle", "oracle"))
    with plotted(path, MAX_WIDTH_IN, 4.4 if len(rows) <= 6 else 5.6, key=key) as (fig, ax):
        x = np.arange(len(rows))
        for k, (key, label) in enumerate(series):
            ax.bar(x + (k - 1) * 0.27, [r[key] for r in rows], 0.27, label=label, color=COLORS[key])
        if len(rows) <= 6:
            x_labels(ax, x, [f"{shown_name(r['domain'], 28)}\n(n={r['n']})" for r in rows])
        else:  # many domains on 640 pixels: one upright line each, so no label runs into the next
            ax.set_xticks(x, [f"{shown_name(r['domain'], 28)} (n={r['n']})" for r in rows], rotation=90, ha="center")
        ax.set_ylabel(f"mean utility ({rep.get('split', 'test')})")
        ax.set_title("utility per domain")
        fig.legend(loc="outside lower center", ncols=3)  # under the axes: it never covers a bar
    return path


@reused("apgr")
def _apgr(rep: dict, path: Path, key: str | None = None) -> Path:
    a = rep["apgr"]
    with plotted(path, MAX_WIDTH_IN, 4.4, key=key) as (fig, ax):
        ax.plot(a["curve"]["strong_share"], a["curve"]["pgr"], color=COLORS["curve"], label=f"router (APGR {a['apgr']:.3f})")
        ax.plot([0, 1], [0, 1], "--", color=COLORS["random"], label="random (APGR 0.5)")
        ax.set_xlabel(f"share of calls to {shown_name(a['strong_worker'], 30)}")
        ax.set_ylabel("performance gap recovered")
        ax.set_title("APGR: gap recovered against calls to the strong worker")
        ax.grid(axis="x", alpha=0.35)
        fig.legend(loc="outside lower center", ncols=2)
    return path


@reused("cost_quality_points", "cost_quality_curve", "cost_quality_curve_of", "split")
def _cost_quality(rep: dict, path: Path, key: str | None = None) -> Path:
    """Mean quality against mean cost: each worker, the router, the oracle, each point named; the
    λ sweep of the router's scores against expected cost when the report has one."""
    with plotted(path, MAX_WIDTH_IN, 4.6, key=key) as (fig, ax):
        for p in rep["cost_quality_points"]:
            kind = "router" if p["name"] == "router" else "oracle" if p["name"].startswith("oracle") else "worker"
            ax.scatter(p["mean_cost_usd"], p["mean_quality"], s=36, color=COLORS[kind], zorder=3)
            ax.annotate(shown_name(p["name"].split(" (")[0], 28), (p["mean_cost_usd"], p["mean_quality"]),
                        xytext=(5, 3), textcoords="offset points", fontsize=8)
        if rep.get("cost_quality_curve"):
            cv = rep["cost_quality_curve"]
            ax.plot([p["mean_cost_usd"] for p in cv], [p["mean_quality"] for p in cv], "-", color=COLORS["curve"], lw=1.2,
                    label=f"{rep.get('cost_quality_curve_of', 'quality head')}: argmax(score − λ·expected cost), λ swept")
            fig.legend(loc="outside lower center")
        ax.set_xlabel(f"mean cost per task (USD, {rep.get('split', 'test')}, realised)")
        ax.set_ylabel(f"mean quality ({rep.get('split', 'test')})")
        ax.set_title("cost against quality (oracle: chosen after the fact)")
        ax.grid(axis="x", alpha=0.35)
        ax.margins(x=0.12, y=0.08)
    return path


@reused()
def plot_budget(sec: dict, path: Path, split: str = "test", key: str | None = None) -> Path:
    """Quality against cost (share of the reference worker's cost) on the held-out split: every
    worker as a point, the router's λ curve and its Pareto points, the cap and the operating point
    chosen on the calibration's rows (validation, or the non-test rows out of fold)."""
    with plotted(path, MAX_WIDTH_IN, 5.2, key=key) as (fig, ax):
        for w in sec["workers"]:
            ax.scatter(w["share"], w["quality"], s=36, color=COLORS["worker"], zorder=3)
            ax.annotate(shown_name(w["name"], 28), (w["share"], w["quality"]), fontsize=8, xytext=(5, 3),
                        textcoords="offset points")
        cv = sorted(sec["router_curve"], key=lambda p: p["share"])
        ax.plot([p["share"] for p in cv], [p["quality"] for p in cv], "-", color="#9fd8bf", lw=1, label="router, λ sweep")
        front = sec["router_pareto"]
        ax.plot([p["share"] for p in front], [p["quality"] for p in front], "o-", color=COLORS["router"], ms=3,
                label="router Pareto points")
        op = sec.get("operating_point")
        if op:
            t = op[split]
            cap = op["budget"]["share"] if op["budget"].get("share") is not None else \
                op["budget"]["usd_per_1k"] / sec["reference_cost_usd_per_1k"]
            ax.axvline(cap, ls="--", color=COLORS["mark"], lw=1, label=op["describe"].split(" (")[0])
            rows = "non-test rows, out of fold" if sec.get("calibration", {}).get("curve_rows") == "non-test" else "validation"
            ax.scatter([t["share"]], [t["quality"]], marker="*", s=160, color=COLORS["mark"], zorder=5,
                       label=f"chosen on {rows}: λ={op['lambda']:.3g}, {split} {t['quality']:.3f} at {t['share']:.3f}")
        ax.set_xlabel(f"mean cost per request / {shown_name(sec['reference_worker'], 30)}'s ({split}, realised)")
        ax.set_ylabel(f"mean quality ({split})")
        ax.set_title("budget mode: quality against cost (routes use expected cost only)")
        ax.grid(axis="x", alpha=0.35)
        fig.legend(loc="outside lower center")  # one column: its labels are long
    return path
