"""What `fugu-lite train` ships with no flags: the cheapest policy whose out-of-fold accuracy is not
significantly below the strongest worker's; the strongest worker, with one line, when nothing
cheaper qualifies, when too few rows carry replies, or when no plan meets a cap; and the table at
20/33/50% of the strongest's cost."""

import numpy as np

from fugu_pipeline.train.selection import STRONGEST
from fugu_pipeline.policies.cascade.config import CascadeConfig
from fugu_pipeline.policies.cascade.fit import fit_cascade
from fugu_pipeline.policies.cascade.search import Cap, CascadeSearch
from fugu_pipeline_tests import cascade_fixture

FAST = CascadeSearch(thresholds=6, three_steps=False, finals=2, cheap=2)
quiet = lambda m: None  # noqa: E731


def _fig(fit, name):
    return next(c for c in fit.candidates if c.name == name)


def test_a_cheap_worker_that_agrees_with_the_strongest_on_90_percent_of_rows_is_used():
    """Quality-only weights (cost weighs nothing): the strongest worker alone must not ship when a
    cheap worker agrees with it on 90% of the rows; what ships is cheaper and, out of fold, not
    significantly below it."""
    data, grid, inputs = cascade_fixture.agreeing(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400), log=quiet)
    assert fit.policy.describe() != "[strong]", fit.reason
    won, strong = _fig(fit, fit.selected), _fig(fit, STRONGEST)
    assert won.cost_usd < 0.8 * strong.cost_usd
    assert won.vs_high >= 0 and won.vs_strongest >= -0.005  # never significantly below, within the margin
    assert "cheapest policy not significantly below always the strongest worker (strong)" in fit.reason


def test_the_strongest_ships_when_nothing_cheaper_keeps_its_accuracy():
    """No verifier signal and wrong answers that agree: every cheaper policy loses accuracy, so the
    strongest ships and the one line says why."""
    data, grid, inputs = cascade_fixture.agreeing(n=400, agree=0.6, signal=0.0)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=400), log=quiet)
    assert fit.selected == STRONGEST and fit.policy.describe() == "[strong]"
    assert "no cheaper policy is within 0.5 point of always the strongest worker (strong" in fit.reason
    assert "the strongest worker ships" in fit.reason
    strong = _fig(fit, STRONGEST)
    for c in fit.candidates:  # every cheaper policy was below it
        assert c.cost_usd >= strong.cost_usd * (1 - 1e-6) or c.vs_high < 0 or c.vs_strongest < -0.005


def test_too_few_rows_with_replies_ship_the_strongest_with_one_line():
    data, grid, inputs = cascade_fixture.make(n=300)
    rows = np.flatnonzero(data.splits != "test")
    grid.text[rows[30:], :] = None  # replies on 30 of the 240 non-test rows
    grid.final[rows[30:], :] = None
    lines = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST), log=lines.append)
    assert fit.policy.describe() == "[strong]" and fit.selected == STRONGEST
    assert fit.reason in lines and "\n" not in fit.reason
    assert fit.reason.startswith("cascade: 30 of the 240 non-test rows have replies from two or more workers, fewer "
                                 "than the 50 (cascade.min_rows)")
    assert "the strongest worker (strong) ships; import the workers' replies" in fit.reason


def test_a_cap_no_plan_meets_ships_the_strongest_with_one_line(tmp_path):
    from fugu_pipeline.policies.cascade.train import CascadeResult

    data, grid, inputs = cascade_fixture.make(n=300)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, cap=Cap(usd_per_1k=0.01)), log=quiet)
    assert fit.policy.describe() == "[strong]"
    assert fit.reason.startswith("cap: pooled: no cascade meets the cap of $0.01 per 1,000 requests on validation")
    assert "raise the cap, or add a cheaper worker; the strongest worker (strong) ships" in fit.reason
    assert CascadeResult(fit, tmp_path, fit.selected_kind, tmp_path).lines() == [f"shipped policy: best worker — {fit.reason}"]


def test_under_a_cap_every_policy_is_compared_with_the_strongest_and_the_table_is_printed(tmp_path):
    from fugu_pipeline.policies.cascade.train import CascadeResult

    data, grid, inputs = cascade_fixture.make(n=300)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300, cap=Cap(share=0.3)), log=quiet)
    strong = _fig(fit, STRONGEST)
    assert strong.kind == "strongest" and strong.note.startswith("over the cap")
    won = _fig(fit, fit.selected)
    assert won.vs_strongest == won.quality - strong.quality or abs(won.vs_strongest - (won.quality - strong.quality)) < 1e-9
    assert f"against always the strongest worker (strong): accuracy {won.vs_strongest:+.4f}" in fit.reason
    lines = CascadeResult(fit, tmp_path, fit.selected_kind, tmp_path).lines()
    assert any("accuracy − always the strongest worker" in line for line in lines)
    shares = [(r["share"], r["policy"]) for r in fit.cap_rows]
    # the fixture names two domains: the plans per domain sharing each cap are a row too
    assert shares == [(None, "strongest alone")] + [(s, k) for s in (0.2, 0.33, 0.5) for k in ("cascade", "plans per group")]
    for r in fit.cap_rows[1:]:
        assert r["accuracy"][1] <= r["accuracy"][0] <= r["accuracy"][2] and r["minus_strongest"] is not None
    assert any(line.startswith("| 33% | cascade |") for line in lines)


def test_the_held_out_cascade_report_has_the_table_at_caps_of_the_strongest_s_cost(tmp_path):
    from fugu_pipeline.policies.cascade.evaluate import cascade_report, load_cascade, report_lines
    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.agreeing(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    rep = cascade_report(load_cascade(save_cascade(tmp_path, data, fit, inputs.answer.shape[2])), data, grid, inputs)
    assert [(r["share"], r["policy"]) for r in rep["cap_rows"]][:2] == [(None, "strongest alone"), (0.2, "cascade")]
    test = data.splits == "test"
    assert rep["cap_rows"][0]["accuracy"][0] == data.quality[test, 1].mean()  # the strongest alone, on the test rows
    for r in rep["cap_rows"][1:]:
        assert r["accuracy"] is None or r["usd_per_1k"][0] <= r["share"] * 10 * 1.3  # within the cap, up to the rows' noise
    assert any(line.strip().startswith("| 50% | cascade |") for line in report_lines(rep))


def test_without_costs_nothing_is_cheaper_so_only_a_clear_gain_replaces_the_best_worker():
    import dataclasses

    data, grid, inputs = cascade_fixture.agreeing(n=300)
    data = dataclasses.replace(data, cost_usd=None, data_version="")
    lines = []
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=lines.append)
    assert any("records no cost" in line for line in lines)
    assert "over always the best worker" in fit.reason and "cheapest" not in fit.reason


def test_the_saved_cascade_records_the_validation_figure_of_the_policy_it_holds(tmp_path):
    import json

    from fugu_pipeline.policies.cascade.save import save_cascade

    data, grid, inputs = cascade_fixture.agreeing(n=400)
    fit = fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=300), log=quiet)
    manifest = json.loads((save_cascade(tmp_path, data, fit, inputs.answer.shape[2]) / "manifest.json").read_text())
    assert manifest["metrics"]["val_utility"] == _fig(fit, fit.selected).mean  # what the contest compares


def test_each_row_sets_plans_are_run_once_for_the_choice_the_frontier_and_the_final_search(monkeypatch):
    """The cost-aware choice, the table, the frontier and the final search read the same row sets
    with the same grids: each plan is run once on each set, not once for each reader (the search's
    time is most of `train`'s), the set of every non-test row included, though the table and the
    frontier search a finer grid than the choice (`CascadeConfig.searched`)."""
    from fugu_pipeline.policies.cascade import plans as cascade_plans

    seen: list[tuple[int, bytes, bytes, tuple]] = []
    real = cascade_plans.RowSet.points

    def counted(self, plans):
        plans = list(plans)
        seen.extend((self.n, self.rows.tobytes(), np.asarray(self.grid.exp_cost).tobytes(), p) for p in plans)
        return real(self, plans)

    monkeypatch.setattr(cascade_plans.RowSet, "points", counted)
    data, grid, inputs = cascade_fixture.agreeing(n=300)
    fit_cascade(data, grid, inputs, CascadeConfig(search=FAST, n_boot=200), log=quiet)
    n_fit = max(n for n, *_ in seen)
    on_all = [k for k in seen if k[0] == n_fit]
    assert on_all and len(on_all) == len(set(on_all)), "a plan run twice on every non-test row"
    per_set = {k[:3] for k in seen}
    assert len(per_set) >= 6 and len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} plans run again on one row set"
    singles = {p for *_, p in on_all if len(p) == 2 and len(p[0][0]) == 1 and p[0][2] is not None}
    assert len(singles) > FAST.finals * FAST.cheap * FAST.thresholds  # the finer grid, searched for the caps
