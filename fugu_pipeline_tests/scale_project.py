"""A throwaway deployment for the scale-out tests: a project folder with a slow mock pool, the
Postgres instance variant, and the Dagster daemon (or `dagster dev`) as child processes."""

from __future__ import annotations

import json
import os
import tempfile
import shutil
import signal
import subprocess
from pathlib import Path

from fugu_pipeline_tests.services import REPO, VENV_BIN

WORKER_IDS = ["math-expert", "code-expert", "general-expert"]
OUTPUT = Path(os.environ.get("FUGU_TEST_OUTPUT") or Path(tempfile.gettempdir()) / "fugu-test-output")  # never the checkout


def slow_pool_yaml(sleep_s: float, max_concurrency: int = 4) -> str:
    """The mock pool with a real delay per call, so partitions overlap and last long enough to
    restart a service under them."""
    strengths = {"math-expert": (0.92, 0.40, 0.45), "code-expert": (0.45, 0.92, 0.40), "general-expert": (0.35, 0.30, 0.90)}
    lines = ["reward: {quality_weight: 1.0, cost_weight: 0.1, latency_weight: 0.05, cost_scale_usd: 0.01, latency_scale_s: 10.0}",
             "judge: {id: mock-judge, kind: mock, mock: {cost_usd: 0.0002, latency_s: 0.5}}", "workers:"]
    for w, (m, c, g) in strengths.items():
        lines.append(f"  - {{id: {w}, kind: mock, max_concurrency: {max_concurrency}, mock: {{strengths: "
                     f"{{math: {m}, code: {c}, general: {g}}}, cost_usd: 0.002, latency_s: 2.0, sleep_s: {sleep_s}}}}}")
    return "\n".join(lines) + "\n"


def make_project(root: Path, instance_yaml: Path, sleep_s: float = 0.0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "configs").mkdir(exist_ok=True)
    (root / "configs" / "workers.slow.yaml").write_text(slow_pool_yaml(sleep_s))
    shutil.copy(instance_yaml, root / "dagster.yaml")
    shutil.copy(REPO / "workspace.yaml", root / "workspace.yaml")
    for name in ("train_sft.yaml", "train_rl.yaml", "train_es.yaml", "promotion.yaml"):
        shutil.copy(REPO / "configs" / name, root / "configs" / name)
    return root


def project_env(project: Path, extra: dict | None = None) -> dict[str, str]:
    env = {**os.environ, "DAGSTER_HOME": str(project), "FUGU_PROJECT_DIR": str(project),
           "FUGU_WORKERS_CONFIG": "configs/workers.slow.yaml", "FUGU_ENCODER": "tiny",
           "FUGU_BATCH_SENSOR_INTERVAL_S": "5", "FUGU_AUTOMATION_INTERVAL_S": "5", "PYTHONUNBUFFERED": "1"}
    env.update(extra or {})
    return env


def default_signals() -> None:
    """In a child: SIGINT and SIGTERM back to their defaults. A process started in the background by
    a non-interactive shell (a CI script) inherits SIGINT ignored, and Dagster's commands map SIGTERM
    to SIGINT's handler: `stop()`'s SIGTERM was then ignored until the SIGKILL 30 s later."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Child:
    """A child process in its own session; `stop()` signals exactly that process group."""

    def __init__(self, args: list[str], cwd: Path, env: dict, log: Path):
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=default_signals)

    def exited(self) -> str | None:
        """None while the process runs; once it has exited, its exit code and log tail (a wait's `alive`)."""
        if self.proc.poll() is None:
            return None
        return f"{Path(self.proc.args[0]).name} exited ({self.proc.returncode}):\n{self.log.read_text(errors='replace')[-4000:]}"

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._fh.close()


def start_daemon(project: Path, env: dict) -> Child:
    return Child([str(VENV_BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], project, env, project / "daemon.log")


def run_statuses(instance) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in instance.get_runs():
        out[r.status.value] = out.get(r.status.value, 0) + 1
    return out


def save_figures(name: str, figures: dict) -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    path = OUTPUT / f"{name}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return path
