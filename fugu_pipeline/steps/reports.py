"""The held-out report of a one-step checkpoint (`eval_report_sft`, `_rl`, `_es`, `_heads`).

Every metric and baseline on the test rows, on the checkpoint's own features, and the composite
against the current king (its live term calls the configured workers; their outcomes are kept
per head and task in `data/live/`), written to `<checkpoint>/reports/test.json` with its plots.

Content-addressed: the fingerprint of (code version, the checkpoint's content hash, the matrix's
data version, the composite's settings, the live workers and judge) names a record; when it exists
and its report is on disk, the report is read back and nothing is evaluated or called. The king's
figures in a report are the king's when it was computed (the promotion step scores the king again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fugu_pipeline.steps import records
from fugu_pipeline.steps.versions import code_version

STEP = "report"


@dataclass
class Report:
    rep: dict  # the report as written (every figure, the composite)
    path: Path  # test.json
    plots: list[Path]
    record: records.StepRecord


def report_code_version() -> str:
    return code_version(__name__, "fugu_pipeline.evaluate.reports", "fugu_pipeline.policies.oneshot.contest",
                        "fugu_pipeline.policies.oneshot.default_report")


def evaluate_oneshot(checkpoint_path: str | Path, source, models_dir: Path, composite, *, matrix_version: str,
                     live=None, tasks=None, live_key: str = "", log: Callable[[str], None] = print) -> Report:
    """The report of `checkpoint_path` (see the module docstring). `source`: the FeatureSource
    (each checkpoint on its own features); `composite`: the policy's composite settings;
    `live_key`: what identifies the live workers and judge. Raises ValueError in one line when the
    checkpoint cannot be scored on these rows."""
    from fugu_pipeline.evaluate.reports import write_report
    from fugu_pipeline.policies.oneshot.contest import add_composite
    from fugu_pipeline.policies.oneshot.default_report import served_report
    from fugu_pipeline.route.shipped import served_point_of
    from fugu_pipeline.policies.registry import load_checkpoint

    ckpt = load_checkpoint(checkpoint_path)
    point = served_point_of(ckpt)[0]  # beside the weights, not in their hash: a new point is a new report
    fp = records.fingerprint(step=STEP, code=report_code_version(), checkpoint=ckpt.manifest.content_hash,
                             matrix=matrix_version, composite=composite.model_dump(mode="json"), live=live_key,
                             split="test", served=None if point is None else point.model_dump(mode="json"))
    found = records.find(models_dir, STEP, fp)
    if found is not None:
        path = Path(models_dir) / found.output["report"]
        rep = json.loads(path.read_text(encoding="utf-8"))
        log(f"report of {Path(checkpoint_path).name}: inputs unchanged since {found.when()}: {path} kept, nothing evaluated")
        return Report(rep, path, [path.parent / p for p in rep.get("plots", [])], found)
    data, problems = source.for_checkpoint(ckpt)  # the rows with the checkpoint's own features (contract checked)
    if problems:
        raise ValueError(f"{checkpoint_path} cannot be scored with this encoder: " + "; ".join(problems))
    rep = served_report(ckpt, data, "test")  # as it serves: at its operating point with no cap asked
    add_composite(rep, ckpt, data, models_dir, composite, live=live, tasks=tasks, features=source)
    path, plots = write_report(rep, Path(checkpoint_path) / "reports", "test")
    rel = records.relative(path, models_dir)
    record = records.keep(models_dir, STEP, fp, {"report": rel}, needs=[path, *plots])
    return Report(json.loads(path.read_text(encoding="utf-8")), path, plots, record)
