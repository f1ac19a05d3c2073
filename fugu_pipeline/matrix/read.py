"""Reading the reward matrix: arrays in fixed worker order, summaries, and health checks.

Every read goes through `open_read_only`. DuckDB lets no other process open a file while one
process holds a read-write connection to it, and the `duckdb` command line opens read-write by
default: a user looking at the matrix would make every check and every training step fail. So a
read that meets that lock says so in one line, retries for up to `FUGU_DUCKDB_LOCK_WAIT_S`
seconds (default 5), then reads a snapshot copy of the file (the matrix is only ever replaced
whole, by a rename, so the copy is the last build).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from fugu_pipeline.reward import UtilityConfig
from fugu_pipeline.settings import settings


log = logging.getLogger(__name__)
_HOLDER = re.compile(r"held in (.+?) \(PID (\d+)\)")


class RewardMatrixError(ValueError):
    pass


def _lock_conflict(exc: duckdb.IOException) -> bool:
    return "lock" in str(exc).lower()


def _holder(exc: duckdb.IOException) -> str:
    m = _HOLDER.search(str(exc))
    return f"PID {m.group(2)}, {m.group(1)}" if m else "another process"


@contextmanager
def open_read_only(db_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the matrix, even while another process holds a read-write one
    (see the module docstring)."""
    wait_s = settings().duckdb_lock_wait_s
    deadline, delay, warned = time.monotonic() + wait_s, 0.1, False
    while True:
        try:
            con = duckdb.connect(str(db_path), read_only=True)
            snapshot = None
            break
        except duckdb.IOException as exc:
            if not _lock_conflict(exc):
                raise _damaged(db_path, exc) from None
            if not warned:
                warned = True
                log.warning(f"{db_path} is locked by a read-write connection ({_holder(exc)}); retrying for {wait_s:g}s, "
                            f"then reading a snapshot copy. Close that connection, or open the file with `duckdb -readonly`.")
            if time.monotonic() >= deadline:
                snapshot, con = _open_snapshot(db_path, _holder(exc))
                break
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, 1.0)
    try:
        _check_schema(db_path, con)
        yield con
    except (duckdb.IOException, duckdb.SerializationException, duckdb.InternalException) as exc:
        raise _damaged(db_path, exc) from None  # blocks that cannot be read past a sound header
    finally:
        con.close()
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)


REBUILD = "rebuild it (materialize `reward_matrix`, or run `fugu-lite pipeline`) or restore it from a copy"

# What every reader of the matrix reads: the tables `build.SCHEMA` creates and the columns read here.
REQUIRED_COLUMNS = {
    "tasks": ("task_id", "batch", "prompt", "prompt_hash", "domain", "split", "tags"),
    "workers": ("position", "worker_id"),
    "responses": ("task_id", "worker_id", "status"),
    "rewards": ("task_id", "worker_id", "position", "quality", "cost_usd", "latency_s", "utility"),
    "reward_wide": ("task_id",),
    "meta": ("key", "value"),
}


def _damaged(db_path: Path, exc: Exception) -> RewardMatrixError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RewardMatrixError(f"{db_path} cannot be read as a reward matrix (truncated, damaged, or not a DuckDB "
                             f"file: {first}); {REBUILD}")


def _check_schema(db_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    """Refuse, in one line, a matrix that lacks a table or column the readers use (an older schema,
    or another DuckDB file), instead of a DuckDB catalog error from the first query."""
    have: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                     "WHERE table_schema = 'main'").fetchall():
        have.setdefault(table, set()).add(column)
    missing = [f"table {t}" if t not in have else f"column {t}.{c}"
               for t, cols in REQUIRED_COLUMNS.items() for c in (cols if t in have else cols[:1])
               if t not in have or c not in have[t]]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise RewardMatrixError(f"{db_path} is not a reward matrix of this version (no {shown}): it was built by an "
                                f"older version or is another DuckDB file; {REBUILD}")


def _open_snapshot(db_path: Path, holder: str) -> tuple[str, duckdb.DuckDBPyConnection]:
    folder = tempfile.mkdtemp(prefix="fugu-matrix-")
    copy = Path(folder) / db_path.name
    try:
        shutil.copyfile(db_path, copy)
        return folder, duckdb.connect(str(copy), read_only=True)
    except (OSError, duckdb.Error) as err:
        shutil.rmtree(folder, ignore_errors=True)
        raise RewardMatrixError(f"{db_path} is locked ({holder}) and a snapshot copy could not be read ({err}); "
                                f"close that connection and run again") from None


def matrix_summary(con: duckdb.DuckDBPyConnection) -> dict:
    n_tasks = con.execute("SELECT count(*) FROM tasks").fetchone()[0]
    n_workers = con.execute("SELECT count(*) FROM workers").fetchone()[0]
    n_cells = con.execute("SELECT count(*) FROM rewards").fetchone()[0]
    n_failed = con.execute("SELECT count(*) FROM responses WHERE status = 'failed'").fetchone()[0]
    return {"tasks": n_tasks, "workers": n_workers, "cells_filled": n_cells,
            "cells_expected": n_tasks * n_workers, "cells_failed": n_failed,
            "data_version": con.execute("SELECT value FROM meta WHERE key='data_version'").fetchone()[0]}


@dataclass
class RewardArrays:
    task_ids: list[str]
    prompts: list[str]
    domains: list[str]
    splits: np.ndarray
    worker_ids: list[str]
    utility: np.ndarray
    quality: np.ndarray
    cost_usd: np.ndarray
    latency_s: np.ndarray
    data_version: str
    n_incomplete: int
    tags: list[tuple[str, ...]] | None = None  # per task (the import's or the task file's tags)
    cost_simulated: bool = False  # every worker is a mock: its costs are simulated, nothing was paid


def read_arrays(db_path: Path, complete_only: bool = True) -> RewardArrays:
    """The matrix as arrays in fixed worker order; rows with a missing cell are dropped and
    counted (`n_incomplete`) unless `complete_only=False` (missing cells are then NaN)."""
    _require(db_path)
    with open_read_only(db_path) as con:
        return _arrays(con, complete_only)


def read_training_inputs(db_path: Path) -> tuple[RewardArrays, UtilityConfig, str]:
    """What a trainer reads, through one connection: the complete rows (`read_arrays`), the
    utility weights (`read_utility_config`) and how they were made (`read_utility_source`).
    Opening the file costs tens of milliseconds of CPU, and the main job's steps read all three
    many times over."""
    _require(db_path)
    with open_read_only(db_path) as con:
        return _arrays(con, True), _utility_config(db_path, con), _utility_source(con)


def _require(db_path: Path) -> None:
    if not db_path.exists():
        raise RewardMatrixError(f"{db_path}: no reward matrix yet; materialize `reward_matrix` (or run `fugu-lite pipeline`)")


def _arrays(con: duckdb.DuckDBPyConnection, complete_only: bool) -> RewardArrays:
    kinds = con.execute("SELECT worker_id, kind FROM workers ORDER BY position").fetchall()
    workers = [r[0] for r in kinds]
    tasks = con.execute("SELECT task_id, prompt, domain, split, tags FROM tasks ORDER BY task_id").fetchall()
    cells = con.execute("SELECT task_id, position, quality, cost_usd, latency_s, utility FROM rewards").fetchall()
    version = con.execute("SELECT value FROM meta WHERE key='data_version'").fetchone()[0]
    idx = {t[0]: i for i, t in enumerate(tasks)}
    shape = (len(tasks), len(workers))
    U, Q, C, L = (np.full(shape, np.nan) for _ in range(4))
    for tid, p, q, c, lat, u in cells:
        i = idx[tid]
        U[i, p], Q[i, p], C[i, p], L[i, p] = u, (np.nan if q is None else q), c, lat
    keep = ~np.isnan(U).any(axis=1) if complete_only else np.ones(len(tasks), bool)
    sel = np.flatnonzero(keep)
    return RewardArrays(
        task_ids=[tasks[i][0] for i in sel], prompts=[tasks[i][1] for i in sel],
        domains=[tasks[i][2] for i in sel], splits=np.array([tasks[i][3] for i in sel]),
        worker_ids=workers, utility=U[sel], quality=Q[sel], cost_usd=C[sel], latency_s=L[sel],
        data_version=version, n_incomplete=int((~keep).sum()),
        tags=[tuple(tasks[i][4] or ()) for i in sel], cost_simulated=bool(kinds) and all(k == "mock" for _, k in kinds),
    )


def missing_cells_note(db_path: Path) -> str:
    """Which workers lack graded cells, in words ("" when none does): the workers whose missing
    cells leave rows incomplete, each with its graded and failed counts, fewest first."""
    with open_read_only(db_path) as con:
        n_tasks = con.execute("SELECT count(*) FROM tasks").fetchone()[0]
        rows = con.execute(
            "SELECT w.worker_id, (SELECT count(*) FROM rewards r WHERE r.position = w.position), "
            "(SELECT count(*) FROM responses s WHERE s.worker_id = w.worker_id AND s.status = 'failed') "
            "FROM workers w ORDER BY 2, w.position").fetchall()
    short = [f"{w} has {n} of {n_tasks} cells graded ({f} failed)" for w, n, f in rows if n < n_tasks]
    if not short:
        return ""
    return ("; ".join(short[:5]) + (f" (+{len(short) - 5} more)" if len(short) > 5 else "")
            + ": collect its missing cells again (the `responses` partitions, or `fugu-lite pipeline`), "
              "or remove it from the worker config, then rebuild the matrix")


# --------------------------------------------------------------------------- health


def signal_health(utility: np.ndarray, splits: np.ndarray | None = None, tol: float = 1e-9) -> dict:
    """How much there is to learn: ties, unique winners, and the oracle − best-fixed gap."""
    U = np.asarray(utility, float)
    if U.size == 0:
        return {"tasks": 0, "all_tie_share": 1.0, "unique_winner_share": 0.0, "oracle_minus_best_fixed": 0.0}
    best = U.max(axis=1, keepdims=True)
    n_best = (U >= best - tol).sum(axis=1)
    all_tie = float(np.mean(n_best == U.shape[1]))
    unique = float(np.mean(n_best == 1))
    oracle = float(best.mean())
    fixed = float(U.mean(axis=0).max())
    return {"tasks": int(U.shape[0]), "all_tie_share": all_tie, "unique_winner_share": unique,
            "oracle_minus_best_fixed": oracle - fixed}


def little_to_learn(health: dict, min_gap: float = 0.02, max_tie_share: float = 0.9) -> str | None:
    if health["tasks"] == 0:
        return "the matrix has no complete rows"
    if health["all_tie_share"] >= max_tie_share:
        return f"{health['all_tie_share']:.0%} of tasks tie across all workers"
    if health["oracle_minus_best_fixed"] < min_gap:
        return f"oracle beats the best fixed worker by only {health['oracle_minus_best_fixed']:.4f}"
    return None


def check_no_nan(db_path: Path) -> int:
    with open_read_only(db_path) as con:
        return con.execute(
            "SELECT count(*) FROM rewards WHERE isnan(utility) OR isinf(utility) OR utility IS NULL"
        ).fetchone()[0]


def read_data_version(db_path: Path) -> str:
    """The matrix's data version (every graded cell, prompt and split: `build.data_version`), the
    `reward_matrix` asset's too: what a step trained on it names as its input."""
    _require(db_path)
    with open_read_only(db_path) as con:
        return con.execute("SELECT value FROM meta WHERE key='data_version'").fetchone()[0]


def read_utility_config(db_path: Path) -> UtilityConfig:
    """The utility weights the matrix was built with (its `meta` table)."""
    with open_read_only(db_path) as con:
        return _utility_config(db_path, con)


def _utility_config(db_path: Path, con: duckdb.DuckDBPyConnection) -> UtilityConfig:
    row = con.execute("SELECT value FROM meta WHERE key='utility'").fetchone()
    if row is None:
        raise RewardMatrixError(f"{db_path}: the matrix records no utility weights; rebuild it (materialize reward_matrix)")
    return UtilityConfig.model_validate_json(row[0])


def read_utility_source(db_path: Path) -> str:
    """How the matrix's utility was made and where its weights came from ("" for older matrices)."""
    with open_read_only(db_path) as con:
        return _utility_source(con)


def _utility_source(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute("SELECT value FROM meta WHERE key='utility_source'").fetchone()
    return row[0] if row else ""
