"""The configured set of one-step heads (`configs/train.yaml`: kNN, domain prior, ridge, MLP,
ensemble, ...): what `router_heads` and `fugu-lite train` run.

The features are resolved from the command's encoder settings and the config's `features:` block
(lexical block, layer sets and prompt rules chosen on the selected head's out-of-fold figure, a
flag or run config overriding the file); each grid point is scored out of fold over the non-test
rows, the rule chosen by a nested check, each kind's best refitted and saved to
`<models>/<kind>/<hash>/` with `budget.json` (and the default operating point) beside it, and
beside the selected head `policy.json`: the description of what ships when no cascade is chosen
instead (`route/shipped.py`; the cascade step writes its own beside what it ships).

The set's record keeps, beside the checkpoints, the out-of-fold routing scores of each kind's best
head and the ensemble (`oof.npz`): the one-shot policies a cascade is chosen against
(`steps/cascade.py`), so the cascade is a step of its own that reads them instead of fitting the set again.

Content-addressed: the fingerprint of (code version, resolved config, the matrix's data version,
the features asked for, `force`) names a record; when it exists, nothing is fitted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fugu_pipeline.steps import records
from fugu_pipeline.steps.inputs import Rows, config_file, load_step_config, unchanged_since_read
from fugu_pipeline.steps.oneshot import StageError
from fugu_pipeline.steps.versions import code_version

STEP = "heads"
CONFIG_FILE = "train.yaml"
OOF_FILE = "oof.npz"


def heads_code_version() -> str:
    return code_version(__name__, "fugu_pipeline.policies.oneshot.fit", "fugu_pipeline.train.feature_choice",
                        "fugu_pipeline.policies.oneshot.default_train")


def heads_config(root: Path, given: str | Path | None = None):
    """(TrainSetConfig, the file it came from or None, its settings version)."""
    from fugu_pipeline.policies.oneshot.configs import TrainSetConfig

    path = config_file(root, given, CONFIG_FILE)
    cfg, version = load_step_config(path, TrainSetConfig)
    return cfg, path, version


def fit_heads(cfg, rows: Rows, models_dir: Path, *, cfg_path: Path | None = None, cfg_version: str = "absent",
              force: bool = False, lexical: bool | None = None, layer_sets=None, prompt_rules: str | None = None,
              log: Callable[[str], None] = print) -> records.StepRecord:
    """Fit (or find already fitted) the head set; returns its record. `output`: `checkpoints` and
    `selected` (paths), `selected_kind`, `saved` (each head: kind, name, path, selected, figures),
    `features` (the choice recorded in every manifest); `summary`: the rule, the protocol, why the
    selected one, the default operating point. Raises ConfigError, TrainingDataError, LayerSetError
    or StageError in one line."""
    from fugu_pipeline.train.feature_choice import describe_features, heads_features

    settings, sets, rules = heads_features(rows.settings, cfg.features, lexical=lexical, layer_sets=layer_sets,
                                           prompt_rules=prompt_rules)
    log(describe_features(settings, sets, rules))
    fp = records.fingerprint(step=STEP, code=heads_code_version(), config=cfg.model_dump(mode="json"),
                             matrix=rows.matrix_version(), features=rows.encoder_version(settings),
                             layer_sets=[list(s) for s in sets] if sets else None, prompt_rules=rules, force=force)
    found = records.find(models_dir, STEP, fp)
    if found is not None:
        log(f"heads: inputs unchanged since {found.when()}: {len(found.output['saved'])} checkpoints kept, nothing fitted")
        write_policy(found.summary.get("policy"), Path(models_dir) / found.output["selected"])
        return found
    folder = records.scratch(models_dir, STEP)
    try:
        report, data, recorded = _fit(cfg, rows, models_dir, settings, sets, rules, force, log)
        routes: dict = {}
        at_cap: dict = {}
        at_shares: dict = {}
        point = _calibrate(report, data, cfg, log, routes, at_cap, at_shares)
        _keep_oof(folder / OOF_FILE, report, data, routes, at_cap, at_shares)
        changed = unchanged_since_read(cfg_path, cfg_version)
        if changed:
            raise StageError(changed)
    except BaseException:
        records.discard(folder)
        raise
    rel = lambda p: records.relative(p, models_dir)  # noqa: E731
    output = {"checkpoints": [rel(s.path) for s in report.saved], "selected": rel(report.selected_path()),
              "selected_kind": report.selected_kind, "features": recorded,
              "saved": [{"kind": s.kind, "name": s.name, "path": rel(s.path), "selected": s.selected,
                         "figures": dict(s.figures)} for s in report.saved]}
    policy = _selected_policy(report, point)  # what ships when no cascade is chosen instead
    summary = {"reason": report.reason, "rule": report.rule, "rule_reason": report.rule_reason,
               "protocol": report.protocol, "objective": report.objective, "selected": report.selected,
               "seconds": report.seconds, "config": str(cfg_path) if cfg_path else "built-in defaults",
               **({"default_point": point.describe(), "default_point_reason": point.reason,
                   "default_lines": _default_lines(point)} if point else {}), "policy": policy}
    write_policy(policy, report.selected_path())
    return records.keep(models_dir, STEP, fp, output, needs=[s.path for s in report.saved], summary=summary, folder=folder)


def absolute(record: records.StepRecord, models_dir: Path) -> dict:
    """The set's output with absolute paths (what the asset hands on and the command prints)."""
    out = dict(record.output)
    m = Path(models_dir)
    out["checkpoints"] = [str(m / p) for p in out["checkpoints"]]
    out["selected"] = str(m / out["selected"])
    out["saved"] = [{**s, "path": str(m / s["path"])} for s in out["saved"]]
    return out


def _fit(cfg, rows: Rows, models_dir: Path, settings, sets, rules, force, log):
    from fugu_pipeline.train.feature_choice import fit_choosing_features
    from fugu_pipeline.policies.oneshot.fit import fit_and_save, select_heads
    from fugu_pipeline.policies.oneshot.reuse import PredictionMemo

    memo = PredictionMemo()  # a family part whose inputs no feature variant changes is fitted once
    selection, data, recorded = fit_choosing_features(
        settings, rows.read, lambda d: select_heads(d, cfg, log, force, memo), score=lambda sel: sel[0].val_score,
        prompt_rules=rules, layer_sets=sets, log=log, prefill=rows.prefill)
    report = fit_and_save(data, models_dir, cfg, log=log, force=force, selection=selection, metrics=recorded)
    return report, data, recorded


def _calibrate(report, data, cfg, log, routes: dict, at_cap: dict, at_shares: dict):
    """budget.json beside each quality head, with the default operating point (the selected head's
    returned; each head's out-of-fold route at its point into `routes`, under the cascade's pooled
    cap its route at that cap into `at_cap`, and the selected head's at each share of the cascade's
    table at caps into `at_shares`)."""
    from fugu_pipeline.policies.cascade.choice import TABLE_SHARES
    from fugu_pipeline.policies.oneshot.default_train import calibrate_saved

    c = cfg.cascade  # the rule's settings, one set for the cascade's choice and the default point
    return calibrate_saved(report.saved, data, log, margin=c.margin, n_boot=c.n_boot, seed=cfg.seed, routes=routes,
                           floor=c.floor, groups=c.groups, min_rows=c.search.min_domain_rows, min_gap=c.cluster_min_gap,
                           group_floor=c.group_floor, cap=c.cap if not c.domain_caps else None, cap_routes=at_cap,
                           shares=TABLE_SHARES, share_routes=at_shares)


def _selected_policy(report, point) -> dict:
    """The description of the selected head as it serves with no cap asked (`route/shipped.py`): its
    default operating point and the out-of-fold figures that point was chosen on."""
    from fugu_pipeline.route.shipped import ShippedPolicy, checkpoint_tag

    tag, h = checkpoint_tag(report.selected_path())
    name = next(s.name for s in report.saved if s.selected)
    figures = {} if point is None else {
        "strongest_worker": point.strongest_worker, "oof_accuracy": point.oof_accuracy, "oof_cost_usd": point.oof_cost_usd,
        "strongest_accuracy": point.strongest_accuracy, "strongest_cost_usd": point.strongest_cost_usd,
        "difference": point.difference, "n_rows": point.n_rows}
    return ShippedPolicy(kind="one-shot", name=f"one-shot {name}", checkpoint=tag, content_hash=h,
                         operating_point=point, reason=point.reason if point else report.reason,
                         **figures).model_dump(mode="json")


def write_policy(policy: dict | None, checkpoint_dir: Path) -> None:
    """`policy.json` beside the checkpoint that ships, from the record's description (written again
    when the record is found, so the file always says what the last run chose)."""
    if policy:
        from fugu_pipeline.route.shipped import ShippedPolicy

        ShippedPolicy.model_validate(policy).save(checkpoint_dir)


def _default_lines(point) -> list[str]:
    from fugu_pipeline.policies.oneshot.default_point import default_lines

    return list(default_lines(point))


def _keep_oof(path: Path, report, data, routes: dict, at_cap: dict, at_shares: dict) -> None:
    """The out-of-fold routing scores of each kind's best head and the ensemble, the selected first,
    and, where a head has a default operating point, its out-of-fold route at that point (and at the
    cascade's pooled cap, where one is set); the selected head's at each share of the table at caps
    that it meets."""
    import numpy as np

    from fugu_pipeline.policies.cascade.train import one_shot_heads

    heads = one_shot_heads(report)
    pick = lambda got: {i: got[n.removeprefix("one-shot ")] for i, n in enumerate(heads)  # noqa: E731
                        if n.removeprefix("one-shot ") in got}
    np.savez(path, names=np.array(list(heads)), task_ids=np.array(data.task_ids),
             **{f"scores_{i}": np.asarray(s) for i, s in enumerate(heads.values())},
             **{f"route_{i}": np.asarray(r) for i, r in pick(routes).items()},
             **{f"caproute_{i}": np.asarray(r) for i, r in pick(at_cap).items()},
             shares=np.array([k for k, r in at_shares.items() if r is not None], dtype=np.float64),
             **{f"share_{k:g}": np.asarray(r) for k, r in at_shares.items() if r is not None})


def read_oof(record: records.StepRecord, task_ids: list[str]) -> tuple[dict, dict, dict, dict]:
    """({"one-shot <name>": out-of-fold scores}, {"one-shot <name>": out-of-fold route at its default
    operating point}, {"one-shot <name>": out-of-fold route at the cascade's pooled cap}, {share: the
    selected head's route at that share of the strongest's cost}) the set kept, for rows `task_ids`
    (the same rows in the same order, else StageError: the matrix changed since the set was fitted)."""
    import numpy as np

    with np.load(record.folder / OOF_FILE) as z:
        if list(z["task_ids"]) != list(task_ids):
            raise StageError(f"the heads of {record.folder} were fitted on other rows than the matrix holds now; "
                             "materialize router_heads again (it is stale), then the cascade")
        names = [str(n) for n in z["names"]]
        return ({n: z[f"scores_{i}"] for i, n in enumerate(names)},
                {n: z[f"route_{i}"] for i, n in enumerate(names) if f"route_{i}" in z.files},
                {n: z[f"caproute_{i}"] for i, n in enumerate(names) if f"caproute_{i}" in z.files},
                {float(k): z[f"share_{k:g}"] for k in (z["shares"] if "shares" in z.files else [])})
