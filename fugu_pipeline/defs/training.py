"""Dagster helpers for the router training assets: what a training run shows in the UI."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from fugu_pipeline.defs.metadata import rounded

if TYPE_CHECKING:
    from fugu_pipeline.train.result import TrainResult

# curves drawn on the left axis (loss / fitness) vs the right axis (validation utility)
_VAL_CURVES = ("val_utility", "val_mean", "val_best")


CURVES_FILE = "reports/training_curves.png"  # beside the checkpoint, as its held-out report's plots


class GatheredLog:
    """A training loop's progress lines (one an epoch or generation) for the step's run log: written
    as one event (one block) every `every_s` seconds and when the loop ends, not one event a line.
    Each Dagster event is a commit to the run's event-log database (about 7 ms of CPU and 30 ms of
    wall time on a shared core); a short training run logged 20 to 40 of them."""

    def __init__(self, log: Callable[[str], None], every_s: float = 10.0):
        self.log, self.every_s, self.lines, self.since = log, every_s, [], time.monotonic()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if time.monotonic() - self.since >= self.every_s:  # a long run still shows its progress
            self.flush()

    def flush(self) -> None:
        if self.lines:
            self.log("\n".join(self.lines))
        self.lines, self.since = [], time.monotonic()

    def __enter__(self) -> "GatheredLog":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()  # a failed run keeps the lines it wrote


def curves_png(result: "TrainResult", path: Path | None = None) -> bytes:
    """The training curves as a PNG, in the report style (evaluate/plots.py): train loss or fitness
    per epoch/generation, and validation utility, with the kept epoch marked. With `path`, the PNG is
    kept there, and one already there drawn from the same curves by the same code is returned as it
    is (a re-run that trains the same checkpoint draws nothing)."""
    from fugu_pipeline.evaluate.plots import COLORS, MAX_WIDTH_IN, plot_key, png_bytes, stored_key
    from fugu_pipeline.files import atomic_write

    c = result.curves
    step = "generation" if result.method == "es" else "epoch"
    key = plot_key("curves_png", __name__, result.method, result.head_kind, result.param_count, result.best_epoch, c)
    if path is not None and key is not None:
        try:
            kept = Path(path).read_bytes()
        except OSError:
            kept = b""
        if stored_key(kept) == key:
            return kept

    def draw(fig, axes):
        ax_train, ax_val = axes
        for name, ys in c.items():
            if name in _VAL_CURVES or name == "val_generation" or not ys:
                continue
            ax_train.plot(range(1, len(ys) + 1), ys, label=name)
        ax_train.set_xlabel(step)
        ax_train.set_ylabel("loss" if result.method != "es" else "fitness (greedy utility)")
        ax_train.set_title("train loss" if result.method != "es" else "train fitness (greedy utility)")
        for name in _VAL_CURVES:
            ys = c.get(name) or []
            if ys:
                xs = c.get("val_generation") or range(1, len(ys) + 1)
                ax_val.plot(list(xs), ys, marker=".", label=name)
        ax_val.axvline(result.best_epoch, color=COLORS["mark"], linestyle="--", linewidth=1, label=f"kept ({step} {result.best_epoch})")
        ax_val.set_xlabel(step)
        ax_val.set_ylabel("mean utility (validation)")
        ax_val.set_title("validation utility")
        for ax in (ax_train, ax_val):
            ax.legend()
        fig.suptitle(f"{result.method} · {result.head_kind} · {result.param_count:,} params")

    png = png_bytes(draw, MAX_WIDTH_IN, 5.6, nrows=2, key=key)
    if path is not None:
        atomic_write(path, png)
    return png


def train_result_metadata(checkpoint_path: str | Path) -> dict[str, dg.MetadataValue]:
    """Materialization metadata for a router training asset, from the checkpoint's manifest (the
    same whether it was trained now or kept from an earlier run with the same inputs): the curve plot
    (kept as `<checkpoint>/reports/training_curves.png`), the parameter count, the kept epoch,
    validation utilities against the baselines, and where the checkpoint is."""
    from types import SimpleNamespace

    from fugu_pipeline.train.checkpoints import MANIFEST_FILE, Manifest

    man = Manifest.model_validate_json((Path(checkpoint_path) / MANIFEST_FILE).read_text(encoding="utf-8"))
    m = man.metrics
    drawn = SimpleNamespace(method=man.method, head_kind=man.head_kind, param_count=man.param_count,
                            best_epoch=int(m.get("best_epoch", 0)), curves=man.curves)
    png = base64.b64encode(curves_png(drawn, Path(checkpoint_path) / CURVES_FILE)).decode("ascii")
    return {
        "curves": dg.MetadataValue.md(f"![{man.method} training curves](data:image/png;base64,{png})"),
        "method": dg.MetadataValue.text(man.method),
        "head_kind": dg.MetadataValue.text(man.head_kind),
        "param_count": dg.MetadataValue.int(man.param_count),
        "best_epoch": dg.MetadataValue.int(drawn.best_epoch),
        "val_utility": dg.MetadataValue.float(rounded(float(m["val_utility"]))),
        "val_best_fixed_utility": dg.MetadataValue.float(rounded(float(m["val_best_fixed_utility"]))),
        "val_oracle_utility": dg.MetadataValue.float(rounded(float(m["val_oracle_utility"]))),
        "train_utility": dg.MetadataValue.float(rounded(float(m["train_utility"]))),
        "data_version": dg.MetadataValue.text(man.data_version),
        "wall_s": dg.MetadataValue.float(round(float(man.wall_s or 0.0), 2)),
        "checkpoint": dg.MetadataValue.path(str(checkpoint_path)),
    }
