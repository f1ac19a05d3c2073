"""What the report-writing commands share (`evaluate`, `validate`): the promotion policy file, the
live evaluator, and printing the baselines and the composite under a report's summary line."""

from __future__ import annotations

import sys
from pathlib import Path


def policy(args):
    """--policy (or the project's configs/promotion.yaml), read as every command and asset reads it."""
    from fugu_pipeline.evaluate.promotion import project_policy

    return project_policy(getattr(args, "project_dir", None) or ".", args.policy)


def live_for(args, data):
    """The live evaluator (the worker YAML's pool) and the tasks with graders, or (None, None).
    The tasks come from `--tasks`; without it, from the project's batch folder only when `--data` is
    the project's own reward matrix (the one the pipeline builds from that folder): any other data
    did not come from there, and the folder is not read."""
    from fugu_pipeline.evaluate.live import live_evaluator, tasks_by_id
    from fugu_pipeline.workers.config import load_workers_config

    tasks_path, own = task_source(args)
    if args.reward_config and not _names_workers(args.reward_config):  # utility weights only: a note, not an error
        print(f"live term: not measured ({args.reward_config} gives the utility weights only, no workers to call; "
              "pass a worker YAML with --workers to measure it)", file=sys.stderr)
        return None, None
    if not args.reward_config or tasks_path is None:
        print(f"live term: not measured (needs --workers W.yaml with workers and --tasks{own})", file=sys.stderr)
        return None, None
    try:
        config = load_workers_config(args.reward_config)
    except Exception as exc:  # a worker YAML that does not load: its one-line error
        print(f"live term: not measured ({exc})", file=sys.stderr)
        return None, None
    refused: list | None = None if args.tasks else []  # the project's folder: a batch the matrix refused is left out
    tasks = tasks_by_id(tasks_path, refused)
    for exc in refused or ():
        print(f"live term: {exc.path} left out as the matrix leaves it out: {exc.first_problem()}", file=sys.stderr)
    return live_evaluator(config, getattr(args, "project_dir", None) or "."), tasks


def task_source(args) -> tuple[Path | None, str]:
    """(where the live term's tasks come from, or None; what to add to a note without them)."""
    from fugu_pipeline.paths import ProjectPaths

    if args.tasks:
        return Path(args.tasks), ""
    paths = ProjectPaths(Path(getattr(args, "project_dir", None) or ".").resolve())
    data = Path(str(args.data or "")).resolve()
    if data == paths.reward_db and paths.benchgen.is_dir():
        return paths.benchgen, ""
    return None, (f" naming the BenchGen file or folder that holds the graders of {args.data}'s tasks; the project's "
                  f"batch folder is read only for its own matrix, {paths.reward_db.relative_to(paths.root)}")


def _names_workers(path) -> bool:
    """Whether a YAML has a `workers:` key (a worker config), as opposed to a `reward:` block alone."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True  # let the worker-config loader say what is wrong with it
    return not isinstance(doc, dict) or "workers" in doc


def composite_for_report(rep: dict, ckpt, data, args, features=None) -> None:
    """`fugu-lite evaluate`: the composite against the king of --models-dir, live where it can; the
    king reads its own features of the same rows from `features` (a FeatureSource), as promotion
    scores it."""
    from fugu_pipeline.policies.oneshot.contest import add_composite

    live, tasks = live_for(args, data)
    add_composite(rep, ckpt, data, args.models_dir, policy(args).composite, live=live, tasks=tasks, features=features)


def print_report_tables(rep: dict) -> None:
    """The baselines and the composite with its terms, under the summary line."""
    from fugu_pipeline.evaluate.baselines import baseline_lines
    from fugu_pipeline.evaluate.composite import composite_lines

    for line in baseline_lines(rep["baselines"]):
        print(line)
    c = rep.get("composite")
    if c is not None:
        for line in composite_lines(c["challenger"], "composite"):
            print(line)
        if c["king"] is not None:
            for line in composite_lines(c["king"], f"king composite ({c['king_note']})"):
                print(line)
            d = c["difference"]
            print(f"composite − king {d['mean']:+.4f} [95%: {d['low']:+.4f}, {d['high']:+.4f}]")
        else:
            print(f"no king to compare ({c['king_note']})")
        print(c["live"])


def print_groups(rep: dict) -> None:
    """Per domain and per tag: n, router against the best fixed worker on the same metric (quality
    against the best on training quality, utility against the best on training utility), the
    oracle, and the realised cost per 1,000 requests of the routes and of that best fixed worker.
    A tag's figures are averaged over its rows, and (`macro`) over its domains as well."""
    from fugu_pipeline.evaluate.plots import shown_name

    quality = "best_fixed_quality_worker" in rep
    metric, fixed = ("quality", rep.get("best_fixed_quality_worker")) if quality else ("utility", rep["best_fixed_worker"])
    names = ("router_quality", "best_fixed_quality", "oracle_quality") if quality else ("router", "best_fixed", "oracle")
    for key, label in (("per_domain", "domain"), ("per_tag", "tag")):
        rows = rep.get(key)
        if not rows:
            continue
        cost = "router_cost_usd" in rows[0]
        macro = "macro" in rows[0]
        how = "; a tag's figures averaged over its rows, and over its domains (macro: each domain's mean, then their mean)" \
            if macro else ("; averaged over the tag's rows" if label == "tag" else "")
        print(f"per {label} ({metric}; best fixed = {fixed}, chosen on train{how}"
              f"{'; cost in $ per 1,000 requests' if cost else ''}):")
        head = f"  {label:<28} {'n':>5} {'router':>8} {'fixed':>8} {'oracle':>8}"
        if macro:
            head += f" {'domains':>7} {'macro router':>12} {'macro fixed':>11} {'macro oracle':>12}"
        print(head + (f" {'router $':>10} {'fixed $':>10}" if cost else ""))
        for r in rows:
            vals = [r[k] for k in names]
            fc = r.get("best_fixed_quality_cost_usd" if quality else "best_fixed_cost_usd")
            name = shown_name(r[label], 26) + " *" if r.get("seen_in_training") is False else shown_name(r[label], 28)
            line = f"  {name:<28} {r['n']:>5} {vals[0]:8.4f} {vals[1]:8.4f} {vals[2]:8.4f}"
            if macro:
                m = r["macro"]
                line += f" {m['domains']:>7} {m[names[0]]:12.4f} {m[names[1]]:11.4f} {m[names[2]]:12.4f}"
            if cost:
                line += f" {r['router_cost_usd'] * 1000:10.4g} {fc * 1000:10.4g}"
            print(line)
        if any(r.get("seen_in_training") is False for r in rows):
            print("  * a domain absent from the training split: routed as unseen")
