"""The suite's own rules, checked on the suite: every assertion can fail and none is a wall-clock
limit (`scripts/check_assertions.py`, which CI runs too), and the skip budget CI holds the machine to
(`skip_budget.py`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.skip_budget import load_budget, over_budget

sys.path.insert(0, str(REPO / "scripts"))
from check_assertions import problems_in  # noqa: E402


# the samples below are source text for the checker, not assertions of this suite
CLOCK = "time.monotonic()"


@pytest.mark.parametrize("source, why", [
    ("def test_a(x):\n    assert x is None or True\n", "always true (an `or` with a true constant)"),
    ("def test_a():\n    assert True\n", "asserts a constant"),
    ("def test_a():\n    assert 1 == 1\n", "asserts a constant"),
    ("def test_a(x):\n    assert (x, 'message')\n", "non-empty tuple"),
    ("def test_a(x):\n    assert x.y == x.y\n", "compared with itself"),
    ("def test_a(x):\n    assert len(x) >= 0\n", "holds for every value"),
    ("def test_a(x):\n    assert x or not x\n", "`x or not x`"),
    ("def test_a(main):\n    assert main(['validate']) in (0, 1)\n", "success and failure alike"),
    ("def test_a(check, kind):\n    assert check() or kind == 'b'\n", "for that value the assertion checks nothing"),
    (f"import time\ndef test_a(f):\n    t = {CLOCK}\n    f()\n    assert {CLOCK} - t < 2\n",
     "a wall-clock bound"),
    ("import time\ndef test_a(f):\n    t0 = time.perf_counter()\n    f()\n    took = time.perf_counter() - t0\n"
     "    assert took < 30\n", "a wall-clock bound"),
    ("def test_a(r):\n    assert r.seconds < 5\n", "a wall-clock bound"),
    (f"import time\ndef until(ok):\n    deadline = {CLOCK} + 30\n    while not ok():\n"
     f"        assert {CLOCK} < deadline\n", "a deadline decides"),
    (f"import time\ndef test_a(f):\n    t0 = {CLOCK}\n    f()\n    assert {CLOCK} <= t0 + 5\n",
     "a deadline decides"),
    ("def test_a(info):\n    assert 190 <= info['upstream_ms'] < 550\n", "a wall-clock bound"),
])
def test_the_assertion_check_finds_what_cannot_fail(source, why):
    found = problems_in(source, "t.py")
    assert len(found) == 1 and why in found[0], found


@pytest.mark.parametrize("source", [
    "def test_a(f):\n    assert f() == f()\n",  # two calls may differ
    "def test_a(x):\n    assert (x or 'default') == 'a'\n",
    f"import time\ndef test_a(f):\n    t = {CLOCK}\n    f()\n    assert {CLOCK} - t >= 1.0\n",  # it waited
    "def test_a(info):\n    assert info['latency_ms'] >= info['upstream_ms'] > 0\n",  # one measure against another
    "import time\ndef test_a(p):\n    now = time.time()\n    assert 9 < p(now + 10, now=now) <= 10\n",
])
def test_the_assertion_check_leaves_real_checks_alone(source):
    assert problems_in(source, "t.py") == []


def test_no_assertion_of_the_suite_is_one_that_cannot_fail():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "check_assertions.py"), str(REPO / "fugu_pipeline_tests")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_skip_budget_fails_a_skip_its_reasons_do_not_allow(tmp_path):
    (tmp_path / "b.yaml").write_text("- {reason: 'needs CUDA', max: 1, why: no GPU here}\n"
                                     "- {reason: 'FUGU_SCALE_DEMO=1', max: 2, why: by hand}\n")
    budget = load_budget(tmp_path / "b.yaml")
    assert over_budget([("t.py::a", "needs CUDA (torch.cuda.is_available() is False)"),
                        ("t.py::b", "runs with FUGU_SCALE_DEMO=1")], budget) == []
    problems = over_budget([("t.py::a", "needs CUDA"), ("t.py::b", "needs CUDA"),
                            ("t.py::c", "port 8080 is taken on this machine")], budget)
    assert problems == ["t.py::c: skipped (port 8080 is taken on this machine): no entry of the budget allows this reason",
                        "2 skips for 'needs CUDA', at most 1 allowed: t.py::a, t.py::b"]
    (tmp_path / "bad.yaml").write_text("- {reason: '(', max: 1, why: x}\n")
    with pytest.raises(SystemExit, match="bad.yaml"):
        load_budget(tmp_path / "bad.yaml")


def test_ci_holds_the_suite_to_its_skip_budget():
    """The budget CI passes exists, loads, and every entry says why the CI machine skips it."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "--skip-budget=.ci/skip-budget.yaml" in ci and "-rs" in ci and '-m ""' in ci
    assert load_budget(REPO / ".ci" / "skip-budget.yaml")
