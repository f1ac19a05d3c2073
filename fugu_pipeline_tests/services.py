"""Loopback services for the scale-out tests, started and stopped through scripts/services.sh.

A test that needs PostgreSQL, Redis or a browser skips, saying why, unless FUGU_SERVICE_TESTS=1
(`.ci/run` sets it after `bash scripts/services.sh install`) and the program is installed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "services.sh"
VENV_BIN = Path(sys.executable).parent
GATE = "FUGU_SERVICE_TESTS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_service_tests(what: str) -> None:
    if os.environ.get(GATE) != "1":
        pytest.skip(f"{what}: real-service test, runs with {GATE}=1 (.ci/run sets it after `bash scripts/services.sh install`)")


def installed(service: str) -> str | None:
    """None when the service's program is installed, else why not."""
    if service == "postgres":
        ok = bool(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or shutil.which("pg_ctl")
        return None if ok else "PostgreSQL is not installed (bash scripts/services.sh install)"
    if service == "redis":
        return None if shutil.which("redis-server") else "redis-server is not installed (bash scripts/services.sh install)"
    if service == "chromium":
        return None if Path("/usr/bin/chromium").exists() else "Debian's chromium is not installed (bash scripts/services.sh install)"
    if service == "s3":
        return None if (VENV_BIN / "moto_server").exists() else "moto is not installed (pip install -e '.[dev]')"
    raise ValueError(service)


class Service:
    """One loopback service in its own folder; `stop()` ends exactly the process it started."""

    def __init__(self, kind: str, port: int | None = None):
        self.kind = kind
        self.port = port or free_port()
        # postgres runs as the `postgres` user, who cannot enter pytest's 0700 tmp folders
        self.dir = Path(tempfile.mkdtemp(prefix=f"fugu-{kind}-"))
        os.chmod(self.dir, 0o755)

    def _script(self, *args: str, env: dict | None = None) -> str:
        out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **(env or {})}, cwd=REPO)
        if out.returncode != 0:
            raise RuntimeError(f"services.sh {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip()

    def start(self) -> "Service":
        self._script("start", self.kind, str(self.dir), str(self.port))
        return self

    def stop(self) -> None:
        self._script("stop", self.kind, str(self.dir))

    def restart(self, down_s: float = 0.0) -> float:
        t0 = time.monotonic()
        self._script("restart", self.kind, str(self.dir), env={"FUGU_PG_DOWN_S": str(down_s)})
        return time.monotonic() - t0

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return {"redis": f"redis://127.0.0.1:{self.port}/0", "s3": f"http://127.0.0.1:{self.port}",
                "postgres": f"postgresql://dagster@127.0.0.1:{self.port}/dagster"}[self.kind]

    def pg_env(self) -> dict[str, str]:
        return {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": str(self.port), "DAGSTER_PG_USER": "dagster",
                "DAGSTER_PG_PASSWORD": "unused", "DAGSTER_PG_DB": "dagster"}


def split_sample(project: Path, batches: dict[str, int], start: int = 0) -> dict[str, list[str]]:
    """Write batch files made of the sample's tasks (distinct task ids per batch). Returns
    batch -> task ids."""
    rows = [json.loads(line) for line in (REPO / "data" / "benchgen" / "sample.jsonl").read_text().splitlines() if line.strip()]
    out, i = {}, start
    for name, n in batches.items():
        picked = []
        for _ in range(n):
            row = dict(rows[i % len(rows)])
            row["task_id"] = f"{name}-{i:05d}"
            picked.append(row)
            i += 1
        path = project / "data" / "benchgen" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in picked))
        out[name] = [r["task_id"] for r in picked]
    return out


def cell_counts(responses_dir: Path, expected: dict[str, list[str]], worker_ids: list[str]) -> dict:
    """Cells expected, present once, lost (never written) and duplicated (a cell answered by more
    than one call) over the response files; a failed call that was retried is not a duplicate."""
    lost = dup = present = 0
    for batch, task_ids in expected.items():
        for w in worker_ids:
            path = responses_dir / batch / f"{w}.jsonl"
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
            ok_by_task: dict[str, int] = {}
            for rec in lines:
                if rec.get("status") == "ok":
                    ok_by_task[rec["task_id"]] = ok_by_task.get(rec["task_id"], 0) + 1
            for t in task_ids:
                n = ok_by_task.get(t, 0)
                lost += n == 0
                dup += max(0, n - 1)
                present += n >= 1
    expected_n = sum(len(v) for v in expected.values()) * len(worker_ids)
    return {"expected": expected_n, "present": present, "lost": lost, "duplicated": dup}
