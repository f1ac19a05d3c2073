"""Every reader of untrusted text (`testing/hostile_text.py`: READERS) on hostile input: long digit
runs, thousands of `=`, deep brackets, a megabyte of one character, mixed with the readers' own
trigger tokens and lone surrogates (hypothesis draws them from `PIECES`).

Nothing here decides by the clock. The regular expressions are checked by their shape
(`test_regex_safety.py`: Python's `re` has no step counter); here each reader's own work is counted
(the interpreter's line and C-call events, the same for the same input) on a text repeated k and 2k
times, and must not grow faster than the text. A faulthandler alarm, far above any honest call,
only catches a hang and names it: it prints the stuck reader's traceback and ends the process.
"""

from __future__ import annotations

import faulthandler
import sys
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fugu_pipeline.testing.hostile_text import PIECES, READERS, hostile_texts

HANG_S = 120  # no reader comes near this on a megabyte; it is there to name a hang, not to time
SETTINGS = settings(deadline=None, derandomize=True, database=None, max_examples=30,
                    suppress_health_check=list(HealthCheck))
# a text: a few hostile pieces, each once, a few dozen or thousands of times (a digit run, then a
# trigger, then an `=` is what the old checks took exponential time on)
TEXTS = st.lists(st.tuples(st.sampled_from(PIECES), st.one_of(st.integers(1, 60), st.sampled_from((1000, 4000)))),
                 min_size=1, max_size=8).map(lambda chunks: "".join(piece * k for piece, k in chunks))
NAMED = list(hostile_texts(20_000).values())  # tried first, every run
UNITS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=12).map("".join)


@contextmanager
def hang_alarm(config):
    """Past HANG_S, faulthandler prints every thread's traceback to the real stderr (capture off:
    the dump must be seen) and ends the process; pytest then names the test that was running."""
    with config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        faulthandler.dump_traceback_later(HANG_S, exit=True)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()


def work(fn, text: str) -> int:
    """The interpreter's line events and C calls while `fn(text)` runs: deterministic, unlike a clock."""
    count = 0

    def line(frame, event, arg):
        nonlocal count
        count += 1
        return line

    def calls(frame, event, arg):
        nonlocal count
        count += event == "c_call"

    sys.settrace(lambda frame, event, arg: line)
    sys.setprofile(calls)
    try:
        fn(text)
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_reader_ends_on_hostile_text(name, pytestconfig):
    fn = READERS[name]

    @SETTINGS
    @given(TEXTS)
    def check(text):
        with hang_alarm(pytestconfig):
            fn(text)

    for text in NAMED:
        check = example(text)(check)
    check()


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_reader_does_work_in_proportion_to_its_input(name, pytestconfig):
    """A unit of hostile pieces repeated to ~4,000 characters, then twice that: at most ~2x the work."""
    fn = READERS[name]

    @SETTINGS
    @given(UNITS)
    def check(unit):
        k = max(1, 4000 // len(unit))
        once, twice = unit * k, unit * (2 * k)
        with hang_alarm(pytestconfig):
            fn(once)  # caches warmed (compiled patterns, a regex's analysis)
            small, large = work(fn, once), work(fn, twice)
        assert large <= 2.5 * small + 2000, f"{name}: {small} steps on {len(once)} characters, {large} on {len(twice)}"

    check()


@pytest.mark.slow
@pytest.mark.parametrize("text", ["digits", "digits before =", "= run", "parentheses", "boxed", "spaces",
                                  "one character (a)", "surrogates", "triggers, runs"])
def test_every_reader_ends_on_a_megabyte(text, pytestconfig):
    hostile = hostile_texts(1_000_000)[text]
    for fn in READERS.values():
        with hang_alarm(pytestconfig):
            fn(hostile)


def test_the_reported_prompt_is_read(pytestconfig):
    """The request that stopped a server: a 40-digit literal before an `=` (24 digits took 4.7 s)."""
    from fugu_pipeline.policies.cascade.answer_checks import arithmetic_steps
    from fugu_pipeline.policies.cascade.answer_features import TEXT_STATS, answer_stats

    prompt = "Compute x = " + "10" * 20 + " y = 1"
    with hang_alarm(pytestconfig):
        assert arithmetic_steps(prompt) == []  # `x = ...` is algebra, not a computation
        assert answer_stats(prompt, "1", prompt).shape == (len(TEXT_STATS),)
