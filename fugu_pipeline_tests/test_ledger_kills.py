"""The cost ledger never misses a paid call and never counts one twice, whatever instant a kill -9
lands at: `fugu-lite generate` against a real HTTP worker on 127.0.0.1 killed while a call is in
flight at the server, and at each step of the collection path (`call_journal.crash_point`: the
call announced, its cost line written, its record written), then resumed; the live term and a
coordinator's sessions likewise. Every call the server saw has exactly one line; the only lines
without a call are those of calls announced and never sent (counted at their worst case)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

from fugu_pipeline.ledger import CostLedger, read_entries
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline_tests.conftest import REPO

PRICE_IN, PRICE_OUT = 1e-5, 2e-5
MODELS = {"a": "test/model-a", "b": "test/model-b"}


def tasks(n: int) -> list[dict]:
    return [{"task_id": f"t{i}", "prompt": f"What is {i} plus 1000?", "domain": "math", "split": "train",
             "reference_answer": str(1000 + i), "grader": {"type": "numeric"}} for i in range(n)]


class Killer:
    """The stub's answers, and a kill -9 of the client when the server receives its k-th request
    (the call is then in flight: the server has it, the client never sees the answer)."""

    def __init__(self, stub: StubLLMServer):
        self.pid, self.at, self.seen = None, None, 0
        stub.answer_fn = self

    def arm(self, pid: int | None, at: int | None) -> None:
        self.pid, self.at, self.seen = pid, at, 0

    def __call__(self, model: str, prompt: str) -> str:
        self.seen += 1
        if self.pid is not None and self.seen == self.at:
            os.kill(self.pid, signal.SIGKILL)
        return f"The answer is {1000 + int(prompt.split()[2])}"


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-" + "cd" * 20)
    with StubLLMServer() as s:
        for m in MODELS.values():
            s.add_model(m, prompt=PRICE_IN, completion=PRICE_OUT)
        yield s


def project(tmp_path: Path, stub: StubLLMServer, n_tasks: int) -> tuple[Path, Path]:
    worker = {"kind": "openrouter", "base_url": stub.openrouter_url, "max_tokens": 50, "max_concurrency": 1,
              "max_price_in_per_mtok": PRICE_IN * 1e6, "max_price_out_per_mtok": PRICE_OUT * 1e6}
    raw = {"max_attempts": 1, "workers": [{"id": w, "model": m, **worker} for w, m in MODELS.items()]}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks(n_tasks)))
    return tmp_path / "w.yaml", tmp_path / "t.jsonl"


def requests_per_task(stub: StubLLMServer) -> Counter:
    out: Counter = Counter()
    for (_, prompt), n in stub.calls.items():
        out[f"t{int(prompt.split()[2])}"] += n
    return out


def check_accounting(ledger: Path, stub: StubLLMServer, kinds: tuple[str, ...], never_sent: int) -> list:
    """The assertions every kill test makes; returns the ledger's lines of `kinds`."""
    lines = [e for e in read_entries(ledger) if e.kind in kinds]
    made, counted = requests_per_task(stub), Counter(e.task_id for e in lines)
    missing = {t: n - counted[t] for t, n in made.items() if n > counted[t]}
    assert not missing, f"paid calls with no ledger line, per task: {missing}"
    twice = [k for k, n in Counter((e.call, e.kind) for e in lines).items() if n > 1]
    assert not twice, f"calls counted twice: {twice}"
    assert sum(counted.values()) - sum(made.values()) == never_sent  # only calls announced, never sent, have no request
    return lines


GENERATE_ROUNDS = [("server", 2), ("ledger", 2), ("intent", 2), ("record", 3), ("server", 3), (None, None)]


def test_generate_killed_at_every_step_counts_every_paid_call_once(tmp_path, stub):
    workers, task_file = project(tmp_path, stub, 6)
    ledger, out = tmp_path / "costs.jsonl", tmp_path / "r.jsonl"
    killer = Killer(stub)
    cmd = [sys.executable, "-m", "fugu_pipeline.cli", "generate", "--workers", str(workers), "--tasks", str(task_file),
           "--output", str(out), "--ledger", str(ledger), "--resume"]
    codes = []
    for how, at in GENERATE_ROUNDS:
        env = {**os.environ, "FUGU_TEST_CRASH_AT": f"{how}:{at}" if how not in (None, "server") else ""}
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killer.arm(proc.pid if how == "server" else None, at)
        proc.communicate(timeout=120)
        codes.append(proc.returncode)
    lines = check_accounting(ledger, stub, ("collection",), never_sent=1)
    assert codes == [-signal.SIGKILL] * 5 + [0], codes
    worst = [e for e in lines if e.worst_case]
    assert len(worst) == 3 and all(e.cost_usd > 0 for e in worst)  # two killed at the server, one announced only
    # every answered call's record carries its call id, whose line holds the record's cost
    exact = {e.call: e.cost_usd for e in lines if not e.worst_case}
    records = [json.loads(x) for p in sorted((tmp_path / "r.jsonl.responses").rglob("*.jsonl"))
               for x in p.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok"]
    assert len({(r["task_id"], r["worker_id"]) for r in ok}) == 12
    assert all(exact[r["call_id"]] == pytest.approx(r["cost_usd"]) for r in ok)
    assert len(exact) == len(ok) + 1  # and the call killed between its line and its record: counted, called again
    assert len(out.read_text().splitlines()) == 6


LIVE_CHILD = textwrap.dedent("""
    import sys, yaml
    from fugu_pipeline.evaluate.live import LivePolicy, OneCallEvaluator
    from fugu_pipeline.evaluate.live_store import LiveStore
    from fugu_pipeline.ledger import CostLedger
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.config import WorkersConfig
    config = WorkersConfig.model_validate(yaml.safe_load(open(sys.argv[1])))
    tasks = [Task.model_validate_json(x) for x in open(sys.argv[2])]
    store = LiveStore(sys.argv[4], "ctx") if len(sys.argv) > 4 else None
    ev = OneCallEvaluator(config, concurrency=1, ledger=CostLedger(sys.argv[3]), store=store)
    ev.evaluate(LivePolicy("head", "", {t.task_id: "a" for t in tasks}, head="h"), tasks)
""")


def test_the_live_term_killed_mid_call_counts_the_call(tmp_path, stub):
    workers, task_file = project(tmp_path, stub, 5)
    ledger = tmp_path / "costs.jsonl"
    killer = Killer(stub)
    cmd = [sys.executable, "-c", LIVE_CHILD, str(workers), str(task_file), str(ledger)]
    proc = subprocess.Popen(cmd, cwd=REPO)
    killer.arm(proc.pid, 3)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    killer.arm(None, None)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)  # the next run settles it
    assert again.returncode == 0, again.stderr[-2000:]
    lines = check_accounting(ledger, stub, ("live",), never_sent=0)
    assert len(lines) == 3 + 5 and [e.worst_case for e in lines] == [False, False, True] + [False] * 5
    assert "1 call(s) were in flight when a run was killed: counted at their worst case" in again.stderr
    with CostLedger(ledger) as book:
        assert book.settle_in_flight() == []  # settled once, and the journal removed
    assert not list((tmp_path / "costs.jsonl.in-flight").iterdir())


def test_the_live_term_killed_mid_call_keeps_what_it_finished(tmp_path, stub):
    """With the live store: the outcomes finished before a kill -9 are kept as they come, so the
    next run calls only the task killed in flight and those not reached (before: the store was
    written after the last task, and a kill lost every outcome of the run)."""
    workers, task_file = project(tmp_path, stub, 5)
    ledger, store = tmp_path / "costs.jsonl", tmp_path / "live"
    killer = Killer(stub)
    cmd = [sys.executable, "-c", LIVE_CHILD, str(workers), str(task_file), str(ledger), str(store)]
    proc = subprocess.Popen(cmd, cwd=REPO)
    killer.arm(proc.pid, 3)  # the third task's call in flight; the first two answered and graded
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    killer.arm(None, None)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert requests_per_task(stub) == {"t0": 1, "t1": 1, "t2": 2, "t3": 1, "t4": 1}
    lines = check_accounting(ledger, stub, ("live",), never_sent=0)
    assert len(lines) == 6 and sum(e.worst_case for e in lines) == 1


CASCADE_CHILD = textwrap.dedent("""
    import sys, torch, yaml
    torch.set_num_threads(1)
    from fugu_pipeline.evaluate.live import OneCallEvaluator
    from fugu_pipeline.evaluate.live_store import LiveStore
    from fugu_pipeline.ledger import CostLedger
    from fugu_pipeline.policies.cascade.live import CascadeLive
    from fugu_pipeline.policies.registry import load_router
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.workers.config import WorkersConfig
    config = WorkersConfig.model_validate(yaml.safe_load(open(sys.argv[1])))
    tasks = [Task.model_validate_json(x) for x in open(sys.argv[2])]
    ev = OneCallEvaluator(config, concurrency=1, ledger=CostLedger(sys.argv[3]), store=LiveStore(sys.argv[4], "ctx"))
    router = load_router(sys.argv[5], device="cpu")
    out = CascadeLive(ev).evaluate(router, "cascade-head", tasks)
    print(sum(o.calls for o in out))
""")


def test_a_cascades_live_run_killed_mid_call_counts_the_call_and_calls_nothing_twice(tmp_path, stub):
    """A cascade's live term (each step's workers called through the live evaluator) killed while
    a call is in flight: the next run settles it at its worst case; every call the server saw has
    one line; a third run reads every outcome from the store and calls nothing."""
    from fugu_pipeline.testing.cascade_serving import build_cascade_checkpoint

    stub.add_model("test/model-c", prompt=PRICE_IN, completion=PRICE_OUT)
    workers, task_file = project(tmp_path, stub, 4)
    raw = yaml.safe_load(workers.read_text())
    raw["workers"].append({**raw["workers"][0], "id": "c", "model": "test/model-c"})
    workers.write_text(yaml.safe_dump(raw))
    ckpt = build_cascade_checkpoint(tmp_path / "models", tmp_path / "emb", workers=["a", "b", "c"])
    ledger, store = tmp_path / "costs.jsonl", tmp_path / "live"
    killer = Killer(stub)
    cmd = [sys.executable, "-c", CASCADE_CHILD, str(workers), str(task_file), str(ledger), str(store), str(ckpt)]
    proc = subprocess.Popen(cmd, cwd=REPO)
    killer.arm(proc.pid, 3)  # the first step of the second task: its first call in flight
    proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    killer.arm(None, None)
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    # a step's workers are called at once: the kill finds one or both of the second task's calls
    # announced (the one that killed it reached the server; the other may not have been sent yet)
    settled = re.search(r"(\d+) call\(s\) were in flight when a run was killed: counted at their worst case", again.stderr)
    assert settled and int(settled[1]) in (1, 2), again.stderr
    in_flight = int(settled[1])
    live = [e for e in read_entries(ledger) if e.kind == "live"]
    never_sent = len(live) - sum(requests_per_task(stub).values())
    assert 0 <= never_sent <= in_flight - 1
    lines = check_accounting(ledger, stub, ("live",), never_sent=never_sent)
    assert sum(e.worst_case for e in lines) == in_flight
    # the first task, done and kept before the kill, is not run again: its two calls were made once
    assert requests_per_task(stub)["t0"] == 2 and int(again.stdout.split()[-1]) == 4 * 2  # each task: a, b agree
    seen = sum(stub.calls.values())
    third = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0 and sum(stub.calls.values()) == seen, third.stderr[-2000:]
    assert len(read_entries(ledger)) == len(lines)


SESSION_CHILD = textwrap.dedent("""
    import os, signal, sys, torch
    torch.set_num_threads(1)
    from pathlib import Path
    from fugu_pipeline.policies.coordinator.project import open_run, roles_encoder_settings
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.session.policy import FixedPolicy
    from fugu_pipeline.tasks.schema import Task
    from fugu_pipeline.testing.roles_batch import roles_batch
    from fugu_pipeline.policies.coordinator.train import RolesConfig
    from fugu_pipeline.workers.config import load_workers_config
    config = load_workers_config(sys.argv[1])
    tasks = [Task.model_validate(r) for r in roles_batch(8)]
    enc = Encoder.load(roles_encoder_settings("tiny", 256, device="cpu", dtype="float32"))
    run = open_run(config, enc.settings, Path(sys.argv[2]), tasks, RolesConfig(max_length=256), encoder=enc,
                   ledger=Path(sys.argv[3])).__enter__()
    run.runner.run([FixedPolicy(config.worker_ids, w) for w in config.worker_ids], [(t, 0) for t in tasks], True)
    os.kill(os.getpid(), signal.SIGKILL)  # the sessions are stored; the run never closes
""")


def test_a_stored_session_s_turns_are_in_the_ledger_when_the_run_is_killed(tmp_path):
    from fugu_pipeline.session.store import TrajectoryStore

    store, ledger = tmp_path / "trajectories", tmp_path / "costs.jsonl"
    proc = subprocess.run([sys.executable, "-c", SESSION_CHILD, str(REPO / "configs" / "workers.mock-roles.yaml"),
                           str(store), str(ledger)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (db,) = store.glob("*.sqlite")
    with TrajectoryStore(store, db.stem) as s:
        _, every = s.read()
    paid = [t for tr in every for t in tr.turns if t.status == "ok" and not t.reused]
    assert len(paid) >= 16
    lines = read_entries(ledger)
    assert len([e for e in lines if e.kind == "session"]) == len(paid)
    assert sum(e.cost_usd for e in lines) == pytest.approx(sum(t.cost_usd for t in paid))


ANNOUNCE_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from fugu_pipeline.ledger import CostLedger
    book = CostLedger(sys.argv[1])
    book.append("collection", 0.25, worker_id="a", task_id="t0", ref="b")
    book.begin("collection", worker_id="a", task_id="t1", ref="b", worst_usd=0.75)
    os.kill(os.getpid(), signal.SIGKILL)  # the call to t1 is in flight
""")


def test_a_pack_made_after_a_killed_run_cites_the_calls_it_left_in_flight(tmp_path):
    from fugu_pipeline.train.exchange import pack, read_receipt
    from fugu_pipeline_tests.harness_data import controlled_data, routing_head

    ledger = tmp_path / "costs.jsonl"
    proc = subprocess.run([sys.executable, "-c", ANNOUNCE_AND_DIE, str(ledger)], cwd=REPO, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ckpt = routing_head(tmp_path / "elsewhere", controlled_data(n_test=200), (0, 1, 2), method="es", cost=0.5)
    receipt = read_receipt(pack(ckpt, tmp_path / "pack", submitter="alice", ledger=ledger))
    assert receipt.ledger_lines == 2
    assert receipt.ledger_totals["collection"].calls == 2
    assert receipt.ledger_totals["collection"].cost_usd == pytest.approx(1.0)
    assert [e.worst_case for e in read_entries(tmp_path / "pack" / "ledger.jsonl")] == [False, True]
