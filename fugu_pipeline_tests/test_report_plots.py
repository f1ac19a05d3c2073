"""The plots of a held-out report, checked on the figures themselves (every Figure the report draws
is caught as it is saved): one legible style for all of them, each narrow enough for the Dagster
UI's "Show Markdown" dialog. Before: 90 dpi, two plots without a y label, the per-domain legend
over a bar, x labels rotated under three bars, a cost–quality scatter whose points had no names,
no cost curve in the report of a head without quality predictions (SFT, RL, CMA-ES) although the
quality heads' reports had one, and plots 1,050-1,650 pixels wide (the dialog scrolled sideways)."""

import numpy as np
import pytest

from fugu_pipeline.evaluate.metrics import EvalInputs, evaluation_report
from fugu_pipeline.evaluate.plots import DPI, STYLE, plot_budget, plot_report

DIALOG_PX = 640  # the widest plot the Dagster UI's "Show Markdown" dialog shows whole (plots.py)

WORKERS = ["math-expert", "code-expert", "general-expert"]
DOMAINS = ["code", "general", "math"]


def inputs(quality_head: bool) -> EvalInputs:
    rng = np.random.default_rng(0)
    n = 60
    domains = [DOMAINS[i % 3] for i in range(n)]
    quality = rng.uniform(0.8, 1.0, (n, 3))  # every bar high: a legend inside the axes has nowhere to go
    cost = np.tile([0.002, 0.004, 0.001], (n, 1)) * rng.uniform(0.8, 1.2, (n, 3))
    utility = quality - 0.1 * cost / 0.01
    scores = utility + rng.normal(0, 0.05, (n, 3))
    return EvalInputs(worker_ids=WORKERS, utility=utility, scores=scores, train_utility=utility[:20], domains=domains,
                      quality=quality, cost_usd=cost, latency_s=np.ones((n, 3)), train_quality=quality[:20],
                      quality_pred=np.clip(quality + rng.normal(0, 0.05, (n, 3)), 0, 1) if quality_head else None,
                      expected_cost=np.tile([0.002, 0.004, 0.001], (n, 1)), cost_ref=0.002)


@pytest.fixture
def figures(monkeypatch):
    """Every matplotlib Figure saved while the test runs, with the dpi it was saved at."""
    from matplotlib.figure import Figure

    caught = []
    real = Figure.savefig

    def spy(self, *args, **kwargs):
        caught.append((self, kwargs.get("dpi")))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return caught


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_every_report_plot_is_legible(tmp_path, figures):
    from matplotlib.patches import Rectangle
    from PIL import Image

    rep = evaluation_report(inputs(quality_head=True), n_boot=200)
    paths = plot_report(rep, tmp_path, "test")
    assert [p.name for p in paths] == ["test_summary.png", "test_per_domain.png", "test_curve.png"]
    for path in paths:
        assert round(Image.open(path).info["dpi"][0]) == DPI, path.name
    assert len(figures) == 3 and all(dpi == DPI for _, dpi in figures)
    assert min(STYLE[k] for k in STYLE if k.endswith("size")) * DPI / 72 >= 11  # the smallest text: 11 px or more
    for fig, _ in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            assert ax.get_ylabel().strip(), f"{ax.get_title()!r}: no y label"
            bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
            ticks = [t for t in ax.get_xticklabels() if t.get_text()]
            if bars and len(ticks) <= 4:
                assert all(t.get_rotation() == 0 for t in ticks), f"{ax.get_title()!r}: x labels rotated under {len(ticks)} bars"
            legends = [lg for lg in (ax.get_legend(), *fig.legends) if lg is not None]
            for lg in legends:
                box = lg.get_window_extent(renderer)
                assert not any(overlaps(box, b.get_window_extent(renderer)) for b in bars), f"{ax.get_title()!r}: legend over a bar"
    scatter = figures[2][0].axes[0]
    points = sum(len(c.get_offsets()) for c in scatter.collections)
    named = {t.get_text() for t in scatter.texts}
    assert points == 5 and set(WORKERS) | {"router", "oracle"} <= named, named  # every point named beside it


def test_a_head_without_quality_predictions_gets_the_cost_curve_too(tmp_path, figures):
    from fugu_pipeline.evaluate.reports import add_policy_cost_curve

    inp = inputs(quality_head=False)
    rep = evaluation_report(inp, n_boot=200)
    assert "cost_quality_curve" not in rep  # what the SFT, RL and CMA-ES reports had: points only
    add_policy_cost_curve(rep, inp)
    curve = rep["cost_quality_curve"]
    assert rep["cost_quality_curve_of"] == "router probabilities"
    assert curve[0]["lambda"] == 0 and curve[0]["mean_cost_usd"] == pytest.approx(rep["router_mean_cost_usd"])
    assert curve[-1]["mean_cost_usd"] < curve[0]["mean_cost_usd"]  # a high λ buys the cheap worker
    plot_report(rep, tmp_path, "test")
    lines = [ln for ln in figures[2][0].axes[0].get_lines() if len(ln.get_xdata()) > 1]
    assert lines and "router probabilities" in lines[0].get_label()


def test_a_report_written_again_from_the_same_figures_keeps_its_plots_and_a_change_redraws(tmp_path, figures):
    """A re-run of the main job writes each report again from the same figures: the PNGs already there
    are kept (nothing drawn), byte for byte what a fresh draw gives; a changed figure draws again."""
    from fugu_pipeline.evaluate.plots import stored_key

    rep = evaluation_report(inputs(quality_head=True), n_boot=200)
    first = plot_report(rep, tmp_path / "a", "test")
    assert len(figures) == 3 and all(stored_key(p) for p in first)
    drawn = {p.name: p.read_bytes() for p in first}
    again = plot_report(rep, tmp_path / "a", "test")
    assert len(figures) == 3  # nothing drawn the second time
    assert {p.name: p.read_bytes() for p in again} == drawn
    fresh = plot_report(rep, tmp_path / "b", "test")  # the same figures drawn anew elsewhere: the same bytes
    assert len(figures) == 6 and {p.name: p.read_bytes() for p in fresh} == drawn

    rep["king_composite"] = 0.5  # a figure no plot shows (a re-run has a king to compare with): nothing drawn
    plot_report(rep, tmp_path / "a", "test")
    assert len(figures) == 6
    rep["router_utility"] += 0.01  # drawn on the summary plot only: that one is drawn again
    plot_report(rep, tmp_path / "a", "test")
    assert len(figures) == 7 and (tmp_path / "a" / "test_summary.png").read_bytes() != drawn["test_summary.png"]
    (tmp_path / "a" / "test_curve.png").write_bytes(b"not a png")  # a damaged file is drawn again too
    plot_report(rep, tmp_path / "a", "test")
    assert len(figures) == 8 and (tmp_path / "a" / "test_curve.png").read_bytes() == drawn["test_curve.png"]


def test_each_plot_reads_only_the_figures_its_key_covers(tmp_path):
    """A plot kept on a re-run must not show a figure its key leaves out (it would show the old one):
    every key each drawing function reads from the report is in the list it declares."""
    from fugu_pipeline.evaluate import plots

    class Reads(dict):
        def __init__(self, data):
            super().__init__(data)
            self.read = set()

        def __getitem__(self, k):
            self.read.add(k)
            return super().__getitem__(k)

        def get(self, k, default=None):
            self.read.add(k)
            return super().get(k, default)

    inp = inputs(quality_head=True)
    rep = evaluation_report(inp, n_boot=200)
    rep["apgr"] = {"curve": {"strong_share": [0, 0.5, 1], "pgr": [0, 0.6, 1]}, "apgr": 0.6, "strong_worker": "code-expert"}
    for fn in (plots._summary, plots._per_domain, plots._apgr, plots._cost_quality):
        seen = Reads(rep)
        fn.__wrapped__(seen, tmp_path / f"{fn.__name__}.png")
        assert fn.fields and seen.read <= set(fn.fields), (fn.__name__, seen.read - set(fn.fields))
    assert plots.plot_budget.fields == ()  # the whole budget section


def png_width(path) -> int:
    """The width a PNG's header gives (bytes 16-20 of its IHDR chunk)."""
    import struct

    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">I", head[16:20])[0]


def budget_section() -> dict:
    """A budget section as a report holds it: three workers, the router's λ curve, a cap and the point chosen."""
    workers = [{"name": w, "share": s, "quality": q} for w, s, q in
               (("math-expert", 11.8, 0.71), ("code-expert", 15.7, 0.76), ("general-expert", 1.0, 0.74))]
    curve = [{"share": 1.0 + k, "quality": 0.74 + 0.02 * k} for k in range(9)]
    chosen = {"share": 1.0, "quality": 0.74}
    return {"workers": workers, "router_curve": curve, "router_pareto": curve, "reference_worker": "general-expert",
            "reference_cost_usd_per_1k": 0.5,
            "operating_point": {"test": chosen, "budget": {"share": 0.3}, "lambda": 0.02,
                                "describe": "cap 30% of the strongest worker's cost (margin 1.645 SE)"}}


def test_every_plot_fits_the_dagster_ui_dialog(tmp_path, figures):
    """The UI shows a metadata image at its own size in a dialog at most 80% of the window wide: every
    plot (the report's, a report of many domains, the budget plot, the training curves) is at most
    640 pixels wide. Before: the summary 1,650, the training curves 1,200, the others 1,050."""
    from types import SimpleNamespace

    from fugu_pipeline.defs.training import curves_png

    rep = evaluation_report(inputs(quality_head=True), n_boot=200)
    paths = plot_report(rep, tmp_path / "three", "test")
    many = {**rep, "per_domain": [{**rep["per_domain"][0], "domain": f"benchmark-{k:02d}"} for k in range(14)]}
    paths.append(plot_report(many, tmp_path / "many", "test")[1])
    paths.append(plot_budget(budget_section(), tmp_path / "test_budget.png"))
    result = SimpleNamespace(method="sft", head_kind="layernorm_linear", param_count=323, best_epoch=3,
                             curves={"train_loss": [1.2, 1.1, 1.05, 1.04], "val_utility": [0.7, 0.8, 0.85, 0.83]})
    (tmp_path / "curves.png").write_bytes(curves_png(result))
    paths.append(tmp_path / "curves.png")
    widths = {p.name if p.parent.name != "many" else "many domains": png_width(p) for p in paths}
    assert len(widths) == 6 and all(100 < w <= DIALOG_PX for w in widths.values()), widths
    budget = figures[-2][0]  # the budget plot's cap says "cap" once
    labels = [t.get_text() for lg in budget.legends for t in lg.get_texts()]
    assert "cap 30% of the strongest worker's cost" in labels and not any("cap (cap" in x for x in labels), labels
