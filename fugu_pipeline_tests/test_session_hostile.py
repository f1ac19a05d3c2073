"""Hostile but plausible input to multi-turn sessions and the routing commands: every case here
was reproduced against the real code first (a traceback, a silently ignored flag, a pointer that
names another checkpoint, a second run that paid for sessions it then could not store)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fugu_pipeline.cli.main import main
from fugu_pipeline.collect.store import PartitionBusyError
from fugu_pipeline.route.router import RouterError
from fugu_pipeline.session.runner import SessionRunner
from fugu_pipeline.session.store import TrajectoryStore
from fugu_pipeline.train.pointer import ROLES_POINTER, write_pointer

from .conftest import REPO

WORKERS = str(REPO / "configs" / "workers.mock.yaml")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("prompt, says", [("ab\udcff\udcfecd", "not valid UTF-8"), ("", "--prompt is empty"),
                                          ("  \n ", "--prompt is empty")])
def test_multi_turn_ask_refuses_an_undecodable_or_empty_prompt_in_one_line(tmp_path, capsys, prompt, says):
    # before: a prompt with undecodable argv bytes ran into the featurizer's hash (UnicodeEncodeError
    # traceback), and an empty one paid workers for turns about nothing
    rc, err = _cli(capsys, "ask", "--mode", "multi-turn", "--workers", WORKERS, "--models-dir", str(tmp_path),
                   "--prompt", prompt)
    assert rc == 2 and says in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", [["route"], ["ask", "--workers", WORKERS]])
def test_one_step_commands_refuse_an_empty_prompt(tmp_path, capsys, command):
    rc, err = _cli(capsys, *command, "--models-dir", str(tmp_path), "--prompt", " ")
    assert rc == 2 and "--prompt is empty" in err


@pytest.mark.parametrize("flags", [["--budget-share", "0.3"], ["--budget-usd-per-1k", "1"], ["--cost-weight", "2"]])
def test_multi_turn_ask_refuses_one_step_budget_flags_instead_of_ignoring_them(tmp_path, capsys, flags):
    # before: the session ran with no cap at all, as if the flag had not been given
    rc, err = _cli(capsys, "ask", "--mode", "multi-turn", "--workers", WORKERS, "--models-dir", str(tmp_path),
                   "--prompt", "What is 6 times 7?", *flags)
    assert rc == 2 and flags[0] in err and "max_usd_per_run" in err


def test_promoted_roles_pointer_whose_hash_is_not_its_checkpoint_is_refused(tmp_path, monkeypatch):
    # before: roles.json naming content_hash X ran whatever checkpoint sat at its path (the one-step
    # pointer has always been checked this way)
    from fugu_pipeline.policies.coordinator import route as roles

    closed = []
    fake = SimpleNamespace(checkpoint=SimpleNamespace(manifest=SimpleNamespace(content_hash="bbbb")),
                           close=lambda: closed.append(True))
    monkeypatch.setattr(roles.RolesCoordinator, "load", classmethod(lambda cls, path, **kw: fake))
    write_pointer(tmp_path, {"checkpoint": "roles/bbbb", "content_hash": "aaaa", "method": "roles"}, ROLES_POINTER)
    with pytest.raises(RouterError, match="content_hash aaaa but roles/bbbb holds checkpoint bbbb"):
        roles.PromotedRoles(tmp_path)
    assert closed == [True]  # the refused coordinator's encoder is not left open
    write_pointer(tmp_path, {"checkpoint": "roles/bbbb", "content_hash": "bbbb", "method": "roles"}, ROLES_POINTER)
    assert roles.PromotedRoles(tmp_path).refresh() is fake


class _NoCalls:
    worker_ids = ["alpha"]
    dead: dict = {}

    def spec(self, worker_id):
        return None

    async def call(self, *a, **kw):  # pragma: no cover - the point is that it is never reached
        raise AssertionError("a second run on a busy store must not call any worker")


def test_second_run_on_the_same_store_stops_before_any_call(tmp_path):
    # before: the second run took the store's lock at its first finished session, so it had already
    # paid for a batch of sessions when PartitionBusyError threw them away
    first = TrajectoryStore(tmp_path, "ctx")
    SessionRunner(_NoCalls(), first)
    try:
        with pytest.raises(PartitionBusyError, match="another run"):
            SessionRunner(_NoCalls(), TrajectoryStore(tmp_path, "ctx"))
    finally:
        first.close()
    again = TrajectoryStore(tmp_path, "ctx")
    SessionRunner(_NoCalls(), again)  # free again once the first run closed its store
    again.close()
