"""What the main job runs and what it skips, and why: one `Decision` per step.

The rule is Dagster's: a step runs when its asset (or partition) is MISSING or STALE
(`staleness.py`: its code version, or an input's data version, or a settings asset's observed
version differs from what its latest materialization recorded), or when something upstream of it
runs in this job (its input may come out different; when it comes out the same, the step finds its
record and computes nothing). Otherwise it is FRESH and skipped, with the run that made it.

A few inputs are files Dagster cannot see, so their versions are compared here, the same way:

- `tasks[batch]`: the batch file's content version against the partition's data version (what the
  batch sensor compares too);
- `responses[batch|worker]`: a partition whose file changed on disk since its latest run (an answer
  or a grade edited by hand: its content version against the partition's data version) runs again
  (it calls nothing, records the file's new version, and so the matrix and what reads it are built
  again); so does one whose latest run left failed, missing or stopped cells (it calls only those);
- `reward_matrix`: the combined version of every `responses` partition against the one it was built
  from (Dagster stops comparing partition versions above 100 partitions), and a matrix imported
  from routing data is rebuilt from the collection;
- any asset: an output its latest materialization names (a checkpoint, a report, the matrix file)
  that is gone from disk; and the run config it was given (`--layer-sets` for `router_heads`), which
  Dagster's versions do not cover, against the one asked for now.
"""

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from fugu_pipeline.defs.models import RUN_CONFIG
from fugu_pipeline.defs.staleness import StaleStatus, cause_text, resolver
from fugu_pipeline.defs.versions import DATA_VERSION_TAG, RESPONSES_VERSION, file_version, responses_version

OUTPUT_PATHS = ("checkpoint", "report", "path", "selected", "cascade")  # metadata naming an asset's output on disk


@dataclass
class Decision:
    key: str
    partition: str | None
    run: bool
    why: str

    @property
    def label(self) -> str:
        return f"{self.key}[{self.partition}]" if self.partition else self.key


def _latest(instance: dg.DagsterInstance, key: str, partition: str | None = None):
    """The latest materialization record of `key` (or of one partition), or None."""
    flt = dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition] if partition else None)
    records = instance.fetch_materializations(flt, limit=1).records
    return records[0] if records else None


def _meta(record) -> dict:
    return {k: getattr(v, "value", v) for k, v in record.asset_materialization.metadata.items()}


def _since(record) -> str:
    import time

    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.timestamp))
    return f"run {record.run_id[:8]} ({when})"


def _gone(record) -> str | None:
    """An output the materialization names that is no longer on disk."""
    meta = record.asset_materialization.metadata
    for name in OUTPUT_PATHS:
        value = meta.get(name)
        if isinstance(value, dg.PathMetadataValue) and value.value and not Path(value.value).exists():
            return f"its output {value.value} is gone"
    return None


class Planner:
    """Decisions over the instance as it is now (make a new one after a run: answers are cached)."""

    def __init__(self, instance: dg.DagsterInstance, defs: dg.Definitions):
        self.instance, self.graph = instance, defs.resolve_asset_graph()
        self.res = resolver(instance, self.graph)

    def _status(self, key: str, partition: str | None = None) -> tuple[str | None, object]:
        """(why it runs or None, its latest record) by Dagster's status and the output-on-disk check."""
        record = _latest(self.instance, key, partition)
        status = self.res.get_status(dg.AssetKey(key), partition) if record is not None else StaleStatus.MISSING
        if status == StaleStatus.MISSING or record is None:
            return "never materialized", None
        if status == StaleStatus.STALE:
            return f"stale: {cause_text(self.res, dg.AssetKey(key), partition)}", record
        return _gone(record), record

    def _fresh(self, key: str, partition: str | None, record, what: str = "inputs, code and settings") -> Decision:
        return Decision(key, partition, False, f"fresh: {what} unchanged since {_since(record)}")

    def tasks(self, batch: str, path: Path) -> Decision:
        why, record = self._status("tasks", batch)
        if why is None and (record.event_log_entry.tags or {}).get(DATA_VERSION_TAG) != file_version(path):
            why = f"stale: {path.name} changed"
        return Decision("tasks", batch, True, why) if why else self._fresh("tasks", batch, record, "file and code")

    def responses(self, batch: str, worker: str) -> Decision:
        part = f"{batch}|{worker}"
        why, record = self._status("responses", part)
        if why is None:
            meta, loaded = _meta(record), _latest(self.instance, "tasks", batch)
            n_tasks = _meta(loaded).get("tasks") if loaded is not None else None
            recorded = (record.event_log_entry.tags or {}).get(DATA_VERSION_TAG)
            if meta.get("path") and recorded and file_version(Path(str(meta["path"]))) != recorded:
                why = f"stale: {Path(str(meta['path'])).name} changed on disk since {_since(record)}"
            elif meta.get("cells_failed"):
                why = f"{meta['cells_failed']} failed cell(s) to call again"
            elif meta.get("stopped"):
                why = f"its last run stopped early ({str(meta['stopped'])[:80]})"
            elif isinstance(n_tasks, int) and int(meta.get("dagster/row_count") or 0) < n_tasks:
                why = f"{n_tasks - int(meta.get('dagster/row_count') or 0)} cell(s) not collected yet"
        part_key = dg.MultiPartitionKey({"batch": batch, "worker": worker})
        return Decision("responses", part_key, True, why) if why else self._fresh("responses", part_key, record,
                                                                                 "tasks and cells")

    def matrix(self) -> Decision:
        why, record = self._status("reward_matrix")
        if why is None:
            meta = _meta(record)
            if str(meta.get("source", "")).startswith("import:"):
                why = "it holds imported routing data; the main job builds it from the collection"
            elif meta.get(RESPONSES_VERSION) != responses_version(self.instance):
                why = "stale: responses changed"
        return Decision("reward_matrix", None, True, why) if why else self._fresh("reward_matrix", None, record)

    def downstream(self, keys: list[str], run_config: dict[str, dict] | None = None) -> list[Decision]:
        """One decision per key, in the order given (the graph's): runs when missing, stale, its output
        gone, given another run config than its latest materialization was, or downstream of a step
        that runs."""
        out, running = [], set()
        for key in keys:
            why, record = self._status(key)
            if why is None and RUN_CONFIG in (meta := _meta(record)) and meta[RUN_CONFIG] != (run_config or {}).get(key, {}):
                why = f"stale: its run config changed ({meta[RUN_CONFIG]} -> {(run_config or {}).get(key, {})})"
            parents = {p.to_user_string() for p in self.graph.get(dg.AssetKey(key)).parent_keys}
            if why is None and parents & running:
                why = f"upstream runs ({', '.join(sorted(parents & running))})"
            if why:
                running.add(key)
                out.append(Decision(key, None, True, why))
            else:
                out.append(self._fresh(key, None, record))
        return out
