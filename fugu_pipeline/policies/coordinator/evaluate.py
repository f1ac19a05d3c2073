"""The multi-turn report: is delegation worth its extra calls, and where?

On the held-out tasks, with the same sampling seeds and workers for everyone, live through the
session loop (trajectories stored, so a re-evaluation costs nothing):
- the coordinator (greedy), the one-step router (`policies/coordinator/route.py:OneStepPolicy`, when one is
  given) and every fixed worker answering alone in one turn; the best fixed worker is the one
  with the best mean reward on (a sample of) the TRAINING tasks, then scored on held-out;
- the answer-aware cascade (a `policies.cascade.route.CascadeRouter`, when one is given: FrugalGPT's
  call-cheap-first, escalate-on-doubt): its steps run over the replies the fixed workers gave
  alone to the same tasks and seeds (no new call), graded as they were; a cascade's turns are
  its calls (each worker it reaches answers once). With no cascade the report says why in one line;
- for each: accuracy with a 95% bootstrap interval, mean reward (not for the cascade: it is not
  a session), turns and calls per correct answer (efficiency), cost per correct answer, mean
  turns, cost and latency, stop reasons (the cascade's: the step that accepted);
- paired bootstrap intervals of coordinator − one-step, coordinator − cascade and coordinator −
  best fixed (accuracy; reward where both have one), per domain too, and a verdict per domain
  against the most accurate of them: where the coordinator is significantly more accurate, what
  that costs in turns and money; where it is not, whether it learned to stop at one turn;
- the coordinator's role and worker usage per turn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from fugu_pipeline.evaluate.metrics import ci_text, paired_bootstrap
from fugu_pipeline.session.policy import FixedPolicy, Policy
from fugu_pipeline.session.records import Trajectory
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.tasks.schema import Task

EVAL_SEED_BASE = 2 * 10**9  # held-out sessions use seeds EVAL_SEED_BASE + k, k < seeds


def bootstrap_mean(x: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict:
    x = np.asarray(x, float)
    if len(x) == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(x.mean()), "low": float(lo), "high": float(hi), "n": int(len(x))}


def per_task(trs: list[list[Trajectory]], value: Callable[[Trajectory], float]) -> np.ndarray:
    """(tasks,) means over seeds; `trs[task][seed]`."""
    return np.array([np.mean([value(t) for t in row]) for row in trs])


def summarize(trs: list[list[Trajectory]], reward: Callable[[Trajectory], float], n_boot: int = 2000) -> dict:
    flat = [t for row in trs for t in row]
    correct = sum(t.correct for t in flat)
    turns = sum(t.n_turns for t in flat)
    cost = sum(t.cost_usd for t in flat)
    per = lambda total: total / correct if correct else None  # noqa: E731
    return {
        "sessions": len(flat), "accuracy": bootstrap_mean(per_task(trs, lambda t: t.quality or 0.0), n_boot),
        "mean_reward": float(np.mean([reward(t) for t in flat])) if flat else float("nan"),
        "turns_per_correct": per(turns), "calls_per_correct": per(sum(t.n_calls for t in flat)),
        "cost_per_correct_usd": per(cost), "mean_turns": turns / max(len(flat), 1),
        "mean_cost_usd": cost / max(len(flat), 1), "mean_latency_s": float(np.mean([t.latency_s for t in flat] or [0])),
        "stop_reasons": dict(Counter(t.stop_reason for t in flat)),
    }


def usage_per_turn(trs: list[list[Trajectory]]) -> list[dict]:
    rows: dict[int, dict] = {}
    for t in (t for row in trs for t in row):
        for turn in t.turns:
            r = rows.setdefault(turn.index, {"turn": turn.index, "roles": Counter(), "workers": Counter()})
            r["roles"][turn.role] += 1
            r["workers"][turn.served_by or "(failed)"] += 1
    return [{"turn": k, "roles": dict(v["roles"]), "workers": dict(v["workers"])} for k, v in sorted(rows.items())]


def role_use(trs: list[list[Trajectory]]) -> dict:
    """How the coordinator used the roles: turns per role, the share of sessions with a Verifier
    turn, and the mean role probabilities of its picks with the share of near-certain ones (a
    saturated softmax puts > 0.999 on one role in every state)."""
    flat = [t for row in trs for t in row]
    turns = [turn for t in flat for turn in t.turns]
    probs = [turn.role_probs for turn in turns if turn.role_probs]
    mean = {r: float(np.mean([p.get(r, 0.0) for p in probs])) for r in ("thinker", "worker", "verifier")} if probs else {}
    return {"turns": dict(Counter(turn.role for turn in turns)),
            "sessions_with_verifier": sum(any(x.role == "verifier" for x in t.turns) for t in flat) / max(len(flat), 1),
            "mean_role_probabilities": mean,
            "near_certain_picks": sum(max(p.values()) > 0.999 for p in probs) / max(len(probs), 1)}


def verdict(domain: str, coord: dict, base: dict, base_name: str, gain: dict) -> str:
    turns_x = coord["mean_turns"] / max(base["mean_turns"], 1e-9)
    cpc = (f"{coord['cost_per_correct_usd'] / base['cost_per_correct_usd']:.2f}x the cost per correct answer"
           if coord["cost_per_correct_usd"] and base["cost_per_correct_usd"] else "no correct answers to price")
    ci = f"{gain['mean']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]"
    if gain["low"] > 0:
        return f"{domain}: WORTH IT: accuracy {ci} over {base_name} for {turns_x:.2f}x the turns and {cpc}"
    if coord["mean_turns"] <= 1.05:
        return f"{domain}: one turn is enough: the coordinator stops after one answer (accuracy {ci} vs {base_name}, {cpc})"
    how = "significantly worse" if gain["high"] < 0 else "not significant"
    return f"{domain}: NOT WORTH IT: accuracy {ci} over {base_name} ({how}) for {turns_x:.2f}x the turns and {cpc}"


def evaluate_roles(
    runner: SessionRunner,
    coordinator: Policy,
    test: list[Task],
    train: list[Task],
    worker_ids: list[str],
    reward: Callable[[Trajectory], float],
    *,
    one_step: Policy | None = None,
    seeds: int = 1,
    n_train_for_fixed: int = 60,
    n_boot: int = 2000,
    cascade=None,
    cascade_source: str | None = None,
) -> dict:
    """The report (module docstring) as a dict; `report_lines` prints it. `cascade` (a
    `policies.cascade.route.CascadeRouter`): also the cascade on the same tasks, from the fixed workers'
    replies; `cascade_source` says where it came from or, without one, why there is none."""
    if not test:
        raise ValueError("no held-out tasks to evaluate the coordinator on")
    pairs = [(t, EVAL_SEED_BASE + k) for t in test for k in range(seeds)]
    fixed = [FixedPolicy(worker_ids, w) for w in worker_ids]
    chosen = sorted(train, key=lambda t: t.task_id)[:: max(1, len(train) // n_train_for_fixed)][:n_train_for_fixed]
    train_fixed = runner.run(fixed, [(t, EVAL_SEED_BASE) for t in chosen], greedy=True) if chosen else [[] for _ in fixed]
    train_reward = [float(np.mean([reward(t) for t in row])) if row else float("-inf") for row in train_fixed]
    best = int(np.argmax(train_reward))
    policies = {"coordinator": coordinator, **({"one_step": one_step} if one_step is not None else {}),
                **{f"fixed:{w}": p for w, p in zip(worker_ids, fixed)}}
    runs = runner.run(list(policies.values()), pairs, greedy=True)
    by_task = {name: [row[i * seeds:(i + 1) * seeds] for i in range(len(test))] for name, row in zip(policies, runs)}
    by_task["best_fixed"] = by_task[f"fixed:{worker_ids[best]}"]

    rep: dict = {"n_tasks": len(test), "seeds": seeds, "worker_ids": list(worker_ids),
                 "best_fixed_worker": worker_ids[best], "best_fixed_chosen_on": f"{len(chosen)} training tasks",
                 "train_reward_fixed": dict(zip(worker_ids, train_reward)),
                 "policies": {name: summarize(v, reward, n_boot) for name, v in by_task.items()}}
    rep["usage_per_turn"] = usage_per_turn(by_task["coordinator"])
    q = {k: per_task(v, lambda t: t.quality or 0.0) for k, v in by_task.items()}
    r = {k: per_task(v, reward) for k, v in by_task.items()}
    baselines = ["best_fixed"] + (["one_step"] if one_step is not None else [])
    cas = None
    if cascade is not None:  # the cascade's steps over the fixed workers' single-turn replies: no new call
        cas = cascade_runs(cascade, test, {w: by_task[f"fixed:{w}"] for w in worker_ids}, seeds)
        q["cascade"] = cas["quality"].mean(axis=1)
        rep["policies"]["cascade"] = summarize_cascade(cas, n_boot)
        rep["cascade"] = {"source": cascade_source, "plan": cascade.head.policy.describe()}
        baselines.append("cascade")
    else:
        rep["cascade"] = {"missing": cascade_source or "no cascade checkpoint given"}
    rep["paired"] = {f"coordinator_vs_{b}": {"accuracy": paired_bootstrap(q["coordinator"], q[b], n_boot),
                                             **({"reward": paired_bootstrap(r["coordinator"], r[b], n_boot)} if b in r else {})}
                     for b in baselines}
    domains = np.array([t.domain for t in test])
    rep["per_domain"], rep["verdicts"] = [], []
    for d in sorted(set(domains.tolist())):
        rows = np.flatnonzero(domains == d)
        sub = {k: [v[i] for i in rows] for k, v in by_task.items()}
        entry = {"domain": d, "n": int(len(rows)), "policies": {k: summarize(v, reward, n_boot) for k, v in sub.items()},
                 "coordinator_roles": role_use(sub["coordinator"])}
        if cas is not None:
            entry["policies"]["cascade"] = summarize_cascade({k: v[rows] for k, v in cas.items()}, n_boot)
        for b in baselines:
            entry[f"coordinator_vs_{b}"] = paired_bootstrap(q["coordinator"][rows], q[b][rows], n_boot)
        rep["per_domain"].append(entry)
        strongest = max(baselines, key=lambda b: entry["policies"][b]["accuracy"]["mean"])
        names = {"one_step": "the one-step router", "cascade": "the answer-aware cascade",
                 "best_fixed": f"the best fixed worker ({worker_ids[best]})"}
        rep["verdicts"].append(verdict(d, entry["policies"]["coordinator"], entry["policies"][strongest],
                                       names[strongest], entry[f"coordinator_vs_{strongest}"]))
    rep["summary"] = " | ".join(report_lines(rep)[:len(_shown(rep))])
    return rep


def cascade_runs(cascade, test: list[Task], fixed: dict[str, list[list[Trajectory]]], seeds: int) -> dict:
    """The cascade over the fixed workers' replies (`fixed[worker][task][seed]`), seed by seed:
    (tasks, seeds) arrays of `policies.cascade.evaluate.cascade_over_single_turns`'s figures."""
    from fugu_pipeline.policies.cascade.evaluate import cascade_over_single_turns

    got = [cascade_over_single_turns(cascade, test, {w: [row[k] for row in rows] for w, rows in fixed.items()})
           for k in range(seeds)]
    return {key: np.stack([g[key] for g in got], axis=1) for key in got[0]}


def summarize_cascade(cas: dict, n_boot: int = 2000) -> dict:
    """`summarize`'s figures for the cascade's (tasks, seeds) arrays: a call is a turn (each worker
    it reaches answers once); no reward (it is not a session)."""
    quality, calls, cost = cas["quality"], cas["calls"], cas["cost_usd"]
    correct = int((quality >= 1.0 - 1e-9).sum())
    per = lambda total: float(total) / correct if correct else None  # noqa: E731
    n = max(quality.size, 1)
    return {
        "sessions": int(quality.size), "accuracy": bootstrap_mean(quality.mean(axis=1), n_boot), "mean_reward": None,
        "turns_per_correct": per(calls.sum()), "calls_per_correct": per(calls.sum()),
        "cost_per_correct_usd": per(cost.sum()), "mean_turns": float(calls.sum()) / n,
        "mean_cost_usd": float(cost.sum()) / n, "mean_latency_s": float(cas["latency_s"].sum()) / n,
        "stop_reasons": {f"step {s}": int(c) for s, c in sorted(Counter(cas["stopped"].ravel().tolist()).items())},
    }


def _fmt(s: dict) -> str:
    a = s["accuracy"]
    tpc = f"{s['turns_per_correct']:.2f}" if s["turns_per_correct"] else "-"
    cpc = f"${s['cost_per_correct_usd']:.5f}" if s["cost_per_correct_usd"] else "-"
    reward = "-" if s["mean_reward"] is None else f"{s['mean_reward']:.3f}"
    return (f"accuracy {a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}]  turns/correct {tpc}  cost/correct {cpc}  "
            f"mean turns {s['mean_turns']:.2f}  reward {reward}")


def _shown(rep: dict) -> list[str]:
    """The policies a report prints, in order: the coordinator, then its baselines."""
    return [n for n in ("coordinator", "one_step", "cascade", "best_fixed") if n in rep["policies"]]


def _gains(names: list[str], label: dict, paired: dict) -> str:
    """One line: the coordinator's paired accuracy difference from each baseline."""
    return "; ".join(f"coordinator − {label[n]}: accuracy {ci_text(paired[f'coordinator_vs_{n}'], '+.3f')}"
                     for n in names[1:])


def report_lines(rep: dict) -> list[str]:
    """The report as lines of text (what the CLI prints and the asset shows)."""
    names = _shown(rep)
    label = {"coordinator": "multi-turn coordinator", "one_step": "one-step router", "cascade": "answer-aware cascade",
             "best_fixed": f"best fixed ({rep['best_fixed_worker']})"}
    lines = [f"{label[n]:<28} {_fmt(rep['policies'][n])}" for n in names]
    lines.append(_gains(names, label, {k: v["accuracy"] for k, v in rep["paired"].items()}))
    for d in rep["per_domain"]:
        lines.append(f"-- {d['domain']} ({d['n']} tasks)")
        lines += [f"   {label[n]:<25} {_fmt(d['policies'][n])}" for n in names]
        lines.append("   " + _gains(names, label, d))
        u = d.get("coordinator_roles")
        if u:
            lines.append(f"   coordinator roles: turns {u['turns']}, sessions with a Verifier {u['sessions_with_verifier']:.2f}, "
                         "mean role probabilities " + ", ".join(f"{r} {p:.2f}" for r, p in u["mean_role_probabilities"].items())
                         + f", picks above 0.999: {u['near_certain_picks']:.2f}")
    lines += rep["verdicts"]
    c = rep.get("cascade") or {}
    if "missing" in c:
        lines.append(f"answer-aware cascade: none to compare with ({c['missing']})")
    elif c:
        lines.append(f"answer-aware cascade: {c['source']}: {c['plan']}, run over the fixed workers' replies to the same "
                     "tasks (turns = calls)")
    return lines
