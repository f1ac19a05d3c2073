"""Every command on every page runs as written, after the README's set-up (`page_commands.py` says
how a page marks a block that cannot run offline).

The slow test copies the project (its git files, never the checkout's outputs) into a temporary
folder with `.venv` linked to the environment running the tests, runs the main job there once (the
README's and getting started's `fugu-lite pipeline --encoder tiny`: their block is that run), and
then, for each page, runs the page's ```bash blocks in order in a copy of that folder: one shell
state per page (exported variables and the working folder carry from one block to the next), every
unmarked block must exit 0. Servers (`serve`, `dagster dev`, `mkdocs serve`) start in the
background on free ports the test picks (never the docs' own 8080, 3000, 8000: a reader may be using
them; `page_commands.with_ports`), are probed on loopback and stopped when the page is done. On 2
cores the whole file takes about two and a half minutes, most of it the main job and the servers'
start-up. No block is timed: one still running after `BLOCK_TIMEOUT_S` (far beyond any block's
time on a loaded machine) is a stuck one, and the failure names its page and line.

The quick tests check the markers, that every command calls the project's programs through
`.venv/bin/` the same way, and that no page speaks of history or paths a user does not have.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.page_commands import (
    MAIN_JOB,
    bare_programs,
    blocks,
    page_ports,
    pages,
    stray_marks,
    with_ports,
    with_server_port,
)

PAGES = pages(REPO)
# pages with a block to run (an unmarked or a background one); a page whose blocks are all marked
# skip or same-as has nothing to run
RUN_PAGES = [p for p in PAGES if any(b.lang == "bash" and b.mark in (None, "background") for b in blocks(REPO, p))]
# what finds a stuck block or server, never what decides a slow one: far beyond their times on a loaded machine
BLOCK_TIMEOUT_S = 1200
SERVER_START_S = 600


def test_every_marker_sits_before_a_bash_block_and_says_why():
    bad = [m for p in PAGES for m in stray_marks(REPO, p)]
    assert not bad, "\n".join(bad)


def test_every_command_calls_the_projects_programs_through_the_venv():
    """`python scripts/x.py` is the system's Python, without the project (ModuleNotFoundError):
    every page calls `.venv/bin/python`, `.venv/bin/fugu-lite`, ... as the README's set-up leaves them."""
    bare = [line for p in PAGES for b in blocks(REPO, p) if b.lang == "bash" for line in bare_programs(b)]
    assert not bare, "\n".join(bare)


def test_same_as_blocks_are_on_the_page_they_name():
    missing = []
    for p in PAGES:
        for b in blocks(REPO, p):
            if b.mark == "same-as":
                other = REPO / b.arg
                texts = {o.text for o in blocks(REPO, other) if o.lang == "bash"} if other.is_file() else set()
                if b.text not in texts:
                    missing.append(f"{b.where}: not a block of {b.arg}")
    assert not missing, "\n".join(missing)


# History a reader of the site does not have, and places only the developers' machines have.
HISTORY = re.compile("|".join([
    r"\bBefore,", r"\(before[:,]", r"; before[:,]", r"\bpreviously\b", r"\bprevious round\b", r"\bearlier (?:stop|round|run)s?\b",
    r"\bthe shared \d-core\b", r"\bdevelopment machine\b", r"\.\./shared\b", r"/work/shared\b", r"\bused to\b",
    r"\bno longer\b", r"\bthis round\b", r"\bthe old code\b",
]))


def test_no_page_tells_history_or_points_at_the_developers_folders():
    found = [f"{p.relative_to(REPO)}:{n}: {m.group(0)!r} in {line.strip()[:100]}"
             for p in PAGES for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in [HISTORY.search(line)] if m]
    assert not found, "\n".join(found)


def _git_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the pages' commands run in a copy of the project's git files; git ls-files failed: {exc}")
    return [f for f in out.decode().split("\0") if f]


def _env() -> dict:
    """A newcomer's shell: none of the project's variables, no key, no Dagster home."""
    drop = ("FUGU_", "OPENROUTER_", "DAGSTER_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env


def _bash(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the project after the README's set-up and its main job, shared by every page."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "fugu-lite").exists():
        pytest.skip(f"{venv} holds no fugu-lite: the pages' commands need the project installed in this environment")
    root = tmp_path_factory.mktemp("pages") / "project"
    for rel in _git_files():
        src = REPO / rel
        if src.is_file() and not rel.startswith(".venv"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    (root / ".venv").symlink_to(venv)
    t0 = time.monotonic()
    main = _bash(MAIN_JOB, root, BLOCK_TIMEOUT_S)
    assert main.returncode == 0, f"{MAIN_JOB} exited {main.returncode}:\n{main.stdout[-3000:]}\n{main.stderr[-3000:]}"
    print(f"main job in {time.monotonic() - t0:.1f}s")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_server_a_page_starts_can_be_moved_to_a_free_port():
    """The page test runs each background server on a port it picks: the block's command must be one
    whose port it knows how to set, and no loopback URL of the page may keep a docs' port."""
    bad = []
    for p in PAGES:
        page = blocks(REPO, p)
        ports = {old: 50000 + i for i, old in enumerate(page_ports(page))}
        for b in page:
            if b.mark == "background":
                try:
                    with_server_port(with_ports(b.text, ports), ports[urlparse(b.arg).port or 80])
                except ValueError as exc:
                    bad.append(f"{b.where}: {exc}")
            if b.lang == "bash" and b.mark in (None, "background"):
                left = [old for old in ports if re.search(rf"(127\.0\.0\.1|localhost):{old}\b", with_ports(b.text, ports))]
                if left:
                    bad.append(f"{b.where}: port(s) {left} left in the block")
    assert not bad, "\n".join(bad)
    free = _free_port()  # the page's own port moved to one this machine has free
    moved = with_server_port(with_ports("curl http://127.0.0.1:8080/v1; .venv/bin/fugu-lite serve --workers w.yaml",
                                        {8080: free}), free)
    assert moved == f"curl http://127.0.0.1:{free}/v1; .venv/bin/fugu-lite serve --port {free} --workers w.yaml"
    assert with_server_port(".venv/bin/mkdocs serve  # here", free) == f".venv/bin/mkdocs serve --dev-addr 127.0.0.1:{free}  # here"


def _wait_up(url: str, proc: subprocess.Popen, log: Path, where: str) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{where}: the server exited {proc.returncode} before {url} answered:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url, timeout=10)  # any HTTP answer: up (a 401 without the token is up too)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    pytest.fail(f"{where}: stuck: {url} did not answer within {SERVER_START_S}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C to the server's process group, as a terminal sends it; then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(REPO)) for p in RUN_PAGES])
def test_the_pages_commands_run_as_written(page, project, tmp_path):
    work = tmp_path / "project"
    shutil.copytree(project, work, symlinks=True)
    state, where = tmp_path / "state.sh", tmp_path / "cwd"
    where.write_text(str(work))
    servers: list[subprocess.Popen] = []
    ran, t0 = [], time.monotonic()
    page_blocks = blocks(REPO, page)
    ports = {old: _free_port() for old in page_ports(page_blocks)}  # never the docs' own ports
    try:
        for b in page_blocks:
            if b.lang != "bash" or b.mark in ("skip", "same-as"):
                continue
            text = with_ports(b.text, ports)
            if b.text.strip() == MAIN_JOB:  # the shared run (the fixture ran this very command)
                ran.append(f"{b.where} (the shared main job)")
                continue
            t1 = time.monotonic()
            prelude = f'cd "$(cat {where})"; [ -f {state} ] && source {state}; set -e\n'
            if b.mark == "background":
                url = with_ports(b.arg, ports)
                log = tmp_path / f"server-{b.line}.log"
                with open(log, "w") as out:
                    proc = subprocess.Popen(["bash", "-c", prelude + with_server_port(text, ports[urlparse(b.arg).port or 80])],
                                            cwd=work, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                servers.append(proc)
                _wait_up(url, proc, log, b.where)
                ran.append(f"{b.where} (background, {url} answered after {time.monotonic() - t1:.1f}s)")
                continue
            script = prelude + text + f"\nexport -p > {state}; pwd > {where}\n"
            try:
                r = _bash(script, work, BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{b.where}: stuck: still running after {BLOCK_TIMEOUT_S}s:\n{text}")
            assert r.returncode == 0, (f"{b.where}: exit {r.returncode}\n--- block\n{b.text}\n--- stdout\n"
                                       f"{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
            ran.append(f"{b.where} {time.monotonic() - t1:.1f}s")
    finally:
        t1 = time.monotonic()
        for proc in servers:
            _stop(proc)
        ran.append(f"servers stopped in {time.monotonic() - t1:.1f}s")
    print(f"{page.relative_to(REPO)}: {len(ran)} block(s) in {time.monotonic() - t0:.1f}s: {', '.join(ran)}")
