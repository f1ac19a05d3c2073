"""The answer-aware cascade: its plans, verifier and frontier (`router_cascade`, the cascade part of
`fugu-lite train`), and its held-out report (`eval_report_cascade`).

The cascade is fitted over the workers' recorded replies, chosen out of fold against the one-shot
heads the set kept (`steps/heads.py`: their out-of-fold scores) and "always the best worker", on the
features of the set's selected head. Skipped, and recorded as skipped with the reason, when the
config turns it off or the matrix holds no replies.

Content-addressed like every step: (code version, the head set's fingerprint, the `cascade:` block,
folds and seed, the matrix's data version) for the fit; (code version, the cascade's and the
one-shot head's content hashes, the matrix's data version) for the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fugu_pipeline.steps import records
from fugu_pipeline.steps.heads import read_oof, write_policy
from fugu_pipeline.steps.inputs import Rows
from fugu_pipeline.steps.versions import code_version

STEP = "cascade"
REPORT_STEP = "cascade_report"


def cascade_code_version() -> str:
    return code_version(__name__, "fugu_pipeline.policies.cascade.train")


def cascade_report_code_version() -> str:
    return code_version(__name__, "fugu_pipeline.policies.cascade.evaluate")


def heads_settings(rows: Rows, heads: records.StepRecord, models_dir: Path):
    """The encoder settings of the head set's features (its selected head's contract), on the
    command's device and dtype: the cascade reads the same rows the heads were chosen on."""
    from fugu_pipeline.route.router import encoder_settings_for
    from fugu_pipeline.policies.registry import load_checkpoint

    contract = load_checkpoint(Path(models_dir) / heads.output["selected"]).manifest.feature_contract
    return encoder_settings_for(contract, rows.settings.device, rows.settings.dtype, rows.model)


def fit_cascade(cfg, rows: Rows, models_dir: Path, heads: records.StepRecord, *,
                log: Callable[[str], None] = print) -> records.StepRecord:
    """Fit (or find already fitted) the cascade against the head set `heads`; returns its record,
    whose `output` holds `cascade` (the checkpoint, None when skipped), `shipped` (the checkpoint that
    ships: the cascade's or a one-shot head's), `policy` (cascade, one-shot or best worker) and
    `skipped` (why, when skipped); `summary["lines"]`: the choice, in words; `summary["policy"]`: the
    description of what ships (`route/shipped.py`), written beside it as `policy.json`."""
    cc = cfg.cascade
    block = {"cascade": cc.model_dump(mode="json"), "folds": cfg.folds, "seed": cfg.seed}
    fp = records.fingerprint(step=STEP, code=cascade_code_version(), heads=heads.fingerprint, config=block,
                             matrix=rows.matrix_version())
    found = records.find(models_dir, STEP, fp)
    if found is not None:
        log(f"cascade: inputs unchanged since {found.when()}: "
            + (f"checkpoint {found.output['cascade']} kept, nothing fitted" if found.output.get("cascade")
               else f"skipped then too ({found.output.get('skipped')})"))
        if found.output.get("shipped"):
            _ships(found.summary.get("policy"), Path(models_dir) / found.output["shipped"], heads, models_dir)
        return found
    if cc.enabled == "off":  # nothing to read
        return records.keep(models_dir, STEP, fp, {"cascade": None, "skipped": "cascade.enabled is off"})
    from fugu_pipeline.policies.cascade.train import train_cascade

    settings = heads_settings(rows, heads, models_dir)
    data = rows.read(settings)
    skipped: list[str] = []
    scores, at_point, at_cap, at_shares = read_oof(heads, data.task_ids)
    result = train_cascade(data, rows.matrix, settings, rows.cache_root, cfg, scores,
                           [_Saved(models_dir, s) for s in heads.output["saved"]], models_dir,
                           lambda m: (skipped.append(m), log(m)), heads.output.get("features"), head_routes=at_point,
                           cap_routes=at_cap, share_routes=at_shares)
    if result is None:
        why = skipped[-1] if skipped else "no replies"
        return records.keep(models_dir, STEP, fp, {"cascade": None, "skipped": why})
    output = {"cascade": records.relative(result.path, models_dir), "shipped": records.relative(result.shipped_path, models_dir), "policy": result.shipped,
              "selected": heads.output["selected"]}
    policy = result.policy.model_dump(mode="json")  # the one description: printed, saved beside, served
    _ships(policy, result.shipped_path, heads, models_dir)
    return records.keep(models_dir, STEP, fp, output, needs=[result.path, result.shipped_path],
                        summary={"lines": result.lines(), "policy": policy})


def _ships(policy: dict | None, shipped: Path, heads: records.StepRecord, models_dir: Path) -> None:
    """`policy.json` beside the checkpoint that ships; the heads step's beside its selected head is
    taken away when something else ships (that head is then not what `train` said ships)."""
    selected = Path(models_dir) / heads.output["selected"]
    if Path(shipped).resolve() != selected.resolve():
        from fugu_pipeline.route.shipped import POLICY_FILE

        (selected / POLICY_FILE).unlink(missing_ok=True)
    write_policy(policy, Path(shipped))


class _Saved:
    """A saved head of the set as `train_cascade` reads it (name, path, selected)."""

    def __init__(self, models_dir: Path, saved: dict):
        self.name, self.kind, self.selected = saved["name"], saved["kind"], saved["selected"]
        self.path = Path(models_dir) / saved["path"]


def evaluate_cascade(cascade: records.StepRecord, rows: Rows, models_dir: Path, heads: records.StepRecord, *,
                     log: Callable[[str], None] = print) -> dict | None:
    """The held-out report of the cascade (every policy against the one-shot head and the workers,
    the frontier and its plot), read back when its inputs are unchanged; None when it was skipped.
    The report dict carries `report_path`."""
    if not cascade.output.get("cascade"):
        return None
    path = Path(models_dir) / cascade.output["cascade"]
    one_shot = Path(models_dir) / cascade.output["selected"]
    fp = records.fingerprint(step=REPORT_STEP, code=cascade_report_code_version(), cascade=path.name,
                             one_shot=one_shot.name, matrix=rows.matrix_version())
    found = records.find(models_dir, REPORT_STEP, fp)
    if found is not None:
        target = Path(models_dir) / found.output["report"]
        log(f"cascade report: inputs unchanged since {found.when()}: {target} kept, nothing evaluated")
        return {**json.loads(target.read_text(encoding="utf-8")), "report_path": str(target)}
    from fugu_pipeline.policies.cascade.evaluate import evaluate_cascade as evaluate

    settings = heads_settings(rows, heads, models_dir)
    rep = evaluate(path, rows.read(settings), rows.matrix, settings, rows.cache_root, one_shot=one_shot)
    target = Path(rep["report_path"])
    needs = [target, *([Path(rep["frontier_png"])] if rep.get("frontier_png") else [])]
    records.keep(models_dir, REPORT_STEP, fp, {"report": records.relative(target, models_dir)}, needs=needs)
    return rep
