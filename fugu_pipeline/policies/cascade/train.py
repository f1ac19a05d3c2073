"""The cascade step of `fugu-lite train` and the `router_heads` asset: after the one-shot heads are
chosen, fit a cascade over the workers' replies, compare every policy out of fold against "always
the best worker", save the cascade checkpoint and say which policy ships.

Skipped, in one line, when the matrix holds no replies (`cascade.enabled: auto`, the default);
`enabled: on` makes that an error, `off` skips it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fugu_pipeline.features.routing_data import RoutingData, TrainingDataError
from fugu_pipeline.matrix.answers import read_answers
from fugu_pipeline.matrix.read import RewardMatrixError
from fugu_pipeline.policies.cascade.answer_features import trained_stats
from fugu_pipeline.policies.cascade.cross_encoder import CROSS_STAT
from fugu_pipeline.policies.cascade.cross_encoder_use import cross_encoder_step
from fugu_pipeline.policies.cascade.fit import CascadeFit, answer_inputs, fit_cascade
from fugu_pipeline.policies.cascade.frontier import frontier_lines
from fugu_pipeline.policies.cascade.groups import group_label
from fugu_pipeline.policies.cascade.save import save_cascade
from fugu_pipeline.policies.cascade.ship import head_of
from fugu_pipeline.route.shipped import ShippedPolicy


@dataclass
class CascadeResult:
    fit: CascadeFit
    path: Path  # the cascade checkpoint (with the best worker alone when that is what ships)
    shipped: str  # "cascade", "one-shot" or "best worker"
    shipped_path: Path  # the checkpoint that ships: the cascade's, or the one-shot head's
    policy: ShippedPolicy | None = None  # what ships, as train prints it and route, serve and evaluate report it

    def lines(self) -> list[str]:
        from fugu_pipeline.policies.cascade.choice import table_lines
        from fugu_pipeline.train.selection import STRONGEST

        f = self.fit
        shipped = self.policy.lines() if self.policy else [f"shipped policy: {self.shipped} — {f.reason}"]
        if not f.choices:  # nothing could be chosen: the strongest worker ships, and why
            return shipped
        out = [f"policies, out of fold over the non-test rows ({f.objective}); gain over {f.baseline} and accuracy − "
               f"{STRONGEST}, each with its paired 95% interval:"]
        for c in f.candidates:
            mark = "*" if c.name == f.selected else " "
            out.append(f"{mark} {c.kind:<11} {c.name}: {c.mean:.4f} (quality {c.quality:.4f}, ${c.cost_usd * 1000:.4g} per "
                       f"1,000) gain {c.gain:+.4f} [{c.low:+.4f}, {c.high:+.4f}]; accuracy − strongest {c.vs_strongest:+.4f} "
                       f"[{c.vs_low:+.4f}, {c.vs_high:+.4f}]" + (f" {c.note}" if c.note else ""))
        if getattr(f, "groups", None) is not None:
            by = f.groups.by
            out.append(f"per {by}, out of fold (one plan per {by}, the plans chosen together so that the whole keeps "
                       f"within the cap; accuracy − {STRONGEST} on the {by}'s rows):" if f.groups.shared_cap else
                       f"per {by}, out of fold (each {by}'s cheapest choice not significantly below {STRONGEST} "
                       f"on its rows; the whole held to the same rule):")
            out += f.groups.lines()
        for d, ch in f.choices.items():
            where = "all prompts" if d == "*" else group_label(d)
            out.append(f"  cascade for {where}: {ch.plan.describe()} (validation quality {ch.quality:.4f}, "
                       f"${ch.cost * 1000:.4g} per 1,000, {ch.considered} plans considered)")
        out += frontier_lines(f.frontier)
        out.append(f"verifier: out-of-fold AUC {f.verifier_figures['oof_auc']:.3f}, log-loss {f.verifier_figures['oof_logloss']:.4f}")
        if f.cap_rows:
            out += table_lines(f.cap_rows, "out of fold over the non-test rows, at caps of the strongest worker's cost:")
        return out + shipped


def one_shot_heads(heads_report) -> dict:
    """{"one-shot <name>": out-of-fold routing scores} of each kind's best head and the ensemble,
    the selected one first (the table's one-shot router)."""
    heads = {}
    for c in heads_report.candidates:
        if c.name in heads_report.best_per_kind.values():
            heads[f"one-shot {c.name}"] = c.scores
    if heads_report.ensemble is not None:
        heads[f"one-shot {heads_report.ensemble['name']}"] = heads_report.ensemble["scores"]
    first = f"one-shot {heads_report.ensemble['name'] if heads_report.selected == 'ensemble' and heads_report.ensemble else heads_report.selected}"
    return {**({first: heads[first]} if first in heads else {}), **heads}


def train_cascade(data: RoutingData, db_path: Path, settings, cache_root: Path, cfg, heads_report,
                  saved: list, models_dir: Path, log=print, metrics: dict | None = None,
                  head_routes: dict | None = None, cap_routes: dict | None = None,
                  share_routes: dict | None = None) -> CascadeResult | None:
    """Fit and save the cascade (see the module docstring). `heads_report` and `saved` are the
    one-shot selection (`fit.select_heads`, or the `one_shot_heads` scores it kept) and its saved
    heads (`fit_and_save`); `settings` the encoder settings of `data`'s features (the replies are read
    by the same model); `head_routes`: each head's out-of-fold route at its default operating point
    (what it serves with no cap asked), which its candidate is scored at; `cap_routes`: its route at
    the pooled cap, which its candidate "at the cap" is scored at; `share_routes`: the selected
    head's at each share of the table at caps."""
    cc = cfg.cascade
    if cc.enabled == "off":
        return None
    try:
        grid = read_answers(db_path, data.task_ids, data.worker_ids)
    except RewardMatrixError as exc:
        if cc.enabled == "on":
            raise TrainingDataError(f"cascade.enabled is on, but {exc}") from None
        log(f"cascade: skipped ({str(exc).split(': ', 1)[-1].split(':')[0]})")
        return None
    cross = cross_encoder_step(cc, data, grid, cfg.seed, log)  # None: off, or its encoder is missing (one line)
    inputs = answer_inputs(data, grid, settings, cache_root, progress=None, encode=cc.encode_replies,
                           stat_names=trained_stats(cc.run_examples))
    heads = heads_report if isinstance(heads_report, dict) else one_shot_heads(heads_report)
    fit = fit_cascade(data, grid, inputs, cc, cfg.folds, cfg.seed, heads, log, cross_encoder=cross, head_routes=head_routes,
                      cap_routes=cap_routes, share_routes=share_routes)
    path = save_cascade(models_dir, data, fit, inputs.answer.shape[2] + int(CROSS_STAT in fit.stat_names), metrics,
                        training_config={"cascade": cc.model_dump(), "folds": cfg.folds, "seed": cfg.seed})
    shipped, shipped_path = fit.selected_kind, path
    selected = next((s.path for s in saved if s.selected), None)  # the table at caps' one-shot row
    if shipped == "one-shot":
        name = head_of(fit.selected).removeprefix("one-shot ")
        shipped_path = next((s.path for s in saved if s.name == name), None) or selected
    from fugu_pipeline.policies.cascade.ship import shipped_policy

    return CascadeResult(fit, path, shipped, shipped_path, shipped_policy(fit, shipped_path, head_routes, path, selected))

