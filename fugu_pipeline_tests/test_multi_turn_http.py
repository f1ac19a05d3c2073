"""The multi-turn coordinator with real HTTP workers: `openai_compatible` workers on a stub LLM server
on 127.0.0.1 (`testing/stub_llm.py`) that replies by role. Training (`train_coordinator`, what the
`router_roles` asset runs), `fugu-lite evaluate-roles` and `fugu-lite validate` of a coordinator pack
each run many batches of sessions, then close their clients: every batch must find clients that
belong to the loop it runs on. (`serve` and `ask --mode multi-turn` against the same kind of stub:
`test_roles_serve.py`, which also runs here on the run's one loop.)

Small on purpose: a few tasks, two generations, three turns at most."""

from __future__ import annotations

import asyncio
import shutil
import warnings

import pytest
import yaml

from fugu_pipeline.policies.coordinator.project import open_run, train_coordinator
from fugu_pipeline.tasks.schema import Task
from fugu_pipeline.testing.roles_batch import roles_batch, write_roles_batch
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.policies.coordinator.train import RolesConfig
from fugu_pipeline.workers.config import WorkersConfig
from fugu_pipeline_tests import roles_fixtures

from .conftest import REPO

IDS = ["fast-solver", "planner", "checker"]
REPLIES = {"thinker": "Plan: work it out step by step, then check it.", "worker": "Worked it out.\nFinal answer: 42",
           "verifier": "I checked it.\nVERDICT: ACCEPT"}
TINY_RUN = dict(generations=2, population_size=4, tasks_per_generation=3, explore_tasks=3, explore_seeds=1,
                val_every=1, val_tasks=3, val_seeds=1, max_turns=3, max_length=256)
QUIET = lambda s: None  # noqa: E731


def http_workers(base_url: str) -> dict:
    """The mock-roles pool's worker ids and judge as openai_compatible workers at `base_url`."""
    def worker(i: int, wid: str) -> dict:
        return {"id": wid, "kind": "openai_compatible", "model": f"stub/{wid}", "base_url": base_url,
                "price_in_per_mtok": 1.0 + i, "price_out_per_mtok": 2.0 + i}

    return {"workers": [worker(i, w) for i, w in enumerate(IDS)], "judge": worker(9, "judge"),
            "timeout_s": 10.0, "connect_timeout_s": 2.0, "read_timeout_s": 5.0}


@pytest.fixture(scope="module")
def stub():
    with StubLLMServer() as s:
        for role, text in REPLIES.items():
            s.set_role_reply(role, text)
        yield s


encoder = roles_fixtures.encoder  # the tiny encoder as the coordinator reads transcripts, once per file


@pytest.fixture(scope="module")
def project(tmp_path_factory, stub):
    """A host project: the roles tasks, the HTTP worker config, a small roles config."""
    root = tmp_path_factory.mktemp("http-project")
    shutil.copytree(REPO / "configs", root / "configs")
    write_roles_batch(root / "data" / "benchgen" / "roles.jsonl", n_per_family=20)
    (root / "configs" / "workers.http.yaml").write_text(yaml.safe_dump(http_workers(stub.openai_url)))
    (root / "configs" / "train_roles.yaml").write_text(yaml.safe_dump(TINY_RUN))
    return root


def tasks_of() -> list[Task]:
    return [Task.model_validate(r) for r in roles_batch(20)]  # 36 train, 9 val, 15 test


@pytest.fixture(scope="module")
def checkpoint(project, encoder):
    """A coordinator trained on the mock pool (its ledger in the project), for evaluate-roles and
    validate to judge against the HTTP workers."""
    from fugu_pipeline.workers.config import load_workers_config

    cfg = RolesConfig(**{**TINY_RUN, "generations": 3})  # a pack's receipt needs 3 fitness steps
    with open_run(load_workers_config(REPO / "configs" / "workers.mock-roles.yaml"), encoder.settings,
                  project / "data" / "mock-trajectories", tasks_of(), cfg, encoder=encoder,
                  ledger=project / "data" / "ledger" / "costs.jsonl") as run:
        return train_coordinator(run, tasks_of(), cfg, project / "elsewhere", log=QUIET)[0]


def test_training_against_http_workers_runs_every_generation(project, encoder, stub):
    """`train_coordinator` (what the `router_roles` asset calls):
    exploration, every generation's candidates and validation are separate batches of sessions.
    With one new event loop per batch, the second batch found HTTP clients bound to the first loop
    (RuntimeError: Event loop is closed)."""
    config = WorkersConfig.model_validate(http_workers(stub.openai_url))
    cfg = RolesConfig(**TINY_RUN)
    before = sum(stub.successes.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # an HTTP client left open is a failure too
        with open_run(config, encoder.settings, project / "data" / "trajectories", tasks_of(), cfg, encoder=encoder,
                      ledger=project / "data" / "ledger" / "http-costs.jsonl") as run:
            checkpoint, result = train_coordinator(run, tasks_of(), cfg, project / "models", log=QUIET)
            stats = run.runner.stats
    assert (checkpoint / "head.safetensors").is_file() and len(result.curves["train_best"]) == TINY_RUN["generations"]
    assert stats.sessions_run > TINY_RUN["explore_tasks"] and sum(stub.successes.values()) - before >= stats.sessions_run


def test_a_runner_keeps_one_loop_and_closes_its_clients_on_it(project, encoder, stub):
    """The run's clients are made, used and closed on one loop: after the run, none is open."""
    from fugu_pipeline.session.policy import FixedPolicy

    tasks = tasks_of()
    config = WorkersConfig.model_validate(http_workers(stub.openai_url))

    with open_run(config, encoder.settings, project / "data" / "trajectories-2", tasks, RolesConfig(**TINY_RUN),
                  encoder=encoder, ledger=project / "data" / "ledger" / "costs-2.jsonl") as run:
        for seed in (1, 2):  # two batches, one after the other, each calling every worker
            run.runner.run([FixedPolicy(IDS, w) for w in IDS], [(t, seed) for t in tasks[:2]], greedy=True)
        pools = [c.client.pool for c in run.caller.clients.values()]
        assert all(len(pool.open_clients()) == 1 for pool in pools)  # one client per upstream, kept for the run
    assert sum(run.caller.calls.values()) == 12
    assert not any(pool.open_clients() for pool in pools)


def test_evaluate_roles_against_http_workers(project, checkpoint, stub, capsys):
    from fugu_pipeline.cli import main

    before = sum(stub.successes.values())
    assert main(["evaluate-roles", "--project-dir", str(project), "--workers", "configs/workers.http.yaml",
                 "--checkpoint", str(checkpoint), "--encoder", "tiny", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "worker calls this run:" in out and "report:" in out and sum(stub.successes.values()) > before


def test_validate_of_a_coordinator_pack_against_http_workers(project, checkpoint, stub, tmp_path, monkeypatch, capsys):
    from fugu_pipeline.cli import main
    from fugu_pipeline.train.signing import KEY_ENV, accept_key, new_key_pair

    host = tmp_path / "host"
    shutil.copytree(project / "configs", host / "configs")
    shutil.copytree(project / "data" / "benchgen", host / "data" / "benchgen")
    (host / "lenient.yaml").write_text(yaml.safe_dump(
        {"min_gain_over_best_fixed": -1.0, "require_significant": False, "composite": {"overfit_rule": "guarded"}}))
    private, public = new_key_pair()
    monkeypatch.chdir(host)
    monkeypatch.setenv(KEY_ENV, private)
    accept_key(host / "models", "bob", public)
    assert main(["pack", str(checkpoint), "--out", "pack", "--ledger",
                 str(project / "data" / "ledger" / "costs.jsonl")]) == 0
    capsys.readouterr()
    before = sum(stub.successes.values())
    code = main(["validate", "--challenger", "pack", "--project-dir", str(host), "--workers", "configs/workers.http.yaml",
                 "--encoder", "tiny", "--device", "cpu", "--policy", "lenient.yaml"])
    out = capsys.readouterr().out
    assert code == 0 and "worker calls this run:" in out and "PROMOTED" in out, out  # the lenient policy, no king
    assert sum(stub.successes.values()) > before


def test_clients_made_on_one_loop_are_not_handed_to_another(stub):
    """The HTTP layer itself: a client of a loop that has ended is never used on a later loop; each
    loop gets its own, and closing on a loop closes that loop's."""
    from fugu_pipeline.workers.http import make_http_client

    config = WorkersConfig.model_validate(http_workers(stub.openai_url))
    client = make_http_client(config.workers[0], config, stream=False)

    async def once() -> str:
        return (await client.complete([{"role": "user", "content": "Role: Worker\nhi"}])).answer

    assert asyncio.run(once()) == asyncio.run(once())  # the second loop: its own client

    async def close() -> None:
        await client.aclose()

    asyncio.run(close())
    assert not client.pool.open_clients()


def test_the_stub_takes_role_replies_on_its_command_line():
    from fugu_pipeline.testing.stub_llm import role_replies

    assert role_replies(["Worker=Worked it out.\\nFinal answer: 42", "verifier=VERDICT: ACCEPT"]) == {
        "worker": "Worked it out.\nFinal answer: 42", "verifier": "VERDICT: ACCEPT"}
    with pytest.raises(ValueError, match="ROLE=TEXT"):
        role_replies(["judge=yes"])
