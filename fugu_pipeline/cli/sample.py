"""`fugu-lite sample-data`: a small routing sample with replies, written offline.

The mock worker pool (`configs/workers.mock.yaml`) answers the shipped BenchGen sample tasks
(`data/benchgen/sample.jsonl`); every answer is graded as the main job grades it. The sample is
synthetic (deterministic mock workers, no real model), and it has everything real routing data
has: each worker's quality, cost, latency and reply, the task's domain and split. It is written in
the shapes the routing commands read, so every page's commands run on it:

- `routing.jsonl`: the reward-matrix JSONL (`train`, `evaluate`, `baseline`, cascades);
- `workers.yaml`: the worker pool with its `reward:` block, for `--workers`;
- `scores.csv`: a wide table, a column per worker (`import table`);
- `calls.csv`: a long table, a row per (task, worker) call (`import long`).
"""

from __future__ import annotations

import csv
import shutil
import tempfile
from pathlib import Path

from fugu_pipeline.cli.common import CLIError
from fugu_pipeline.cli.data import reward_rows

FILES = ("routing.jsonl", "workers.yaml", "scores.csv", "calls.csv")


def cmd_sample_data(args) -> int:
    import asyncio

    from fugu_pipeline.collect.partition import collect_partition
    from fugu_pipeline.collect.store import ResponseStore
    from fugu_pipeline.ledger import CostLedger
    from fugu_pipeline.matrix.import_format import write_reward_jsonl
    from fugu_pipeline.tasks.loading import load_tasks
    from fugu_pipeline.workers.config import load_workers_config

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: a file, not a folder; name a folder for the sample's files")
    there = [f for f in FILES if (out / f).exists()]
    if there and not args.force:
        raise CLIError(f"--out {out} already holds {', '.join(there)}: add --force to write them again, "
                       "or choose another folder")
    config = load_workers_config(args.workers)
    paid = [w.id for w in config.workers + ([config.judge] if config.judge else []) if w.kind != "mock"]
    if paid:
        raise CLIError(f"--workers {args.workers}: {', '.join(paid)} not mock worker(s); sample-data calls the "
                       "offline mock pool only (configs/workers.mock.yaml). Collect real answers with "
                       "`fugu-lite generate --workers W.yaml --tasks T.jsonl --output R.jsonl`")
    tasks = load_tasks(args.tasks)
    if args.limit is not None:
        tasks = tasks[: args.limit]
    with tempfile.TemporaryDirectory(prefix="fugu-sample-") as tmp:  # the mock pool's pretend bills stay out of the project's ledger
        store = ResponseStore(Path(tmp) / "responses")
        ledger = CostLedger(Path(tmp) / "costs.jsonl")
        for w in config.worker_ids:
            asyncio.run(collect_partition(tasks, "sample", w, config, store, ledger=ledger))
        ledger.close()
        recs = {w: store.read("sample", w) for w in config.worker_ids}
    rows = reward_rows(tasks, recs, config)
    if not rows:
        raise CLIError(f"--tasks {args.tasks}: no task got an answer from every mock worker; nothing was written")
    out.mkdir(parents=True, exist_ok=True)
    write_reward_jsonl(rows, out / "routing.jsonl")
    shutil.copyfile(args.workers, out / "workers.yaml")
    _write_tables(rows, out)
    splits = {s: sum(r.split == s for r in rows) for s in ("train", "val", "test")}
    domains = sorted({r.domain for r in rows})
    print(f"wrote {len(rows)} tasks x {len(config.worker_ids)} workers ({', '.join(config.worker_ids)}) to {out}/: "
          f"{', '.join(FILES)}")
    print(f"domains {', '.join(domains)}; splits " + ", ".join(f"{k} {v}" for k, v in splits.items()))
    print("synthetic: the offline mock pool's graded replies, not a real model's; for real data see "
          "`fugu-lite generate` (real workers) or `fugu-lite import` (published routing data)")
    return 0


def _write_tables(rows, out: Path) -> None:
    """The same sample as a wide table (a column per worker) and a long one (a row per call)."""
    workers = rows[0].worker_ids
    with open(out / "scores.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["task_id", "prompt", "domain", "split"] + [c for wid in workers
                                                               for c in (wid, f"{wid}|cost_usd", f"{wid}|answer")])
        for r in rows:
            w.writerow([r.task_id, r.prompt, r.domain, r.split]
                       + [v for i in range(len(workers)) for v in (r.quality[i], r.cost_usd[i], r.answers[i])])
    with open(out / "calls.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["task_id", "prompt", "domain", "split", "worker", "quality", "cost_usd", "latency_s", "answer"])
        for r in rows:
            for i, wid in enumerate(workers):
                w.writerow([r.task_id, r.prompt, r.domain, r.split, wid, r.quality[i], r.cost_usd[i],
                            r.latency_s[i], r.answers[i]])
