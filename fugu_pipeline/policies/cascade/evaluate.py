"""Scoring a cascade checkpoint offline, from the recorded answers: its per-task outcomes on the
held-out rows (what a contest compares), and its report.

- `load_cascade(path)`: the checkpoint, refused unless it is a cascade.
- `cascade_outcomes(checkpoint, data, grid, inputs)`: per held-out task, the quality of the answer
  the cascade returns, its utility, the cost and latency of the calls it made (a step's cost counts
  only when the cascade reaches it: the rows' recorded costs), the calls, the step it stopped at
  and the worker answering. No call is made. A checkpoint trained under a cap is run as served:
  the spend guard (`spend.py`) over the rows in traffic order (`route.follow.traffic_order`: interleaved
  by a hash of the task id, whatever the file's order).
- `cascade_report(...)`: the same rows summed up: accuracy and cost per domain at the checkpoint's
  operating point, against the best worker (chosen on the non-test rows), each with its paired
  bootstrap 95% interval.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fugu_pipeline.evaluate.metrics import ci_text, paired_bootstrap
from fugu_pipeline.policies.cascade.verifier_context import context_of_head


@dataclass
class CascadeOutcome:
    task_id: str
    domain: str
    quality: float
    utility: float
    cost_usd: float
    latency_s: float
    calls: int
    stop_step: int
    answered_by: str
    group: str = ""  # the key of the plan it ran (its domain, or its prompt cluster: policies/cascade/groups.py)
    plan: str = ""  # the plan it ran (its group's, or the point a spend guard served instead)
    path: str = ""  # the workers it called, step by step ("a>b+c"): what the contest compares across heads


def load_cascade(path: str | Path):
    from fugu_pipeline.policies.cascade.head import KIND
    from fugu_pipeline.train.checkpoints import CheckpointError, load_checkpoint

    ckpt = load_checkpoint(path)
    if ckpt.manifest.head_kind != KIND:
        raise CheckpointError(f"{path} is a {ckpt.manifest.head_kind!r} checkpoint, not a cascade: score it with "
                              "`fugu-lite evaluate`")
    return ckpt


def verifier_scores(head, inputs) -> np.ndarray:
    """The checkpoint's verifier over every cell with a reply (NaN elsewhere)."""
    scores = np.full(inputs.has.shape, np.nan)
    if float(head.used[0]) != 1.0:
        return scores
    X, _, at = inputs.design(np.arange(inputs.has.shape[0]))
    if len(X):
        scores[at[:, 0], at[:, 1]] = head.verify(X)
    return scores


def read_replies(checkpoint, grid, inputs, scores: np.ndarray | None = None) -> tuple:
    """What a plan reads of the recorded replies, computed once for every run of a report: (answer
    codes, verifier scores in the checkpoint's context, which replies pass their examples).
    `scores`: its `verifier_scores` when already computed."""
    from fugu_pipeline.policies.cascade.policy import answer_codes

    head = checkpoint.head
    codes = answer_codes(grid.final)
    scores = verifier_scores(head, inputs) if scores is None else scores
    return (codes, context_of_head(getattr(head, "context", None), scores, codes, inputs),  # a reply read with the paid ones
            inputs.passed_examples())  # what a plan's examples rule reads


def cascade_outcomes(checkpoint, data, grid, inputs, split: str = "test", rows: np.ndarray | None = None,
                     as_given: bool = False, budget=None, read: tuple | None = None) -> list[CascadeOutcome]:
    """Per task of `split` (in row order; or of the row indices `rows`, in that order): what the
    cascade returns and what it paid (see the module docstring). `data`, `grid`
    (matrix/answers.py) and `inputs` (policies/cascade/fit.answer_inputs) are row-aligned and in the
    checkpoint's worker order. A capped
    checkpoint's guard serves the rows in traffic order, or as given with `as_given` (a log in the
    order its requests came). `budget` (`cost_cap.CostCap`): the rows served as requests asking
    that cap are (`_followed`); `spend.CapOutOfReach` when no saved point meets it. `read`:
    `read_replies` when already computed."""
    from fugu_pipeline.policies.cascade.policy import simulate
    from fugu_pipeline.route.follow import traffic_order

    if list(data.worker_ids) != list(checkpoint.manifest.worker_ids):
        raise ValueError(f"the data's workers {data.worker_ids} are not the checkpoint's {checkpoint.manifest.worker_ids}; "
                         "put them in its order (RoutingData.in_worker_order)")
    head = checkpoint.head
    rows = np.flatnonzero(data.splits == split) if rows is None else np.asarray(rows, int)
    codes, scores, passed = read_replies(checkpoint, grid, inputs) if read is None else read
    cost = data.cost_usd if data.cost_usd is not None else np.zeros(data.utility.shape)
    lat = data.latency_s if data.latency_s is not None else np.zeros(data.utility.shape)
    doms = np.asarray(data.domains, dtype=str)
    u = data.utility_config
    runs: dict = {}

    def run(plan):  # the plan over every row of `rows`, once
        key = plan.model_dump_json()
        if key not in runs:
            runs[key] = simulate(plan, data.worker_ids, codes, scores, data.quality, cost, lat, rows, passed)
        return runs[key]

    keys = np.asarray(head.group_keys(doms[rows], inputs.prompt[rows]), dtype=object)  # domain, or prompt cluster
    plans = [head.policy.plan_for(g) for g in keys]
    order = np.arange(len(rows)) if as_given else traffic_order([data.task_ids[i] for i in rows])
    if budget is not None or getattr(head, "cap_usd", None) is not None:
        plans = _followed(checkpoint, keys, plans, run, order, budget)
    out: list[CascadeOutcome] = []
    for k, i in enumerate(rows):
        res, j = run(plans[k]), k
        util = u.utility(float(res.quality[j]), float(res.cost[j]), float(res.latency[j])) if u else float(res.quality[j])
        out.append(CascadeOutcome(data.task_ids[i], str(doms[i]), float(res.quality[j]), util, float(res.cost[j]),
                                  float(res.latency[j]), int(res.calls[j]), int(res.stop_step[j]),
                                  data.worker_ids[int(res.answer_worker[j])], str(keys[k]), plans[k].describe(),
                                  ">".join("+".join(s.workers) for s in plans[k].steps[:int(res.stop_step[j]) + 1])))
    return out


def _followed(checkpoint, keys: np.ndarray, plans: list, run, order: np.ndarray, budget=None) -> list:
    """The plan each row runs as served under a cap (`CascadeRouter.plan_for`): the cap `budget` a
    request asks (`spend.request_shares`), else the cap the checkpoint was trained under
    (`spend.trained_shares`, a worker shipped alone kept while the cap allows it); the cap's
    followers over the rows in `order` (`route.follow.traffic_order`), each row the point its group
    is served within them (`spend.request_point`), what it cost on the row counted. A group with no
    saved points under the trained cap keeps its plan (`plans`), as serving does."""
    from fugu_pipeline.policies.cascade.policy import CascadePlan
    from fugu_pipeline.policies.cascade.spend import (cap_points, guard_key, new_guard, own_point, request_point,
                                                      request_shares, trained_shares)

    metrics = checkpoint.manifest.metrics or {}
    params = checkpoint.head.head_params()
    if budget is not None:
        shares, own = request_shares(params, metrics, budget), None
    else:
        shares, own = trained_shares(checkpoint.head, metrics), own_point(checkpoint.head, metrics)
    guards: dict = {}  # as serving keeps them: one per cap, per group's part, and the pooled one beside the parts

    def guard_of(cap, group, pooled):
        return guards.setdefault(guard_key(cap, group, pooled), new_guard(cap, pooled))

    points: dict = {}  # group -> the saved points its requests choose among
    of: dict = {}  # id of a point -> its plan
    out: list = list(plans)
    for k in order:
        if keys[k] not in points:
            points[keys[k]] = cap_points(params, metrics, keys[k])
        if not points[keys[k]]:
            continue
        best, held, _ = request_point(shares, points[keys[k]], keys[k], guard_of, own)
        if id(best) not in of:
            of[id(best)] = CascadePlan.model_validate(best["plan"])
        out[k] = of[id(best)]
        for guard in held:
            guard.record(float(run(out[k]).cost[k]))
    return out


def _trained_cap_words(checkpoint) -> str:
    """How a checkpoint trained under a cap serves it, after its plan, as `train`'s shipped line says it."""
    from fugu_pipeline.policies.cascade.ship import follows_words
    from fugu_pipeline.policies.cascade.spend import own_point

    head = checkpoint.head
    if getattr(head, "cap_usd", None) is None:
        return ""
    return follows_words(head.cap_usd, getattr(head, "group_caps", None),
                         own_point(head, checkpoint.manifest.metrics or {}) is not None)


def cascade_report(checkpoint, data, grid, inputs, split: str = "test", baselines: dict | None = None,
                   budget=None) -> dict:
    """Accuracy, cost and utility of the cascade on `split`, overall and per domain, against the
    best worker (by utility on the non-test rows) and the strongest one, with paired intervals;
    `baselines` ({name: (quality, utility) per row of the split}, e.g. the one-shot head's routes)
    are compared the same way. `budget`: the rows served as requests asking that cap are."""
    read = read_replies(checkpoint, grid, inputs)  # every reply read once, for the outcomes and the caps
    outs = cascade_outcomes(checkpoint, data, grid, inputs, split, budget=budget, read=read)
    rows = np.flatnonzero(data.splits == split)
    fit = np.flatnonzero(data.splits != split)
    best = int(np.argmax(data.utility[fit].mean(axis=0)))
    pooled_strong = int(np.argmax(data.quality[fit].mean(axis=0)))
    q = np.array([o.quality for o in outs])
    c = np.array([o.cost_usd for o in outs])
    ut = np.array([o.utility for o in outs])
    cost = data.cost_usd if data.cost_usd is not None else np.zeros(data.utility.shape)
    head = checkpoint.head
    clustered = getattr(head, "clusters", None) is not None  # planned per prompt cluster: one row per cluster
    doms = np.array([o.group if clustered else o.domain for o in outs], dtype=str)
    strong_cost = float(cost[rows, pooled_strong].mean()) if len(rows) else 0.0
    per_domain = []
    fit_doms = np.asarray(data.domains, dtype=str)[fit]
    if clustered:
        fit_doms = np.asarray(head.group_keys(fit_doms, inputs.prompt[fit]), dtype=str)
    for d in sorted(set(doms.tolist())):
        m = doms == d
        r = rows[m]
        mine = fit[fit_doms == d]  # the group's own strongest worker, on its non-test rows
        strong = int(np.argmax(data.quality[mine].mean(axis=0))) if len(mine) else pooled_strong
        per_domain.append({
            "domain": d, "n": int(m.sum()), "plan": served_plans([o.plan for o, mk in zip(outs, m) if mk]),
            "accuracy": float(q[m].mean()), "cost_usd_per_1k": float(c[m].mean() * 1000),
            "cost_share_of_strongest": float(c[m].mean() / max(cost[r, strong].mean(), 1e-300)),
            "best_worker_accuracy": float(data.quality[r, best].mean()), "strongest": data.worker_ids[strong],
            "strongest_accuracy": float(data.quality[r, strong].mean()),
            "minus_strongest_accuracy": paired_bootstrap(q[m], data.quality[r, pooled_strong]),
            "cost_share_of_pooled_strongest": float(c[m].mean() / max(cost[r, pooled_strong].mean(), 1e-300))})
    return {
        "split": split, "n_tasks": len(outs), "checkpoint": str(checkpoint.path),
        "policy": checkpoint.head.policy.describe() + _trained_cap_words(checkpoint) if budget is None else
        f"under {budget.describe()}: the most accurate saved point within the effective cap, following the spend",
        "budget": None if budget is None else budget.model_dump(),
        "worker_ids": data.worker_ids, "best_worker": data.worker_ids[best], "strongest_worker": data.worker_ids[pooled_strong],
        "accuracy": paired_bootstrap(q, np.zeros(len(q))),
        "utility": float(ut.mean()) if len(ut) else float("nan"),
        "cost_usd_per_1k": float(c.mean() * 1000) if len(c) else 0.0,
        "cost_share_of_strongest": float(c.mean() / max(strong_cost, 1e-300)) if len(c) else 0.0,
        "calls_per_task": float(np.mean([o.calls for o in outs])) if outs else 0.0,
        "minus_best_worker_utility": paired_bootstrap(ut, data.utility[rows, best]),
        "minus_strongest_accuracy": paired_bootstrap(q, data.quality[rows, pooled_strong]),
        "per_domain": per_domain,  # per domain, or per prompt cluster (`grouped_by`)
        "grouped_by": "prompt cluster" if clustered else "domain",
        "groups": (checkpoint.manifest.metrics or {}).get("groups"),  # the per-domain choice, out of fold (train)
        "cap_rows": cap_rows_on(checkpoint, data, grid, inputs, rows, pooled_strong, read=read),
        "baselines": {name: {"accuracy": float(np.mean(bq)), "utility": float(np.mean(bu)),
                             "cascade_minus_utility": paired_bootstrap(ut, bu), "cascade_minus_accuracy": paired_bootstrap(q, bq)}
                      for name, (bq, bu) in (baselines or {}).items()},
        "outcomes": [asdict(o) for o in outs],
    }


def served_plans(plans: list[str]) -> str:
    """The plan a group's rows ran: the one plan, or the most frequent with how many rows ran others
    (a spend guard's cuts, or the points a request's cap chose)."""
    from collections import Counter

    if not plans:
        return ""
    (top, n), others = Counter(plans).most_common(1)[0], len(set(plans)) - 1
    return top if not others else f"{top} on {n} of {len(plans)} rows ({others} other plan(s) on the rest)"


def cap_rows_on(checkpoint, data, grid, inputs, rows: np.ndarray, strong: int, n_boot: int = 2000,
                read: tuple | None = None) -> list[dict]:
    """The table at 20/33/50% of the strongest worker's cost on `rows`, each share served as requests
    asking that cap are (`cascade_outcomes` with the cap, as `evaluate --cap share=0.2` reports it:
    one spend guard per cap, in traffic order, each row the most accurate saved point of its group
    within the allowance) and run on the rows with their recorded costs; beside it the strongest
    worker alone. A share no saved point meets has no figures. `read`: `read_replies` when already
    computed."""
    from fugu_pipeline.cost_cap import CostCap
    from fugu_pipeline.policies.cascade.choice import TABLE_SHARES, cap_table
    from fugu_pipeline.policies.cascade.spend import CapOutOfReach, cap_points

    if not cap_points(checkpoint.head.head_params(), checkpoint.manifest.metrics or {}) or data.quality is None \
            or not len(rows):
        return []
    cost = data.cost_usd if data.cost_usd is not None else np.zeros(data.utility.shape)
    read = read_replies(checkpoint, grid, inputs) if read is None else read
    per_row: dict = {}
    for share in TABLE_SHARES:
        try:
            outs = cascade_outcomes(checkpoint, data, grid, inputs, rows=rows, budget=CostCap(share=share), read=read)
        except CapOutOfReach:
            per_row[f"cascade@{share}"] = None
            continue
        per_row[f"cascade@{share}"] = (np.array([o.quality for o in outs]), np.array([o.cost_usd for o in outs]))
    return cap_table(per_row, (data.quality[rows, strong], cost[rows, strong]), n_boot=n_boot)


def report_lines(rep: dict) -> list[str]:
    """The report as printed lines: the policy, the figures with intervals, one line per domain."""
    a, dw, ds = rep["accuracy"], rep["minus_best_worker_utility"], rep["minus_strongest_accuracy"]
    by = rep.get("grouped_by", "domain")
    out = [f"cascade on {rep['n_tasks']} {rep['split']} tasks: {rep['policy']}",
           f"  accuracy {a['mean']:.4f} [{a['low']:.4f}, {a['high']:.4f}]; cost ${rep['cost_usd_per_1k']:.4g} per 1,000 "
           f"requests = {rep['cost_share_of_strongest']:.1%} of {rep['strongest_worker']}'s; {rep['calls_per_task']:.2f} calls a task",
           f"  utility − always {rep['best_worker']} (best worker on the non-test rows): {dw['mean']:+.4f} "
           f"[{dw['low']:+.4f}, {dw['high']:+.4f}]",
           f"  accuracy − {rep['strongest_worker']} (strongest): {ds['mean']:+.4f} [{ds['low']:+.4f}, {ds['high']:+.4f}]",
           *[f"  against {n}: accuracy {b['accuracy']:.4f}, utility {b['utility']:.4f}; cascade − it: utility "
             f"{b['cascade_minus_utility']['mean']:+.4f} [{b['cascade_minus_utility']['low']:+.4f}, "
             f"{b['cascade_minus_utility']['high']:+.4f}], accuracy {b['cascade_minus_accuracy']['mean']:+.4f} "
             f"[{b['cascade_minus_accuracy']['low']:+.4f}, {b['cascade_minus_accuracy']['high']:+.4f}]"
             for n, b in rep.get("baselines", {}).items()],
           f"  | {by} | n | plan | accuracy | accuracy − {rep['strongest_worker']} [95%] | $ per 1,000 | saving against "
           f"{rep['strongest_worker']} | share of the {by}'s strongest's cost | best worker | the {by}'s strongest |"]
    for d in rep["per_domain"]:
        vs = d.get("minus_strongest_accuracy")
        saving = f"{1 - d['cost_share_of_pooled_strongest']:.0%}" if "cost_share_of_pooled_strongest" in d else "—"
        out.append(f"  | {d['domain']!r} | {d['n']} | {d['plan']} | {d['accuracy']:.4f} | {ci_text(vs) if vs else '—'} | "
                   f"{d['cost_usd_per_1k']:.4g} | {saving} | {d['cost_share_of_strongest']:.1%} | "
                   f"{d['best_worker_accuracy']:.4f} | {d['strongest']} {d['strongest_accuracy']:.4f} |")
    if rep.get("groups"):
        out.append(f"  chosen per {by} out of fold over the non-test rows (train):")
        out += [f"    {g['domain']!r} ({g['rows']} rows): {g['choice']}: accuracy − strongest {g['vs_strongest']:+.4f} "
                f"[{g['vs_low']:+.4f}, {g['vs_high']:+.4f}], {g['cost_share']:.0%} of the strongest's cost"
                for g in rep["groups"]["chosen"]]
        if rep["groups"]["merged"]:
            out.append("    served the pooled plan (too few rows): " + ", ".join(f"{d!r} ({n})" for d, n in rep["groups"]["merged"]))
    if rep.get("cap_rows"):
        from fugu_pipeline.policies.cascade.choice import table_lines

        out += ["  " + line for line in table_lines(rep["cap_rows"], (
            f"at caps of {rep['strongest_worker']}'s cost (the checkpoint's validation points within each cap), on the "
            f"{rep['n_tasks']} {rep['split']} rows:"))]
    out += rep.get("frontier_lines", [])  # policies/cascade/frontier_plot.py
    if rep.get("shipped_policy"):
        out.append(f"as chosen at training: {rep['shipped_policy']['line']}")
    return out


def one_shot_baseline(checkpoint_path, data, split: str = "test") -> dict:
    """{"one-shot <method>": (quality, utility) per row of `split`}: a one-step head's greedy routes
    on `data`'s features (the rows the cascade is scored on), for `cascade_report`."""
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.train.checkpoints import load_checkpoint

    ckpt = load_checkpoint(checkpoint_path, expected_contract=data.contract)
    d = data.in_worker_order(ckpt.manifest.worker_ids)
    rows = np.flatnonzero(d.splits == split)
    route = np.argmax(head_scores(ckpt.head, d.features[rows], [d.domains[i] for i in rows]), axis=1)
    q = d.quality[rows, route] if d.quality is not None else d.utility[rows, route]
    return {f"one-shot {ckpt.manifest.method} {ckpt.manifest.content_hash}": (q, d.utility[rows, route])}


def evaluate_cascade(path, data, db_path, settings, cache_root, split: str = "test", out_dir=None,
                     one_shot=None, budget=None) -> dict:
    """The report of the cascade at `path` on `data`'s `split` (the replies read from the matrix at
    `db_path`, encoded with `settings` through the cache at `cache_root`); written as
    `<out_dir or path/reports>/<split>.json` when `out_dir` is not False. `budget`: served as
    requests asking that cap (`cost_cap.CostCap`); `spend.CapOutOfReach` before any work when no
    saved point meets it."""
    import json

    from fugu_pipeline.policies.cascade.frontier_plot import add_frontier
    from fugu_pipeline.files import atomic_write
    from fugu_pipeline.matrix.answers import read_answers
    from fugu_pipeline.policies.cascade.cross_encoder import CROSS_STAT
    from fugu_pipeline.policies.cascade.cross_encoder_use import with_saved_cross
    from fugu_pipeline.policies.cascade.fit import answer_inputs
    from fugu_pipeline.route.shipped import read_shipped

    ckpt = load_cascade(path)
    if budget is not None:  # refused now, not after the replies are encoded
        budget_reachable(ckpt, budget)
    data = data.in_worker_order(ckpt.manifest.worker_ids, f"cascade {path}")
    grid = read_answers(db_path, data.task_ids, data.worker_ids)
    names = ckpt.head.answer_stats
    plain = [n for n in names if n != CROSS_STAT]  # the cross-encoder's column is its own model's (below)
    inputs = answer_inputs(data, grid, settings, cache_root, encode=ckpt.head.answer_dim > len(names), stat_names=plain)
    inputs = with_saved_cross(ckpt, data, grid, inputs, np.flatnonzero(data.splits == split))
    base = one_shot_baseline(one_shot, data, split) if one_shot is not None else None
    rep = cascade_report(ckpt, data, grid, inputs, split, base, budget=budget)
    shipped = read_shipped(path, ckpt.manifest.content_hash)[0]  # what train chose and printed (route/shipped.py)
    if shipped is not None:
        rep["shipped_policy"] = shipped.public()
    if out_dir is not False:
        target = Path(out_dir or Path(path) / "reports") / f"{split}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        add_frontier(rep, ckpt, target.parent)  # policies/cascade/frontier_plot.py: the out-of-fold frontier, printed and plotted
        atomic_write(target, (json.dumps(rep, indent=2, default=float) + "\n").encode())
        rep["report_path"] = str(target)
    return rep


def budget_reachable(checkpoint, budget) -> None:
    """CapOutOfReach when the checkpoint cannot serve `budget` (checked before any work)."""
    from fugu_pipeline.policies.cascade.spend import request_shares

    request_shares(checkpoint.head.head_params(), checkpoint.manifest.metrics or {}, budget)


def cascade_over_single_turns(router, tasks: list, replies: dict[str, list]) -> dict:
    """A cascade (`policies.cascade.route.CascadeRouter`) on tasks every worker has answered alone once
    (`replies[worker][k]`: a finished single-turn trajectory of task k, with `answer`, `quality`,
    `cost_usd`, `latency_s`): the multi-turn report's baseline on the same tasks, with no new call.
    Returns per-task arrays: `quality` (of the accepted answer), `cost_usd` and `calls` (the steps
    reached), `latency_s` (each step as long as its slowest call: a step's workers are called at
    once) and `stopped` (the step that accepted, from 1)."""
    from fugu_pipeline.tasks.final_answer import detect_kind, extract, kind_for_grader
    from fugu_pipeline.policies.cascade.policy import decide

    q, c, n, lat, stop = [], [], [], [], []
    keys = router.group_keys([t.prompt for t in tasks], [t.domain for t in tasks])  # one encoding, when by cluster
    for k, task in enumerate(tasks):
        plan = router.head.policy.plan_for(keys[k])
        kind = router.answer_kind(task.domain) or kind_for_grader(task.grader.type) or detect_kind(
            task.prompt, [replies[w][k].answer for w in plan.workers])
        finals, scores, order, called, cost, wait = [], [], [], [], 0.0, 0.0
        for s, step in enumerate(plan.steps):
            got = [(w, replies[w][k]) for w in step.workers]
            cost += sum(t.cost_usd for _, t in got)
            wait += max(getattr(t, "latency_s", 0.0) for _, t in got)
            new = [extract(t.answer, kind) for _, t in got]
            mine = [(w, t.answer, f) for (w, t), f in zip(got, new)]
            paid = [(w, t.answer, f) for w, t, f in zip(called, order, finals)] + mine  # read with the paid ones
            scores += router.verify(task.prompt, task.domain, mine, paid)
            finals += new
            order += [t for _, t in got]
            called += [w for w, _ in got]
            d = decide(step, s == len(plan.steps) - 1, finals, scores, len(got))
            if d.accept:
                break
        q.append(order[d.answer_index].quality or 0.0)
        c.append(cost)
        n.append(len(order))
        lat.append(wait)
        stop.append(s + 1)
    return {"quality": np.array(q), "cost_usd": np.array(c), "calls": np.array(n), "latency_s": np.array(lat),
            "stopped": np.array(stop)}
