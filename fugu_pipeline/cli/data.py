"""Data commands: `list-models` (the live catalog), `generate` (collect and grade into a reward JSONL)
and `import` (public routing data into the reward-matrix import format)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fugu_pipeline.cli.common import CLIError, print_json


def cmd_list_models(args) -> int:
    from dotenv import load_dotenv

    from fugu_pipeline.workers.catalog import catalog_base_url, fetch_catalog, format_rows, list_models

    load_dotenv(override=False)
    snap = fetch_catalog(catalog_base_url(args.base_url), os.environ.get("OPENROUTER_API_KEY"))
    print(format_rows(list_models(snap, args.contains, args.limit)))
    for note in snap.skipped:
        print(f"fugu-lite list-models: skipped a malformed catalog entry: {note}", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    """Collect every worker's answer to every task (resumable), then write the reward matrix JSONL
    of the complete rows. Exit status 3 (`FAILED_CELLS_EXIT`) when a cell failed, after naming the
    failed cells (task, worker, what went wrong)."""
    import asyncio

    from dotenv import load_dotenv
    from tqdm import tqdm

    from fugu_pipeline.collect.partition import collect_partition
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.matrix.importers import write_reward_jsonl
    from fugu_pipeline.matrix.read import signal_health
    from fugu_pipeline.tasks.loading import load_tasks
    from fugu_pipeline.workers.config import load_workers_config, reward_source
    from fugu_pipeline.workers.contract import FatalWorkerError

    load_dotenv(override=False)
    config = load_workers_config(args.workers)
    tasks = load_tasks(args.tasks)
    out = Path(args.output)
    store_root = out.with_name(out.name + ".responses")
    if (out.exists() or store_root.exists()) and not args.resume:
        raise CLIError(f"{out} (or {store_root}) exists: add --resume to continue it, or choose another --output")
    store = ResponseStore(store_root)
    batch = "cli"
    n = len(tasks) if args.limit is None else min(args.limit, len(tasks))
    from fugu_pipeline.ledger import LEDGER_FILE, CostLedger

    ledger = CostLedger(args.ledger or LEDGER_FILE)  # every paid call (a pack's receipt cites it)
    ledger.check()  # a ledger it cannot append to stops it before any call (and a killed run's calls are settled)
    bar = tqdm(total=n * len(config.worker_ids), unit="call", desc="generate")
    try:
        for w in config.worker_ids:
            done = store.read(batch, w)
            bar.update(sum(1 for t in tasks[:n] if t.task_id in done and done[t.task_id].status == "ok"))
            stats = asyncio.run(collect_partition(tasks[:n], batch, w, config, store, on_record=lambda r: bar.update(1),
                                                  ledger=ledger))
            if stats.skipped_note:
                bar.write(f"{w}: {stats.skipped_note}")
            if stats.n_failed:
                bar.write(f"{w}: {stats.n_failed} failed cell(s) ({stats.errors}); run again with --resume to retry them")
            if stats.stopped:
                bar.write(stats.stopped)
    except FatalWorkerError as exc:
        bar.close()
        ledger.close()
        raise CLIError(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C: every finished cell is stored already
        bar.close()
        ledger.close()
        print(f"fugu-lite generate: interrupted; the finished cells are kept in {store_root}: run the same "
              "command with --resume to continue", file=sys.stderr)
        return 130
    bar.close()
    ledger.close()
    records = {w: store.read(batch, w) for w in config.worker_ids}
    failed = failed_cells(tasks[:n], records)
    rows = reward_rows(tasks[:n], records, config)
    if not rows and not failed:
        raise CLIError("no task has an answer from every worker yet; run again with --resume")
    if rows:
        write_reward_jsonl(rows, out)
        print(f"{len(rows)} of {n} tasks complete -> {out} (responses kept in {store_root})")
        print(f"utility: {config.reward.describe()} ({reward_source(config, args.workers)}); "
              f"train and evaluate with --workers {args.workers} to use the same weights")
        health = signal_health(__import__("numpy").array([r.rewards for r in rows]))
        print(f"learning signal: {health}")
    if failed:
        print(describe_failed(failed, n * len(config.worker_ids)), file=sys.stderr)
        return FAILED_CELLS_EXIT
    return 0


FAILED_CELLS_EXIT = 3  # `generate`: some cells failed (2 is a usage error)
SHOWN_FAILURES = 10


def failed_cells(tasks, records: dict) -> list[tuple[str, str, str]]:
    """(task id, worker id, error kind) of every cell whose latest record failed, in task order."""
    from fugu_pipeline.collect.partition import error_kind

    out = []
    for t in tasks:
        for w, recs in records.items():
            rec = recs.get(t.task_id)
            if rec is not None and rec.status == "failed":
                out.append((t.task_id, w, error_kind(rec.error)))
    return out


def describe_failed(failed: list[tuple[str, str, str]], cells: int) -> str:
    """The closing lines of a run with failed cells: how many, the first `SHOWN_FAILURES` named."""
    shown = [f"  {task} x {worker}: {kind}" for task, worker, kind in failed[:SHOWN_FAILURES]]
    more = [f"  and {len(failed) - SHOWN_FAILURES} more"] if len(failed) > SHOWN_FAILURES else []
    return "\n".join([f"fugu-lite generate: {len(failed)} of {cells} cells failed (exit status {FAILED_CELLS_EXIT}); "
                      "run the same command with --resume to call them again:", *shown, *more])


TABLE_OPTIONS = ("prompt_column", "workers", "domain_column", "split_column", "id_column", "cost_column", "answer_column", "drop_incomplete",
                 "test_file", "val_file", "score_range")
LONG_OPTIONS = ("worker_column", "score_column", "latency_column", "prompts", "duplicates")
WIDE_OPTIONS = ("score_field", "prices", "input_tokens_field", "output_tokens_field")  # import table only


def cmd_import(args) -> int:
    from fugu_pipeline.matrix.importers import import_source, worker_names

    given = {k: v for k, v in (("seed", args.seed), ("test_fraction", getattr(args, "test_fraction", None)),
                                ("val_fraction", getattr(args, "val_fraction", None))) if v is not None}
    if args.kind == "jsonl" and given.keys() == {"seed"}:
        raise CLIError("--seed draws the splits of a jsonl file's rows that name none, with --test-fraction and/or "
                       "--val-fraction; a row that names its split keeps it")
    table = {k: getattr(args, k, None) for k in TABLE_OPTIONS + LONG_OPTIONS + WIDE_OPTIONS}
    table = {k: v for k, v in table.items() if v not in (None, False)}
    if "workers" in table:
        table["workers"] = worker_names(table["workers"])
        if args.kind == "jsonl":
            given = {**given, "workers": table.pop("workers")}
    if table and args.kind not in ("table", "long"):
        first = next(iter(table))
        raise CLIError(f"--{first.replace('_', '-')} is an option of `fugu-lite import table` and `import long`"
                       + (" and `import jsonl`" if first == "workers" else ""))
    only_long = [k for k in table if k in LONG_OPTIONS]
    if only_long and args.kind != "long":
        raise CLIError(f"--{only_long[0].replace('_', '-')} is an option of `fugu-lite import long` (one row per call)")
    only_wide = [k for k in table if k in WIDE_OPTIONS]
    if only_wide and args.kind != "table":
        raise CLIError(f"--{only_wide[0].replace('_', '-')} is an option of `fugu-lite import table` (one column per worker)")
    if args.kind in ("table", "long"):
        if "score_range" in table:
            typed = table["score_range"]
            parts = typed.replace(" ", "").split(",")
            try:
                table["score_range"] = tuple(float(x) for x in parts)
            except ValueError:
                parts = []
            if len(parts) != 2:
                raise CLIError(f"--score-range {typed!r}: give LOW,HIGH, e.g. 1,10")
        given = {**given, **table}
    if "test_fraction" in given and args.kind == "dcrouter":
        raise CLIError("--test-fraction: dcrouter's test split is its upstream test file; only --val-fraction applies")
    for k in ("test_fraction", "val_fraction"):
        if k in given and not 0 <= given[k] < 1:
            raise CLIError(f"--{k.replace('_', '-')} {given[k]}: give a share in [0, 1), e.g. 0.5")
    try:
        summary = import_source(args.kind, Path(args.path), Path(args.output), **given)
    except ValueError as exc:
        if args.kind in ("table", "long") or hasattr(exc, "errors"):  # options checked by TableSpec / LongSpec, or a record
            from fugu_pipeline.matrix.import_common import option_errors
            from fugu_pipeline.tasks.loading import TaskFileError

            reasons = option_errors(exc, lambda f: "--" + f.replace("_", "-"))  # not pydantic's dump of every input
            if isinstance(exc, TaskFileError):  # it names the file; main prints "fugu-lite import: " before it
                raise CLIError(reasons) from None
            raise CLIError(f"import {args.kind}: {reasons}") from None
        if "test_fraction" not in str(exc):
            raise
        raise CLIError(f"--test-fraction and --val-fraction: {exc}") from None
    note = _record_import(Path(args.output), args.ledger)
    if note:
        summary["ledger"] = note
    print_json(summary)
    return 0


def _record_import(out: Path, ledger_path: str | None) -> str | None:
    """One `import` line in the cost ledger: what the imported calls cost, as the data records it
    (a receipt of a head trained on it may then claim that cost). None when it records no cost."""
    import hashlib
    import math

    from fugu_pipeline.ledger import LEDGER_FILE, CostLedger
    from fugu_pipeline.matrix.import_format import read_reward_jsonl

    total = 0.0
    for row in read_reward_jsonl(out):
        total += sum(c for c in (row.cost_usd or []) if c is not None and math.isfinite(c) and c > 0)
    if total <= 0:
        return None
    digest = hashlib.sha256(out.read_bytes()).hexdigest()[:16]
    with CostLedger(ledger_path or LEDGER_FILE) as ledger:
        e = ledger.append("import", total, ref=f"{out.name}@{digest}")
    return f"{ledger.path} line {e.seq}: import of ${total:.4f}"


def cmd_convert(args) -> int:
    from fugu_pipeline.tasks.converters import run

    return run(args)


def reward_rows(tasks, recs: dict, config) -> list:
    """One reward-import row per task that every worker answered (`recs`: worker -> task id -> its
    call record), with quality, cost (the call's and its judge's), latency, the utility of the
    config's weights and each worker's reply, so the file trains cascades too."""
    from fugu_pipeline.matrix.import_format import RewardRow
    from fugu_pipeline.tasks.final_answer import kind_for_grader

    rows = []
    for t in tasks:
        cells = [recs[w].get(t.task_id) for w in config.worker_ids]
        if any(c is None or c.status != "ok" for c in cells):
            continue
        q = [c.quality for c in cells]
        cost = [c.cost_usd + c.judge_cost_usd for c in cells]
        lat = [c.latency_s for c in cells]
        rows.append(RewardRow(task_id=t.task_id, prompt=t.prompt, domain=t.domain, split=t.split,
                              worker_ids=config.worker_ids, quality=q, cost_usd=cost, latency_s=lat,
                              rewards=[config.reward.utility(a, b, c) for a, b, c in zip(q, cost, lat)],
                              answers=[c.answer for c in cells], answer_kind=kind_for_grader(t.grader.type)))
    return rows
